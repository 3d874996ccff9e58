"""TLS for the ext_proc port: on by default, with a self-signed certificate made at start or one from a directory.

The reference generates an RSA-4096 key at every start. picker uses ECDSA P-256: generating it takes well under
a millisecond where RSA-4096 takes from half a second to several seconds of CPU (a slow, variable start, felt
most on a busy 2-core node), and P-256 handshakes are cheaper too. Envoy, NGINX and agentgateway all accept
ECDSA certificates, and gateways connect to the EPP's self-signed certificate without verifying it anyway.

``--cert-path DIR`` loads ``DIR/tls.crt`` and ``DIR/tls.key`` (the layout of a Kubernetes TLS Secret) instead.
With ``--enable-cert-reload`` (the reference's flag; on by default here) the files are watched: a rotated pair is
served from the next TLS handshake on, without a restart. gRPC asks ``CertificateFiles.fetch`` for the current
configuration at each handshake; the files are looked at (``stat``) at most once a second and re-read only when
they changed. A pair that does not load (a rotation caught half-written, a key that does not match the
certificate) is logged once and the previous pair kept, so a bad rotation never takes the port down.

``--client-ca-file FILE`` turns on mutual TLS: a gateway must present a certificate signed by one of the CAs in
the PEM bundle, or its handshake fails. The bundle is reloaded like the pair.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import NameOID

from picker import errors

__all__ = ["CertificateFiles", "CertificatePair", "load_client_ca", "load_pair", "self_signed", "server_credentials"]

log = logging.getLogger(__name__)

_VALIDITY = datetime.timedelta(days=3650)  # ten years, as the reference


class CertificatePair:
    """A PEM certificate and its PEM private key."""

    __slots__ = ("cert_pem", "key_pem")

    def __init__(self, cert_pem: bytes, key_pem: bytes) -> None:
        self.cert_pem = cert_pem
        self.key_pem = key_pem


def self_signed(hosts: tuple[str, ...] = ()) -> CertificatePair:
    """A fresh self-signed ECDSA P-256 certificate for ``localhost``, the loopback IPs, this host and ``hosts``."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    seen = {"localhost"}
    for host in (*hosts, socket.gethostname(), "127.0.0.1", "::1"):
        if not host or host in seen or host in ("0.0.0.0", "::"):
            continue
        seen.add(host)
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "picker"),
                         x509.NameAttribute(NameOID.COMMON_NAME, "picker-epp")])  # fmt: skip
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return CertificatePair(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


def load_pair(cert_dir: str) -> CertificatePair:
    """``tls.crt`` and ``tls.key`` from a directory (a mounted Kubernetes TLS Secret), checked to belong together."""
    base = Path(cert_dir)
    try:
        pair = CertificatePair((base / "tls.crt").read_bytes(), (base / "tls.key").read_bytes())
    except OSError as exc:
        raise errors.ConfigError(f"--cert-path {cert_dir}: {exc.strerror or exc}: {exc.filename}") from exc
    _check_pair(pair, cert_dir)
    return pair


def load_client_ca(path: str) -> bytes:
    """A PEM bundle of CA certificates (``--client-ca-file``); at least one certificate, all parseable."""
    try:
        pem = Path(path).read_bytes()
    except OSError as exc:
        raise errors.ConfigError(f"--client-ca-file {path}: {exc.strerror or exc}") from exc
    try:
        if not x509.load_pem_x509_certificates(pem):
            raise ValueError("no certificate")
    except ValueError as exc:
        raise errors.ConfigError(f"--client-ca-file {path}: not a PEM certificate bundle: {exc}") from exc
    return pem


def _check_pair(pair: CertificatePair, where: str) -> None:
    try:
        cert = x509.load_pem_x509_certificate(pair.cert_pem)
        key = load_pem_private_key(pair.key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise errors.ConfigError(f"--cert-path {where}: tls.crt/tls.key do not load: {exc}") from exc
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, public) != cert.public_key().public_bytes(
        serialization.Encoding.DER, public
    ):
        raise errors.ConfigError(f"--cert-path {where}: tls.key is not the key of tls.crt")


def server_credentials(pair: CertificatePair, client_ca: bytes | None = None) -> grpc.ServerCredentials:
    """Fixed credentials; with ``client_ca`` a client certificate signed by it is required (mTLS)."""
    return grpc.ssl_server_credentials(
        [(pair.key_pem, pair.cert_pem)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


class CertificateFiles:
    """``--cert-path`` (and ``--client-ca-file``) served with reload on change: ``credentials()`` for the port.

    ``fetch`` (``fetch_pem`` for the native front) runs on a gRPC core (or front) thread at every handshake, so it
    only compares file stats (at most once per ``check_interval_s``) and reads the files when they changed; a lock
    keeps two handshakes from reloading at once.
    """

    def __init__(
        self,
        cert_dir: str,
        client_ca_file: str | None = None,
        *,
        check_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cert_dir = cert_dir
        self.client_ca_file = client_ca_file
        self.pair = load_pair(cert_dir)
        self.client_ca = load_client_ca(client_ca_file) if client_ca_file else None
        self.reloads = 0  # pairs (or bundles) taken into use after the first
        self._check_interval_s = check_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._checked_at = clock()
        self._bad_stamp: tuple[tuple[int, int], ...] | None = None

    def _paths(self) -> list[str]:
        paths = [os.path.join(self.cert_dir, "tls.crt"), os.path.join(self.cert_dir, "tls.key")]
        return [*paths, self.client_ca_file] if self.client_ca_file else paths

    def _stat(self) -> tuple[tuple[int, int], ...]:
        # A Kubernetes Secret volume swaps a symlinked directory: os.stat follows it to the new files.
        stamps = []
        for path in self._paths():
            try:
                st = os.stat(path)
                stamps.append((st.st_mtime_ns, st.st_size))
            except OSError:
                stamps.append((0, -1))
        return tuple(stamps)

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(self.pair.key_pem, self.pair.cert_pem)], root_certificates=self.client_ca
        )

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._configuration(), self.fetch, require_client_authentication=self.client_ca is not None
        )

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """The configuration to use from this handshake on, or None to keep the current one."""
        return self._configuration() if self._reloaded() else None

    def fetch_pem(self) -> tuple[bytes, bytes, bytes | None] | None:
        """``fetch`` for the native front (which asks before each handshake): (cert, key, client CA) PEM or None."""
        return (self.pair.cert_pem, self.pair.key_pem, self.client_ca) if self._reloaded() else None

    def _reloaded(self) -> bool:
        """Did the files change into a valid new pair (now in ``pair`` and ``client_ca``)?"""
        now = self._clock()
        if now - self._checked_at < self._check_interval_s or not self._lock.acquire(blocking=False):
            return False
        try:
            self._checked_at = now
            stamp = self._stat()
            if stamp == self._stamp or stamp == self._bad_stamp:
                return False
            try:
                pair = load_pair(self.cert_dir)
                client_ca = load_client_ca(self.client_ca_file) if self.client_ca_file else None
            except errors.ConfigError as exc:
                self._bad_stamp = stamp  # logged once per bad state of the files, retried when they change
                log.warning("TLS files changed but do not load; keeping the previous certificate: %s", exc)
                return False
            self.pair, self.client_ca, self._stamp, self._bad_stamp = pair, client_ca, stamp, None
            self.reloads += 1
            log.info("TLS certificate reloaded", extra={"cert_path": self.cert_dir})
            return True
        finally:
            self._lock.release()
