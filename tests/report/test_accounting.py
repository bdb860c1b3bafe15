"""The accounting of every step (``aprof._accounting``) on spans of known times: unions never
sums, the idle time, the tail, the replicas, the anomalies; checked against a brute-force
count of every nanosecond tick on small inputs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aprof._accounting import MAX_VALUES, Ledger, StepAccount, Union, summary

S = 1_000_000_000  # ns per second


def _request(
    ledger: Ledger,
    begin: float,
    end: float,
    *,
    step: int | None = 1,
    replica: int = 0,
    request_id: str | None = None,
    tokens: int = 0,
    prompt_tokens: int = 0,
    gated: bool = False,
    process: str = "driver",
) -> None:
    ledger.request(
        round(begin * S),
        round(end * S),
        step=step,
        replica=replica,
        request_id=request_id,
        tokens=tokens,
        prompt_tokens=prompt_tokens,
        gated=gated,
        process=process,
    )


def _one(ledger: Ledger) -> StepAccount:
    (account,) = ledger.accounts()
    return account


def test_concurrent_requests_count_once_and_idle_is_what_nothing_covers() -> None:
    ledger = Ledger()
    ledger.step(1, 0, 10 * S, profiled=False)
    for i in range(8):  # eight requests in flight together, on two processes
        _request(ledger, 1, 3, replica=i % 2, process=f"p{i % 2}")
    _request(ledger, 2.5, 4, replica=1)  # overlaps the batch's end
    ledger.stage(6 * S, 8 * S)
    ledger.stage(7 * S, 9 * S)  # two ranks' stages overlapping
    a = _one(ledger)
    assert (a.wall_s, a.rollout_s, a.train_s, a.overlap_s) == (10, 3, 3, 0)
    assert a.idle_s == pytest.approx(4)  # [0,1], [4,6], [9,10]
    assert a.rollout_s + a.train_s - a.overlap_s + a.idle_s == pytest.approx(a.wall_s)
    busy = {r.replica: r.busy_s for r in a.replicas}
    assert busy == {0: 2, 1: 3}
    assert [r.requests for r in a.replicas] == [4, 5]
    assert a.imbalance == pytest.approx(3 / 2.5)


def test_training_while_requests_are_in_flight_is_overlap() -> None:
    ledger = Ledger()
    ledger.step(1, 0, 10 * S, profiled=False)
    _request(ledger, 0, 6)
    ledger.stage(4 * S, 9 * S)
    a = _one(ledger)
    assert (a.rollout_s, a.train_s, a.overlap_s, a.idle_s) == (6, 5, 2, 1)


def test_a_request_counts_in_the_step_it_was_admitted_in_and_its_time_where_it_ran() -> None:
    ledger = Ledger()
    ledger.step(1, 0, 10 * S, profiled=False)
    ledger.step(2, 10 * S, 20 * S, profiled=False)
    _request(ledger, 8, 14, step=1, request_id="late")  # admitted in 1, still running in 2
    one, two = ledger.accounts()
    assert (one.requests, two.requests) == (1, 0)
    assert (one.rollout_s, two.rollout_s) == (2, 4)
    assert one.max_s == 6
    assert two.replicas[0].busy_s == 4 and two.replicas[0].requests == 0


def test_the_tail_begins_when_nine_in_ten_requests_have_ended() -> None:
    ledger = Ledger()
    ledger.step(1, 0, 30 * S, profiled=False)
    for i in range(9):
        _request(ledger, 0, 1 + i * 0.1, request_id=f"r{i}")
    _request(ledger, 0, 20, replica=1, request_id="slow")
    a = _one(ledger)
    # ceil(0.9 * 10) = 9 requests had ended at 1.8 s; the last ended at 20 s.
    assert a.tail_s == pytest.approx(18.2)
    assert a.tail_share == pytest.approx(18.2 / 20)
    assert a.slowest[0].request_id == "slow"
    assert [s.latency_s for s in a.slowest] == sorted(
        (s.latency_s for s in a.slowest), reverse=True
    )
    assert len(a.slowest) == 5
    assert (a.p50_s, a.p90_s, a.max_s) == (pytest.approx(1.4), pytest.approx(1.8), 20)


def test_tokens_and_gated_waits_per_replica() -> None:
    ledger = Ledger()
    ledger.step(3, 0, 10 * S, profiled=True)
    _request(ledger, 1, 3, step=3, tokens=100, prompt_tokens=20, gated=True)
    _request(ledger, 2, 5, step=3, tokens=50, prompt_tokens=7, gated=True)
    _request(ledger, 6, 7, step=3, tokens=-4, prompt_tokens=-1)  # a negative count is none
    ledger.capture_started(3, 0, round(2.5 * S))
    (r,) = _one(ledger).replicas
    assert (r.requests, r.tokens, r.prompt_tokens, r.busy_s) == (3, 150, 27, 5)
    assert r.tokens_per_s == 30
    assert r.gated_wait_s == pytest.approx(1.5 + 0.5)


def test_a_slow_unprofiled_step_is_an_anomaly_naming_the_phase_that_grew() -> None:
    ledger = Ledger()
    for n in range(1, 8):
        begin = n * 100 * S
        long = n == 6
        ledger.step(n, begin, begin + (30 if long else 10) * S, profiled=n == 7)
        _request(ledger, n * 100, n * 100 + 6)
        ledger.stage(begin + 6 * S, begin + 9 * S)
    accounts = list(ledger.accounts(factor=2.0, baseline=10))
    flagged = {a.step: a.anomaly for a in accounts if a.anomaly is not None}
    assert list(flagged) == [6]
    assert flagged[6] is not None
    assert flagged[6].factor == pytest.approx(3.0)
    assert flagged[6].phase == "idle"
    assert summary(accounts)["anomalies"] == [6]


def test_the_first_steps_and_profiled_ones_are_not_judged() -> None:
    ledger = Ledger()
    walls = [1, 1, 50, 1, 1, 1, 50]  # step 3: only two before it; step 7: profiled
    for n, wall in enumerate(walls, start=1):
        ledger.step(n, n * 1000 * S, (n * 1000 + wall) * S, profiled=n == 7)
    assert [a.anomaly for a in ledger.accounts()] == [None] * 7


def test_staleness_and_steps_without_requests() -> None:
    ledger = Ledger()
    ledger.step(1, 0, S, profiled=False)
    ledger.step(2, S, 2 * S, profiled=False)
    for value in (0, 1, 1, 2):
        ledger.staleness(2, value)
    one, two = ledger.accounts()
    assert one.staleness is None and one.requests == 0 and one.p50_s is None
    assert one.idle_s == 1 and one.tail_s is None and one.replicas == ()
    assert two.staleness == {"count": 4, "mean": 1.0, "max": 2}


def test_many_requests_are_kept_as_a_sample_and_said_to_be_estimated() -> None:
    ledger = Ledger()
    ledger.step(1, 0, 100 * S, profiled=False)
    n = MAX_VALUES + 500
    for i in range(n):
        _request(ledger, 0, 1 + i / n)
    a = _one(ledger)
    assert a.requests == n and a.estimated
    assert a.max_s == pytest.approx(1 + (n - 1) / n)
    assert a.p50_s is not None and 1.3 < a.p50_s < 1.7


def test_the_json_has_the_names_dashboards_read() -> None:
    ledger = Ledger()
    ledger.step(1, 0, 2 * S, profiled=True)
    _request(ledger, 0, 1, request_id="a", tokens=3)
    doc = json.loads(json.dumps(_one(ledger).as_json(), allow_nan=False))
    assert {"step", "wall_s", "profiled", "phases", "requests", "replicas", "anomaly"} <= set(doc)
    assert set(doc["phases"]) == {"rollout_s", "train_s", "overlap_s", "idle_s"}
    assert {"count", "p50_s", "p90_s", "p99_s", "max_s", "tail_s", "slowest"} <= set(
        doc["requests"]
    )
    assert {"request_id", "replica", "latency_s"} <= set(doc["requests"]["slowest"][0])
    replica = {"replica", "busy_s", "requests", "tokens", "prompt_tokens", "tokens_per_s"}
    assert replica | {"gated_wait_s"} <= set(doc["replicas"][0])
    assert doc["anomaly"] is None


_SPANS = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20), st.booleans()), max_size=12)


@given(spans=_SPANS, step=st.tuples(st.integers(0, 40), st.integers(0, 40)))
def test_phases_match_a_tick_by_tick_count(
    spans: list[tuple[int, int, bool]], step: tuple[int, int]
) -> None:
    begin, end = min(step), min(step) + max(step)
    ledger = Ledger()
    ledger.step(1, begin, end, profiled=False)
    rollout: set[int] = set()
    train: set[int] = set()
    for at, length, is_stage in spans:
        ticks = set(range(at, at + length))
        if is_stage:
            ledger.stage(at, at + length)
            train |= ticks
        else:
            ledger.request(
                at,
                at + length,
                step=1,
                replica=0,
                request_id=None,
                tokens=0,
                prompt_tokens=0,
                gated=False,
                process="p",
            )
            rollout |= ticks
    wall = set(range(begin, end))
    a = _one(ledger)
    ns = 1e-9
    assert a.rollout_s == pytest.approx(len(rollout & wall) * ns)
    assert a.train_s == pytest.approx(len(train & wall) * ns)
    assert a.overlap_s == pytest.approx(len(rollout & train & wall) * ns)
    assert a.idle_s == pytest.approx(len(wall - rollout - train) * ns)


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10)), max_size=20))
def test_a_union_settled_in_pieces_is_the_union(pieces: list[tuple[int, int]]) -> None:
    whole, parts = Union(), Union()
    for i, (at, length) in enumerate(pieces):
        whole.add(at, at + length)
        parts.add(at, at + length)
        if i % 3 == 0:
            parts.settle()
    whole.settle()
    parts.settle()
    assert list(parts.intervals()) == list(whole.intervals())
    ticks = {t for at, length in pieces for t in range(at, at + length)}
    assert whole.covered(0, 100) == len(ticks)


def test_the_slowest_requests_name_their_trajectory_and_turn_through_a_merge() -> None:
    ledger = Ledger()
    ledger.step(1, 0, 10 * S, profiled=False)
    for request_id, seconds, trajectory, turn in (("a-t1", 5, "a", 1), (None, 1, None, None)):
        ledger.request(
            0,
            seconds * S,
            step=1,
            replica=0,
            request_id=request_id,
            tokens=0,
            prompt_tokens=0,
            gated=False,
            process="p",
            trajectory=trajectory,
            turn=turn,
        )
    merged = Ledger()
    merged.merge(json.loads(json.dumps(ledger.take())))  # as a ledger file carries it
    a = _one(merged)
    assert [(s.request_id, s.trajectory, s.turn) for s in a.slowest] == [
        ("a-t1", "a", 1),
        (None, None, None),
    ]
    (first, _) = a.as_json()["requests"]["slowest"]
    assert (first["trajectory"], first["turn"]) == ("a", 1)
