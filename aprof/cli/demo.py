"""``aprof demo``: a small async RL loop, profiled end to end, with a table of what was captured.

It launches ``--replicas`` reference servers (subprocesses; ``--server reference sglang``: in
their SGLang dialect), or profiles running servers (``--server vllm|sglang URL ...``), then
runs ``--num-steps`` global steps: each step rolls out ``--concurrency`` multi-turn
tool-calling agent loops over the replicas and trains a tiny policy on CPU. The ``--steps``
steps are profiled: a rollout window on every replica but the last of two or more
(auto-stopped by the server after ``--forward-steps`` engine forward steps; the last replica's
requests are the step's uncaptured ones, beside which the report sets the captured) and a
``trainer`` role window around the policy update. Every step's policy update is the trainer
stage ``update_policy`` on the driver's timeline (``prof.stage``), which the report counts as
the step's training time; in ``--mode fully-async`` the rollouts go on during it. Everything
goes under ``--out``; the servers' and the trainer's own output goes to log files under
``--out``/logs.

examples:
  aprof demo
  aprof demo --mode fully-async --out aprof-demo-async
  aprof demo --server vllm http://127.0.0.1:8000 http://127.0.0.1:8001
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import itertools
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import aiohttp

from agentloop import (
    AgentLoopRunner,
    LLMClient,
    Sample,
    ScriptedToolCalls,
    ToolAgentLoop,
    Trajectory,
    calculator,
    search,
)
from aprof import (
    AprofError,
    CaptureTarget,
    ConfigError,
    Manifest,
    ManifestError,
    Profiler,
    ProfilerConfig,
    WorkerGroup,
    configure_logging,
    describe,
    load_config,
    merge,
    report,
)
from aprof._report import summary
from aprof.cli._demo_trainer import TrainerProcess
from servers import LaunchError, SGLangServer, VLLMServer, launch, launch_spec
from servers.process import free_port

REFERENCE_VERSION = "0.32.0"
"""The vLLM release the reference servers imitate: per-capture bounds, so they auto-stop."""
TRAINER_LOG = "trainer.log"
"""The trainer process's output (torch's own lines among it), in the run's ``logs`` folder."""
PROMPTS = (
    "Add the numbers and look up what you need: ",
    "Plan the next tool call. ",
    "Question: how does continuous batching work? ",
    "Compute, then search, then answer. ",
)


def arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aprof demo``."""
    parser.add_argument(
        "--server",
        nargs="+",
        default=["reference"],
        metavar=("KIND", "ARG"),
        help="'reference [vllm|sglang]' (the default: launch reference servers, in the vLLM "
        "dialect unless 'sglang' is given), 'vllm URL [URL ...]' or 'sglang URL [URL ...]' "
        "(running vLLM or SGLang servers launched with profiling, one replica per URL)",
    )
    parser.add_argument("--mode", choices=("sync", "fully-async"), default="sync")
    parser.add_argument("--steps", default="1,2,5", help="global steps to profile (default 1,2,5)")
    parser.add_argument("--num-steps", type=int, default=6, help="global steps to run (default 6)")
    parser.add_argument("--replicas", type=int, default=2, help="reference servers (default 2)")
    parser.add_argument(
        "--concurrency", type=int, default=16, help="agent loops per step (default 16)"
    )
    parser.add_argument(
        "--forward-steps",
        type=int,
        default=8,
        help="engine forward steps per rollout window (default 8)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("aprof-demo"), help="output folder (default aprof-demo)"
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 on success, 1 with one line on stderr on bad input or a failed launch."""
    problem = _check(args)
    if problem is not None:
        print(f"aprof demo: {problem}", file=sys.stderr)
        return 1
    try:
        config = load_config(
            {
                "global_profiler": {
                    "steps": args.steps,
                    "save_path": str(args.out),
                    "wait_for_stops": True,
                },
                "rollout": {"replicas": _captured(args), "forward_steps": args.forward_steps},
                "roles": {"trainer": {"discrete": True}},
                "log": {"level": "warning"},
            }
        )
    except ConfigError as exc:
        print(f"aprof demo: {exc}", file=sys.stderr)
        return 1
    configure_logging(config.log.format, config.log.level)
    logs = config.global_profiler.save_path / "logs"
    try:
        manifest = asyncio.run(_main(args, config, logs))
    except (LaunchError, _ServerError) as exc:
        print(f"aprof demo: {exc}", file=sys.stderr)
        return 1
    except BrokenProcessPool:
        print(
            f"aprof demo: the trainer's process failed (see {logs / TRAINER_LOG})", file=sys.stderr
        )
        return 1
    _print_table(manifest, config.global_profiler.save_path)
    _print_merged(config.global_profiler.save_path)
    _print_report(config.global_profiler.save_path)
    servers = "replica_<r>.log: the servers; " if args.server[0] == "reference" else ""
    print(f"logs: {logs} ({servers}{TRAINER_LOG}: the trainer, with torch's own lines)")
    return 0


def _captured(args: argparse.Namespace) -> list[int]:
    """The replicas with rollout windows: all but the last of two or more, whose requests go
    uncaptured in the same steps, under the same load."""
    kind, *rest = args.server
    count = len(rest) if kind in _URL_SERVERS else args.replicas
    return list(range(max(1, count - 1)))


class _ServerError(AprofError):
    """A server given with ``--server vllm|sglang URL`` cannot be used."""


def _check(args: argparse.Namespace) -> str | None:
    if importlib.util.find_spec("torch") is None:
        # The reference servers and the trainer run torch models.
        return "needs torch: pip install torch==2.13.0 (the CPU build) or any torch >= 2.4"
    for flag in ("num_steps", "replicas", "concurrency", "forward_steps"):
        if getattr(args, flag) < 1:
            return f"--{flag.replace('_', '-')} must be >= 1"
    kind, *rest = args.server
    if kind == "reference":
        if rest and rest not in (["vllm"], ["sglang"]):
            got = " ".join(rest)
            return f"--server reference: expected the dialect 'vllm' or 'sglang', got {got!r}"
        return None
    if kind not in _URL_SERVERS:
        return (
            "--server: expected 'reference [vllm|sglang]', 'vllm URL [URL ...]' or "
            f"'sglang URL [URL ...]', got {kind!r}"
        )
    if not rest:
        return f"--server {kind} needs the URL of at least one running {_URL_SERVERS[kind]} server"
    bad = [url for url in rest if not url.startswith(("http://", "https://"))]
    if bad:
        return f"--server {kind}: not an http(s) URL: {bad[0]!r}"
    return None


_URL_SERVERS = {"vllm": "vLLM", "sglang": "SGLang"}
"""The ``--server`` kinds that take the URLs of running servers, with their engines' names."""


async def _main(args: argparse.Namespace, config: ProfilerConfig, logs: Path) -> Manifest:
    out = config.global_profiler.save_path
    async with contextlib.AsyncExitStack() as stack:
        # Left last: the windows' final stops call into the trainer's process.
        trainer = stack.enter_context(TrainerProcess(config, logs / TRAINER_LOG))
        # Entered before the profiler, left after it: the servers outlive its final stops.
        urls, model, targets = await _servers(args, config, logs, stack)
        await trainer.ready()
        prof = Profiler(config)
        for target in targets:
            prof.add_target(target)
        prof.add_target(WorkerGroup("trainer", [trainer], config))
        await stack.enter_async_context(prof)
        llm = await stack.enter_async_context(
            LLMClient(urls, prof=prof, model=model, timeout_s=120.0)
        )
        loop = ToolAgentLoop(
            llm, [calculator, search], parser=ScriptedToolCalls(2), max_turns=3, max_tokens=16
        )
        runner = AgentLoopRunner(loop, concurrency=args.concurrency)
        samples = _samples()
        left = _uncaptured(config, urls)
        _say(f"profiling steps {args.steps} of {args.num_steps}{left}; output in {out}")
        if args.mode == "sync":
            for n in range(1, args.num_steps + 1):
                began = time.monotonic()
                async with prof.step(n):
                    batch = await runner.run_batch(itertools.islice(samples, args.concurrency))
                    loss = await _train(prof, trainer, batch)
                _progress(prof, n, args.num_steps, batch, loss, began)
        else:
            async with runner.stream(samples, max_staleness=1) as rollouts:
                for n in range(1, args.num_steps + 1):
                    began = time.monotonic()
                    async with prof.step(n):
                        batch = await rollouts.take(args.concurrency, timeout_s=120.0)
                        loss = await _train(prof, trainer, batch)
                    _progress(prof, n, args.num_steps, batch, loss, began)
    return prof.manifest


def _uncaptured(config: ProfilerConfig, urls: Sequence[str]) -> str:
    """Which replicas the demo leaves uncaptured, said in parentheses; empty if none."""
    left = [f"replica_{r}" for r in range(len(urls)) if not config.rollout.selects(r)]
    if not left:
        return ""
    return f" ({', '.join(left)} not captured: the report sets its requests beside the captured)"


async def _servers(
    args: argparse.Namespace, config: ProfilerConfig, logs: Path, stack: contextlib.AsyncExitStack
) -> tuple[list[str], str | None, list[CaptureTarget]]:
    """The replicas' URLs, the model to ask for, and their capture targets."""
    kind, *rest = args.server
    if kind in _URL_SERVERS:
        # Both serve the OpenAI completions API the agent loops speak, and list the model.
        adapter = VLLMServer if kind == "vllm" else SGLangServer
        targets = [adapter(url, replica=r) for r, url in enumerate(rest)]
        model = await _served_model(rest[0], shown=targets[0].base_url)
        return rest, model, list(targets)
    sglang = rest == ["sglang"]
    specs = [
        launch_spec(
            "reference",
            config,
            version=REFERENCE_VERSION,
            port=free_port(),
            dialect="sglang" if sglang else "vllm",
        )
        for _ in range(args.replicas)
    ]
    dialect = "SGLang" if sglang else "vLLM"
    _say(
        f"launching {len(specs)} reference servers ({dialect} dialect) and the trainer "
        f"(logs in {logs})"
    )
    launched = await asyncio.gather(
        *(launch(spec, log_path=logs / f"replica_{r}.log") for r, spec in enumerate(specs)),
        return_exceptions=True,
    )
    for server in launched:
        if not isinstance(server, BaseException):
            stack.push_async_callback(server.aclose)
    for server in launched:
        if isinstance(server, BaseException):
            raise server
    return (
        [spec.base_url for spec in specs],
        None,
        [spec.adapter(replica=r) for r, spec in enumerate(specs)],
    )


async def _served_model(url: str, *, shown: str) -> str:
    """The model a running vLLM or SGLang server serves (its first ``/v1/models`` entry);
    ``shown`` is ``url`` as an error names it (without its user and password)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(f"{url.rstrip('/')}/v1/models") as response,
        ):
            response.raise_for_status()
            body: dict[str, Any] = await response.json()
            return str(body["data"][0]["id"])
    except aiohttp.ClientResponseError as exc:  # its text names the URL as given
        raise _ServerError(f"{shown}/v1/models answered {exc.status}") from None
    except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, ValueError) as exc:
        why = describe(exc)
        raise _ServerError(f"cannot read the served model from {shown}/v1/models: {why}") from None


def _samples() -> Iterator[Sample]:
    for i in itertools.count():
        yield Sample(id=f"sample{i}", prompt=PROMPTS[i % len(PROMPTS)])


def _reward(traj: Trajectory) -> float:
    """A stand-in reward: the share of the trajectory's tool calls that answered."""
    results = [r for turn in traj.turns for r in turn.tool_results]
    return sum(r.ok for r in results) / len(results) if results else 0.0


async def _train(prof: Profiler, trainer: TrainerProcess, batch: Sequence[Trajectory]) -> float:
    """The step's policy update, as the trainer stage ``update_policy`` on the driver's
    timeline: the report counts it as the step's training time."""
    done = [traj for traj in batch if traj.ok]
    async with prof.stage("update_policy"):
        # In the trainer's process: the policy update is CPU-bound and the rollouts
        # (fully-async) go on meanwhile: their requests overlap the stage.
        return await trainer.update([traj.response for traj in done], [_reward(t) for t in done])


def _progress(
    prof: Profiler, n: int, total: int, batch: Sequence[Trajectory], loss: float, began: float
) -> None:
    failed = sum(not traj.ok for traj in batch)
    turns = sum(len(traj.turns) for traj in batch)
    windows = [w for w in prof.manifest.windows if w.step == n]
    captured = ", ".join(f"{w.target} {w.state}" for w in windows) or "not profiled"
    _say(
        f"step {n}/{total}: {len(batch)} rollouts ({failed} failed, {turns} turns), "
        f"loss {loss:.3f}, {time.monotonic() - began:.1f}s; {captured}"
    )


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _print_table(manifest: Manifest, out: Path) -> None:
    header = ("step", "target", "state", "stop", "fwd req/obs", "gated/admitted", "files", "size")
    rows = [header]
    for w in manifest.windows:
        fs = w.forward_steps
        rows.append(
            (
                str(w.step),
                w.target,
                w.state,
                w.stop_reason or "-",
                f"{'-' if fs.requested is None else fs.requested}/"
                f"{'-' if fs.observed is None else fs.observed}",
                f"{w.requests.gated}/{w.requests.admitted}" if w.kind == "rollout" else "-",
                str(len(w.files)),
                _size(sum(f.bytes for f in w.files)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    print(f"\nmanifest: {out / 'manifest.json'}")
    print(f"  windows of each step in {out / 'manifest'}/step_<n>.json, all: aprof.load_manifest")
    for timeline in manifest.timeline:
        print(f"timeline: {out / timeline.path}")


def _print_merged(out: Path) -> None:
    """Each profiled step merged onto one clock (``aprof merge``), and where to open it."""
    try:
        merged = merge(out)
    except (ManifestError, OSError, ValueError) as exc:  # the run itself is done and kept
        print(f"merged: none ({exc})")
        merged = []
    for step in merged:
        notes = f", {len(step.notes)} notes: aprof merge {out} --steps {step.step}"
        print(f"merged: {step.path} (step {step.step}{notes if step.notes else ''})")
    print(
        "open the merged steps, the timeline and any trace file (*.trace.json.gz) in "
        "https://ui.perfetto.dev"
    )


def _print_report(out: Path) -> None:
    """A few lines of ``aprof report`` (latency, gated wait, iteration times per step) and
    where its HTML is; the demo's run is done and kept whatever the report meets."""
    try:
        made = report(out)
    except Exception as exc:  # a report that cannot be made costs itself only
        print(f"report: none ({describe(exc)})")
        return
    print(f"report: {made.html} (all of it in the terminal: aprof report {out} --no-html)")
    sys.stdout.write(summary(made))


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            break
    return f"{size:.1f} {unit}"
