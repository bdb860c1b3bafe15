"""Which replica a request goes to: least in flight, sticky per trajectory, avoiding failures."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection

from aprof import UsageError


class ReplicaBalancer:
    """Picks replicas ``0 .. replicas-1`` for requests and counts those in flight.

    A request with a preferred replica (the one that served its trajectory so far) goes there
    while that replica is not avoided, so all turns of a trajectory reuse one prefix cache.
    Other requests go to the replica with the fewest requests in flight, ties taken in turn.
    A replica marked :meth:`failed` (a connection error) is avoided for ``avoid_s`` seconds,
    or until a request to it succeeds; when every candidate is avoided, one is used anyway.
    """

    def __init__(
        self,
        replicas: int,
        *,
        avoid_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"a balancer needs at least one replica, got {replicas}")
        if not 0 < avoid_s < math.inf:
            raise ValueError(f"avoid_s must be a positive number of seconds, got {avoid_s!r}")
        self._in_flight = [0] * replicas
        self._avoid_until = [-math.inf] * replicas
        self._avoid_s = avoid_s
        self._clock = clock
        self._next = 0

    @property
    def replicas(self) -> int:
        """How many replicas there are."""
        return len(self._in_flight)

    @property
    def in_flight(self) -> tuple[int, ...]:
        """Requests in flight per replica."""
        return tuple(self._in_flight)

    def avoided(self, replica: int) -> bool:
        """Whether ``replica`` failed with a connection error less than ``avoid_s`` ago."""
        return self._clock() < self._avoid_until[replica]

    def acquire(self, *, prefer: int | None = None, exclude: Collection[int] = ()) -> int | None:
        """Pick a replica for one request and count it in flight; ``None`` if all are excluded."""
        candidates = [r for r in range(self.replicas) if r not in exclude]
        if not candidates:
            return None
        healthy = [r for r in candidates if not self.avoided(r)]
        if prefer in healthy:
            chosen = prefer
        else:
            pool = healthy or candidates
            least = min(self._in_flight[r] for r in pool)
            tied = [r for r in pool if self._in_flight[r] == least]
            # Ties go round-robin, so sequential requests still spread over the replicas.
            chosen = min(tied, key=lambda r: (r - self._next) % self.replicas)
            self._next = (chosen + 1) % self.replicas
        self._in_flight[chosen] += 1
        return chosen

    def release(self, replica: int) -> None:
        """One request to ``replica`` ended; raises :class:`aprof.UsageError` (a ``RuntimeError``)
        when none was in flight there."""
        if self._in_flight[replica] < 1:
            raise UsageError(f"replica {replica} has no request in flight")
        self._in_flight[replica] -= 1

    def failed(self, replica: int) -> None:
        """``replica`` failed with a connection error: avoid it for ``avoid_s`` seconds."""
        self._avoid_until[replica] = self._clock() + self._avoid_s

    def succeeded(self, replica: int) -> None:
        """``replica`` answered: it is up."""
        self._avoid_until[replica] = -math.inf
