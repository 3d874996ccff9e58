"""TLS for the ext_proc port: on by default, with a self-signed certificate made at start or one from a directory.

The reference generates an RSA-4096 key at every start. picker uses ECDSA P-256: generating it takes well under
a millisecond where RSA-4096 takes from half a second to several seconds of CPU (a slow, variable start, felt
most on a busy 2-core node), and P-256 handshakes are cheaper too. Envoy, NGINX and agentgateway all accept
ECDSA certificates, and gateways connect to the EPP's self-signed certificate without verifying it anyway.

``--cert-path DIR`` loads ``DIR/tls.crt`` and ``DIR/tls.key`` (the layout of a Kubernetes TLS Secret) instead.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from picker import errors

__all__ = ["CertificatePair", "load_pair", "self_signed", "server_credentials"]

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
    """``tls.crt`` and ``tls.key`` from a directory (a mounted Kubernetes TLS Secret)."""
    base = Path(cert_dir)
    try:
        return CertificatePair((base / "tls.crt").read_bytes(), (base / "tls.key").read_bytes())
    except OSError as exc:
        raise errors.ConfigError(f"--cert-path {cert_dir}: {exc.strerror or exc}: {exc.filename}") from exc


def server_credentials(pair: CertificatePair) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(pair.key_pem, pair.cert_pem)])
