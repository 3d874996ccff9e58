"""One error tree. Lower layers raise these; only ``extproc.responses`` maps them to a reply.

The wire text is the reference EPP's: ``inference error: <Code> - <message>``.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "BadRequest",
    "ConfigError",
    "HeadersTooLarge",
    "Internal",
    "PayloadTooLarge",
    "PickerError",
    "ResourceExhausted",
    "ServiceUnavailable",
]


class PickerError(Exception):
    """An error that ends a request with an HTTP status (an ImmediateResponse)."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "Internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def wire_text(self) -> str:
        return f"inference error: {self.code} - {self.message}"


class Internal(PickerError):
    status = 500
    code = "Internal"


class BadRequest(PickerError):
    status = 400
    code = "BadRequest"


class PayloadTooLarge(PickerError):
    # The reference has no 413 (its buffer is unbounded); the code name follows its naming style.
    status = 413
    code = "PayloadTooLarge"


class HeadersTooLarge(PickerError):
    # Request headers over --max-header-bytes (HTTP 431); named in the style of PayloadTooLarge.
    status = 431
    code = "RequestHeaderFieldsTooLarge"


class ResourceExhausted(PickerError):
    status = 429
    code = "ResourceExhausted"


class ServiceUnavailable(PickerError):
    status = 503
    code = "ServiceUnavailable"


class ConfigError(Exception):
    """Bad configuration found at startup. Never reaches a stream."""
