"""The precise prefix path's I/O: the KV-event subscriber (ZeroMQ) and the token source (HTTP).

Both feed pure parts: ``picker.kvcache`` (index, ingest) and ``InferenceRequest.token_ids``.
"""

from picker.kvevents.subscriber import KVEventSubscriber, SubscriberSettings, publisher_addresses
from picker.kvevents.tokens import ServerTokenSource

__all__ = ["KVEventSubscriber", "ServerTokenSource", "SubscriberSettings", "publisher_addresses"]
