"""A real ``picker serve`` at the default (info) level: whatever requests carry — good, malformed, oversized,
rejected — their prompt text never reaches the logs. The run's whole output is grepped for a marker that every
prompt (and every header value) contains."""

from __future__ import annotations

import asyncio

import orjson

from picker.bench.procs import free_port, picker_command, spawn
from tests.e2e.backends import Backend
from tests.extproc.gateway import EnvoyBuffered, EnvoyFullDuplex, NginxShim, gateway

MARKER = "zq7-SECRET-PROMPT-TEXT"


async def test_prompt_text_never_appears_in_info_logs() -> None:
    backend = Backend("b0")
    await backend.start()
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    argv = [
        *picker_command(), "serve", "--host", "127.0.0.1", "--secure-serving=false",
        "--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port), "--metrics-port", str(metrics_port),
        "--endpoints", f"{backend.hostport},127.0.0.1:1",  # the second one is down: scrape errors get logged
        "--refresh-metrics-interval", "50ms", "--max-body-bytes", "2048", "--grace-period", "0s",
    ]  # fmt: skip
    try:
        async with spawn("picker", argv) as child:
            await child.wait_http(f"http://127.0.0.1:{metrics_port}/metrics")
            target = f"127.0.0.1:{grpc_port}"
            prompt = f"tell me about {MARKER}"
            bodies = [
                orjson.dumps({"model": "m", "prompt": prompt}),
                orjson.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}]}),
                orjson.dumps({"model": MARKER, "prompt": prompt}),
                orjson.dumps({"prompt": prompt}),  # no model: 400
                f'{{"model":"m","prompt":"{MARKER}'.encode(),  # truncated JSON: 400
                f'{{"model":"m","prompt":"{MARKER}\xff"}}'.encode("latin-1"),  # invalid UTF-8: 400
                orjson.dumps({"model": "m", "prompt": MARKER * 200}),  # over the body limit: 413
            ]
            headers = {":path": "/v1/completions", "x-request-id": MARKER, "x-gateway-model-name-rewrite": MARKER}
            for cls in (EnvoyFullDuplex, EnvoyBuffered, NginxShim):
                async with gateway(cls, target) as gw:
                    for body in bodies:
                        await gw.request(headers, [body], subset=[MARKER])
                        await gw.request(headers, [body])
            # Out-of-order messages and a stream cut mid-body.
            async with gateway(EnvoyFullDuplex, target) as gw:
                await gw.request({":path": "/v1/chat/completions", "x-objective": MARKER}, [MARKER.encode()])
            await asyncio.sleep(0.5)  # scrape failures of the dead endpoint are logged meanwhile
            output = child.output(tail_bytes=4 * 1024 * 1024)
    finally:
        await backend.stop()
    assert '"level": "info"' in output.replace('":"', '": "') or '"level":"info"' in output, output[-2000:]
    assert "excluded from scheduling" in output or "failing" in output  # warnings were logged during the run
    assert MARKER not in output, [line for line in output.splitlines() if MARKER in line][:5]
