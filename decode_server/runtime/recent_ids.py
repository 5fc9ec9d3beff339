"""Ids noted recently: the engine's early aborts, and the requests it just finished."""

from __future__ import annotations

import time


class RecentIds:
    """Ids noted in the last `ttl_s` seconds, at most `cap` of them (the oldest go first)."""

    def __init__(self, ttl_s: float, cap: int):
        self.ttl_s, self.cap = ttl_s, cap
        self._at: dict[str, float] = {}

    def add(self, key: str) -> None:
        self._at.pop(key, None)
        self._at[key] = time.monotonic()
        self._prune()

    def pop(self, key: str) -> bool:
        self._prune()
        return self._at.pop(key, None) is not None

    def __contains__(self, key: object) -> bool:
        self._prune()
        return key in self._at

    def _prune(self) -> None:
        at, cutoff = self._at, time.monotonic() - self.ttl_s
        while at and (len(at) > self.cap or next(iter(at.values())) < cutoff):
            del at[next(iter(at))]
