"""Admission without flow control (the default): shed sheddable requests while the pool is saturated.

A request whose priority is negative (its InferenceObjective says so; the resolver sets ``req.priority``) is
*sheddable*. When flow control is off, the reference checks only those: pool saturation ≥ 1.0 over the request's
candidates ⇒ rejected with ``system saturated, sheddable request dropped``. Requests with priority ≥ 0 are never
shed, however loaded the pool.

The status is ``--shed-status``: 429 ``ResourceExhausted`` (the reference's code and the spec) or 503
``ServiceUnavailable`` (what the reference's docs say); the message is the same.
"""

from __future__ import annotations

from collections.abc import Sequence

from picker import errors
from picker.admission.saturation import SaturationDetector
from picker.endpoints.model import Endpoint
from picker.request.model import InferenceRequest

__all__ = ["SHED_MESSAGE", "ShedAdmitter", "shed_error"]

SHED_MESSAGE = "system saturated, sheddable request dropped"
SATURATED = 1.0


def shed_error(status: int = 429) -> errors.PickerError:
    """The error that sheds a request, with the configured status (429 or 503)."""
    if status == errors.ServiceUnavailable.status:
        return errors.ServiceUnavailable(SHED_MESSAGE)
    return errors.ResourceExhausted(SHED_MESSAGE)


class ShedAdmitter:
    """The director's ``Admitter`` when flow control is off."""

    __slots__ = ("detector", "shed_status")

    def __init__(self, detector: SaturationDetector, *, shed_status: int = 429) -> None:
        self.detector = detector
        self.shed_status = shed_status

    def decide(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> errors.PickerError | None:
        """None to admit; the error to shed with. Pure: only sheddable requests look at saturation."""
        if req.priority >= 0:
            return None
        if self.detector.saturation(candidates) >= SATURATED:
            return shed_error(self.shed_status)
        return None

    async def admit(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> None:
        err = self.decide(req, candidates)
        if err is not None:
            raise err
