"""Hostile HTTP clients at the run's two servers (the control endpoint, the OTLP receiver) while
a profiled run steps: gzip bombs with and without the token, bodies that are too large or
never end, headers that trickle, a crowd of half-sent requests larger than the process's
descriptor limit, and descriptors running out under the accept loop. Each time the run takes
all its steps, nothing escapes, and its manifest reads back with every window final.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import textwrap
import zlib
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof.testing import RecordingTarget
from faults.common import check_windows, load
from faults.tally import Faults

pytestmark = pytest.mark.faults

LIMIT_S = 30.0
"""Bound on every client and every run of this file."""
STEPS = 6
BOUND = 8
"""``max_connections`` of both servers here."""


def _bomb(size: int) -> bytes:
    """``size`` zero bytes gzip-compressed, built a MiB at a time (memory flat)."""
    stream = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    return b"".join(stream.compress(zeros) for _ in range(size >> 20)) + stream.flush()


def _config(save: Path, token_file: Path, **limits: Any) -> dict[str, Any]:
    return {
        "global_profiler": {"steps": [2, 4], "save_path": str(save), "wait_for_stops": True},
        "rollout": {"start": "on_step", "forward_steps": None},
        "timeouts": {"start_s": 5, "stop_s": 5, "connect_s": 2},
        "control": {"http": {"port": 0, "token_file": str(token_file), **limits}},
        "otel": {"receive": True, "token_file": str(token_file), **limits},
    }


async def _client(host: str, port: int, data: bytes, *, send_all: bool = True) -> bytes:
    """Send ``data`` (or only its head), then read until the server closes; what it said."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        if send_all:
            await writer.drain()
        return await reader.read()
    except ConnectionError:
        return b"(reset)"
    finally:
        writer.close()


def _request(path: str, body: bytes, *, token: str | None, extra: str = "") -> bytes:
    auth = "" if token is None else f"Authorization: Bearer {token}\r\n"
    kind = "application/x-protobuf" if path == "/v1/traces" else "application/json"
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: {kind}\r\n{extra}"
    return head.encode() + body


async def test_hostile_clients_while_a_run_steps(faults: Faults, tmp_path: Path) -> None:
    token = secrets.token_hex(16)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    limits = {"header_s": 0.5, "body_s": 0.5, "max_connections": BOUND}
    cfg = aprof.load_config(_config(tmp_path / "profile", token_file, **limits))
    target = RecordingTarget("replica_0", replica=0)
    bomb = _bomb(48 << 20)
    gz = f"Content-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n\r\n"
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        control = (prof._control.http or "").rsplit(":", 1)
        otel = (prof.otel_endpoint or "").removeprefix("http://").rsplit(":", 1)
        attacks: list[Awaitable[bytes]] = []
        for host, port_text, path in ((*control, "/capture"), (*otel, "/v1/traces")):
            port = int(port_text)
            for who in (None, token):  # a gzip bomb without the token, and with it
                attacks.append(_client(host, port, _request(path, bomb, token=who, extra=gz)))
            big = "Content-Length: 2000000000\r\n\r\n"  # declared, never sent
            attacks.append(_client(host, port, _request(path, b"", token=token, extra=big)))
            trickle = "Content-Length: 1000\r\n\r\n"  # a tenth of it, then silence
            attacks.append(
                _client(host, port, _request(path, b"x" * 100, token=token, extra=trickle))
            )
            for _ in range(3 * BOUND):  # headers that never end, thrice the bound
                head = f"POST {path} HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode()
                attacks.append(_client(host, port, head, send_all=False))
        faults.count("http_clients", len(attacks))
        attacking = asyncio.gather(*attacks)
        stepped = 0
        escaped: BaseException | None = None
        try:
            async with asyncio.timeout(LIMIT_S):
                for n in range(1, STEPS + 1):
                    async with prof.step(n), prof.request(replica=0):
                        await asyncio.sleep(0.05)  # the step's work, under the attack
                    stepped += 1
                answers = await attacking
        except Exception as exc:
            escaped = exc
        faults.check(
            "escaped", escaped is None and stepped == STEPS, f"{stepped} steps: {escaped!r}"
        )
        await prof.flush()
    # Every client was answered or cut within the bound, and no hostile request was taken.
    assert not any(a.startswith(b"HTTP/1.1 200") for a in answers)
    assert answers[0][:12] in (b"HTTP/1.1 401", b"", b"(reset)")  # the bomb without token
    manifest = load(faults, prof.save_path)
    check_windows(faults, manifest)
    assert manifest is not None and [w.step for w in manifest.windows] == [2, 4]
    faults.assert_nothing_lost()


_DRIVER = textwrap.dedent(
    """
    import asyncio, json, os, resource, sys
    import aprof
    from aprof.testing import RecordingTarget

    limit = int(sys.argv[2])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))

    async def main():
        async with aprof.Profiler(aprof.load_config(json.loads(sys.argv[1]))) as prof:
            prof.add_target(RecordingTarget("replica_0", replica=0))
            print(json.dumps([prof._control.http, prof.otel_endpoint]), flush=True)
            await asyncio.to_thread(sys.stdin.readline)  # the crowd is in
            peak = 0
            for n in range(1, 7):
                async with prof.step(n):
                    async with prof.request(replica=0):
                        peak = max(peak, len(os.listdir("/proc/self/fd")))
        print(json.dumps({"peak_fds": peak}), flush=True)

    asyncio.run(main())
    """
)


async def test_a_crowd_larger_than_the_descriptor_limit_leaves_the_manifest_written(
    faults: Faults, tmp_path: Path
) -> None:
    """A driver limited to 256 descriptors, 400 half-sent requests at its two servers: the
    excess is closed at once, the run steps and writes its manifest."""
    token_file = tmp_path / "token"
    token_file.write_text(secrets.token_hex(16))
    cfg = _config(tmp_path / "profile", token_file, max_connections=32)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _DRIVER,
        json.dumps(cfg),
        "256",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None
    crowd: list[asyncio.StreamWriter] = []
    try:
        async with asyncio.timeout(LIMIT_S):
            control, otel = json.loads(await child.stdout.readline())
            addresses = [control.rsplit(":", 1), otel.removeprefix("http://").rsplit(":", 1)]
            for i in range(400):
                host, port = addresses[i % 2]
                _, writer = await asyncio.open_connection(host, int(port))
                writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                crowd.append(writer)
            faults.count("http_clients", len(crowd))
            child.stdin.write(b"go\n")
            said = await child.stdout.readline()
            code = await child.wait()
    finally:
        for writer in crowd:
            writer.close()
        if child.returncode is None:
            child.kill()
            await child.wait()
    faults.check("escaped", code == 0 and bool(said), f"driver exit {code}, said {said!r}")
    assert json.loads(said)["peak_fds"] < 256
    manifest = load(faults, tmp_path / "profile")
    check_windows(faults, manifest)
    assert manifest is not None and [w.step for w in manifest.windows] == [2, 4]
    faults.assert_nothing_lost()


_FULL = textwrap.dedent(
    """
    import asyncio, json, os, resource, sys
    from aiohttp import web
    from structlog.testing import capture_logs
    from aprof._http_server import BoundedServer

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))

    async def hello(request):
        return web.Response(text="hello")

    async def main():
        server = BoundedServer(
            [web.get("/", hello)], name="test server", token=None,
            answer=lambda status, text, headers: web.Response(status=status, text=text),
            header_s=5, max_connections=8, client_max_size=1024, shutdown_s=1,
        )
        _, port = await server.start("127.0.0.1", 0)
        with capture_logs() as logs:
            print(port, flush=True)
            filler = []
            try:
                while True:
                    filler.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                pass
            async with asyncio.timeout(30):
                while server.counts.failed < 3:  # the parent's connection waits meanwhile
                    await asyncio.sleep(0.05)
            for fd in filler:
                os.close(fd)
            async with asyncio.timeout(30):
                while server.counts.accepted < 1:
                    await asyncio.sleep(0.05)
            await asyncio.to_thread(sys.stdin.readline)
        await server.aclose()
        counts = {"failed": server.counts.failed, "outages": server.counts.outages}
        print(json.dumps({"events": [e["event"] for e in logs], **counts}), flush=True)

    asyncio.run(main())
    """
)


async def test_descriptors_running_out_is_logged_once_per_outage(faults: Faults) -> None:
    """A server whose process has no descriptor left: accepting pauses (no busy loop), one
    warning however many accepts fail, one line when it accepts again, and the client that
    waited meanwhile is served."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _FULL,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        async with asyncio.timeout(LIMIT_S):
            port = int(await child.stdout.readline())
            faults.count("http_clients")
            answer = await _client(
                "127.0.0.1", port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            child.stdin.write(b"done\n")
            said = json.loads(await child.stdout.readline())
            code = await child.wait()
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    faults.check("escaped", code == 0, f"server process exit {code}")
    assert answer.startswith(b"HTTP/1.1 200")
    assert said["failed"] >= 3 and said["outages"] == 1
    events = said["events"]
    assert events.count("http server cannot accept") == 1
    assert events.count("http server accepts again") == 1
    faults.assert_nothing_lost()
