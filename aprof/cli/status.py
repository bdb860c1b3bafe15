"""``aprof status SAVE_PATH``: a run seen from outside, alive or ended.

Read SAVE_PATH/control/status.json, which a run writes at each step boundary, as its windows
move and at each capture decision, and a last time when it closes, and show: whether the run is
alive or ended (a status that says running on this host whose process is gone is shown as
ended: killed?), the step open and for how long, the open windows and their phases, the last
finished windows with their state and forward steps, the last ``LAST_STEPS`` steps' accounting
(wall time, rollout, train, overlap and idle as shares of it, requests, p99, tail, anomaly),
the steps captures and triggers have planned, each trigger and its baseline, the run's
problems (the status's, and those of its manifest and timelines as ``aprof report`` has them:
the manifest's notes are problems or notes as their ``level`` says) and its last notes. A run
without a status (an older run) is read from its manifest instead. With --watch, redraw every
--interval seconds until Ctrl-C, also after the run has ended. With --json, print one JSON
object: the status's fields (``problems`` with the manifest's) plus alive, liveness, source
("status" or "manifest"), last_steps, accounting_error and notes. Exits 1 with one line when
SAVE_PATH holds no run or its files cannot be read.

The accounting (``aprof._report.accounting``, with the run's problems and notes) reads the
manifest and every timeline file it lists, seconds on a long run: --watch reads it again at
most every ``ACCOUNTING_EVERY_S`` seconds and shows the last result between. It never breaks
status: a run without a manifest has no such section, and any failure of it is one line there
(``accounting unavailable: ...``).

examples:
  aprof status outputs/profile --watch
  aprof status outputs/profile --json
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from aprof import ConfigError, Manifest, ManifestError, StepSelection, load_manifest
from aprof._control import ControlFolder, RunStatus, WindowStatus, process_gone

if TYPE_CHECKING:
    from rich.console import RenderableType

    from aprof._accounting import StepAccount

INTERVAL_S: Final = 0.5
"""How often --watch reads the status again, unless --interval says otherwise."""
INTERVAL_BOUNDS: Final = (0.1, 60.0)
RECENT: Final = 20
"""Finished windows shown from a manifest (a status lists its own last ones)."""
NONE: Final = "-"
"""A value not known (yet)."""
LAST_STEPS: Final = 5
"""Accounted steps shown, the last ones."""
LAST_NOTES: Final = 10
"""Notes shown, the last ones (``--json`` has them all)."""
ACCOUNTING_EVERY_S: Final = 10.0
"""How often --watch reads the accounting again at most (it reads every timeline file)."""


# -- the command -------------------------------------------------------------------------------


def arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aprof status``."""
    parser.add_argument("save_path", metavar="SAVE_PATH", help="a run's save_path")
    how = parser.add_mutually_exclusive_group()
    how.add_argument(
        "--watch", action="store_true", help="redraw in place until Ctrl-C (needs a terminal)"
    )
    how.add_argument("--json", action="store_true", help="print one machine-readable JSON object")
    parser.add_argument(
        "--interval",
        type=interval,
        default=INTERVAL_S,
        metavar="SECONDS",
        help=f"seconds between reads with --watch ({INTERVAL_BOUNDS[0]:g}..{INTERVAL_BOUNDS[1]:g},"
        f" default {INTERVAL_S:g})",
    )


def interval(text: str) -> float:
    """``--interval``'s value: seconds within ``INTERVAL_BOUNDS``."""
    low, high = INTERVAL_BOUNDS
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(seconds) and low <= seconds <= high):
        raise argparse.ArgumentTypeError(f"{text} is not between {low:g} and {high:g} seconds")
    return seconds


def run(args: argparse.Namespace) -> int:
    """Show the run once (text or JSON) or until Ctrl-C; 0, or 1 with one line on bad input."""
    root = Path(args.save_path)
    try:
        view = look(root)
    except NoRun as exc:
        print(f"aprof status: {one_line(str(exc))}", file=sys.stderr)
        return 1
    if args.watch:
        return watch(root, view, args.interval)
    accounting = last_steps(root)
    if args.json:
        print(json.dumps(as_json(view, accounting), indent=1))
    else:
        sys.stdout.write(as_text(sections(view, time.time_ns(), accounting)))
    return 0


def one_line(text: str) -> str:
    """``text`` with its line breaks escaped."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


# -- reading the run ---------------------------------------------------------------------------


class NoRun(Exception):
    """SAVE_PATH holds no run that can be read; its text says why."""


@dataclass(frozen=True, slots=True)
class RunView:
    """The run as ``aprof status`` shows it, read from its status or its manifest."""

    root: Path
    source: Literal["status", "manifest"]
    run_id: str
    state: Literal["running", "ended", "unknown"]
    """What the run wrote (``unknown``: a manifest only, with windows still running)."""
    alive: bool
    """Running, and its process is not known to be gone."""
    liveness: str
    """Alive or ended, in words: ``ended (its process 12 is gone: killed?)``."""
    status: RunStatus | None
    """The status read, ``None`` when the manifest stood in for it."""
    windows: tuple[WindowStatus, ...]
    """Windows not ended yet."""
    recent: tuple[WindowStatus, ...]
    """The last finished windows, newest last."""
    last_step: int | None
    config_steps: str | None
    problems: tuple[str, ...]


def look(root: Path) -> RunView:
    """The run at ``root`` now: its status, else its manifest; raises ``NoRun``."""
    if root.exists() and not root.is_dir():
        raise NoRun(f"no run at {root}: not a folder (give the run's save_path)")
    unreadable: str | None = None
    try:
        status = ControlFolder(root).status()
    except (OSError, ValueError) as exc:
        status, unreadable = None, f"control/status.json cannot be read: {_reason(exc)}"
    if status is not None:
        return from_status(root, status)
    try:
        manifest = load_manifest(root)
    except ManifestError as exc:
        if unreadable is None and not (root / "manifest.json").exists():
            raise NoRun(f"no run at {root}: no manifest.json and no control/status.json") from None
        raise NoRun(unreadable or str(exc)) from None
    except OSError as exc:
        raise NoRun(f"{root}: {_reason(exc)}") from None
    return from_manifest(root, manifest, unreadable)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def from_status(root: Path, status: RunStatus) -> RunView:
    """What ``status`` says, with whether its process is still there."""
    alive, liveness = judge(status, socket.gethostname())
    return RunView(
        root=root,
        source="status",
        run_id=status.run_id,
        state=status.state,
        alive=alive,
        liveness=liveness,
        status=status,
        windows=tuple(status.windows),
        recent=tuple(status.recent),
        last_step=status.last_step,
        config_steps=status.config_steps,
        problems=tuple(status.problems),
    )


def judge(status: RunStatus, here: str) -> tuple[bool, str]:
    """Whether the run of ``status`` is alive, seen from host ``here``, and that in words."""
    if status.state == "ended":
        return False, "ended"
    if status.host != here:
        return True, (
            f"running, says the run (pid {status.pid} on host {status.host}: "
            f"cannot check its process from {here})"
        )
    if process_gone(status.pid):
        return False, f"ended (its process {status.pid} is gone: killed?)"
    return True, f"running (pid {status.pid} on {status.host})"


def from_manifest(root: Path, manifest: Manifest, unreadable: str | None = None) -> RunView:
    """What the manifest of a run without a status says: its windows and their states
    (``unreadable``: why the status there could not be read)."""
    records = sorted(manifest.windows, key=lambda w: (w.step, w.target))
    shown = [
        WindowStatus(
            step=record.step,
            target=record.target,
            kind=record.kind,
            phase=record.state,
            requested_by=record.requested_by,
            forward_steps=record.forward_steps.observed,
            error=record.error,
        )
        for record in records
    ]
    windows = tuple(w for w in shown if w.phase == "running")
    finished = [w for w in shown if w.phase != "running"]
    failed = [
        f"step {w.step}, {w.target}: {w.phase}: {w.error or 'no error text'}"
        for w in finished
        if w.phase in ("failed", "timeout")
    ]
    state: Literal["ended", "unknown"] = "unknown" if windows else "ended"
    why = "no control/status.json" if unreadable is None else "control/status.json unreadable"
    liveness = (
        f"unknown ({why}; windows still running: alive, or killed)"
        if windows
        else f"ended ({why}: read from manifest.json)"
    )
    return RunView(
        root=root,
        source="manifest",
        run_id=manifest.run_id,
        state=state,
        alive=False,
        liveness=liveness,
        status=None,
        windows=windows,
        recent=tuple(finished[-RECENT:]),
        last_step=max((w.step for w in shown), default=None),
        config_steps=_config_steps(manifest.config),
        problems=(*([] if unreadable is None else [unreadable]), *failed),
    )


def _config_steps(config: dict[str, Any]) -> str | None:
    profiler = config.get("global_profiler")
    if not isinstance(profiler, dict) or "steps" not in profiler:
        return None
    try:
        return str(StepSelection.parse(profiler["steps"]))
    except (ConfigError, ValueError):
        return json.dumps(profiler["steps"])


# -- the last steps' accounting ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LastSteps:
    """The last steps' accounting as read once: the steps, or why there are none; with the
    run's problems and notes read with it."""

    steps: tuple[StepAccount, ...]
    """At most ``LAST_STEPS``, by step, the last ones."""
    empty: str
    """What the section says without a step."""
    error: str | None = None
    """Why the accounting could not be read (one line), ``None`` when it was."""
    problems: tuple[str, ...] = ()
    """The manifest's notes that are problems, timelines that cannot be read (the report's
    run-wide problems)."""
    notes: tuple[str, ...] = ()
    """The manifest's other notes, and the accounting's own."""


def last_steps(root: Path) -> LastSteps | None:
    """The accounting of the run's last steps as far as its timelines are written; ``None``
    when ``root`` has no manifest (nothing to account). Never raises (but on Ctrl-C)."""
    try:
        from aprof._report import accounting

        found = accounting(root)
    except ManifestError as exc:
        if not (root / "manifest.json").exists():
            return None
        return _unavailable(exc)
    except Exception as exc:  # whatever it is, status still shows the rest
        return _unavailable(exc)
    steps = sorted(found.accounts, key=lambda account: account.step)
    empty = "none"
    if not steps:
        try:
            files = len(load_manifest(root).timeline)
        except Exception as exc:
            return _unavailable(exc)
        empty = (
            f"none accounted: its {files} timeline file(s) hold no ended step, or cannot be read"
            if files
            else "no timeline (timeline.enable false, or none written yet)"
        )
    return LastSteps(
        tuple(steps[-LAST_STEPS:]), empty=empty, problems=found.problems, notes=found.notes
    )


def _unavailable(exc: BaseException) -> LastSteps:
    reason = one_line(_reason(exc))
    return LastSteps((), empty=f"accounting unavailable: {reason}", error=reason)


class Accountant:
    """:func:`last_steps` of one run for --watch, read again at most every ``every_s`` seconds
    (counted from the end of the last read) and kept between."""

    def __init__(
        self,
        root: Path,
        every_s: float = ACCOUNTING_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.every_s = every_s
        self._clock = clock
        self._last: LastSteps | None = None
        self._read_at: float | None = None

    def __call__(self) -> LastSteps | None:
        if self._read_at is None or self._clock() - self._read_at >= self.every_s:
            self._last = last_steps(self.root)
            self._read_at = self._clock()
        return self._last


# -- JSON --------------------------------------------------------------------------------------


def as_json(view: RunView, accounting: LastSteps | None = None) -> dict[str, Any]:
    """The status's fields (unknown ones ``null`` when read from a manifest; ``problems``
    with the manifest's after the status's), plus ``alive``, ``liveness``, ``source``,
    ``last_steps`` (each step's ``StepAccount.as_json()``; ``null`` without a manifest or when
    the accounting failed), ``accounting_error`` (why it failed, else ``null``) and ``notes``
    (every note of the manifest that is no problem, and the accounting's own)."""
    if view.status is not None:
        data: dict[str, Any] = view.status.model_dump(mode="json", by_alias=True)
    else:
        data = {field.alias or name: None for name, field in RunStatus.model_fields.items()}
        data.update(
            schema=RunStatus.model_fields["schema_"].default,
            run_id=view.run_id,
            state=view.state,
            last_step=view.last_step,
            windows=[w.model_dump(mode="json") for w in view.windows],
            recent=[w.model_dump(mode="json") for w in view.recent],
            planned=[],
            config_steps=view.config_steps,
            triggers=[],
            problems=list(view.problems),
        )
    data.update(
        alive=view.alive,
        liveness=view.liveness,
        source=view.source,
        problems=list(run_problems(view, accounting)),
        notes=[] if accounting is None else list(accounting.notes),
    )
    if accounting is None or accounting.error is not None:
        data.update(
            last_steps=None, accounting_error=None if accounting is None else accounting.error
        )
    else:
        data.update(last_steps=[step.as_json() for step in accounting.steps], accounting_error=None)
    return data


# -- what is shown -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Section:
    """One part of the screen: a title and its rows (``header`` empty: key and value rows)."""

    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    empty: str = "none"
    """What is shown when there is no row."""


def sections(view: RunView, now_ns: int, accounting: LastSteps | None = None) -> list[Section]:
    """Everything ``aprof status`` shows of ``view`` at wall-clock time ``now_ns`` (with the
    last steps' ``accounting``, when there is one)."""
    return [
        summary(view, now_ns),
        open_windows(view),
        recent_windows(view),
        *([] if accounting is None else [accounted_steps(accounting)]),
        planned_steps(view),
        triggers(view),
        problems(view, accounting),
        notes(accounting),
    ]


def summary(view: RunView, now_ns: int) -> Section:
    """The run: its id, alive or ended, its step, when its status was written."""
    rows: list[tuple[str, str]] = [("run", view.run_id), ("state", view.liveness)]
    status = view.status
    if status is None:
        rows.append(("last step", _number(view.last_step)))
    else:
        rows.append(("step", step_line(status, now_ns)))
        rows.append(("longest step", duration(status.longest_step_s)))
        rows.append(("updated", f"{duration(_seconds(now_ns - status.updated_ns))} ago"))
        if status.http is not None:
            rows.append(("control endpoint", status.http))
    rows.append(("config steps", view.config_steps or NONE))
    rows.append(("save_path", str(view.root)))
    return Section("run", (), tuple(rows))


def step_line(status: RunStatus, now_ns: int) -> str:
    """The step open and for how long, or the last one begun."""
    if status.step is not None:
        began = status.step_began_ns
        age = NONE if began is None else duration(_seconds(now_ns - began))
        return f"{status.step} (open for {age})"
    last = f"last step {status.last_step}" if status.last_step is not None else "no step begun"
    return f"none open ({last})"


def open_windows(view: RunView) -> Section:
    """The windows not ended yet and their phases."""
    rows = tuple((str(w.step), w.target, w.kind, w.phase, w.requested_by) for w in view.windows)
    return Section("open windows", ("step", "target", "kind", "phase", "requested by"), rows)


def recent_windows(view: RunView) -> Section:
    """The last finished windows, newest last, with their state and forward steps."""
    rows = tuple(
        (
            str(w.step),
            w.target,
            w.kind,
            w.phase,
            _number(w.forward_steps),
            w.requested_by,
            one_line(w.error) if w.error else "",
        )
        for w in view.recent
    )
    header = ("step", "target", "kind", "state", "forward steps", "requested by", "error")
    return Section("last finished windows", header, rows)


def accounted_steps(accounting: LastSteps) -> Section:
    """The last steps: wall time, its phases as shares of it, requests, p99, tail, anomaly."""
    rows = tuple(
        (
            f"{a.step} profiled" if a.profiled else str(a.step),
            duration(a.wall_s),
            *(_share(part, a.wall_s) for part in (a.rollout_s, a.train_s, a.overlap_s, a.idle_s)),
            str(a.requests),
            duration(a.p99_s),
            _tail(a),
            "" if a.anomaly is None else f"{a.anomaly.factor:.1f}x {a.anomaly.phase}",
        )
        for a in accounting.steps
    )
    header = (
        "step",
        "wall",
        "rollout",
        "train",
        "overlap",
        "idle",
        "requests",
        "p99",
        "tail",
        "anomaly",
    )
    return Section("last steps", header, rows, empty=accounting.empty)


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else NONE


def _tail(account: StepAccount) -> str:
    """The tail's time and its share of the rollout: ``0.40s (12%)``."""
    if account.tail_s is None:
        return NONE
    if account.tail_share is None:
        return duration(account.tail_s)
    return f"{duration(account.tail_s)} ({100 * account.tail_share:.0f}%)"


def planned_steps(view: RunView) -> Section:
    """Steps captures and triggers added, not begun yet."""
    if view.status is None:
        return Section("planned captures", (), (), empty="unknown (no status)")
    rows = tuple(
        (str(p.step), ", ".join(p.targets), ", ".join(p.requested_by)) for p in view.status.planned
    )
    return Section("planned captures", ("step", "targets", "requested by"), rows)


def triggers(view: RunView) -> Section:
    """Each trigger and where its baseline stands."""
    if view.status is None:
        return Section("triggers", (), (), empty="unknown (no status)")
    rows = tuple(
        (
            t.name,
            f"{t.baseline}/{t.baseline_steps}",
            duration(t.median_s),
            duration(t.threshold_s),
            duration(t.last_s),
            str(t.streak),
            str(t.fired),
            _number(t.quiet_until),
        )
        for t in view.status.triggers
    )
    header = (
        "trigger",
        "baseline",
        "median",
        "threshold",
        "last",
        "streak",
        "fired",
        "quiet until",
    )
    return Section("triggers", header, rows)


def problems(view: RunView, accounting: LastSteps | None = None) -> Section:
    """What went wrong: the status's problems, newest last, then the manifest's."""
    rows = tuple((one_line(p),) for p in run_problems(view, accounting))
    return Section("problems", ("problem",), rows)


def run_problems(view: RunView, accounting: LastSteps | None) -> tuple[str, ...]:
    """The status's problems (or the manifest's failed windows), then the problems the
    accounting read with the manifest and timelines."""
    return view.problems + (() if accounting is None else accounting.problems)


def notes(accounting: LastSteps | None) -> Section:
    """The last ``LAST_NOTES`` notes of the run that are no problem, newest last."""
    shown = () if accounting is None else accounting.notes[-LAST_NOTES:]
    return Section("notes", ("note",), tuple((one_line(n),) for n in shown))


def duration(seconds: float | None) -> str:
    """``seconds`` for a person: ``0.25s``, ``42.0s``, ``3m05s``, ``2h07m``."""
    if seconds is None or not math.isfinite(seconds):
        return NONE
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        minutes, rest = divmod(int(seconds), 60)
        return f"{minutes}m{rest:02d}s"
    hours, rest = divmod(int(seconds) // 60, 60)
    return f"{hours}h{rest:02d}m"


def _seconds(ns: int) -> float:
    return ns / 1e9


def _number(value: int | None) -> str:
    return NONE if value is None else str(value)


# -- plain text --------------------------------------------------------------------------------


def as_text(parts: list[Section]) -> str:
    """The sections as plain text, their columns aligned."""
    return "\n".join(_text(section) for section in parts)


def _text(section: Section) -> str:
    if not section.header:
        if not section.rows:
            return f"{section.title}: {section.empty}\n"
        width = max(len(row[0]) for row in section.rows) + 1
        return "".join(
            f"{(row[0] + ':').ljust(width)} {' '.join(row[1:])}\n" for row in section.rows
        )
    if not section.rows:
        return f"{section.title}: {section.empty}\n"
    table = [section.header, *section.rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(section.header))]
    lines = [f"{section.title} ({len(section.rows)}):"]
    for row in table:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines) + "\n"


# -- --watch -----------------------------------------------------------------------------------


def watch(root: Path, first: RunView, every: float) -> int:
    """Redraw the run every ``every`` seconds until Ctrl-C; 0."""
    from rich.console import Console
    from rich.live import Live

    view: RunView | str = first
    accountant = Accountant(root)
    try:
        with Live(
            screen_of(view, every, accountant()),
            console=Console(),
            auto_refresh=False,
            transient=False,
        ) as live:
            while True:  # until Ctrl-C
                time.sleep(every)
                try:
                    view = look(root)
                except NoRun as exc:  # gone, or half-written by hand: say so, keep watching
                    view = str(exc)
                accounting = None if isinstance(view, str) else accountant()
                live.update(screen_of(view, every, accounting), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0


def screen_of(
    view: RunView | str, every: float, accounting: LastSteps | None = None
) -> RenderableType:
    """What --watch shows: the sections as tables (the last steps' ``accounting`` among them,
    when there is one), or why the run cannot be read now."""
    from rich.console import Group
    from rich.text import Text

    clock = time.strftime("%H:%M:%S")
    footer = Text(f"{clock}, every {every:g}s; Ctrl-C to stop", style="dim")
    if isinstance(view, str):
        return Group(Text(f"aprof status: {one_line(view)}", style="bold red"), footer)
    parts = sections(view, time.time_ns(), accounting)
    style = "green" if view.alive else ("yellow" if view.state == "unknown" else "red")
    first, *rest = (_table(section, style) for section in parts)
    return Group(first, Text(""), *rest, footer)


def _table(section: Section, state_style: str) -> RenderableType:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    if not section.header:
        if not section.rows:
            return Text(f"{section.title}: {section.empty}")
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        for key, *values in section.rows:
            value = Text(" ".join(values), style=state_style if key == "state" else "")
            grid.add_row(Text(key), value)
        return grid
    if not section.rows:
        return Text(f"{section.title}: {section.empty}", style="dim")
    table = Table(
        title=f"{section.title} ({len(section.rows)})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        expand=False,
    )
    for name in section.header:
        table.add_column(name, overflow="fold")
    for row in section.rows:
        table.add_row(*map(Text, row))  # as written: an error's "[Errno 2]" is not markup
    return table
