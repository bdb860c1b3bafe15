"""``aprof report`` in the terminal: a :class:`~aprof._report.model.RunReport` as plain text.

Every problem first (the run's, then each step's), then the run at a glance (where each step's
time went: every step, or on a long run the profiled and anomalous ones and a summary line),
then per profiled step its windows, request latency (captured vs uncaptured), gated wait, server
iteration and trainer stage durations, then the run-wide latency of profiled against unprofiled
steps. No colors; no line is longer than ``WIDTH``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from typing import Any

from aprof._accounting import StepAccount
from aprof._accounting import summary as run_summary
from aprof._otel import PHASES
from aprof._report.hosts import host_lines
from aprof._report.model import Distribution, RunReport, StepReport, WindowRow

WIDTH = 100
"""The most columns a line takes."""
GLANCE_STEPS = 30
"""A run with more steps shows only its profiled and anomalous ones at a glance."""
_INDENT = "  "


def render(report: RunReport) -> str:
    """The whole report: problems on top, then each step, then the run-wide comparison."""
    lines = [_title(report)]
    lines += _problems(report)
    lines += _glance(report.accounts)
    for step in report.steps:
        lines += ["", f"step {step.step}"]
        lines += _table(step.windows)
        lines += _numbers(step)
        lines += _server(report.server.get(step.step))
    lines += ["", *_run_wide(report)]
    hosts = host_lines(report.hosts)
    if hosts:
        lines += ["", *hosts]
    if report.notes:
        lines += ["", "notes:"]
        lines += _wrapped((f"- {note}" for note in report.notes), _INDENT)
    return "\n".join(lines) + "\n"


def summary(report: RunReport) -> str:
    """A few lines for the end of ``aprof demo``: how many problems, each step's latency,
    gated wait and iteration p50s, and the run-wide comparison."""
    problems = _all_problems(report)
    lines = []
    if problems:
        lines += [f"{len(problems)} problems (first: {problems[0]})"]
    for step in report.steps:
        parts = [
            f"latency p50 captured {_ms(step.latency_captured.p50)} "
            f"({step.latency_captured.count}), uncaptured {_ms(step.latency_uncaptured.p50)} "
            f"({step.latency_uncaptured.count})",
        ]
        if step.gated_wait.count:
            parts.append(f"gated wait p50 {_ms(step.gated_wait.p50)} ({step.gated_wait.count})")
        if step.iterations:
            each = ", ".join(f"{t} {_ms(d.p50)}" for t, d in sorted(step.iterations.items()))
            parts.append(f"iteration p50 {each}")
        lines.append(f"step {step.step}: " + "; ".join(parts))
    lines.append(_comparison(report))
    return "\n".join(_wrapped(lines, _INDENT)) + "\n"


def _title(report: RunReport) -> str:
    steps = len(report.steps)
    return _clip(f"run {report.run_id} in {report.save_path}: {steps} profiled steps")


def _all_problems(report: RunReport) -> list[str]:
    found = list(report.problems)
    for step in report.steps:
        found += [f"step {step.step}: {problem}" for problem in step.problems]
    return found


def _problems(report: RunReport) -> list[str]:
    found = _all_problems(report)
    if not found:
        return ["problems: none"]
    return [f"problems ({len(found)}):", *_wrapped((f"! {p}" for p in found), _INDENT)]


_HEADER = ("target", "kind", "tool", "state", "stop", "fwd r/o", "gated/adm", "files", "size")
_CLIPS = (18, 7, 10, 7, 9, 11, 11, 6, 10)
"""The most characters of each column (the whole table fits in ``WIDTH``)."""


_GLANCE = ("step", "wall", "rollout", "train", "overlap", "idle", "reqs", "p99", "tail", "anomaly")


def _glance(accounts: tuple[StepAccount, ...]) -> list[str]:
    """Where each step's time went, one line per step (``*``: profiled)."""
    if not accounts:
        return []
    shown = accounts
    if len(accounts) > GLANCE_STEPS:
        shown = tuple(a for a in accounts if a.profiled or a.anomaly is not None)
    rows = [_GLANCE]
    for a in shown:
        anomaly = "-" if a.anomaly is None else f"x{a.anomaly.factor:.1f} {a.anomaly.phase}"
        rows.append(
            (
                f"{a.step}{'*' if a.profiled else ''}",
                _s(a.wall_s),
                _share(a.rollout_s, a.wall_s),
                _share(a.train_s, a.wall_s),
                _share(a.overlap_s, a.wall_s),
                _share(a.idle_s, a.wall_s),
                str(a.requests),
                _s(a.p99_s),
                _s(a.tail_s),
                anomaly,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_GLANCE))]
    lines = ["", "the run at a glance (* profiled; phases are shares of the step's wall time)"]
    lines += [
        _clip(_INDENT + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        for row in rows
    ]
    total = run_summary(accounts)
    wall = total["wall_s"]
    line = (
        f"{total['steps']} steps, {_s(wall)}: rollout {_share(total['rollout_s'], wall)}, "
        f"train {_share(total['train_s'], wall)}, overlap {_share(total['overlap_s'], wall)}, "
        f"idle {_share(total['idle_s'], wall)}; {len(total['anomalies'])} anomalous"
    )
    if len(shown) < len(accounts):
        line += f" ({len(accounts) - len(shown)} steps neither profiled nor anomalous not listed)"
    return lines + _wrapped([line], _INDENT)


def _s(seconds: float | None) -> str:
    """Three digits: ``7.82 s``, ``284 µs``."""
    if seconds is None:
        return "-"
    for scale, unit in ((1.0, "s"), (1e-3, "ms")):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e6:.3g} µs"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def _table(windows: Iterable[WindowRow]) -> list[str]:
    rows = [_HEADER]
    for w in windows:
        rows.append(
            (
                w.target,
                w.kind,
                w.tool,
                w.state,
                w.stop_reason or "-",
                f"{_or_dash(w.requested)}/{_or_dash(w.observed)}",
                f"{w.gated}/{w.admitted}" if w.kind == "rollout" else "-",
                str(w.files),
                size(w.bytes),
            )
        )
    clipped = [[_clip(cell, most) for cell, most in zip(row, _CLIPS, strict=True)] for row in rows]
    widths = [max(len(row[i]) for row in clipped) for i in range(len(_HEADER))]
    return [
        _INDENT + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in clipped
    ]


def _numbers(step: StepReport) -> list[str]:
    lines = [
        f"{_INDENT}latency     captured    {_dist(step.latency_captured)}",
        f"{_INDENT}            uncaptured  {_dist(step.latency_uncaptured)}",
    ]
    if step.gated_wait.count:
        lines.append(f"{_INDENT}gated wait              {_dist(step.gated_wait)}")
    for target, found in sorted(step.iterations.items()):
        lines.append(_clip(f"{_INDENT}iteration   {target:<11} {_dist(found, p99=False)}"))
    for name, found in sorted(step.stages.items()):
        lines += _wrapped([f"stage       {name}  {_dist(found)}"], _INDENT)
    return lines


def _server(side: dict[str, Any] | None) -> list[str]:
    """The servers' own side of the step's requests (their OpenTelemetry spans), per replica
    where the requests said which, and where its slowest requests' time went."""
    if not side or not side["spans"]:
        return []
    lines = [f"server      n={side['spans']:<5} {_phase_medians(side)}"]
    for replica in side["replicas"]:
        lines.append(
            f"  replica_{replica['replica']} n={replica['spans']} {_phase_medians(replica)}"
        )
    for slow in side["slowest"]:
        served = slow["server"]
        if served is None:
            continue
        parts = [f"{name} {_ms(served.get(f'{name}_s'))}" for name in PHASES]
        if served.get("gap_s") is not None:
            parts.append(f"network and client {_ms(served['gap_s'])}")
        lines.append(f"  slowest {slow['request_id']}: {', '.join(parts)}")
    return _wrapped(lines, _INDENT)


def _phase_medians(side: dict[str, Any]) -> str:
    return "  ".join(
        f"{name} p50 {_ms(found['p50'])}"
        for name in PHASES
        if (found := side[f"{name}_s"]) is not None
    )


def _run_wide(report: RunReport) -> list[str]:
    return [
        "all requests",
        f"{_INDENT}profiled steps    {_dist(report.latency_profiled)}",
        f"{_INDENT}unprofiled steps  {_dist(report.latency_unprofiled)}",
        *_wrapped([_comparison(report)], _INDENT),
    ]


def _comparison(report: RunReport) -> str:
    profiled, unprofiled = report.latency_profiled.p50, report.latency_unprofiled.p50
    if profiled is None or unprofiled is None or unprofiled <= 0:
        return "latency p50 of profiled vs unprofiled steps: not comparable (no requests of one)"
    return (
        f"latency p50 of profiled vs unprofiled steps: {_ms(profiled)} vs {_ms(unprofiled)}, "
        f"x{profiled / unprofiled:.2f}"
    )


def _dist(found: Distribution, *, p99: bool = True) -> str:
    """``n=48  p50 4.30 s  p95 ...`` in ms; ``n=0`` when empty."""
    if not found.count or found.p50 is None:
        return f"n={found.count}"
    text = f"n={found.count:<5} p50 {_ms(found.p50)}  p95 {_ms(found.p95)}"
    return text + (f"  p99 {_ms(found.p99)}" if p99 else "")


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1000
    if ms < 10:
        return f"{ms:.2f} ms"
    if ms < 10_000:
        return f"{ms:.1f} ms"
    return f"{ms:.0f} ms"


def size(n: int) -> str:
    """``n`` bytes, human-readable (``28.9 KiB``)."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _clip(text: str, most: int = WIDTH) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def _wrapped(lines: Iterable[str], indent: str) -> list[str]:
    """Each of ``lines`` after ``indent``, wrapped to ``WIDTH`` (a line's rest indented more)."""
    out: list[str] = []
    for line in lines:
        out += textwrap.wrap(
            line,
            WIDTH,
            initial_indent=indent,
            subsequent_indent=indent + "  ",
            break_long_words=True,
            break_on_hyphens=False,
        ) or [indent]
    return out
