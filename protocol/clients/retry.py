"""The clients' retry policy: retry only what the server provably did not start."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

# Raised before any byte of the request reached the server: always safe to retry.
NOT_SENT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class Retry:
    """When and how long to retry a call that the server provably did not start.

    `attempts` counts every try (1 = no retry). A connect error (when `connect_errors`) waits
    `backoff * multiplier**(n-1)` seconds before try n+1, at most `max_backoff`, shortened by up
    to `jitter` (a fraction) at random. A status in `statuses` (503 by default: the server sends
    it before admitting a request) waits the answer's `Retry-After` (seconds or an HTTP date)
    exactly, else the same backoff; a `Retry-After` above `max_retry_after` is not waited for
    (the error is raised at once). Nothing is retried once a 2xx status line has arrived.
    Adding other statuses (502, 504, ...) can run a generate request twice.
    """

    attempts: int = 3
    backoff: float = 0.25
    multiplier: float = 2.0
    max_backoff: float = 8.0
    jitter: float = 0.1
    max_retry_after: float = 60.0
    statuses: frozenset[int] = frozenset({503})
    connect_errors: bool = True

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("Retry.attempts counts the first try too; it must be >= 1")
        if self.backoff < 0 or self.max_backoff < 0 or self.max_retry_after < 0 or not 0 <= self.jitter <= 1:
            raise ValueError("Retry: backoff, max_backoff and max_retry_after must be >= 0, jitter in [0, 1]")
        object.__setattr__(self, "statuses", frozenset(self.statuses))

    def backoff_for(self, attempt: int) -> float:
        """The wait after failed try number `attempt` (1-based), jitter applied."""
        wait = min(self.backoff * self.multiplier ** (attempt - 1), self.max_backoff)
        return wait * (1 - self.jitter * random.random())

    def wait_after_error(self, attempt: int, error: BaseException) -> float | None:
        """Seconds to wait before retrying after `error` on try `attempt`; None: raise it."""
        if attempt >= self.attempts or not self.connect_errors or not isinstance(error, NOT_SENT_ERRORS):
            return None
        return self.backoff_for(attempt)

    def wait_after_status(self, attempt: int, status: int, headers: Mapping[str, str]) -> float | None:
        """Seconds to wait before retrying a `status` answer on try `attempt`; None: raise it."""
        if attempt >= self.attempts or status not in self.statuses:
            return None
        after = parse_retry_after(headers.get("retry-after"))
        if after is None:
            return self.backoff_for(attempt)
        return after if after <= self.max_retry_after else None


NO_RETRY = Retry(attempts=1)


def parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` as seconds from now (delay-seconds or an HTTP date); None if absent/unparsable."""
    if value is None or not (value := value.strip()):
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())
