"""Who may read ``/metrics``: a static bearer token from a file (``--metrics-auth-token-file``).

``Authorization: Bearer <token>`` must carry exactly the file's token (surrounding whitespace of the file
ignored); the comparison takes the same time whatever the token (``hmac.compare_digest``). The file is looked at
(``stat``) at most once a second and re-read when it changes, so a rotated Secret takes effect without a restart;
an empty or unreadable file refuses everyone rather than letting everyone in. The Kubernetes variant (the
reference's ``--metrics-endpoint-auth``: TokenReview + SubjectAccessReview) is ``discovery/tokenreview.py``;
both answer the same question through ``Verdict``.
"""

from __future__ import annotations

import enum
import hmac
import logging
import os
import time
from collections.abc import Callable

__all__ = ["StaticToken", "Verdict", "bearer_token"]

log = logging.getLogger(__name__)


class Verdict(enum.Enum):
    ALLOWED = 200
    UNAUTHENTICATED = 401  # no token, or one nobody issued
    FORBIDDEN = 403  # a known identity without the right to read /metrics


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive), else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


class StaticToken:
    def __init__(self, path: str, *, check_interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.path = path
        self._clock = clock
        self._check_interval_s = check_interval_s
        self._checked_at = -check_interval_s
        self._stamp: tuple[int, int] | None = None
        self._token = b""
        self._refresh(force=True)

    def _refresh(self, *, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._checked_at < self._check_interval_s:
            return
        self._checked_at = now
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            with open(self.path, "rb") as f:
                token = f.read(64 * 1024).strip()
        except OSError as exc:
            if self._token or self._stamp is None:
                log.warning("metrics token file %s unreadable (%s): refusing every scrape", self.path, exc.strerror)
            self._token, self._stamp = b"", None
            return
        if not token:
            log.warning("metrics token file %s is empty: refusing every scrape", self.path)
        self._token, self._stamp = token, stamp

    def verdict(self, authorization: str | None) -> Verdict:
        self._refresh()
        token = bearer_token(authorization)
        if token is None or not self._token:
            return Verdict.UNAUTHENTICATED
        if hmac.compare_digest(token.encode(), self._token):
            return Verdict.ALLOWED
        return Verdict.UNAUTHENTICATED
