"""NGINX Gateway Fabric's data path, run locally: nginx + njs (Debian) → the endpoint-picker shim → picker.

What NGF deploys for an HTTPRoute whose backend is an InferencePool, reproduced piece by piece:

* **nginx** with the **njs** module (Debian ``nginx`` + ``libnginx-mod-http-js``), configured the way NGF's
  templates shape it: the route's location declares ``js_var $inference_workload_endpoint``, sets ``$epp_host``,
  ``$epp_port`` and ``$epp_internal_path`` and runs ``js_content epp.getEndpoint``; the script posts the
  request to the shim, stores the endpoint it returns and ``internalRedirect``s to the internal location, whose
  ``proxy_pass`` takes ``$inference_backend_<upstream>`` from NGF's map: ``""`` → the pool's upstream,
  ``~.+`` → the picked endpoint, ``default`` → the pool's upstream (FailOpen) or ``invalid-backend-ref``
  (FailClose, an upstream that answers 500). The pool's upstream lists every endpoint, NGF's default load
  balancing (``random two least_conn``).
* **the shim** (``tools/ngf-shim``, built by ``scripts/install-tools.sh`` into ``.tools/bin/ngf-epp-shim``): a
  wire-level stand-in for NGF's ``gateway endpoint-picker``, since NGF's Go module is not served by the module
  proxy reachable here; one gRPC connection per request, ``value`` header strings, one body message, the
  destination read from the request-headers answer only.
* **epp.js**: this module's own script with the behaviour of NGF's ``epp.js`` (same variables and headers),
  written for Debian's njs 0.7.

``render()`` writes the nginx prefix directory; ``run_shim()`` and ``run_nginx()`` start the processes (as
``procs.Child``, stopped on exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from picker.bench import procs

__all__ = [
    "FAIL_CLOSE",
    "FAIL_OPEN",
    "JS_MODULE",
    "NgfNotFound",
    "nginx_binary",
    "render",
    "run_nginx",
    "run_shim",
    "shim_binary",
]

FAIL_OPEN, FAIL_CLOSE = "FailOpen", "FailClose"
JS_MODULE = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")
UPSTREAM = "default_pool_8000"  # NGF names a pool's upstream <namespace>_<service>_<port>
INTERNAL_PATH = "/_ngf-internal-rule0-route0-inference"


class NgfNotFound(RuntimeError):
    pass


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found is None or not JS_MODULE.exists():
        raise NgfNotFound(
            "nginx with njs is needed: apt-get install nginx libnginx-mod-http-js (scripts/install-tools.sh does)"
        )
    return found


def shim_binary() -> str:
    found = procs.tool_binary("ngf-epp-shim")
    if found is not None:
        return found
    raise NgfNotFound("the NGF endpoint-picker shim is not built: run scripts/install-tools.sh (go build)")


# NGF's epp.js behaviour, for njs 0.7: headers + X-EPP-Host/Port to the shim with the buffered body; a 200 with
# the destination header sets $inference_workload_endpoint; anything else is logged; always redirect inside.
_EPP_JS = """\
import qs from 'querystring';

const SHIM = '__SHIM_URL__';

async function getEndpoint(r) {
    const host = r.variables.epp_host;
    const port = r.variables.epp_port;
    const internal = r.variables.epp_internal_path;
    if (!host || !port || !internal) {
        throw Error('epp_host, epp_port and epp_internal_path must be set');
    }
    const headers = {};
    for (const name in r.headersIn) {
        headers[name] = r.headersIn[name];
    }
    headers['X-EPP-Host'] = host;
    headers['X-EPP-Port'] = port;
    try {
        const reply = await ngx.fetch(SHIM, {method: r.method, headers: headers, body: r.requestText || ''});
        const endpoint = reply.headers.get('X-Gateway-Destination-Endpoint');
        if (reply.status === 200 && endpoint) {
            r.variables.inference_workload_endpoint = endpoint;
        } else {
            const text = await reply.text();
            r.error(`no inference endpoint from the EndpointPicker: status ${reply.status}: ${text}`);
        }
    } catch (e) {
        r.error(`EndpointPicker shim unreachable: ${e}`);
    }
    let args = qs.stringify(r.args);
    r.internalRedirect(internal + (args ? '?' + args : ''));
}

export default {getEndpoint};
"""

# The route's location with an EndpointPicker (NGF's "inference" location type) ...
_INFERENCE_ROUTE = """\
        location / {
            js_var $inference_workload_endpoint;
            set $epp_internal_path __INTERNAL__;
            set $epp_host __EPP_HOST__;
            set $epp_port __EPP_PORT__;
            js_content epp.getEndpoint;
        }"""
# ... and without one: the pool's upstream directly (the baseline the demo compares with).
_POOL_ROUTE = """\
        location / {
            js_var $inference_workload_endpoint;
            rewrite ^ __INTERNAL__ last;
        }"""

_NGINX_CONF = """\
load_module __JS_MODULE__;
daemon off;
master_process on;
worker_processes 1;
pid __DIR__/nginx.pid;
error_log __DIR__/error.log notice;

events {
    worker_connections 4096;
}

http {
    # One line per request: what the EndpointPicker chose and where nginx sent it.
    log_format picker '$status $request_time "$upstream_addr" "$inference_workload_endpoint" $request_uri';
    access_log __DIR__/access.log picker;
    client_body_temp_path __DIR__/tmp/body;
    proxy_temp_path __DIR__/tmp/proxy;
    fastcgi_temp_path __DIR__/tmp/fastcgi;
    uwsgi_temp_path __DIR__/tmp/uwsgi;
    scgi_temp_path __DIR__/tmp/scgi;

    js_import epp from __DIR__/epp.js;

    # The InferencePool's endpoints: where FailOpen and an empty pick go.
    upstream __UPSTREAM__ {
        random two least_conn;
        zone __UPSTREAM__ 512k;
__SERVERS__
    }

    # NGF answers a broken backend reference with 500.
    upstream invalid-backend-ref {
        server unix:__DIR__/invalid-backend.sock;
    }

    map $inference_workload_endpoint $inference_backend___UPSTREAM__ {
        "" __UPSTREAM__;
        ~.+ $inference_workload_endpoint;
        default __DEFAULT__;
    }

    server {
        listen unix:__DIR__/invalid-backend.sock;
        return 500;
    }

    server {
        listen 127.0.0.1:__LISTEN__;
        client_max_body_size 16m;
        client_body_buffer_size 16m;
        client_body_in_single_buffer on;

__ROUTE__

        location __INTERNAL__ {
            internal;
            proxy_http_version 1.1;
            proxy_set_header Host $host;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
            proxy_pass http://$inference_backend___UPSTREAM__$request_uri;
        }
    }
}
"""


def render(
    directory: Path,
    *,
    listen_port: int,
    shim_port: int,
    picker_host: str,
    picker_port: int,
    backends: Sequence[tuple[str, int]],
    failure_mode: str = FAIL_CLOSE,
    with_picker: bool = True,
) -> Path:
    """Write ``nginx.conf`` and ``epp.js`` into ``directory`` (the nginx prefix); returns the config's path.

    ``with_picker=False``: the route goes to the pool's upstream with no EndpointPicker (nginx alone).
    """
    if failure_mode not in (FAIL_OPEN, FAIL_CLOSE):
        raise ValueError(f"failure mode must be {FAIL_OPEN} or {FAIL_CLOSE}, not {failure_mode!r}")
    if not backends:
        raise ValueError("the pool needs at least one endpoint")
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / "tmp"
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(tmp / sub, 0o777)  # nginx workers of a root master run as nobody
    os.chmod(directory, 0o755)
    js = _EPP_JS.replace("__SHIM_URL__", f"http://127.0.0.1:{shim_port}")
    (directory / "epp.js").write_text(js)
    conf = (
        _NGINX_CONF.replace("__JS_MODULE__", str(JS_MODULE))
        .replace("__DIR__", str(directory))
        .replace("__UPSTREAM__", UPSTREAM)
        .replace("__SERVERS__", "\n".join(f"        server {host}:{port};" for host, port in backends))
        .replace("__DEFAULT__", UPSTREAM if failure_mode == FAIL_OPEN else "invalid-backend-ref")
        .replace("__LISTEN__", str(listen_port))
        .replace("__ROUTE__", _INFERENCE_ROUTE if with_picker else _POOL_ROUTE)
        .replace("__INTERNAL__", INTERNAL_PATH)
        .replace("__EPP_HOST__", picker_host)
        .replace("__EPP_PORT__", str(picker_port))
    )
    path = directory / "nginx.conf"
    path.write_text(conf)
    return path


@contextlib.asynccontextmanager
async def run_nginx(
    config: Path, listen_port: int, *, on_start: Callable[[procs.Child], None] | None = None
) -> AsyncIterator[procs.Child]:
    """nginx in the foreground with ``config`` (its directory is the prefix); yields once it listens."""
    binary = nginx_binary()
    prefix = config.parent
    test = await asyncio.create_subprocess_exec(
        binary, "-t", "-q", "-p", str(prefix), "-c", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await test.communicate()
    if test.returncode != 0:
        raise procs.ChildFailed(f"nginx rejected {config}: {out.decode(errors='replace')}")
    argv = [binary, "-p", str(prefix), "-c", str(config)]
    async with procs.spawn("nginx", argv, on_start=on_start) as child:
        await _wait_tcp("127.0.0.1", listen_port, 20.0, child)
        yield child


@contextlib.asynccontextmanager
async def run_shim(
    port: int, *, tls: bool = True, on_start: Callable[[procs.Child], None] | None = None
) -> AsyncIterator[procs.Child]:
    """The NGF endpoint-picker shim on 127.0.0.1:``port``; ``tls``: TLS to picker without verification."""
    argv = [shim_binary(), "--listen", f"127.0.0.1:{port}"]
    if not tls:
        argv.append("--endpoint-picker-disable-tls")
    async with procs.spawn("ngf-shim", argv, on_start=on_start) as child:
        await _wait_tcp("127.0.0.1", port, 20.0, child)
        yield child


async def _wait_tcp(host: str, port: int, timeout_s: float, child: procs.Child) -> None:
    """Until ``host:port`` accepts a connection; fails early (with its output) if ``child`` exits."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        child.check()
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection(host, port)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return
        if loop.time() > deadline:
            raise procs.ChildFailed(f"{child.name} did not listen on {host}:{port} within {timeout_s:g} s")
        await asyncio.sleep(0.05)
