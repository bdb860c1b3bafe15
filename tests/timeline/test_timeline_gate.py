"""What a request asks of its gate, for the C recorder and its pure-Python twin alike: a request
to a replica whose window is active (the gate's ``active``) is counted into its tally and
marked captured without a call to ``admit``; any other request calls ``admit``; and
``requests(gate, recorder)``, what ``prof.request`` is, makes requests with the keyword arguments of
``prof.request`` and its errors."""

from __future__ import annotations

from typing import Any

import pytest
from recorders import Impl, both

pytestmark = both


class Admit:
    """An ``admit`` that keeps the requests it is called with and lets each go."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def __call__(self, request: Any) -> None:
        self.seen.append(request)


def live_gate(impl: Impl, admit: Admit) -> Any:
    gate = impl.Gate(admit)
    gate.step, gate.live = 3, True
    return gate


async def test_a_request_to_an_active_window_is_counted_in_its_tally(impl: Impl) -> None:
    admit = Admit()
    gate = live_gate(impl, admit)
    tally = gate.active[0] = impl.Tally()
    for _ in range(3):
        async with impl.Request(gate, None, 0, "r") as req:
            assert req.captured and not req.gated and req.step == 3
    assert tally.admitted == 3
    assert admit.seen == []


async def test_other_requests_call_admit(impl: Impl) -> None:
    admit = Admit()
    gate = live_gate(impl, admit)
    tally = gate.active[0] = impl.Tally()
    gate.active[2] = "not a tally"  # only a Tally counts
    for replica in (1, 2, True, "0"):  # no window, not a tally, not an int (a bool neither)
        async with impl.Request(gate, None, replica, None) as req:
            assert not req.captured
    assert [r.replica for r in admit.seen] == [1, 2, True, "0"]
    assert tally.admitted == 0


async def test_an_unprofiled_step_counts_nothing(impl: Impl) -> None:
    admit = Admit()
    gate = live_gate(impl, admit)
    gate.live = False
    tally = gate.active[0] = impl.Tally()
    async with impl.Request(gate, None, 0, None) as req:
        assert not req.captured
    assert tally.admitted == 0 and admit.seen == []


def test_a_tally_takes_no_arguments_and_holds_a_count(impl: Impl) -> None:
    tally = impl.Tally()
    tally.admitted += 5
    assert tally.admitted == 5
    with pytest.raises(TypeError):
        impl.Tally(1)


async def test_requests_make_requests_as_prof_request_does(impl: Impl) -> None:
    admit = Admit()
    gate = live_gate(impl, admit)
    recorder = impl.Recorder(lambda: None)
    recorder.room = 10
    requests = impl.requests(gate, recorder)
    async with requests(replica=1) as req:
        assert (req.replica, req.request_id) == (1, None)
        assert recorder.open == [req]
    async with requests(request_id="s1-t0", replica=0) as req:
        assert (req.replica, req.request_id) == (0, "s1-t0")
    assert recorder.open == [] and recorder.count == 2
    assert [r.replica for r in admit.seen] == [1, 0]


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0,), {}, "positional argument"),
        ((), {}, "missing 1 required keyword-only argument: 'replica'"),
        ((), {"request_id": "a"}, "missing 1 required keyword-only argument: 'replica'"),
        ((), {"replica": 0, "step": 1}, "got an unexpected keyword argument 'step'"),
    ],
)
def test_requests_refuse_what_prof_request_refuses(
    impl: Impl, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    requests = impl.requests(impl.Gate(Admit()), None)
    with pytest.raises(TypeError) as raised:
        requests(*args, **kwargs)
    assert message in str(raised.value)


def test_requests_take_a_gate_and_a_recorder_or_none(impl: Impl) -> None:
    with pytest.raises(TypeError, match="expected a Gate"):
        impl.requests(object(), None)
    with pytest.raises(TypeError):
        impl.requests(impl.Gate(Admit()), object())


async def test_the_open_ones_are_listed_in_the_order_begun(impl: Impl) -> None:
    recorder = impl.Recorder(lambda: None)
    recorder.room = 10
    gate = impl.Gate(Admit())
    first, second = impl.Request(gate, recorder, 0, "a"), impl.Span(recorder, "turn", {}, None)
    async with first:
        async with second:
            assert recorder.open == [first, second]
            listed = recorder.open
            listed.clear()  # a new list each time: the recorder's own is untouched
            assert recorder.open == [first, second]
        assert recorder.open == [first]
    assert recorder.open == []


async def test_a_request_is_entered_not_awaited(impl: Impl) -> None:
    req = impl.Request(impl.Gate(Admit()), None, 0, None)
    with pytest.raises(TypeError):
        await req
    async with req as entered:
        assert entered is req
    with pytest.raises(TypeError):
        await req
