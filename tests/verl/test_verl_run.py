"""The parts of aprof's verl run that need no verl: its figures, the import hook that puts
the mixins in place, and the trace context handed through verl's server actor. The whole run
is tested inside verl's real training loop (e2e/verl_ppo, `nox -s verl_e2e`)."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from aprof._accounting.account import ReplicaAccount, StepAccount
from aprof.verl._run import figures, mixed
from aprof.verl._trace_context import KEYWORD, carry
from aprof.verl.hook import after_import


def account(wall_s: float, train_s: float, busy: dict[int, float]) -> StepAccount:
    replicas = tuple(ReplicaAccount(r, b, 1, 0, 0, None, 0.0) for r, b in sorted(busy.items()))
    return StepAccount(
        step=7,
        begin_ns=0,
        end_ns=int(wall_s * 1e9),
        profiled=False,
        rollout_s=max(busy.values(), default=0.0),
        train_s=train_s,
        overlap_s=0.0,
        idle_s=0.0,
        requests=len(busy),
        p50_s=None,
        p90_s=None,
        p99_s=None,
        max_s=None,
        tail_s=None,
        tail_share=None,
        estimated=False,
        slowest=(),
        replicas=replicas,
        imbalance=None,
        staleness={"count": 2, "mean": 0.5, "max": 1.0},
    )


def test_the_idle_ratios_come_from_the_interval_unions() -> None:
    found = figures(account(10.0, 4.0, {0: 5.0, 1: 10.0, 5: 10.0}), replicas={0, 1, 2, 3})
    assert found["aprof/trainer_idle_ratio"] == pytest.approx(0.6)
    # Replicas 2 and 3 had no request in flight at all: idle throughout. Replica 5 is not
    # generating for the run (lent back to training, say): not counted.
    assert found["aprof/rollout_idle_ratio"] == pytest.approx(1 - 15 / 40)
    assert found["aprof/step"] == 7
    assert found["aprof/staleness_max"] == 1.0
    assert "aprof/latency_p99_s" not in found  # no value, no key


def test_a_step_of_no_time_gives_no_ratios() -> None:
    found = figures(account(0.0, 0.0, {}), replicas={0})
    assert "aprof/trainer_idle_ratio" not in found
    assert "aprof/rollout_idle_ratio" not in found


@pytest.fixture
def module_dir(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.startswith("aprof_hooked_")]:
            del sys.modules[name]


def test_a_call_runs_right_after_the_module_is_first_imported(module_dir: Path) -> None:
    (module_dir / "aprof_hooked_a.py").write_text("VALUE = 1\n")
    seen: list[int] = []
    after_import("aprof_hooked_a", lambda m: seen.append(m.VALUE))
    assert seen == []
    import aprof_hooked_a  # type: ignore[import-not-found]

    assert seen == [1]
    after_import("aprof_hooked_a", lambda m: seen.append(m.VALUE + 1))  # imported: at once
    assert seen == [1, 2]
    assert aprof_hooked_a.VALUE == 1


def test_a_call_that_raises_leaves_the_import_whole(
    module_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (module_dir / "aprof_hooked_b.py").write_text("VALUE = 2\n")

    def fails(module: ModuleType) -> None:
        raise RuntimeError("broken patch")

    after_import("aprof_hooked_b", fails)
    import aprof_hooked_b  # type: ignore[import-not-found]

    assert aprof_hooked_b.VALUE == 2
    logged = capsys.readouterr()  # structlog writes to either, as the run's logging is set
    assert "broken patch" in logged.out + logged.err


def test_mixed_classes_are_made_once_and_put_the_mixin_first() -> None:
    class Trainer:
        pass

    class Mixin:
        pass

    first = mixed(Trainer, Mixin)
    assert first is mixed(Trainer, Mixin)
    assert first.__mro__[1:3] == (Mixin, Trainer)
    assert first.__name__ == "AprofTrainer"
    assert mixed(first, Mixin) is first


class _Engine:
    """Takes ``trace_headers`` as vLLM's ``AsyncLLM.generate`` does."""

    def __init__(self) -> None:
        self.seen: dict[str, Mapping[str, str] | None] = {}

    async def generate(
        self, *, request_id: str, trace_headers: Mapping[str, str] | None = None
    ) -> str:
        await asyncio.sleep(0)  # the calls interleave
        self.seen[request_id] = trace_headers
        return request_id


def _server_module() -> ModuleType:
    module = ModuleType("aprof_hooked_server")
    exec(  # verl's server shape: generate(request_id=...) calls its engine's generate
        textwrap.dedent(
            """
            class vLLMHttpServer:
                def __init__(self, engine):
                    self.engine = engine

                async def generate(self, prompt_ids, request_id):
                    return await self.engine.generate(request_id=request_id)
            """
        ),
        module.__dict__,
    )
    return module


async def test_each_call_hands_its_own_trace_headers_to_the_engine() -> None:
    module = _server_module()
    carry(module)
    carry(module)  # once
    engine = _Engine()
    server: Any = module.vLLMHttpServer(engine)
    headers = {f"r{i}": {"traceparent": f"00-{i:032x}-{i:016x}-01"} for i in range(5)}
    calls = [
        server.generate([1], request_id=rid, **{KEYWORD: value}) for rid, value in headers.items()
    ]
    assert await asyncio.gather(*calls, server.generate([1], request_id="plain")) == [
        *headers,
        "plain",
    ]
    assert {rid: engine.seen[rid] for rid in headers} == headers
    assert engine.seen["plain"] is None  # a call without the keyword is verl's own
