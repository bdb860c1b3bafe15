"""What hostile HTTP clients at the run's two servers (the control endpoint, the OTLP receiver)
cost a profiled run: the event loop's longest stall, its steps, its descriptors, its manifest.

Each scenario starts a run process of its own (this file with ``--run``): its descriptor limit
set to ``--nofile`` (1,024, as ``ulimit -n 1024``) with ``resource.setrlimit``, a profiler with
both servers on (``control.http`` and ``otel.receive``, each with a token file, every other
limit at its default), one recording capture target and every fifth step profiled. Each step
does ``--step-ms`` of work as 5 ms sleeps inside a request, so a stall of the event loop shows
as fewer steps. A probe task on the same loop wakes every millisecond and keeps the longest gap
between two wake-ups beyond its period (the stall) and, every 50 ms, the number of descriptors
open. This process is the attacker: it raises its own descriptor limit, starts the scenario's
clients, lets them settle for half a second, then tells the run to step for ``--seconds``.

Scenarios: no load; four senders of gzip bombs (``--bomb-mib`` of zeros, as large as each server
takes compressed: 64 KiB at the control endpoint, 4 MiB at the receiver) without the token, to
each server; the same with the token; four senders of oversized bodies with the token
(``Content-Length`` 1 GB, sent as fast as the server reads); and 1,100 half-sent requests
(``--crowd``, half at each server, one more header byte a second each, reopened when cut).

Reported per scenario: the longest stall (ms: the probe's wall-clock gap, which also counts
the machine's other processes taking the CPU away), the longest single callback of the loop
(CPU ms: what the loop's own code held it for), steps per second and their ratio to no load,
the run process's CPU (all its threads, share of one core), the most descriptors it held,
whether its manifest was written (it loads, every window final), and the lines its log got
about failed accepts (asyncio's and aprof's).

Run with ``nox -s bench`` (or ``python benchmarks/bench_doors.py``); docs/benchmarks.md has
the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import resource
import secrets
import sys
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aprof

FINAL = ("done", "failed", "timeout", "skipped")


# -- the run process ---------------------------------------------------------------------------


async def _probe(period_s: float, stop: asyncio.Event, seen: dict[str, float]) -> None:
    """The longest gap between two wake-ups beyond ``period_s``, and the peak descriptors."""
    loop = asyncio.get_running_loop()
    last = loop.time()
    next_count = last
    while not stop.is_set():
        await asyncio.sleep(period_s)
        now = loop.time()
        seen["stall_s"] = max(seen["stall_s"], now - last - period_s)
        if now >= next_count:
            seen["fds"] = max(seen["fds"], len(os.listdir("/proc/self/fd")))
            next_count = now + 0.05
        last = now


class LongestCallback:
    """The most CPU one callback of the event loop took (every ``Handle`` run, timed on the
    thread's CPU clock): what the loop's own code held it for, apart from the machine's
    other processes taking the CPU away, which the probe's wall-clock gaps also see."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        run = asyncio.events.Handle._run

        def timed(handle: asyncio.events.Handle) -> None:
            began = time.thread_time()
            run(handle)
            self.cpu_s = max(self.cpu_s, time.thread_time() - began)

        asyncio.events.Handle._run = timed  # type: ignore[method-assign,assignment]


async def _run(cfg: dict[str, Any], seconds: float, step_ms: float) -> dict[str, Any]:
    from structlog.testing import capture_logs

    from aprof.testing import RecordingTarget

    accept_lines = 0

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            nonlocal accept_lines
            accept_lines += "accept" in record.getMessage()

    logging.getLogger("asyncio").addHandler(Count())
    seen = {"stall_s": 0.0, "fds": 0.0}
    stop = asyncio.Event()
    with capture_logs() as logs:
        async with aprof.Profiler(aprof.load_config(cfg)) as prof:
            prof.add_target(RecordingTarget("replica_0", replica=0))
            print(json.dumps([prof._control.http, prof.otel_endpoint]), flush=True)
            await asyncio.to_thread(sys.stdin.readline)  # the clients are in
            probe = asyncio.create_task(_probe(0.001, stop, seen))
            longest = LongestCallback()
            began, cpu = time.perf_counter(), time.process_time()
            steps = 0
            while time.perf_counter() - began < seconds:
                steps += 1
                async with prof.step(steps), prof.request(replica=0):
                    for _ in range(max(1, int(step_ms / 5))):
                        await asyncio.sleep(0.005)
            took, cpu = time.perf_counter() - began, time.process_time() - cpu
            callback_s = longest.cpu_s
            stop.set()
            await probe
    accept_lines += sum("accept" in str(e.get("event", "")) for e in logs)
    return {
        "steps_per_s": steps / took,
        "stall_ms": seen["stall_s"] * 1000,
        "callback_ms": callback_s * 1000,
        "cpu": cpu / took,
        "fds": int(seen["fds"]),
        "accept_lines": accept_lines,
    }


def run_main(args: argparse.Namespace) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))
    cfg = json.loads(args.run)
    print(json.dumps(asyncio.run(_run(cfg, args.seconds, args.step_ms))), flush=True)


# -- the clients ---------------------------------------------------------------------------


def bomb(mib: int) -> bytes:
    """``mib`` MiB of zeros gzip-compressed, built a MiB at a time."""
    stream = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    return b"".join(stream.compress(zeros) for _ in range(mib)) + stream.flush()


@dataclass
class Target:
    host: str
    port: int
    path: str
    kind: str


def _head(target: Target, token: str | None, extra: str) -> bytes:
    auth = "" if token is None else f"Authorization: Bearer {token}\r\n"
    return (
        f"POST {target.path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: {target.kind}\r\n{extra}"
    ).encode()


async def _send(target: Target, data: bytes, *, stream: bool = False) -> None:
    """One request: ``data``, then (``stream``) more zeros until the server closes."""
    with contextlib.suppress(OSError):
        reader, writer = await asyncio.open_connection(target.host, target.port)
        try:
            writer.write(data)
            if stream:
                chunk = bytes(1 << 16)
                while not reader.at_eof():
                    writer.write(chunk)
                    await writer.drain()
            await reader.read()
        finally:
            writer.close()


async def _loop(send: Callable[[], Awaitable[None]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        await send()
        await asyncio.sleep(0)


async def _slow(target: Target, stop: asyncio.Event) -> None:
    """A half-sent request that gets a header byte a second; reopened when cut."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(target.host, target.port)
        except OSError:
            await asyncio.sleep(0.5)
            continue
        try:
            writer.write(f"POST {target.path} HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode())
            while not stop.is_set() and not reader.at_eof():
                writer.write(b"a")
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await reader.read(1)
        except OSError:
            pass
        finally:
            writer.close()


Attack = Callable[[list[Target], str, asyncio.Event], list[Awaitable[None]]]


def bombs(which: int, with_token: bool, mib: dict[str, bytes]) -> Attack:
    def attack(targets: list[Target], token: str, stop: asyncio.Event) -> list[Awaitable[None]]:
        target = targets[which]
        body = mib[target.path]
        extra = f"Content-Encoding: gzip\r\nContent-Length: {len(body)}\r\n\r\n"
        data = _head(target, token if with_token else None, extra) + body
        return [_loop(lambda: _send(target, data), stop) for _ in range(4)]

    return attack


def oversized(targets: list[Target], token: str, stop: asyncio.Event) -> list[Awaitable[None]]:
    sends: list[Awaitable[None]] = []
    for i in range(4):
        target = targets[i % 2]
        head = _head(target, token, "Content-Length: 1000000000\r\n\r\n")
        sends.append(_loop(functools.partial(_send, target, head, stream=True), stop))
    return sends


def crowd(size: int) -> Attack:
    def attack(targets: list[Target], token: str, stop: asyncio.Event) -> list[Awaitable[None]]:
        return [_slow(targets[i % 2], stop) for i in range(size)]

    return attack


def no_load(targets: list[Target], token: str, stop: asyncio.Event) -> list[Awaitable[None]]:
    return []


# -- one scenario ----------------------------------------------------------------------------


async def scenario(args: argparse.Namespace, attack: Attack) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-doors-") as tmp:
        token = secrets.token_hex(16)
        token_file = Path(tmp) / "token"
        token_file.write_text(token)
        save = Path(tmp) / "profile"
        cfg = {
            "global_profiler": {"steps": {"every": 5}, "save_path": str(save)},
            "rollout": {"start": "on_step", "forward_steps": None},
            "log": {"level": "error"},
            "control": {"http": {"port": 0, "token_file": str(token_file)}},
            "otel": {"receive": True, "token_file": str(token_file)},
        }
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--run",
            json.dumps(cfg),
            "--nofile",
            str(args.nofile),
            "--seconds",
            str(args.seconds),
            "--step-ms",
            str(args.step_ms),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert child.stdin is not None and child.stdout is not None
        control, otel = json.loads(await child.stdout.readline())
        c_host, c_port = control.rsplit(":", 1)
        o_host, o_port = otel.removeprefix("http://").rsplit(":", 1)
        targets = [
            Target(c_host, int(c_port), "/capture", "application/json"),
            Target(o_host, int(o_port), "/v1/traces", "application/x-protobuf"),
        ]
        stop = asyncio.Event()
        tasks = [asyncio.ensure_future(a) for a in attack(targets, token, stop)]
        await asyncio.sleep(0.5)  # the clients settle in
        child.stdin.write(b"go\n")
        said = await child.stdout.readline()
        stop.set()
        await child.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        result: dict[str, Any] = json.loads(said) if said else {"failed": True}
        try:
            manifest = aprof.load_manifest(save)
            result["manifest"] = all(w.state in FINAL for w in manifest.windows)
        except Exception:
            result["manifest"] = False
        return result


async def bench(args: argparse.Namespace) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attacker's own ends
    sized = {"/capture": bomb(args.bomb_mib // 32), "/v1/traces": bomb(args.bomb_mib)}
    scenarios: list[tuple[str, Attack]] = [
        ("no load", no_load),
        ("gzip bombs, no token, control endpoint", bombs(0, False, sized)),
        ("gzip bombs, no token, OTLP receiver", bombs(1, False, sized)),
        ("gzip bombs, with token, control endpoint", bombs(0, True, sized)),
        ("gzip bombs, with token, OTLP receiver", bombs(1, True, sized)),
        ("oversized bodies, with token, both", oversized),
        (f"{args.crowd} half-sent requests (slowloris), both", crowd(args.crowd)),
    ]
    results = [(name, await scenario(args, attack)) for name, attack in scenarios]
    base = results[0][1].get("steps_per_s") or 1.0
    print(
        f"\n{args.seconds:g} s of {args.step_ms:g} ms steps per scenario, every fifth profiled; "
        f"run process limited to {args.nofile} descriptors; bombs of {args.bomb_mib} MiB "
        f"(receiver) and {args.bomb_mib // 32} MiB (control endpoint) inflated.\n"
    )
    print(
        "| scenario | max stall (ms) | longest callback (CPU ms) | steps/s | vs no load "
        "| run's CPU | peak descriptors | manifest written | accept-error log lines |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|:---:|---:|")
    for name, r in results:
        written = "yes" if r["manifest"] else "no"
        if r.get("failed"):
            print(f"| {name} | run failed | | | | | | {written} | |")
            continue
        print(
            f"| {name} | {r['stall_ms']:.1f} | {r['callback_ms']:.1f} | {r['steps_per_s']:.1f} "
            f"| {r['steps_per_s'] / base:.2f}x | {r['cpu']:.0%} | {r['fds']} | {written} "
            f"| {r['accept_lines']} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="stepping per scenario")
    parser.add_argument("--step-ms", type=float, default=50.0, help="work per step")
    parser.add_argument("--nofile", type=int, default=1024, help="the run's descriptor limit")
    parser.add_argument("--crowd", type=int, default=1100, help="half-sent requests")
    parser.add_argument("--bomb-mib", type=int, default=1024, help="a receiver bomb, inflated")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_main(args)
    else:
        asyncio.run(bench(args))


if __name__ == "__main__":
    main()
