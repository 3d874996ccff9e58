"""picker: an inference-aware endpoint picker (EPP) for the Gateway API Inference Extension."""

__version__ = "0.1.0"
__all__ = ["__version__"]
