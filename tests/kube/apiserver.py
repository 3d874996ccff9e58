"""The stand-in Kubernetes API server now lives in ``picker/sim/apiserver.py`` (the soak benchmark uses it too)."""

from picker.sim.apiserver import RESOURCES, FakeApiServer, ResourceType

__all__ = ["RESOURCES", "FakeApiServer", "ResourceType"]
