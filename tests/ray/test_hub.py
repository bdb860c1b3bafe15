"""The hub's rules without Ray: names, the answers to asks, steps waiting for processes, and
reports summed while the driver does not pull; and the entry points' errors."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

import pytest

import aprof
import aprof.ray
from aprof._core.sharing import Counts, RemotePhase, Report, RolloutView
from aprof.ray._hub import Hub

MakeConfig = Callable[..., aprof.ProfilerConfig]


def _hub() -> Hub:
    return Hub(start_s=5.0, connect_s=0.05)


def _view(version: int, step: int | None, **phases: RemotePhase) -> RolloutView:
    return RolloutView(version, step, step is not None, {int(r[1:]): p for r, p in phases.items()})


def test_names_are_role_and_rank_and_never_given_twice() -> None:
    hub = _hub()
    assert hub.register("agent_loop_worker", None)[0] == "agent_loop_worker_0"
    assert hub.register("agent_loop_worker", None)[0] == "agent_loop_worker_1"
    assert hub.register("agent_loop_worker", 3)[0] == "agent_loop_worker_3"
    assert hub.register("agent_loop_worker", 3)[0] == "agent_loop_worker_3-2"  # restarted
    assert hub.register("reward", None)[0] == "reward_0"


@pytest.mark.parametrize(
    ("arrival", "then", "answer"),
    [
        ("active", [], "active"),
        ("queued", [], "go"),
        ("ended", [], "go"),
        ("due", ["starting", "active"], "started"),
        ("due", ["active"], "started"),
        ("starting", ["active", "ended"], "started"),
        ("starting", ["failed"], "failed"),
        ("due", ["starting", "failed"], "failed"),
        ("due", ["queued"], "go"),
        ("due", [None], "go"),  # the step ended before the driver opened the window
        ("starting", [None], "failed"),  # ... while it was starting: counted as waited for
    ],
)
async def test_an_ask_waits_while_the_window_is_due_or_starting(
    arrival: RemotePhase, then: list[RemotePhase | None], answer: str
) -> None:
    hub = _hub()
    await hub.publish(_view(1, 4, r0=arrival))
    asking = asyncio.create_task(hub.ask(4, 0))
    await asyncio.sleep(0)  # lets the ask read its arrival phase (no waiting on time)
    for version, phase in enumerate(then, start=2):
        view = _view(version, 4, r0=phase) if phase is not None else _view(version, 5)
        await hub.publish(view)
    got, version = await asyncio.wait_for(asking, 5)
    assert got == answer
    assert version == len(then) + 1
    asks = [ask for mail in await hub.pull(0, 0) for ask in mail.asks]
    assert asks == ([(4, 0)] if arrival == "due" else [])


async def test_an_older_view_never_replaces_a_newer_one() -> None:
    hub = _hub()
    await hub.publish(_view(3, 2, r0="active"))
    await hub.publish(_view(2, 2, r0="starting"))
    assert await hub.ask(2, 0) == ("active", 3)


async def test_a_step_waits_for_every_process_that_joined_until_it_lags() -> None:
    hub = _hub()
    name, view = hub.register("agent_loop_worker", None)
    entering = asyncio.create_task(hub.entered(_view(view.version + 1, 1)))
    news = await hub.watch(name, view.version, None)  # returns at once: there is news
    assert news.step == 1
    # Its next watch says it has applied the news: the step goes on.
    confirming = asyncio.create_task(hub.watch(name, news.version, None))
    assert await entering == []
    confirming.cancel()
    late = hub.register("agent_loop_worker", None)[0]  # this one never watches
    assert await hub.entered(_view(view.version + 2, 2)) == [name, late]
    assert hub.processes() == {name: "lagging", late: "lagging"}
    assert await hub.entered(_view(view.version + 3, 3)) == []  # not waited for again
    caught_up = asyncio.create_task(hub.watch(name, view.version + 3, None))
    await asyncio.sleep(0)  # one pass of the loop: the watch has said what it has seen
    assert hub.processes()[name] == "watching"  # waited for again
    caught_up.cancel()


async def test_a_process_joining_once_a_step_is_entered_is_given_that_step() -> None:
    # Ray may run a step's entered() before the publish the driver sent ahead of it (the
    # hub is an async actor): entered() brings the view itself, so no process can join
    # between the two and be handed the view before the step.
    hub = _hub()
    assert await hub.entered(_view(2, 1)) == []  # nobody to wait for
    await hub.publish(_view(1, None))  # the earlier publish, arriving late
    name, view = hub.register("agent_loop_worker", None)
    assert (view.version, view.step) == (2, 1)
    assert hub.processes() == {name: "registered"}


async def test_reports_sum_up_until_the_driver_pulls() -> None:
    hub = _hub()
    name = hub.register("agent_loop_worker", None)[0]
    await hub.publish(_view(1, 1))  # news: the watch returns at once
    await hub.watch(name, 0, Report(counts=[Counts(1, 0, 5, 2, 0), Counts(1, 1, 3, 0, 0)]))
    files = [{"path": "timeline/x.trace.json.gz"}]
    await hub.close(name, Report(counts=[Counts(1, 0, 1, 0, 4)], timeline=files))
    [mail] = await hub.pull(0, 0)
    assert mail.asks == []
    report = mail.reports[name]
    assert sorted(report.counts) == [Counts(1, 0, 6, 2, 4), Counts(1, 1, 3, 0, 0)]
    assert (report.timeline, report.closed) == (files, True)
    assert hub.processes() == {name: "closed"}
    assert await hub.pull(0, mail.number) == []


async def test_mail_stays_until_a_pull_says_the_driver_took_it() -> None:
    # Ray runs a pull the driver gave up on (the hub started late): the mail it takes reaches
    # nobody. The driver's next pull, which says it took nothing yet, is handed it again.
    hub = _hub()
    await hub.publish(_view(1, 1, r0="due"))
    given_up = asyncio.create_task(hub.pull(5.0, 0))
    again = asyncio.create_task(hub.pull(5.0, 0))
    await asyncio.sleep(0)  # lets both wait for mail, the one given up on first
    asking = asyncio.create_task(hub.ask(1, 0))
    [mail] = await asyncio.wait_for(given_up, 5)  # it took the ask
    assert mail.asks == [(1, 0)]
    assert await asyncio.wait_for(again, 5) == [mail]
    await hub.publish(_view(2, 1, r0="active"))  # the driver opened the window
    assert await asyncio.wait_for(asking, 5) == ("started", 2)
    # Said taken, it is gone: the next pull hands only what came since, newly numbered.
    name = hub.register("agent_loop_worker", None)[0]
    await hub.close(name, Report())
    [later] = await hub.pull(0, mail.number)
    assert (later.number, later.asks, list(later.reports)) == (mail.number + 1, [], [name])


async def test_the_close_waits_for_each_process_that_watches_until_it_closed() -> None:
    hub = _hub()
    names = [hub.register("agent_loop_worker", None)[0] for _ in range(3)]
    first, second, lagging = names
    await hub.publish(_view(1, 1))
    for name in names:
        assert (await hub.watch(name, 0, None)).version == 1  # news: returns at once
    confirming = [asyncio.create_task(hub.watch(n, 2, None)) for n in (first, second)]
    # It missed a step: the close does not wait for it.
    assert await hub.entered(_view(2, 2)) == [lagging]
    never = hub.register("agent_loop_worker", None)[0]  # never watches: cannot hear of the close
    await hub.publish(RolloutView(3, None, False, {}, closing=True))
    # The close reaches the processes at once: their watches return with it.
    assert [(await w).closing for w in confirming] == [True, True]
    closing = asyncio.create_task(hub.closed(5.0))
    await hub.close(first, Report(counts=[Counts(2, 0, 3, 1, 0)]))
    await asyncio.sleep(0)  # one pass of the loop: the wait has seen the first close
    assert not closing.done()
    await hub.close(second, Report())
    assert await asyncio.wait_for(closing, 5) == []
    assert hub.processes() == {
        first: "closed",
        second: "closed",
        lagging: "lagging",
        never: "registered",
    }
    [mail] = await hub.pull(0, 0)
    reports = mail.reports
    assert {n: (r.counts, r.closed) for n, r in reports.items()} == {
        first: ([Counts(2, 0, 3, 1, 0)], True),
        second: ([], True),
    }
    assert await hub.closed(5.0) == []  # all closed: returns at once


async def test_the_close_waits_for_a_process_at_most_its_bound() -> None:
    hub = _hub()
    busy, done = (hub.register("agent_loop_worker", None)[0] for _ in range(2))
    await hub.publish(_view(1, 1))
    for name in (busy, done):
        await hub.watch(name, 0, None)  # news: returns at once
    await hub.close(done, Report())
    assert await asyncio.wait_for(hub.closed(0.05), 5) == [busy]  # bounded by wait_s
    assert hub.processes() == {busy: "watching", done: "closed"}


async def test_share_says_what_it_needs(make_config: MakeConfig) -> None:
    prof = aprof.Profiler(make_config())
    with pytest.raises(RuntimeError, match="open the profiler first"):
        aprof.ray.share(prof)
    async with prof:
        ray = pytest.importorskip("ray")
        if not ray.is_initialized():
            with pytest.raises(RuntimeError, match=r"call ray\.init\(\) first"):
                aprof.ray.share(prof)


def test_share_outside_the_event_loop_says_where_it_runs(make_config: MakeConfig) -> None:
    with pytest.raises(RuntimeError, match="in the profiler's event loop"):
        aprof.ray.share(aprof.Profiler(make_config()))


def test_connect_refuses_what_is_not_a_handle_a_role_or_a_rank() -> None:
    with pytest.raises(TypeError, match=r"aprof\.ray\.share\(prof\)'s handle"):
        aprof.ray.connect("hub")  # type: ignore[arg-type]
    handle = aprof.ray.ShareHandle(hub=None, config={}, save_path="/tmp/x", run_id="r")
    with pytest.raises(ValueError, match="role 'agent loop' is not path-safe"):
        aprof.ray.connect(handle, role="agent loop")
    with pytest.raises(ValueError, match="rank must be an integer >= 0"):
        aprof.ray.connect(handle, rank=-1)


def test_share_without_ray_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, make_config: MakeConfig
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install 'aprof\[ray\]'"):
        aprof.ray.share(aprof.Profiler(make_config()))
