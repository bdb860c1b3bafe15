"""aprof inside verl 0.9.1's real training loop: each V1 mode and the legacy trainer, turned on
by configuration alone (``examples/verl_ppo.py``), 3 global steps with step 2 profiled."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
from verl_runs import RUN_S, Run, run_example, steps_of, windows

import aprof
from aprof._otel.spans import step_of

PROFILED = 2
STEPS = 3
ROLLOUTS = 4 * 2
"""Rollouts verl makes per step: ``data.train_batch_size`` 4 prompts, ``rollout.n`` 2."""
ASYNC = ("colocate_async", "separate_async")
EXCLUSIVE = "[{role:actor,replicas:all,exclusive:true}]"
"""The actor's captures and its replicas' never run at once (Hydra's override grammar)."""


@pytest.fixture(scope="module", params=["sync", "colocate_async", "separate_async", "legacy"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    mode: str = request.param
    out = tmp_path_factory.mktemp(mode)
    asked: list[subprocess.CompletedProcess[str]] = []
    # In sync: a person asks the live run for one more step (`aprof capture`).
    during = (lambda save_path: asked.append(capture_next(save_path))) if mode == "sync" else None
    # In sync too: vLLM's own request spans sent to aprof's receiver (otel.receive).
    extra = ["++aprof.otel.receive=true"] if mode == "sync" else []
    if mode != "separate_async":
        # The hybrid engine's replicas share the actor's devices; the captures there exclude
        # each other by default only for npu and nsys: here torch's do too (verl #7722).
        extra.append(f"++aprof.colocated={EXCLUSIVE}")
    done = run_example(
        out, mode, "--steps", str(PROFILED), "--num-steps", str(STEPS), *extra, during=during
    )
    assert done.code == 0, f"{mode}: verl exited {done.code}:\n{done.log[-4000:]}"
    done.mode = mode  # type: ignore[attr-defined]
    done.asked = asked  # type: ignore[attr-defined]
    return done


def capture_next(save_path: Path) -> subprocess.CompletedProcess[str]:
    """``aprof capture --next 1 --wait`` as soon as the run at ``save_path`` is live."""
    deadline = time.monotonic() + RUN_S
    while not (save_path / "control" / "status.json").is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no live run at {save_path}")
        time.sleep(0.5)  # another process's file: nothing to wait on but its appearance
    command = [sys.executable, "-m", "aprof", "capture", "--next", "1", "--wait"]
    command += ["--timeout", str(RUN_S), str(save_path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=RUN_S * 2)


def mode_of(run: Run) -> str:
    mode: str = run.mode  # type: ignore[attr-defined]
    return mode


def test_the_profiled_step_captured_the_replica_and_the_actor(run: Run) -> None:
    found = {w.target: w for w in windows(run.save_path, PROFILED)}
    # separate_async: replica 0 is the hybrid one, lent back to training; 1 generates.
    replica = found["replica_1" if mode_of(run) == "separate_async" else "replica_0"]
    assert replica.state == "done", replica
    assert replica.files, "the replica's capture wrote no trace"
    observed = replica.forward_steps.observed
    assert observed is not None and observed <= (replica.forward_steps.requested or math.inf)
    if mode_of(run) != "colocate_async":
        # colocate_async generates mostly from the step before's weight sync on, and its
        # rollout capture ends as the step's samples are taken (verl #7722): it may see none.
        assert observed > 0, replica
    actor = found["actor"]
    assert actor.state == "done", actor
    ranks = {c.rank: c for c in actor.captures}
    assert 0 in ranks and ranks[0].files, actor
    traces = [f.path for f in ranks[0].files]
    assert all(p.startswith(f"step_{PROFILED}/actor/rank_0/") for p in traces), traces
    for path in traces:
        assert (run.save_path / path).is_file()
    # The config selects no other step.
    for step in set(range(1, STEPS + 1)) - {PROFILED}:
        assert not [w for w in windows(run.save_path, step) if w.requested_by == "config"]


def test_a_capture_asked_while_the_run_goes_on_is_answered_and_captured(run: Run) -> None:
    if mode_of(run) != "sync":
        pytest.skip("asked in the sync run")
    (asked,) = run.asked  # type: ignore[attr-defined]
    assert asked.returncode == 0, asked.stdout + asked.stderr
    (answer_file,) = (run.save_path / "control" / "answers").glob("*.json")
    answer = json.loads(answer_file.read_text())
    assert answer["accepted"] and len(answer["steps"]) == 1, answer
    (step,) = answer["steps"]
    # The next step not yet begun when the run read the request; one the config also
    # selects is captured once (the answer names it "merged").
    captured = {w.target: w for w in windows(run.save_path, step)}
    assert set(answer["targets"]) <= set(captured), (answer, captured)
    assert all(captured[t].state == "done" for t in answer["targets"]), captured


def test_the_rollout_and_training_captures_never_overlap_on_shared_devices(run: Run) -> None:
    """The hybrid engine's replicas share the actor's devices, their captures exclusive: the
    actor's captures (one per annotated stage, the first stage after generation included) run
    once the step's rollout capture has stopped (verl #7722)."""
    if mode_of(run) == "separate_async":
        pytest.skip("the standalone replica has devices of its own")
    (colocated,) = aprof.load_manifest(run.save_path).config["colocated"]
    assert (colocated["role"], colocated["exclusive"]) == ("actor", True)
    found = windows(run.save_path, PROFILED)
    (rollout,) = [w for w in found if w.kind == "rollout"]
    (actor,) = [w for w in found if w.target == "actor"]
    assert actor.waited_for is not None and rollout.target in actor.waited_for.targets, actor
    assert rollout.stopped_ns is not None and actor.captures
    for capture in actor.captures:
        assert rollout.stopped_ns <= capture.started_ns, (capture.stage, rollout, actor)
    assert {c.stage for c in actor.captures} == {"actor_compute_log_prob", "actor_update"}


def test_every_step_is_accounted_and_its_phases_sum_to_its_wall_time(run: Run) -> None:
    steps = steps_of(run.report())
    assert set(steps) == set(range(1, STEPS + 1))
    for n, step in steps.items():
        p = step["phases"]
        phases = p["rollout_s"] + p["train_s"] - p["overlap_s"] + p["idle_s"]
        assert phases == pytest.approx(step["wall_s"], rel=1e-6, abs=1e-6), n
        assert p["train_s"] > 0, n  # the trainer's stages are on the driver's timeline


def test_the_requests_aprof_counted_are_the_rollouts_verl_made(run: Run) -> None:
    steps = steps_of(run.report())
    if mode_of(run) in ASYNC:
        # Generation runs ahead of training (a warm-up batch), and an aborted request is
        # sent again: every rollout verl trained on was a request aprof counted.
        assert sum(s["requests"]["count"] for s in steps.values()) >= STEPS * ROLLOUTS
    else:
        assert [steps[n]["requests"]["count"] for n in sorted(steps)] == [ROLLOUTS] * STEPS


def test_separate_async_generation_overlaps_training(run: Run) -> None:
    if mode_of(run) != "separate_async":
        pytest.skip("only separate_async generates while it trains")
    steps = steps_of(run.report())
    assert all(steps[n]["phases"]["overlap_s"] > 0 for n in range(2, STEPS + 1)), steps


def test_verl_logged_aprof_figures_for_every_step(run: Run) -> None:
    logged = run.logged()
    assert {step for step, _ in logged} == set(range(1, STEPS + 1))
    # Each step's figures come with the next step's metrics, the last step's as the run ends.
    figures = {int(data["aprof/step"]): data for _, data in logged if "aprof/step" in data}
    assert set(figures) == set(range(1, STEPS + 1))
    for n, found in figures.items():
        for key in ("wall_s", "rollout_s", "train_s", "idle_s", "requests"):
            assert f"aprof/{key}" in found, (n, sorted(k for k in found if "aprof" in k))
        assert 0 <= found["aprof/trainer_idle_ratio"] <= 1
        assert 0 <= found["aprof/rollout_idle_ratio"] <= 1
        if mode_of(run) not in ASYNC:  # a step's requests all end within it
            assert found["aprof/requests"] == ROLLOUTS, (n, found)
    for step, data in logged:
        assert data.get("aprof/step", step - 1) in (step - 1, step)


def test_verls_own_profiler_stayed_off(run: Run) -> None:
    # verl's rollout profiler would write its traces beside aprof's, in these folders.
    assert not list(run.save_path.glob("agent_loop_rollout_replica_*/*.json*"))
    # Nothing of aprof's failed: the hook, the trainer, the targets (separate_async takes its
    # hybrid replica out of the targets as step 1 lends it back to training), the client.
    for failed in (
        "aprof verl hook failed",
        "aprof verl trainer not loaded",
        "aprof: target not added",
        "aprof: target not removed",
        "aprof: rollout client not profiled",
        "aprof: worker not profiled",
        "aprof profiler did not open",
    ):
        assert failed not in run.log, failed


def test_vllms_own_request_spans_nest_under_aprofs_requests(run: Run) -> None:
    if mode_of(run) != "sync":
        pytest.skip("otel.receive is on in the sync run")
    manifest = aprof.load_manifest(run.save_path)
    salt = manifest.trace_salt
    assert salt is not None
    # The trace context aprof's client handed through verl's server actor to the engine.
    path = run.save_path / "otel" / f"step_{PROFILED}.spans.jsonl"
    spans = [json.loads(line) for line in path.read_text().splitlines()]
    requests = [s for s in spans if s["name"] == "llm_request"]
    assert len(requests) == ROLLOUTS, spans
    assert all(step_of(s["trace_id"], salt) == PROFILED for s in requests)
    assert all(s["parent_span_id"] for s in requests)
    (merged,) = aprof.merge(run.save_path, steps=[PROFILED])
    with gzip.open(merged.path, "rt") as f:
        doc = json.load(f)
    served = [e for e in doc["traceEvents"] if e.get("cat") == "aprof.server"]
    assert sum(e["name"] == "llm_request" for e in served) == ROLLOUTS


def test_each_trajectory_carries_its_staleness_as_verl_counts_it(run: Run) -> None:
    if mode_of(run) == "legacy":
        pytest.skip("the legacy trainer is synchronous: its trajectories are never stale")
    steps = steps_of(run.report())
    stale = {n: steps[n]["staleness"] for n in range(1, STEPS + 1)}
    key = "training/off_policy/trajectory_staleness/max"
    logged = {step: data[key] for step, data in run.logged() if key in data}
    for n, found in stale.items():
        # The trajectories the step trained on, each as verl's own metric counts it.
        assert found is not None and found["count"] == ROLLOUTS, (n, found)
        assert found["max"] == logged[n], n
