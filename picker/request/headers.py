"""Header and metadata names of the EPP protocol, spelled as the reference spells them (protocol.md §4, §5, §8).

``SYSTEM_OWNED`` headers are never echoed upstream by the header response; ``CONTROL`` headers are the ones a
client may send to steer picker, removed before the request reaches the model server.
"""

from __future__ import annotations

__all__ = [
    "CONTENT_LENGTH",
    "CONTENT_TYPE",
    "CONTROL",
    "DATA_PARALLEL",
    "DESTINATION",
    "DESTINATION_SERVED",
    "ENCODERS",
    "FAIRNESS_ID",
    "FORWARDED_PATH",
    "LB_NAMESPACE",
    "MODEL_REWRITE",
    "OBJECTIVE",
    "ORIGINAL_PATH",
    "PATH",
    "PREFILLER",
    "REQUEST_ID",
    "SESSION_TOKEN",
    "SLO_TPOT",
    "SLO_TPOT_DEPRECATED",
    "SLO_TTFT",
    "SLO_TTFT_DEPRECATED",
    "SUBSET_KEY",
    "SUBSET_NAMESPACE",
    "SYSTEM_OWNED",
    "TEST_ENDPOINT_SELECTION",
]

# Response to the proxy: the chosen endpoint(s), "ip:port[,ip:port...]", primary first.
DESTINATION = "x-gateway-destination-endpoint"
# Response path: filter_metadata["envoy.lb"][DESTINATION_SERVED] = the endpoint that actually served.
DESTINATION_SERVED = "x-gateway-destination-endpoint-served"
# Request path: filter_metadata[SUBSET_NAMESPACE][SUBSET_KEY] = the endpoints the proxy allows.
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
# The dynamic-metadata namespace of the destination (and of the served endpoint).
LB_NAMESPACE = "envoy.lb"

OBJECTIVE = "x-gateway-inference-objective"  # InferenceObjective name ⇒ priority
FAIRNESS_ID = "x-gateway-inference-fairness-id"  # flow id; default "default-flow"
MODEL_REWRITE = "x-gateway-model-name-rewrite"  # forces the target model
REQUEST_ID = "x-request-id"
# Per-request latency objectives in milliseconds (llm-d); the unprefixed names are their deprecated aliases.
SLO_TTFT = "x-llm-d-slo-ttft-ms"
SLO_TPOT = "x-llm-d-slo-tpot-ms"
SLO_TTFT_DEPRECATED = "x-slo-ttft-ms"
SLO_TPOT_DEPRECATED = "x-slo-tpot-ms"
TEST_ENDPOINT_SELECTION = "test-epp-endpoint-selection"  # header-based-testing-filter

# llm-d control headers (set by picker on the request to the decode sidecar, never taken from clients).
PREFILLER = "x-prefiller-host-port"
ENCODERS = "x-encoder-hosts-ports"
DATA_PARALLEL = "x-data-parallel-host-port"
SESSION_TOKEN = "x-session-token"

PATH = ":path"
ORIGINAL_PATH = "x-original-path"
FORWARDED_PATH = "x-forwarded-path"
CONTENT_LENGTH = "content-length"
CONTENT_TYPE = "content-type"

# Headers a client may send to steer picker; they are removed before the request goes upstream.
CONTROL: frozenset[str] = frozenset({OBJECTIVE, FAIRNESS_ID, MODEL_REWRITE, SUBSET_KEY})

# Never echoed upstream in the header response (reference util/request/headers.go, plus llm-d's): picker sets
# the ones it owns itself, and content-length is recomputed for the body actually sent.
SYSTEM_OWNED: frozenset[str] = frozenset(
    {
        FAIRNESS_ID,
        OBJECTIVE,
        MODEL_REWRITE,
        SUBSET_KEY,
        DESTINATION,
        DESTINATION_SERVED,
        CONTENT_LENGTH,
        PREFILLER,
        ENCODERS,
        DATA_PARALLEL,
        SESSION_TOKEN,
    }
)
