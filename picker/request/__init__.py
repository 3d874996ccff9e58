"""Request: headers + body → InferenceRequest, parsed once."""

from picker.request.model import ApiKind, InferenceRequest, Subset

__all__ = ["ApiKind", "InferenceRequest", "Subset"]
