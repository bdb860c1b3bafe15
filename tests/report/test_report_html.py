"""``report.html``: every plot drawn from a run's report, in one file that opens from disk, and
checked in a real headless Chromium (Debian's package, driven by Playwright): it loads with no
console error and no request off the disk, and every plot is drawn (a screenshot of each holds
the traces' colours)."""

from __future__ import annotations

import io
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from aprof._accounting import Anomaly, ReplicaAccount, Slow, StepAccount
from aprof._otel import served
from aprof._report import RunReport, StepReport, collect
from aprof._report.html import (
    FILE_NAME,
    MAX_LANES,
    PLOTS,
    lanes,
    render,
    step_on_one_clock,
    windows_gantt,
    write,
)
from aprof._report.model import Distribution, Interval, Row, WindowRow
from aprof._report.page import step_plot_id
from aprof._report.run_plots import (
    MAX_STEPS_DRAWN,
    PHASES_ID,
    PROFILED_LINKS_ID,
    REPLICAS_ID,
    RUN_PLOT_IDS,
    RUN_TITLE,
    SLOWEST_STEPS,
    TAIL_ID,
    drawn_steps,
    phase_time,
    replica_busy,
    slowest_steps,
)
from aprof._report.server import step_side
from aprof._timeline.recorder import span_id_of

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else shutil.which("chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PLOT_IDS = [plot.id for plot in PLOTS]
RUN_IDS = list(RUN_PLOT_IDS)
"""The plots of the run across all its steps (of ``realistic()`` and of the demo)."""
STEP_IDS = [step_plot_id(1), step_plot_id(2)]
"""The pictures on one clock of the two steps of ``realistic()`` and of the demo."""
LOCAL_SCHEMES = ("file:", "data:", "about:", "blob:")
"""What the page may load: nothing but itself and what it makes."""
TRACES = ".trace, .hm"
"""What plotly draws a trace as: an SVG group of class ``trace``, a heat map's ``hm``."""
LINKS = """() => [...document.querySelectorAll('#run-profiled a')].map(a => {
    const id = a.getAttribute('href').slice(1);
    return [a.textContent, id, document.getElementById(id) !== null];
})"""
"""Each link to a profiled step's section: its text, the id it points at, whether the page
holds that id."""
ALL_DRAWN = """() => {
    const plots = [...document.querySelectorAll('.js-plotly-plot')];
    return plots.length > 0 && plots.every(p => p.querySelector('.main-svg') && p._fullLayout);
}"""
"""True once plotly has drawn every plot of the page."""
T0 = 1_796_179_928_000_000_000
NS = 1e-9
HOSTILE = '</script><script>alert("x")</script><img src=x onerror=alert(1)>'


def dist(values: list[float]) -> Distribution:
    """A distribution of ``values`` (seconds) as the report keeps it."""
    ordered = sorted(values)
    if not ordered:
        return Distribution()

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return Distribution(len(ordered), pct(0.5), pct(0.95), pct(0.99), tuple(ordered))


def window(step: int, target: str, start_s: float, stop_s: float, **more: object) -> WindowRow:
    rollout = target.startswith("replica")
    fields: dict[str, object] = {
        "step": step,
        "target": target,
        "kind": "rollout" if rollout else "role",
        "tool": "torch",
        "state": "done",
        "stop_reason": "auto_stop" if rollout else "step_end",
        "started_ns": T0 + int(start_s * 1e9),
        "stopped_ns": T0 + int(stop_s * 1e9),
        "requested": 8 if rollout else None,
        "observed": 8 if rollout else None,
        "admitted": 24 if rollout else 0,
        "gated": 8 if rollout else 0,
        "files": 3 if rollout else 1,
        "bytes": 106_807 if rollout else 29_531,
        "error": None,
    }
    fields.update(more)
    return WindowRow(**fields)  # type: ignore[arg-type]


def at(seconds: float) -> int:
    return T0 + int(seconds * 1e9)


def account(
    step: int,
    wall: float,
    *,
    rollout: float,
    train: float,
    overlap: float = 0.0,
    profiled: bool = False,
    anomaly: Anomaly | None = None,
    busy: tuple[float, ...] = (1.0, 1.0),
    slowest: str | None = "sample0-t2",
) -> StepAccount:
    """A step's account as the ledger makes it: its phases add up to its wall time (idle is
    what is left), ``busy`` per replica; steps 16 s apart as in ``realistic()``."""
    begin = at(16.0 * (step - 1) + 0.4)
    end = begin + round(wall * 1e9)
    wall_s = (end - begin) * NS
    return StepAccount(
        step=step,
        begin_ns=begin,
        end_ns=end,
        profiled=profiled,
        rollout_s=rollout,
        train_s=train,
        overlap_s=overlap,
        idle_s=wall_s - rollout - train + overlap,
        requests=48,
        p50_s=rollout / 4,
        p90_s=rollout / 3,
        p99_s=rollout / 2,
        max_s=rollout / 1.8,
        tail_s=rollout / 10,
        tail_share=0.1,
        estimated=False,
        slowest=(Slow(slowest, 1, rollout / 1.8, "driver-1", slowest, 2),),
        replicas=tuple(
            ReplicaAccount(r, b, 24, 384, 960, 384 / b if b else None, 0.0)
            for r, b in enumerate(busy)
        ),
        imbalance=None,
        staleness=None,
        anomaly=anomaly,
    )


def accounts() -> tuple[StepAccount, ...]:
    """Six steps: 1 and 2 profiled (as ``realistic()``'s), 5 anomalous (its rollout grew), the
    trainer overlapping the rollout in 3 and 4."""
    return (
        account(1, 14.6, rollout=13.0, train=0.8, profiled=True, busy=(12.1, 12.9)),
        account(2, 14.6, rollout=12.5, train=0.9, profiled=True, busy=(8.0, 12.4)),
        account(3, 4.0, rollout=3.1, train=1.0, overlap=0.4, busy=(3.0, 2.9)),
        account(4, 4.2, rollout=3.3, train=1.1, overlap=0.5, busy=(3.2, 3.1)),
        account(5, 10.5, rollout=9.6, train=0.8, anomaly=Anomaly(2.5, "rollout"), busy=(9.5, 2.0)),
        account(6, 4.1, rollout=3.2, train=0.8, busy=(3.1, 3.0)),
    )


def server_sides(found: tuple[StepAccount, ...]) -> dict[int, Any]:
    """Per step, the servers' side as ``aprof report`` makes it from their spans: 8 requests
    per replica, each queued 10 ms (more on replica 1), prefilling 20 ms, decoding 300 ms."""
    sides = {}
    for account in found:
        spans = []
        for i in range(16):
            replica, queued = i % 2, 0.01 * (1 + i % 2 * account.step)
            latencies = {"queue": queued, "model_prefill": 0.02, "model_decode": 0.3}
            spans.append(
                {
                    "span_id": f"{i + 1:016x}",
                    "parent_span_id": span_id_of(f"sample{i}-t2"),
                    "trace_state": f"aprof=r{replica}",
                    "name": "llm_request",
                    "start_ns": account.begin_ns,
                    "end_ns": account.begin_ns + 400_000_000,
                    "attributes": {f"gen_ai.latency.time_in_{k}": v for k, v in latencies.items()},
                }
            )
        sides[account.step] = step_side(served(spans)[0], account)
    return sides


def one_clock(
    step: int, offset: float, windows: tuple[WindowRow, ...], rng: random.Random
) -> tuple[Row, ...]:
    """A step's rows as ``collect`` reads them from the demo: the step, its windows, per
    replica 24 requests (3 turns of 8 samples: 8 lanes) over 8 forward steps, the trainer's
    stage."""
    rows = [Row(f"step {step}", (Interval(at(offset + 0.4), at(offset + 15.0), "step"),), "step")]
    for w in windows:
        item = Interval(w.started_ns or 0, w.stopped_ns or 0, f"{w.target} · step {step}", w.state)
        rows.append(Row(f"{w.target} · window", (item,), "window"))
    for replica in (0, 1):
        requests = []
        for sample in range(8):
            begin = offset + 0.5
            for turn in range(3):
                end = begin + rng.uniform(1, 4)
                state = "captured" if turn < 2 else "uncaptured"
                label = f"request sample{sample}-t{turn}"
                requests.append(Interval(at(begin), at(end), label, state))
                begin = end
        requests.sort(key=lambda item: item.begin_ns)
        rows.append(Row(f"requests → replica_{replica}", tuple(requests), "requests"))
        forward = tuple(
            Interval(at(offset + 3.8 + k * 0.05), at(offset + 3.84 + k * 0.05), f"forward_step#{k}")
            for k in range(8)
        )
        rows.append(Row(f"replica_{replica} · iterations", forward, "iterations"))
    stage = Interval(at(offset + 14.0), at(offset + 14.2), "update_policy")
    rows.append(Row("trainer · rank 0", (stage,), "ranges"))
    return tuple(rows)


def realistic() -> RunReport:
    """A report shaped as ``aprof demo --steps 1,2 --num-steps 3`` leaves (two replicas, a
    trainer), with one replica's window of step 2 cut short."""
    rng = random.Random(17)

    def latencies(n: int, mean: float) -> list[float]:
        return [rng.lognormvariate(0, 0.4) * mean for _ in range(n)]

    steps = []
    for step, offset in ((1, 0.0), (2, 16.0)):
        observed = 5 if step == 2 else 8
        windows = (
            window(step, "trainer", offset + 0.5, offset + 15.1),
            window(step, "replica_0", offset + 3.7, offset + 15.2, observed=observed),
            window(step, "replica_1", offset + 3.6, offset + 15.2),
        )
        problems = ("step 2: replica_0 observed 5 of 8 forward steps",) if step == 2 else ()
        steps.append(
            StepReport(
                step=step,
                windows=windows,
                latency_captured=dist(latencies(16, 0.21)),
                latency_uncaptured=dist(latencies(32, 0.12)),
                gated_wait=dist(latencies(16, 0.03)),
                iterations={f"replica_{r}": dist(latencies(8, 0.011)) for r in (0, 1)},
                stages={
                    "trainer · update_policy": dist(latencies(1, 0.2)),
                    "trainer · compute_log_prob": dist(latencies(2, 0.05)),
                },
                problems=problems,
                timeline=one_clock(step, offset, windows, rng),
            )
        )
    return RunReport(
        run_id="20261202-025208-ee5305",
        save_path=Path("/tmp/aprof-demo"),
        steps=tuple(steps),
        latency_profiled=dist(latencies(96, 0.16)),
        latency_unprofiled=dist(latencies(48, 0.11)),
        notes=("step 1: cuda not recorded: torch.cuda.is_available() is False",),
        accounts=accounts(),
        server=server_sides(accounts()),
    )


def empty() -> RunReport:
    return RunReport("empty-run", Path("/x"), (), Distribution(), Distribution())


# --- the page, read as text ---------------------------------------------------------------------


def test_an_empty_run_says_for_each_plot_that_there_is_nothing_to_show() -> None:
    page = render(empty())
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<title>aprof report: empty-run</title>" in page
    assert page.count("nothing to show:") == len(PLOTS) + 1  # and the run across its steps
    assert "Plotly.newPlot" not in page and len(page) < 20_000  # no plotly.js without a plot
    assert "No problems" in page


def test_every_plot_is_drawn_and_plotly_js_is_inline_once() -> None:
    page = render(realistic())
    for plot_id in RUN_IDS + PLOT_IDS + STEP_IDS:
        assert f'id="{plot_id}"' in page
    assert "nothing to show" not in page
    assert page.count("Plotly.newPlot(") == len(RUN_IDS) + len(PLOTS) + len(STEP_IDS)
    assert page.index(RUN_TITLE) < page.index(f'id="{TAIL_ID}"') < page.index(f'id="{PLOT_IDS[0]}"')
    assert page.index('id="plot-stages"') < page.index("Step 1 on one clock")
    assert page.index("Step 1 on one clock") < page.index("Step 2 on one clock")
    assert page.count("window.PlotlyConfig") == 1  # plotly.js once, in the page
    # Nothing loaded from elsewhere: no script, link, image or frame with a source.
    assert not re.search(r"<(script|img|iframe)\b[^>]*\bsrc\s*=", page, re.I)
    assert not re.search(r"<link\b", page, re.I)


def test_problems_stand_in_a_box_before_the_plots() -> None:
    report = realistic()
    report = replace(report, problems=("1 timeline event dropped",))
    page = render(report)
    box = page.index('<div class="problems" id="problems">')
    assert "Problems (2)" in page
    assert box < page.index("1 timeline event dropped") < page.index(f'id="{PLOT_IDS[0]}"')
    assert "step 2: replica_0 observed 5 of 8 forward steps" in page[box : page.index("<section")]


def test_strings_from_files_are_escaped() -> None:
    step = realistic().steps[0]
    bad = window(1, HOSTILE, 1, 2, state=HOSTILE, stop_reason=HOSTILE, error=HOSTILE)
    hostile = Interval(at(1), at(2), HOSTILE, HOSTILE)
    step = replace(
        step,
        windows=(*step.windows, bad),
        iterations={HOSTILE: dist([0.01, 0.02])},
        stages={HOSTILE: dist([0.1])},
        problems=(HOSTILE,),
        timeline=(
            *step.timeline,
            *(Row(HOSTILE, (hostile,), kind) for kind in ("window", "ranges", HOSTILE)),
            Row(f"requests → {HOSTILE}", (hostile,) * (MAX_LANES + 2), "requests", 1),
        ),
    )
    report = replace(realistic(), run_id=HOSTILE, steps=(step,), notes=(HOSTILE,))
    report = replace(report, save_path=Path("/tmp") / HOSTILE.replace("/", "_"))
    hostile_anomaly = Anomaly(3.0, HOSTILE)
    hostile_step = account(
        7, 40.0, rollout=39.0, train=0.5, anomaly=hostile_anomaly, slowest=HOSTILE
    )
    report = replace(report, accounts=(*report.accounts, hostile_step))
    page = render(report)
    assert "<img" not in page and "<script>alert" not in page
    # plotly.js (its config, its source) and one per plot: no more
    plots = len(PLOTS) + len(RUN_IDS) + 1
    assert page.count("<script") == page.count("</script>") == 2 + plots
    assert "&lt;/script&gt;&lt;script&gt;alert(&quot;x&quot;)" in page  # shown, as text


def test_partial_data_is_drawn_as_far_as_it_goes() -> None:
    """Windows never started or never stopped, distributions counted without a sample, a state
    of no known colour: the page is still made, and says what it leaves out."""
    skipped = window(1, "replica_0", 0, 0, state="skipped", started_ns=None, stopped_ns=None)
    running = window(1, "replica_1", 1, 0, state="running", stopped_ns=None)
    odd = window(1, "trainer", 1, 3, state="some-new-state", requested=None, observed=None)
    counted = Distribution(count=5, p50=0.1)
    step = StepReport(1, (skipped, running, odd), counted, counted, counted, {}, {}, ())
    page = render(RunReport("partial", Path("/x"), (step,), counted, Distribution()))
    assert "2 window(s) without a start or stop time not drawn" in page
    assert 'id="plot-windows"' in page and 'id="plot-forward-steps"' in page
    assert page.count("nothing to show:") == len(PLOTS) - 2 + 1 + 1  # step on one clock, run
    assert "nothing to show: no window, request or forward step of this step" in page


def test_a_window_bar_ends_where_its_capture_ended() -> None:
    """An auto-stopped window's bar ends at its capture's end (``ended_ns``: its last forward
    step), not at the stop aprof recorded at the step's end; another's at its stop."""
    stopped = window(1, "replica_0", 1.0, 9.0, ended_ns=at(1.5))
    trainer = window(1, "trainer", 2.0, 9.0)
    assert stopped.capture_end_ns == at(1.5) and trainer.capture_end_ns == at(9.0)
    none = Distribution()
    step = StepReport(1, (stopped, trainer), none, none, none, {}, {}, ())
    fig = windows_gantt(RunReport("ends", Path("/x"), (step,), none, none))
    assert not isinstance(fig, str)
    (bars,) = fig.data
    assert list(bars.y) == ["replica_0", "trainer"]
    assert list(bars.x) == pytest.approx([500.0, 7000.0])  # ms from each start
    assert "stop recorded 7.50 s later" in bars.hovertext[0]
    assert "stop recorded" not in bars.hovertext[1]


def test_overlapping_requests_take_as_few_lanes_as_they_need() -> None:
    def spans(*pairs: tuple[int, int]) -> list[Interval]:
        return [Interval(begin, end, "r") for begin, end in pairs]

    assert lanes([]) == ([], 0)
    assert lanes(spans((0, 10), (10, 20), (20, 30))) == ([0, 0, 0], 1)  # end to end: one
    assert lanes(spans((0, 10), (5, 15), (12, 20), (16, 30))) == ([0, 1, 0, 1], 2)
    found, count = lanes(spans(*[(k, 100 + k) for k in range(12)]))
    assert count == 12 and sorted(found) == list(range(12))
    shuffled = spans(
        *random.Random(3).sample([(k * 7 % 50, k * 7 % 50 + 9) for k in range(40)], 40)
    )
    found, count = lanes(shuffled)
    for lane in set(found):
        mine = sorted(
            (i.begin_ns, i.end_ns) for i, n in zip(shuffled, found, strict=True) if n == lane
        )
        assert all(a[1] <= b[0] for a, b in pairwise(mine))
    deepest = max(sum(i.begin_ns <= t < i.end_ns for i in shuffled) for t in range(60))
    assert count == deepest  # as few as the deepest overlap


def test_a_step_on_one_clock_folds_deep_overlaps_and_says_what_it_left_out() -> None:
    step = realistic().steps[0]
    deep = tuple(Interval(at(1), at(2 + k / 100), f"request {k}", "captured") for k in range(20))
    rows = (*step.timeline, Row("requests → replica_9", deep, "requests", left_out=7))
    made, lines = step_on_one_clock(replace(step, timeline=rows))
    assert not isinstance(made, str)
    categories = list(made.layout.yaxis.categoryarray)[::-1]
    assert categories[:14] == [
        "step 1",
        "trainer · window",
        "replica_0 · window",
        "replica_1 · window",
        "requests → replica_0",
        *(f"requests → replica_0 · {k}" for k in range(2, 9)),
        "replica_0 · iterations",
        "requests → replica_1",
    ]
    assert categories[-MAX_LANES:] == [
        "requests → replica_9",
        *(f"requests → replica_9 · {k}" for k in range(2, MAX_LANES + 1)),
    ]
    bars = [
        (y, text) for trace in made.data for y, text in zip(trace.y, trace.hovertext, strict=True)
    ]
    assert len(bars) == sum(len(row.items) for row in rows)  # one bar per request, none lost
    last = [text for y, text in bars if y == f"requests → replica_9 · {MAX_LANES}"]
    assert len(last) == 20 - (MAX_LANES - 1)  # the folded lanes drawn in the last
    assert all(f"lanes {MAX_LANES}-20 drawn in lane {MAX_LANES}" in text for text in last)
    assert lines == [
        f"requests → replica_9: 20 requests overlap 20 deep; lanes {MAX_LANES}-20 drawn in "
        f"lane {MAX_LANES}, overlapping",
        "7 more not drawn: a step keeps its earliest requests, forward steps and ranges only "
        "(aprof._report.clock.TIMELINE_ITEMS)",
    ]
    page = render(replace(realistic(), steps=(replace(step, timeline=rows),)))
    assert "7 more not drawn" in page and "overlap 20 deep" in page


def test_write_puts_the_page_below_save_path_and_follows_no_link(tmp_path: Path) -> None:
    save_path = tmp_path / "run"
    path = write(empty(), save_path)
    assert path == save_path / FILE_NAME and "empty-run" in path.read_text()
    path = write(realistic(), save_path)  # replaced
    assert realistic().run_id in path.read_text()
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    path.unlink()
    path.symlink_to(outside)
    write(empty(), save_path)
    assert outside.read_text() == "keep me"
    assert path.is_file() and not path.is_symlink()
    assert sorted(p.name for p in save_path.iterdir()) == [FILE_NAME]  # no temporary file left


def test_import_aprof_does_not_import_plotly() -> None:
    code = "import sys, aprof, aprof._report.html; assert 'plotly' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


# --- the run across all its steps --------------------------------------------------------------


def stacked(figure: object) -> dict[str, list[float]]:
    """The phase time figure's stacked bars: per phase, its seconds per step drawn."""
    return {t.name: list(t.y) for t in figure.data if t.type == "bar" and t.showlegend is False}  # type: ignore[attr-defined]


def test_the_stacked_phases_add_up_to_each_steps_wall_time_and_anomalies_are_marked() -> None:
    steps = accounts()
    figure = phase_time(steps)
    bars = stacked(figure)
    assert list(bars) == ["rollout only", "overlap", "train only", "idle"]
    for k, step in enumerate(steps):
        parts = [bars[name][k] for name in bars]
        assert sum(parts) == pytest.approx(step.wall_s, rel=1e-12, abs=1e-12)
        assert all(part >= -1e-12 for part in parts)
    assert bars["overlap"][2] == 0.4 and bars["rollout only"][2] == pytest.approx(3.1 - 0.4)
    marks = [t for t in figure.data if t.type == "scatter"]
    assert len(marks) == 1
    assert list(marks[0].x) == [5] and list(marks[0].y) == [steps[4].wall_s]
    assert list(marks[0].text) == ["\u00d72.5 rollout"]
    for trace in figure.data:
        if trace.type == "bar" and trace.showlegend is False:  # hatched: the profiled steps
            assert list(trace.marker.pattern.shape) == ["/", "/", "", "", "", ""]
    legend = [t.name for t in figure.data if t.showlegend is not False]
    assert "profiled step" in legend and legend[:4] == list(bars)
    page = render(realistic())
    assert "\u00d72.5 rollout" in page and "anomalous: \u00d72.5 rollout" in page


def test_profiled_steps_link_to_their_pictures_on_one_clock() -> None:
    page = render(realistic())
    links = re.search(rf'<p class="links" id="{PROFILED_LINKS_ID}">(.*?)</p>', page)
    assert links is not None
    targets = re.findall(r'<a href="#([^"]+)">step (\d+)</a>', links.group(1))
    assert targets == [(f"{step_plot_id(n)}-section", str(n)) for n in (1, 2)]
    for target, _ in targets:
        assert page.count(f'id="{target}"') == 1
    # A profiled step the page has no section of is named, not linked.
    page = render(replace(realistic(), steps=realistic().steps[:1]))
    links = re.search(rf'id="{PROFILED_LINKS_ID}">(.*?)</p>', page)
    assert links is not None and links.group(1).endswith(", step 2")


def test_the_busy_time_heat_map_has_a_row_per_replica_and_a_column_per_step() -> None:
    steps = (*accounts(), account(7, 5.0, rollout=4.0, train=0.5, busy=(3.0, 3.5, 1.0)))
    figure = replica_busy(steps)
    assert not isinstance(figure, str)
    (heat,) = figure.data
    assert list(heat.x) == [1, 2, 3, 4, 5, 6, 7]
    assert list(heat.y) == ["replica_0", "replica_1", "replica_2"]
    assert [row[4] for row in heat.z] == [9.5, 2.0, None]  # step 5: replica_1 waited
    assert heat.z[2][6] == 1.0 and heat.text[0][4] == (
        "requests: 24<br>tokens: 384 generated, 960 of prompts<br>tokens/s: 40.4"
    )
    assert "busy: %{z:.3f} s" in heat.hovertemplate
    no_requests = [account(1, 2.0, rollout=0.0, train=1.0, busy=())]
    assert replica_busy(no_requests) == "no replica had a request in flight in any step"


def test_the_tail_table_lists_the_slowest_steps_longest_first() -> None:
    many = [account(n, 1.0 + (n * 7919 % 97) / 10, rollout=0.5, train=0.2) for n in range(1, 60)]
    slowest = slowest_steps(many)
    assert len(slowest) == SLOWEST_STEPS
    assert [a.wall_s for a in slowest] == sorted((a.wall_s for a in many), reverse=True)[:10]
    page = render(realistic())
    table = page[page.index(f'id="{TAIL_ID}"') : page.index("</table>")]
    rows = re.findall(r"<tr><td>(.*?)</td>", table)
    assert rows == [  # the slowest first, the profiled ones linked to their sections
        f'<a href="#{step_plot_id(1)}-section">step 1</a>',
        f'<a href="#{step_plot_id(2)}-section">step 2</a>',
        "step 5",
        "step 4",
        "step 6",
        "step 3",
    ]
    assert "sample0-t2 \u00b7 replica_1 \u00b7 7.22 s" in table and "10.0%" in table
    assert "\u00b7 trajectory sample0-t2 turn 2" in table


def test_a_run_without_accounts_says_so_in_one_line() -> None:
    page = render(replace(realistic(), accounts=()))
    section = page[page.index('<section id="run-section">') :]
    section = section[: section.index("</section>") + len("</section>")]
    assert section == (
        f'<section id="run-section"><h2>{RUN_TITLE}</h2><p class="empty">nothing to show: no '
        "step span on the driver&#x27;s timeline (a run without timeline)</p></section>"
    )
    assert all(f'id="{plot_id}"' not in page for plot_id in RUN_IDS)
    assert page.index(RUN_TITLE) < page.index(f'id="{PLOT_IDS[0]}"')


def test_a_long_run_draws_an_even_sample_with_every_anomalous_and_profiled_step() -> None:
    total = 5 * MAX_STEPS_DRAWN + 1
    anomaly = Anomaly(2.2, "idle")
    marked = {7, 8, 9, 10, 4321, 9999}
    steps = [
        account(
            n,
            1.0 + n / total,
            rollout=0.5,
            train=0.2,
            profiled=n in (7, 8, 4321),
            anomaly=anomaly if n in (9, 10, 9999) else None,
        )
        for n in range(1, total + 1)
    ]
    drawn = drawn_steps(steps)
    numbers = [a.step for a in drawn]
    assert len(drawn) == MAX_STEPS_DRAWN and numbers == sorted(set(numbers))
    assert marked <= set(numbers)
    rest = [n for n in numbers if n not in marked]
    assert rest[0] == 1 and rest[-1] == total  # spread over the whole run
    gaps = {b - a for a, b in pairwise(rest)}
    assert max(gaps) - min(gaps) <= 2 * len(marked) + 1  # evenly, but for the marked
    assert drawn_steps(steps[:MAX_STEPS_DRAWN]) == steps[:MAX_STEPS_DRAWN]  # all when they fit
    only_marked = [replace(a, profiled=True) for a in steps[: 3 * MAX_STEPS_DRAWN]]
    assert len(drawn_steps(only_marked)) == MAX_STEPS_DRAWN
    page = render(replace(realistic(), accounts=tuple(steps)))
    line = (
        f"{MAX_STEPS_DRAWN} of {total} steps drawn: every anomalous and profiled step and an "
        "even sample of the rest."
    )
    assert page.count(line) == 2  # under both per-step plots
    figure = phase_time(drawn)
    assert all(len(t.x) == MAX_STEPS_DRAWN for t in figure.data if t.showlegend is False)


# --- the page, in a real browser ----------------------------------------------------------------


@dataclass
class Loaded:
    """What the browser saw while loading a page."""

    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    shots: dict[str, bytes] = field(default_factory=dict)
    """Each plot's PNG screenshot, by the id of its div."""
    traces: dict[str, int] = field(default_factory=dict)
    """Each plot's drawn traces (the SVG groups plotly gives the class ``trace``, or ``hm`` for
    a heat map's image)."""
    links: list[tuple[str, str, bool]] = field(default_factory=list)
    """The links to the profiled steps' sections: text, target id, whether it is there."""
    followed: list[str] = field(default_factory=list)
    """The page's location hash after clicking each of them."""


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    """A fresh headless Chromium (the OS package, its own new profile)."""
    if CHROMIUM is None:
        pytest.skip("no Chromium: install the OS package (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()


def load(context: object, path: Path, *, full_page: Path | None = None) -> Loaded:
    """Open ``path`` from disk in ``context``, wait until plotly has drawn every plot, and
    screenshot each (and the whole page to ``full_page``)."""
    seen = Loaded()
    page = context.new_page()  # type: ignore[attr-defined]
    page.on(
        "console",
        lambda m: seen.errors.append(f"console: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda exc: seen.errors.append(f"pageerror: {exc}"))
    page.on("requestfailed", lambda r: seen.errors.append(f"request failed: {r.url}"))
    page.on("request", lambda r: seen.requests.append(r.url))
    page.goto(path.as_uri(), wait_until="load", timeout=30_000)
    page.wait_for_function(ALL_DRAWN, timeout=30_000)
    for element in page.query_selector_all(".js-plotly-plot"):
        plot_id = element.get_attribute("id")
        seen.traces[plot_id] = len(element.query_selector_all(TRACES))
        seen.shots[plot_id] = element.screenshot(animations="disabled")
    seen.links = [tuple(link) for link in page.evaluate(LINKS)]
    for link in page.query_selector_all(f"#{PROFILED_LINKS_ID} a"):
        link.click()
        seen.followed.append(page.evaluate("location.hash"))
    if full_page is not None:
        page.screenshot(path=str(full_page), full_page=True, animations="disabled")
    page.close()
    return seen


def drawn(png: bytes) -> tuple[int, float]:
    """How many colours a screenshot holds, and the share of its pixels in colour: the traces'
    colours, not the white, greys and slate blue of the page, axes, grid and labels (a plot
    with its traces hidden has none)."""
    from PIL import Image

    data = Image.open(io.BytesIO(png)).convert("RGB").tobytes()
    pixels = [data[i : i + 3] for i in range(0, len(data), 3)]
    coloured = sum(1 for r, g, b in pixels if max(r, g, b) - min(r, g, b) > 60)
    return len(set(pixels)), coloured / len(pixels)


def check(seen: Loaded, expected: list[str]) -> None:
    assert seen.errors == []
    off_disk = [url for url in seen.requests if not url.startswith(LOCAL_SCHEMES)]
    assert off_disk == []
    assert sorted(seen.shots) == sorted(expected)
    for plot_id, png in seen.shots.items():
        assert seen.traces[plot_id] > 0, plot_id
        colours, share = drawn(png)
        assert colours > 100 and share > 0.001, (plot_id, colours, share)


def hover(page: object, plot_id: str, where: object, *parts: str) -> None:
    """Hover ``where`` (points, or axis values) of a plot and wait until plotly shows a label
    holding each of ``parts`` (plotly may hold a hover back a moment: no sleep, a condition)."""
    page.evaluate(  # type: ignore[attr-defined]
        "([id, where]) => Plotly.Fx.hover(document.getElementById(id), where)", [plot_id, where]
    )
    page.wait_for_function(  # type: ignore[attr-defined]
        """([id, parts]) => [...document.getElementById(id).querySelectorAll('.hovertext')]
            .some(e => parts.every(part => e.textContent.includes(part)))""",
        arg=[plot_id, list(parts)],
        timeout=10_000,
    )


def check_links(seen: Loaded) -> None:
    """The profiled steps 1 and 2 are linked to their sections, which are on the page, and
    clicking a link goes there."""
    targets = {n: f"{step_plot_id(n)}-section" for n in (1, 2)}
    assert seen.links == [(f"step {n}", target, True) for n, target in targets.items()]
    assert seen.followed == [f"#{target}" for target in targets.values()]


def test_the_page_loads_offline_and_every_plot_renders(browser: object, tmp_path: Path) -> None:
    path = write(realistic(), tmp_path / "run")
    seen = load(browser, path)
    check(seen, RUN_IDS + PLOT_IDS + STEP_IDS)
    check_links(seen)
    # The check sees the traces, not the frame: with them hidden each plot reads as blank.
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_function(ALL_DRAWN, timeout=30_000)
    # Hover text is that of the point hovered (the heat map's rows in their own order).
    hover(page, REPLICAS_ID, {"xval": 5, "yval": 1}, "step 5 \u00b7 replica_1", "busy: 2.000 s")
    hover(page, REPLICAS_ID, {"xval": 5, "yval": 1}, "requests: 24", "tokens/s: 192.0")
    hover(page, REPLICAS_ID, {"xval": 5, "yval": 0}, "replica_0", "busy: 9.500 s", "40.4")
    point = [{"curveNumber": 0, "pointNumber": 0}]
    hover(page, PHASES_ID, point, "step 1 \u00b7 profiled", "rollout only: 13.000 s", "14.600 s")
    # The servers' side: step 2's replica_1 waited 30 ms in the queue (its fourth bar).
    bar = [{"curveNumber": 0, "pointNumber": 3}]
    hover(page, "plot-server-side", bar, "step 2 \u00b7 replica_1", "queued: p50 30.00 ms")
    hidden = f"{TRACES}, .legend, .colorbar, .hoverlayer"
    page.add_style_tag(content=f"{hidden} {{ visibility: hidden !important; }}")
    for element in page.query_selector_all(".js-plotly-plot"):
        assert drawn(element.screenshot())[1] == 0
    page.close()


def test_an_empty_run_loads_without_errors(browser: object, tmp_path: Path) -> None:
    path = write(empty(), tmp_path / "run")
    seen = Loaded()
    page = browser.new_page()  # type: ignore[attr-defined]
    page.on("console", lambda m: seen.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: seen.errors.append(str(exc)))
    page.goto(path.as_uri(), wait_until="load")
    assert page.locator(".empty").count() == len(PLOTS) + 1 and seen.errors == []
    page.close()


def test_a_demo_runs_report_renders(browser: object, demo_run: Path) -> None:
    report = collect(demo_run)
    assert [s.step for s in report.steps] == [1, 2] and all(s.timeline for s in report.steps)
    seen = load(browser, demo_run / "report.html")  # the demo's own page
    # Every plot but the servers' side: the reference server sends no request spans.
    drawn_ids = [p for p in PLOT_IDS if p != "plot-server-side"]
    assert "no server sent spans of the run" in (demo_run / "report.html").read_text()
    check(seen, RUN_IDS + drawn_ids + STEP_IDS)
    check_links(seen)


def test_a_demo_runs_steps_are_all_accounted_for_on_the_page(demo_run: Path) -> None:
    report = collect(demo_run)
    assert [(a.step, a.profiled) for a in report.accounts] == [(1, True), (2, True), (3, False)]
    page = (demo_run / "report.html").read_text()
    bars = stacked(phase_time(report.accounts))
    for k, step in enumerate(report.accounts):
        assert sum(bars[name][k] for name in bars) == pytest.approx(step.wall_s, rel=1e-9)
    for plot_id in (PHASES_ID, REPLICAS_ID):
        assert page.count(f'id="{plot_id}"') == 1
    for replica in ("replica_0", "replica_1"):
        assert f'"{replica}"' in page[page.index(f'id="{REPLICAS_ID}"') :]
