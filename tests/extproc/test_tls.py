"""TLS on the ext_proc port: on by default (self-signed), or a cert directory, or off."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from picker import errors
from picker.extproc import tls
from tests.conftest import endpoint
from tests.extproc.conftest import make_store, picker
from tests.extproc.gateway import EnvoyFullDuplex, gateway

HEADERS = {":path": "/v1/completions"}
BODY = b'{"model":"m","prompt":"p"}'


async def test_tls_is_on_by_default_and_a_client_trusting_the_cert_is_routed() -> None:
    async with picker(make_store([endpoint(1)]), secure_serving=True) as running:
        assert running.certificate is not None
        creds = grpc.ssl_channel_credentials(root_certificates=running.certificate.cert_pem)
        async with gateway(EnvoyFullDuplex, running.grpc_target, creds) as gw:
            out = await gw.request(HEADERS, [BODY])
            assert out.destination == "192.168.1.1:8000"

        async with gateway(EnvoyFullDuplex, running.grpc_target) as plain:  # no TLS: refused
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await plain.request(HEADERS, [BODY])
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_plaintext_when_secure_serving_is_off() -> None:
    async with picker(make_store([endpoint(1)]), secure_serving=False) as running:
        assert running.certificate is None
        async with gateway(EnvoyFullDuplex, running.grpc_target) as gw:
            assert (await gw.request(HEADERS, [BODY])).destination == "192.168.1.1:8000"


async def test_cert_path_directory_is_used(tmp_path: Path) -> None:
    pair = tls.self_signed()
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    async with picker(make_store([endpoint(1)]), secure_serving=True, cert_path=str(tmp_path)) as running:
        assert running.certificate is not None
        assert running.certificate.cert_pem == pair.cert_pem
        creds = grpc.ssl_channel_credentials(root_certificates=pair.cert_pem)
        async with gateway(EnvoyFullDuplex, running.grpc_target, creds) as gw:
            assert (await gw.request(HEADERS, [BODY])).destination == "192.168.1.1:8000"


def test_self_signed_certificate_is_ecdsa_for_loopback_and_extra_hosts() -> None:
    pair = tls.self_signed(("10.1.2.3", "picker.example"))
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = set(san.get_values_for_type(x509.DNSName))
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    assert {"localhost", "picker.example"} <= names
    assert {"127.0.0.1", "::1", "10.1.2.3"} <= ips
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days >= 3649


# -- rotation and mutual TLS ---------------------------------------------------------------------------------


def _ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _client_cert(ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate]) -> tuple[bytes, bytes]:
    """A client certificate (PEM cert, PEM key) signed by ``ca``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gateway")]))
        .issuer_name(ca[1].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca[0], hashes.SHA256())
    )
    return cert.public_bytes(Encoding.PEM), key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def _write_pair(directory: Path, pair: tls.CertificatePair) -> None:
    # As a Secret volume update does: new files appear whole (rename), never half-written in place.
    for name, data in (("tls.crt", pair.cert_pem), ("tls.key", pair.key_pem)):
        tmp = directory / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, directory / name)


async def _routed(target: str, creds: grpc.ChannelCredentials) -> str:
    async with gateway(EnvoyFullDuplex, target, creds) as gw:
        return (await gw.request(HEADERS, [BODY])).destination


async def test_rotated_certificate_is_served_from_the_next_handshake_without_a_restart(tmp_path: Path) -> None:
    first, second = tls.self_signed(), tls.self_signed()
    _write_pair(tmp_path, first)
    async with picker(make_store([endpoint(1)]), secure_serving=True, cert_path=str(tmp_path)) as running:
        files = running.cert_files
        assert files is not None
        files._check_interval_s = 0.0  # look at the files at every handshake (default: once a second)
        assert await _routed(running.grpc_target, grpc.ssl_channel_credentials(first.cert_pem)) == "192.168.1.1:8000"

        _write_pair(tmp_path, second)
        os.utime(tmp_path / "tls.crt", ns=(1, 1))  # a different stamp even within one mtime tick
        assert await _routed(running.grpc_target, grpc.ssl_channel_credentials(second.cert_pem)) == "192.168.1.1:8000"
        assert files.reloads == 1
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # the old certificate is gone
            await _routed(running.grpc_target, grpc.ssl_channel_credentials(first.cert_pem))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

        # A broken rotation (key of another certificate) is refused: the working pair stays in use.
        (tmp_path / "tls.key").write_bytes(first.key_pem)
        assert await _routed(running.grpc_target, grpc.ssl_channel_credentials(second.cert_pem)) == "192.168.1.1:8000"
        assert files.reloads == 1


def test_a_key_that_does_not_match_the_certificate_is_a_config_error(tmp_path: Path) -> None:
    _write_pair(tmp_path, tls.CertificatePair(tls.self_signed().cert_pem, tls.self_signed().key_pem))
    with pytest.raises(errors.ConfigError, match=r"not the key of tls\.crt"):
        tls.load_pair(str(tmp_path))


async def test_mutual_tls_requires_a_client_certificate_signed_by_the_client_ca(tmp_path: Path) -> None:
    server, ca, other_ca = tls.self_signed(), _ca("gateways"), _ca("strangers")
    _write_pair(tmp_path, server)
    ca_file = tmp_path / "client-ca.pem"
    ca_file.write_bytes(ca[1].public_bytes(Encoding.PEM))
    store = make_store([endpoint(1)])
    async with picker(store, secure_serving=True, cert_path=str(tmp_path), client_ca_file=str(ca_file)) as running:
        cert, key = _client_cert(ca)
        good = grpc.ssl_channel_credentials(server.cert_pem, private_key=key, certificate_chain=cert)
        assert await _routed(running.grpc_target, good) == "192.168.1.1:8000"

        for creds in (
            grpc.ssl_channel_credentials(server.cert_pem),  # no client certificate
            grpc.ssl_channel_credentials(server.cert_pem, *reversed(_client_cert(other_ca))),  # another CA's
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _routed(running.grpc_target, creds)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_with_the_self_signed_certificate_and_no_reload(tmp_path: Path) -> None:
    ca = _ca("gateways")
    ca_file = tmp_path / "client-ca.pem"
    ca_file.write_bytes(ca[1].public_bytes(Encoding.PEM))
    async with picker(make_store([endpoint(1)]), secure_serving=True, client_ca_file=str(ca_file)) as running:
        assert running.certificate is not None
        assert running.cert_files is None
        cert, key = _client_cert(ca)
        good = grpc.ssl_channel_credentials(running.certificate.cert_pem, private_key=key, certificate_chain=cert)
        assert await _routed(running.grpc_target, good) == "192.168.1.1:8000"
        with pytest.raises(grpc.aio.AioRpcError):
            await _routed(running.grpc_target, grpc.ssl_channel_credentials(running.certificate.cert_pem))


def test_client_ca_file_must_hold_certificates(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(errors.ConfigError, match="not a PEM certificate bundle"):
        tls.load_client_ca(str(bad))
