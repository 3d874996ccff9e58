"""picker.scrape: model-server ``/metrics`` polling and per-engine metric mappings.

``poller.run`` is the background task (imported on its own, with its HTTP client ``http``, so pure users of the
mappings, such as the benchmarks, import no I/O); ``engines.extract`` turns one page into ``EndpointMetrics``;
``prometheus.scan`` is the selective exposition-format parser underneath.
"""

from picker.scrape.engines import extract
from picker.scrape.errors import ScrapeError

__all__ = ["ScrapeError", "extract"]
