"""The ext_proc edge: the gRPC servicer, the per-stream state machine, gateway profiles, health and TLS.

Only this package knows protobuf and gRPC; below it, requests are plain values.
"""

from picker.extproc.health import HealthServicer
from picker.extproc.servicer import ExtProcServicer
from picker.extproc.stream import Stream, StreamEnv

__all__ = ["ExtProcServicer", "HealthServicer", "Stream", "StreamEnv"]
