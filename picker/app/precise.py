"""The run-time half of a ``precise-prefix-cache-scorer``: the KV-event subscriber that feeds the scorers' indexes
and the token source that looks up a prompt's token ids before scheduling, built from the scheduler config.
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from picker import errors
from picker.kvcache.ingest import Ingestor
from picker.kvevents import KVEventSubscriber, ServerTokenSource, SubscriberSettings
from picker.scheduling.config import SchedulerConfig
from picker.scheduling.plugins import precise_prefix, token_producer
from picker.telemetry import kvmetrics

__all__ = ["PrecisePath", "precise_path"]


@dataclass
class PrecisePath:
    """What a configured ``precise-prefix-cache-scorer`` needs at run time: the KV-event subscriber feeding its
    index and the token source looking up the prompt's ids before scheduling."""

    subscriber: KVEventSubscriber
    ingestor: Ingestor
    tokens: ServerTokenSource

    def sample(self) -> kvmetrics.KVSample:
        st = self.ingestor.stats
        index = self.ingestor.indexes[0]
        return kvmetrics.KVSample(
            messages={
                "applied": st.applied,
                "duplicate": st.duplicates,
                "unknown_endpoint": st.unknown_endpoint,
                "malformed": st.malformed.total(),
                "replayed": st.replayed,
            },
            malformed=dict(st.malformed),
            resyncs=dict(st.resyncs),
            events=st.events,
            gaps=st.gaps,
            missed_batches=st.missed_batches,
            restarts=st.restarts,
            index_entries=index.entries,
            index_keys=index.keys,
            index=index.stats.as_dict(),
        )

    async def close(self) -> None:
        self.subscriber.terminate()
        await self.tokens.close()


def precise_path(config: SchedulerConfig) -> PrecisePath | None:
    """The subscriber and token source of the config's precise scorers (one subscriber feeds them all; the first
    scorer's ``kvEventsConfig`` sets it up). Binding in central mode happens here: a busy port fails the start."""
    scorers = [p for p in config.plugins.values() if isinstance(p, precise_prefix.PrecisePrefixCacheScorer)]
    if not scorers:
        return None
    producers = config.configured(token_producer.KIND)
    params = producers[0].params if producers else token_producer.Params()
    assert isinstance(params, token_producer.Params)
    tokens = ServerTokenSource(params)  # first: a bad localTokenizer is a ConfigError before any socket opens
    events = scorers[0].params.kv_events_config
    ingestor = Ingestor([s.index for s in scorers])
    subscriber = KVEventSubscriber(
        ingestor,
        SubscriberSettings(
            topic_filter=events.topic_filter,
            discover=events.discover_pods,
            socket_port=events.pod_discovery_config.socket_port,
            replay_port=events.pod_discovery_config.replay_socket_port,
            bind=events.zmq_endpoint,
            queue_size=events.queue_size,
        ),
    )
    try:
        subscriber.start()
    except zmq.ZMQError as exc:
        subscriber.terminate()
        raise errors.ConfigError(f"kv events: cannot bind {events.zmq_endpoint!r}: {exc}") from exc
    return PrecisePath(subscriber, ingestor, tokens)
