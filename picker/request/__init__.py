"""Request: headers + body → InferenceRequest, parsed once; model rewrite; response usage."""

from picker.request.model import ApiKind, InferenceRequest, Subset

__all__ = ["ApiKind", "InferenceRequest", "Subset"]
