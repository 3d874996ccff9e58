"""TLS on the ext_proc port: on by default (self-signed), or a cert directory, or off."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

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
