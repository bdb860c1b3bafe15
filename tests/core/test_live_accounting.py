"""``prof.accounting()``: a live run's latest steps from its timeline writes, through the
writer process and through the writer thread that stands in when the process cannot start;
the same as ``aprof report`` reads from the files, to the µs the files keep."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import aprof
from aprof._core.accounting import KEEP
from aprof._report import accounting
from aprof._timeline.writer_process import WriterProcess

MakeConfig = Callable[..., aprof.ProfilerConfig]
LIMIT_S = 30
US_S = 4e-6
"""Files keep whole µs: a span's two ends may each lose one."""


async def _step(prof: aprof.Profiler, n: int, release: asyncio.Event) -> None:
    async with prof.step(n):

        async def one(i: int) -> None:
            async with prof.request(replica=i % 2, request_id=f"s{n}-{i}") as req:
                req.forward(tokens=10 * (i + 1))
                await release.wait()

        requests = [asyncio.create_task(one(i)) for i in range(6)]
        for _ in range(3):
            await asyncio.sleep(0)  # every request has begun: they are in flight together
        release.set()
        await asyncio.gather(*requests)
        release.clear()
        with prof.stage("update_actor"):
            await asyncio.sleep(0)


@pytest.mark.parametrize("writer", ["process", "thread"])
async def test_the_live_account_is_the_reports(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    if writer == "thread":
        monkeypatch.setattr(WriterProcess, "shared", classmethod(lambda cls: None))
    release = asyncio.Event()
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(make_config()) as prof:
        assert prof.accounting() is None  # no step has ended
        for n in (1, 2, 3):
            await _step(prof, n, release)
            await prof.flush()  # the step's write (it goes on after the step otherwise)
            live = prof.accounting()
            assert live is not None and live.step == n
            assert live.requests == 6
            assert sorted((r.replica, r.requests, r.tokens) for r in live.replicas) == [
                (0, 3, 90),
                (1, 3, 120),
            ]
            assert live.train_s > 0 and live.rollout_s > 0
        assert prof.accounting(2) is not None and prof.accounting(9) is None
    from_files = {a.step: a for a in accounting(prof.save_path).accounts}
    for n in (1, 2, 3):
        live = prof.accounting(n)
        assert live is not None
        read = from_files[n]
        for name in ("wall_s", "rollout_s", "train_s", "overlap_s", "idle_s", "max_s"):
            assert getattr(live, name) == pytest.approx(getattr(read, name), abs=US_S), name
        assert (live.requests, len(live.slowest)) == (read.requests, len(read.slowest))


async def test_only_the_latest_steps_are_kept(make_config: MakeConfig) -> None:
    release = asyncio.Event()
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(make_config()) as prof:
        for n in range(1, KEEP + 4):
            await _step(prof, n, release)
        await prof.flush()
        kept = [n for n in range(1, KEEP + 4) if prof.accounting(n) is not None]
    assert kept == list(range(4, KEEP + 4))
