"""The manifest's notes are problems or information as their ``level`` says, and ``aprof
report`` (text), ``report.html`` and ``aprof status`` (text and ``--json``) all show them so: an
accepted capture request is a note everywhere, a capture whose listed file is missing a problem
everywhere; notes of older manifests (no ``level``) read as they always did."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import aprof
import aprof.cli
from aprof import CaptureResult, Window
from aprof._report import collect, render, with_html
from aprof.testing import RecordingTarget

MakeConfig = Callable[..., aprof.ProfilerConfig]


EVENT = {"name": "forward", "ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 1}


class Traced(RecordingTarget):
    """Writes one event into each capture's trace (the report reads an empty trace as cut
    short)."""

    async def stop(self, window: Window) -> CaptureResult:
        result = await super().stop(window)
        for path in result.files:
            path.write_text(json.dumps({"traceEvents": [EVENT]}))
        return result


class LosesAFile(Traced):
    """Lists, with each capture's trace, a file that is not there."""

    async def stop(self, window: Window) -> CaptureResult:
        result = await super().stop(window)
        return dataclasses.replace(result, files=(*result.files, window.dir / "gone.trace.json"))


async def a_run(make_config: MakeConfig, target: RecordingTarget) -> tuple[Path, str]:
    """Three steps, none selected by the config; a capture of step 2 asked for (and
    accepted) in step 1. The run's save_path and the note the acceptance left."""
    config = make_config(
        global_profiler={"steps": []},
        rollout={"replicas": [0], "start": "on_step", "forward_steps": None},
    )
    async with aprof.Profiler(config) as prof:
        prof.add_target(target)
        for n in (1, 2, 3):
            async with prof.step(n):
                if n == 1:
                    answer = prof.capture(next=1)
                    assert answer.accepted and answer.steps == [2]
    [note] = [n for n in prof.manifest.notes if "capture" in n.text]
    assert note.level == "info"
    return prof.save_path, note.line


def status(save_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict[str, Any]]:
    """What ``aprof status`` shows of the run, as text and as JSON."""
    capsys.readouterr()
    assert aprof.cli.main(["status", str(save_path)]) == 0
    text = capsys.readouterr().out
    assert aprof.cli.main(["status", str(save_path), "--json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return text, data


async def test_an_accepted_capture_is_a_note_in_the_report_the_page_and_status(
    make_config: MakeConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    save_path, accepted = await a_run(make_config, Traced("replica_0", replica=0))
    assert accepted.startswith("on_demand capture ")

    report = with_html(collect(save_path), save_path)
    assert report.problems == () and all(step.problems == () for step in report.steps)
    assert accepted in report.notes
    text = render(report)
    assert "problems: none" in text
    assert f"notes:\n  - {accepted[:40]}" in text
    assert report.html is not None
    page = report.html.read_text()
    assert '<div class="ok" id="problems">No problems' in page
    notes = page[page.index('<div class="notes">') :]
    assert f"<li>{accepted}</li>" in notes[: notes.index("</div>")]

    shown, data = status(save_path, capsys)
    assert "problems: none" in shown
    assert f"notes (1):\n  note\n  {accepted}\n" in shown
    assert data["problems"] == [] and data["notes"] == [accepted]


async def test_a_missing_file_is_a_problem_in_the_report_the_page_and_status(
    make_config: MakeConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    save_path, accepted = await a_run(make_config, LosesAFile("replica_0", replica=0))
    [missing] = [n for n in aprof.load_manifest(save_path).notes if "missing" in n.text]
    assert missing.level == "problem"
    problem = missing.line
    assert problem.startswith("step 2 replica_0: listed files missing: step_2/")

    report = with_html(collect(save_path), save_path)
    assert report.problems == (problem,)
    assert accepted in report.notes and problem not in report.notes
    text = render(report)
    problems = text[text.index("\nproblems (") : text.index("\n\n")]
    assert f"\n  ! {problem[:40]}" in problems  # the trace itself, missing, is the step's
    assert report.html is not None
    page = report.html.read_text()
    box = page[page.index('<div class="problems" id="problems"><h2>Problems (') :]
    assert f"<li>{problem}</li>" in box[: box.index("</div>")]

    shown, data = status(save_path, capsys)
    assert f"problems (1):\n  problem\n  {problem}\n" in shown
    assert data["problems"] == [problem] and data["notes"] == [accepted]


async def test_notes_on_disk_say_their_level_and_older_ones_read_as_before(
    make_config: MakeConfig,
) -> None:
    save_path, accepted = await a_run(make_config, LosesAFile("replica_0", replica=0))
    run = json.loads((save_path / "manifest.json").read_text())
    step = json.loads((save_path / "manifest" / "step_2.json").read_text())
    written = {(n["step"], n["level"]) for n in run["notes"] + step["notes"]}
    assert written == {(None, "info"), (2, "problem")}
    assert all(set(n) == {"step", "target", "text", "level"} for n in run["notes"] + step["notes"])

    # An older run's notes have no level: a note of no step was a problem, a step's a note.
    for note in run["notes"] + step["notes"]:
        del note["level"]
    (save_path / "manifest.json").write_text(json.dumps(run))
    (save_path / "manifest" / "step_2.json").write_text(json.dumps(step))
    report = collect(save_path)
    assert report.problems == (accepted,)
    assert any(line.startswith("step 2 replica_0: listed files missing") for line in report.notes)
