"""The timeline writers' ledgers beside the timelines (``timeline/<process>.ledger.jsonl``):
the accounting reads them instead of the timelines' JSON where they cover what the manifest
lists, through the writer process and the writer thread alike, and falls back to the
timelines, with a note, when they are damaged, cut short, a link or do not cover it."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aprof
from aprof._accounting import StepAccount, ledger_file
from aprof._manifest.model import StepFile, WindowRecord
from aprof._report import accounting, collect, dumps
from aprof._report.ledgers import Writes, read_writes
from aprof._timeline.writer_process import WriterProcess

MakeConfig = Callable[..., aprof.ProfilerConfig]
LIMIT_S = 30
US_S = 4e-6
"""The timelines keep whole µs; the ledgers, ns."""
PHASES = ("wall_s", "rollout_s", "train_s", "overlap_s", "idle_s", "p99_s", "max_s")


async def _run(make_config: MakeConfig, steps: int = 4) -> Path:
    release = asyncio.Event()
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(make_config()) as prof:
        for n in range(1, steps + 1):
            async with prof.step(n):

                async def one(i: int, n: int = n) -> None:
                    async with prof.request(replica=i % 2, request_id=f"s{n}-{i}") as req:
                        req.forward(tokens=3)
                        await release.wait()

                requests = [asyncio.create_task(one(i)) for i in range(4)]
                for _ in range(3):
                    await asyncio.sleep(0)  # all four in flight together
                release.set()
                await asyncio.gather(*requests)
                release.clear()
                with prof.stage("update"):
                    await asyncio.sleep(0)
            await prof.flush()  # one write per step: one ledger line per step
    return prof.save_path


def _same(left: tuple[StepAccount, ...], right: tuple[StepAccount, ...]) -> None:
    assert [a.step for a in left] == [a.step for a in right]
    for a, b in zip(left, right, strict=True):
        assert (a.requests, a.profiled) == (b.requests, b.profiled)
        for name in PHASES:
            assert getattr(a, name) == pytest.approx(getattr(b, name), abs=US_S), name


def _ledgers(save_path: Path) -> Path:
    (process,) = {entry.process for entry in aprof.load_manifest(save_path).timeline}
    return save_path / "timeline" / ledger_file(process)


def _from_timelines(save_path: Path, tmp_path: Path) -> tuple[StepAccount, ...]:
    """The accounts of a copy of the run without its ledgers: from the timelines' JSON."""
    copy = tmp_path / "copy"
    shutil.copytree(save_path, copy)
    _ledgers(copy).unlink()
    found = accounting(copy)
    assert found.notes == ()
    return found.accounts


@pytest.mark.parametrize("writer", ["process", "thread"])
async def test_the_accounting_reads_the_ledgers_and_says_what_the_timelines_say(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, writer: str
) -> None:
    if writer == "thread":
        monkeypatch.setattr(WriterProcess, "shared", classmethod(lambda cls: None))
    save_path = await _run(make_config)
    lines = _ledgers(save_path).read_text().splitlines()
    assert len(lines) >= 4  # a line per write
    assert [json.loads(line)["part"] for line in lines] == [1] * len(lines)
    found = accounting(save_path)
    assert found.notes == () and found.problems == ()
    assert [a.step for a in found.accounts] == [1, 2, 3, 4]
    assert all(a.requests == 4 and a.train_s > 0 and a.rollout_s > 0 for a in found.accounts)
    _same(found.accounts, _from_timelines(save_path, tmp_path))
    _same(collect(save_path).accounts, found.accounts)  # the report takes them too


@pytest.mark.parametrize(
    ("damage", "noted"),
    [
        ("garbage", True),
        ("cut", True),  # the last line cut short: the listed count is never reached
        ("behind", True),  # an append failed: the file stops short of the listing
        ("missing", False),  # an older run's: no file, nothing to say
        ("link", True),
        ("folder", True),
    ],
)
async def test_ledgers_that_do_not_cover_the_timeline_leave_it_to_the_json(
    make_config: MakeConfig, tmp_path: Path, damage: str, noted: bool
) -> None:
    save_path = await _run(make_config)
    expected = _from_timelines(save_path, tmp_path)
    file = _ledgers(save_path)
    text = file.read_text()
    lines = text.splitlines()
    # The lines before the first write that reached the listed count (the close's write may
    # add no event: its line names the same count as the one before).
    listed = json.loads(lines[-1])["events"]
    before = [line for line in lines if json.loads(line)["events"] < listed]
    reaching = lines[len(before)]
    if damage == "garbage":
        file.write_bytes(b"\x00\xffnot json\n" + text.encode())
    elif damage == "cut":
        file.write_text("".join(f"{line}\n" for line in before) + reaching[: len(reaching) // 2])
    elif damage == "behind":
        file.write_text("".join(f"{line}\n" for line in before))
    elif damage == "missing":
        file.unlink()
    elif damage == "link":
        outside = tmp_path / "outside.jsonl"
        outside.write_text(text)
        file.unlink()
        os.symlink(outside, file)
    else:
        file.unlink()
        file.mkdir()
    found = accounting(save_path)
    assert bool(found.notes) is noted, found.notes
    assert all(file.name in note for note in found.notes)
    _same(found.accounts, expected)


async def test_a_ledger_that_cannot_be_appended_costs_no_timeline_write(
    make_config: MakeConfig,
) -> None:
    # After the first write a folder takes the ledgers' name: every later append fails, every
    # timeline write succeeds, and the accounting reads the timelines.
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(make_config()) as prof:
        for n in (1, 2, 3):
            async with prof.step(n), prof.request(replica=0, request_id=f"s{n}"):
                await asyncio.sleep(0)
            await prof.flush()
            if n == 1:
                squat = _ledgers(prof.save_path)
                squat.unlink()
                squat.mkdir()
    assert squat.is_dir() and not any(squat.iterdir())
    (entry,) = aprof.load_manifest(prof.save_path).timeline
    assert entry.dropped == 0
    found = accounting(prof.save_path)
    assert [(a.step, a.requests) for a in found.accounts] == [(1, 1), (2, 1), (3, 1)]
    assert len(found.notes) == 1 and squat.name in found.notes[0]


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=30,
)


@pytest.fixture(scope="module")
def ledgered_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with its ledgers (read only; each example copies it)."""
    save_path = tmp_path_factory.mktemp("ledgered") / "profile"
    config = aprof.load_config({"global_profiler": {"steps": [2], "save_path": str(save_path)}})
    asyncio.run(_run(lambda: config))
    return save_path


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ledger=_JSON, which=st.integers(0, 7), field=_JSON)
def test_any_json_in_a_ledger_line_is_a_note_never_an_error(
    ledgered_run: Path,
    tmp_path_factory: pytest.TempPathFactory,
    ledger: object,
    which: int,
    field: object,
) -> None:
    run = tmp_path_factory.mktemp("damaged") / "profile"
    shutil.copytree(ledgered_run, run)
    file = _ledgers(run)
    lines = [json.loads(line) for line in file.read_text().splitlines()]
    # The line that covers the listing keeps its part and count: only its ledger is hostile,
    # whole, or one of its fields (a plain ledger is a list of six).
    plain = lines[-1]["ledger"] or lines[0]["ledger"]
    if which < 6 and isinstance(plain, list):
        plain = [*plain[:which], field, *plain[which + 1 :]]
    else:
        plain = ledger
    lines[-1]["ledger"] = plain
    file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    found = accounting(run)  # never raises
    json.loads(dumps(found))  # and its JSON is valid, every number finite
    assert all(file.name in note for note in found.notes)


async def test_the_report_reads_only_the_timeline_parts_of_profiled_steps(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A part per write (the writer thread: the limit is patched in this process), step 3 the
    # profiled one (a role window, as the manifest lists one).
    monkeypatch.setattr(WriterProcess, "shared", classmethod(lambda cls: None))
    monkeypatch.setattr("aprof._timeline.chrome_trace._PART_BYTES", 1)
    save_path = await _run(make_config, steps=6)
    listing = json.loads((save_path / "manifest.json").read_text())
    window = WindowRecord(step=3, target="trainer", kind="role", tool="torch", state="done")
    step_file = StepFile(run_id=listing["run_id"], step=3, windows=[window])
    (save_path / "manifest").mkdir(exist_ok=True)
    (save_path / "manifest" / "step_3.json").write_text(step_file.model_dump_json(by_alias=True))
    parts = [entry["path"] for entry in listing["timeline"]]
    assert len(parts) >= 6
    whole = collect(save_path)
    (step,) = whole.steps
    assert step.latency_uncaptured.count == 4 and whole.problems == ()

    # Every part but those holding step 3 damaged: the ledgers say all the report needs.
    lines = [json.loads(line) for line in _ledgers(save_path).read_text().splitlines()]
    holding = {
        line["part"]
        for line in lines
        if line["ledger"] and "3" in {**line["ledger"][0], **line["ledger"][1]}
    }
    assert 0 < len(holding) < len(parts)
    for k, path in enumerate(parts, start=1):
        if k not in holding:
            (save_path / path).write_bytes(b"not a timeline")
    found = collect(save_path)
    assert found.problems == () and found.notes == ()
    assert found.steps == whole.steps
    _same(found.accounts, whole.accounts)
    assert found.latency_unprofiled == whole.latency_unprofiled
    assert found.latency_unprofiled.count == 5 * 4

    # Without the ledgers, each of those parts is read, and found damaged.
    _ledgers(save_path).unlink()
    unread = collect(save_path).problems
    assert len(unread) == len(parts) - len(holding)
    assert all("timeline unreadable" in problem for problem in unread)


async def test_each_ledger_line_says_where_its_write_lies_in_the_part(
    make_config: MakeConfig, tmp_path: Path
) -> None:
    save_path = await _run(make_config, steps=5)
    (entry,) = aprof.load_manifest(save_path).timeline
    lines = [json.loads(line) for line in _ledgers(save_path).read_text().splitlines()]
    assert len(lines) >= 5 and lines[0]["at"][0] == 0 and lines[1]["at"][0] > 0
    whole = json.loads(gzip.decompress((save_path / entry.path).read_bytes()))
    # Write by write, and all at once (consecutive writes are read as one), the part's events.
    found: list[object] = []
    for line in lines:
        one = Writes(entry.path, line["base"], [tuple(line["at"])])
        data = read_writes(str(save_path), one, 1 << 30)
        assert data["baseTimeNanoseconds"] == whole["baseTimeNanoseconds"]
        found += data["traceEvents"]
    assert found == whole["traceEvents"]
    every = Writes(entry.path, lines[0]["base"], [tuple(line["at"]) for line in lines])
    assert read_writes(str(save_path), every, 1 << 30)["traceEvents"] == found

    # Places past the part's end are refused before anything is read.
    for at in ((0, 1 << 49), (1 << 49, 1), (lines[1]["at"][0], 1 << 40)):
        with pytest.raises(ValueError, match="past the part's end"):
            read_writes(str(save_path), Writes(entry.path, 0, [at]), 1 << 30)

    # A part rewritten since (recompressed: the same events elsewhere) is read whole.
    window = WindowRecord(step=3, target="trainer", kind="role", tool="torch", state="done")
    run_id = aprof.load_manifest(save_path).run_id
    (save_path / "manifest").mkdir(exist_ok=True)
    (save_path / "manifest" / "step_3.json").write_text(
        StepFile(run_id=run_id, step=3, windows=[window]).model_dump_json(by_alias=True)
    )
    expected = collect(save_path)
    assert expected.steps[0].latency_uncaptured.count == 4
    part = save_path / entry.path
    part.write_bytes(gzip.compress(gzip.decompress(part.read_bytes()), compresslevel=9))
    with pytest.raises(ValueError):
        read_writes(str(save_path), every, 1 << 30)
    again = collect(save_path)
    assert again.steps == expected.steps and again.problems == ()
