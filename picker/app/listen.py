"""How the ext_proc port listens: its TLS (none, reloaded files or a self-signed pair), which front serves it
(the native one or grpc.aio), and binding a grpc.aio server with a clear error when the port is taken.
"""

from __future__ import annotations

import logging
import os

import grpc

from picker import errors
from picker.extproc import native, tls
from picker.settings import ServerSettings

__all__ = ["address", "bind", "ext_proc_tls", "native_frontend"]

log = logging.getLogger("picker")


def ext_proc_tls(
    srv: ServerSettings,
) -> tuple[tls.CertificatePair | None, tls.CertificateFiles | None, grpc.ServerCredentials | None]:
    """The ext_proc port's credentials: none (plaintext), files (reloaded on change) or a self-signed pair."""
    if not srv.secure_serving:
        if srv.client_ca_file:
            raise errors.ConfigError("--client-ca-file needs --secure-serving")
        return None, None, None
    if srv.cert_path and srv.cert_reload:
        files = tls.CertificateFiles(srv.cert_path, srv.client_ca_file)
        return files.pair, files, files.credentials()
    # ECDSA P-256, not the reference's RSA-4096: see tls.py
    pair = tls.load_pair(srv.cert_path) if srv.cert_path else tls.self_signed((srv.host, os.environ.get("POD_IP", "")))
    client_ca = tls.load_client_ca(srv.client_ca_file) if srv.client_ca_file else None
    return pair, None, tls.server_credentials(pair, client_ca)


def native_frontend(srv: ServerSettings) -> bool:
    """Serve ext_proc on the native front (``--grpc-frontend``)?"""
    if srv.grpc_frontend == "grpc":
        return False
    if native.AVAILABLE:
        return True
    reason = "picker.extproc._front is not built (scripts/install.sh builds it when cargo is there)"
    if srv.grpc_frontend == "native":
        raise errors.ConfigError(f"--grpc-frontend=native: {reason}")
    log.info("ext_proc served by grpc.aio", extra={"reason": reason})
    return False


def bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    try:
        if credentials is None:
            return int(server.add_insecure_port(address))
        return int(server.add_secure_port(address, credentials))
    except RuntimeError as exc:  # grpc's "Failed to bind"
        raise errors.ConfigError(f"cannot listen on {address}: {exc}") from exc


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
