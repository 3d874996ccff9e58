"""NGINX Gateway Fabric's data path, run locally: nginx + njs (Debian) → NGF's endpoint-picker shim → picker.

What NGF deploys for an HTTPRoute whose backend is an InferencePool, piece by piece:

* **nginx** with the **njs** module (Debian ``nginx`` + ``libnginx-mod-http-js``), configured as NGF's templates
  render it: the route's location declares ``js_var $inference_workload_endpoint``, sets ``$epp_internal_path``,
  ``$epp_host`` and ``$epp_port`` and runs ``js_content epp.getEndpoint``; the script posts the request to the shim,
  stores the endpoint it returns and ``internalRedirect``s to the internal location, whose ``proxy_pass`` takes
  ``$inference_backend_<upstream>`` from NGF's map: ``""`` → the pool's upstream, ``~.+`` → the picked endpoint,
  ``default`` → the pool's upstream (FailOpen) or ``invalid-backend-ref`` (FailClose, an upstream that answers
  500). The pool's upstream lists every endpoint with NGF's default load balancing (``random two least_conn``).
* **epp.js**: NGF's own script, unchanged, imported from ``../shared/third_party/ngf-epp-shim/epp.js``.
* **the shim**: NGF's own ``gateway endpoint-picker``, built from the same directory by
  ``scripts/build-ngf-shim.sh`` into ``.tools/bin/ngf-gateway``. It always listens on 127.0.0.1:54800, so
  ``run_shim`` holds a machine-wide lock on that port (``portlock``) while it runs.

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

from picker.bench import portlock, procs

__all__ = [
    "FAIL_CLOSE",
    "FAIL_OPEN",
    "INTERNAL_PATH",
    "JS_MODULE",
    "PROMPT_BODY_BUFFER",
    "SHIM_PORT",
    "NgfNotFound",
    "epp_js",
    "nginx_binary",
    "render",
    "run_nginx",
    "run_shim",
    "shim_binary",
]

FAIL_OPEN, FAIL_CLOSE = "FailOpen", "FailClose"
JS_MODULE = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")
SHIM_PORT = 54800  # NGF's types.GoShimPort; epp.js posts to http://127.0.0.1:54800
UPSTREAM = "default_pool_8000"  # NGF names a pool's upstream <namespace>_<service>_<port>
INTERNAL_PATH = "/_ngf-internal-proxy-pass-rule0-route0-backend0-inference"
# The body buffer docs/gateways.md tells NGF users to add (a SnippetsFilter): nginx's default 16 KiB sends longer
# prompts to a file, where epp.js can't read them, and picker never sees them. 16m matches --max-body-bytes.
PROMPT_BODY_BUFFER = "16m"
_REPO = Path(__file__).resolve().parents[2]


class NgfNotFound(RuntimeError):
    pass


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found is None or not JS_MODULE.exists():
        raise NgfNotFound(
            "nginx with njs is needed: apt-get install nginx libnginx-mod-http-js (scripts/install-tools.sh does)"
        )
    return found


def shim_source() -> Path:
    """NGF's upstream files: ``$PICKER_SHARED_DIR/third_party/ngf-epp-shim`` (default ``../shared`` of the repo)."""
    shared = Path(os.environ.get("PICKER_SHARED_DIR") or _REPO.parent / "shared")
    return shared / "third_party" / "ngf-epp-shim"


def epp_js() -> Path:
    """NGF's ``epp.js``, used where it lies (never copied)."""
    path = shim_source() / "epp.js"
    if not path.is_file():
        raise NgfNotFound(f"NGF's epp.js is not at {path} (set PICKER_SHARED_DIR to the shared/ directory)")
    return path


def shim_binary() -> str:
    found = procs.tool_binary("ngf-gateway")
    if found is not None:
        return found
    raise NgfNotFound("NGF's endpoint-picker shim is not built: run scripts/install-tools.sh (go build)")


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
__USER__daemon off;
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

    map $http_host $gw_api_compliant_host {
        '' $host;
        default $http_host;
    }

    js_import epp from __EPP_JS__;

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
__BODY__

__ROUTE__

        location __INTERNAL__ {
            internal;
            proxy_http_version 1.1;
            proxy_set_header Host "$gw_api_compliant_host";
            proxy_set_header X-Forwarded-For "$proxy_add_x_forwarded_for";
            proxy_set_header Connection "";
            proxy_pass http://$inference_backend___UPSTREAM__$request_uri;
        }
    }
}
"""


def render(
    directory: Path,
    *,
    listen_port: int,
    picker_host: str,
    picker_port: int,
    backends: Sequence[tuple[str, int]],
    failure_mode: str = FAIL_CLOSE,
    with_picker: bool = True,
    body_buffer: str | None = None,
) -> Path:
    """Write ``nginx.conf`` into ``directory`` (the nginx prefix); returns the config's path.

    ``with_picker=False``: the route goes to the pool's upstream with no EndpointPicker (nginx alone).
    ``body_buffer`` (an nginx size, e.g. ``"4m"``): ``client_body_buffer_size`` and ``client_max_body_size``, so
    bodies up to that size stay in memory where epp.js's ``r.requestText`` can read them; ``None`` keeps nginx's
    defaults, as NGF renders a route without a ClientSettingsPolicy or snippet (16 KiB buffer, 1 MiB limit).
    """
    if failure_mode not in (FAIL_OPEN, FAIL_CLOSE):
        raise ValueError(f"failure mode must be {FAIL_OPEN} or {FAIL_CLOSE}, not {failure_mode!r}")
    if not backends:
        raise ValueError("the pool needs at least one endpoint")
    script = epp_js() if with_picker else None
    directory.mkdir(parents=True, exist_ok=True)
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (directory / "tmp" / sub).mkdir(parents=True, exist_ok=True)
    body = ""
    if body_buffer is not None:
        body = f"        client_body_buffer_size {body_buffer};\n        client_max_body_size {body_buffer};\n"
    # Workers of a root master would run as nobody, who can't reach a private temporary directory (pytest's).
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = (
        _NGINX_CONF.replace("__JS_MODULE__", str(JS_MODULE))
        .replace("__USER__", user)
        .replace("__DIR__", str(directory))
        .replace("__EPP_JS__", str(script) if script else "")
        .replace("__UPSTREAM__", UPSTREAM)
        .replace("__SERVERS__", "\n".join(f"        server {host}:{port};" for host, port in backends))
        .replace("__DEFAULT__", UPSTREAM if failure_mode == FAIL_OPEN else "invalid-backend-ref")
        .replace("__LISTEN__", str(listen_port))
        .replace("__BODY__\n", body)
        .replace("__ROUTE__", _INFERENCE_ROUTE if with_picker else _POOL_ROUTE)
        .replace("__INTERNAL__", INTERNAL_PATH)
        .replace("__EPP_HOST__", picker_host)
        .replace("__EPP_PORT__", str(picker_port))
    )
    if script is None:
        conf = conf.replace("    js_import epp from ;\n", "")
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
    *, tls: bool = True, lock_wait_s: float = 300.0, on_start: Callable[[procs.Child], None] | None = None
) -> AsyncIterator[procs.Child]:
    """NGF's shim on 127.0.0.1:54800 (its fixed port, held under ``portlock`` for the block).

    ``tls``: TLS to picker without certificate verification (NGF's default); else ``--endpoint-picker-disable-tls``.
    """
    argv = [shim_binary(), "endpoint-picker"]
    if not tls:
        argv.append("--endpoint-picker-disable-tls")
    try:
        async with (
            portlock.hold(SHIM_PORT, wait_s=lock_wait_s),
            procs.spawn("ngf-shim", argv, on_start=on_start) as child,
        ):
            child.dies_on_sigterm = True  # the shim handles no signal
            await _wait_tcp("127.0.0.1", SHIM_PORT, 20.0, child)
            yield child
    except portlock.PortBusy as exc:
        raise procs.ChildFailed(f"NGF's shim can't start: {exc}") from exc


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
