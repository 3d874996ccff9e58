"""picker.scrape: model-server ``/metrics`` polling and per-engine metric mappings.

``poller.run`` is the background task (aiohttp; imported on its own so pure users of the mappings, such as the
benchmarks, need no HTTP client); ``engines.extract`` turns one page into ``EndpointMetrics``;
``prometheus.scan`` is the selective exposition-format parser underneath.
"""

from picker.scrape.engines import extract
from picker.scrape.errors import ScrapeError

__all__ = ["ScrapeError", "extract"]
