"""ReplicaBalancer: least in flight, sticky preference, bounded avoidance of failed replicas."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop import ReplicaBalancer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@settings(max_examples=50)
@given(st.integers(1, 5), st.data())
def test_every_pick_follows_the_rules(replicas: int, data: st.DataObject) -> None:
    clock = Clock()
    balancer = ReplicaBalancer(replicas, avoid_s=10, clock=clock)
    held: list[int] = []
    index = st.integers(0, replicas - 1)
    for _ in range(30):
        op = data.draw(st.sampled_from(["acquire", "release", "failed", "succeeded", "tick"]))
        if op == "acquire":
            prefer = data.draw(st.none() | index)
            exclude = data.draw(st.sets(index))
            before = balancer.in_flight
            candidates = [r for r in range(replicas) if r not in exclude]
            healthy = [r for r in candidates if not balancer.avoided(r)]
            chosen = balancer.acquire(prefer=prefer, exclude=exclude)
            if not candidates:
                assert chosen is None
                continue
            assert chosen is not None
            if prefer in healthy:
                assert chosen == prefer
            else:
                pool = healthy or candidates
                assert chosen in pool
                assert before[chosen] == min(before[r] for r in pool)
            held.append(chosen)
        elif op == "release" and held:
            balancer.release(held.pop(data.draw(st.integers(0, len(held) - 1))))
        elif op == "failed":
            balancer.failed(data.draw(index))
        elif op == "succeeded":
            balancer.succeeded(data.draw(index))
        elif op == "tick":
            clock.now += data.draw(st.sampled_from([1.0, 9.99, 10.0]))
        assert balancer.in_flight == tuple(held.count(r) for r in range(replicas))


def test_ties_go_round_robin_so_sequential_requests_spread() -> None:
    balancer = ReplicaBalancer(3)
    picks = []
    for _ in range(6):
        replica = balancer.acquire()
        assert replica is not None
        picks.append(replica)
        balancer.release(replica)
    assert picks == [0, 1, 2, 0, 1, 2]


def test_a_failed_replica_is_avoided_for_avoid_s_or_until_it_answers() -> None:
    clock = Clock()
    balancer = ReplicaBalancer(2, avoid_s=5, clock=clock)
    balancer.failed(0)
    assert [balancer.acquire(prefer=0) for _ in range(3)] == [1, 1, 1]
    clock.now = 4.9
    assert balancer.avoided(0)
    clock.now = 5.0
    assert not balancer.avoided(0)
    assert balancer.acquire(prefer=0) == 0
    balancer.failed(1)
    balancer.succeeded(1)
    assert not balancer.avoided(1)


def test_when_every_replica_is_avoided_one_is_used_anyway() -> None:
    balancer = ReplicaBalancer(2)
    balancer.failed(0)
    balancer.failed(1)
    assert balancer.acquire() in (0, 1)
    assert balancer.acquire(exclude={0, 1}) is None


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one replica"):
        ReplicaBalancer(0)
    with pytest.raises(ValueError, match="avoid_s"):
        ReplicaBalancer(1, avoid_s=0)
    with pytest.raises(RuntimeError, match="no request in flight"):
        ReplicaBalancer(1).release(0)
