"""picker.sim: a vLLM-compatible simulator.

One engine model (``engine.Engine``, a discrete-event step function on the caller's clock) runs in virtual time
(``virtual.run_virtual``, the policy lab) and in real time behind the HTTP server (``server.SimServer`` paced by
``driver.EngineDriver``). ``config`` holds the step-time model and presets, ``tokenizer`` the deterministic
tokenizer shared with the load client. The names below need no aiohttp; import ``server``/``harness``/``cli``
(and ``sidecar``, llm-d's prefill/decode routing sidecar) for the HTTP side.
"""

from picker.sim.config import PRESETS, EngineConfig, StepTiming, preset
from picker.sim.engine import Engine, EngineStats, RequestRejected, RequestState, SimRequest
from picker.sim.tokenizer import Tokenizer, default_tokenizer
from picker.sim.virtual import Rejected, run_virtual

__all__ = [
    "PRESETS",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "Rejected",
    "RequestRejected",
    "RequestState",
    "SimRequest",
    "StepTiming",
    "Tokenizer",
    "default_tokenizer",
    "preset",
    "run_virtual",
]
