"""``aprof serve-reference`` as a process: ready, healthy, clean exit on SIGTERM, crash knob."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

ENTRY = """
import sys
from aprof.cli import main
sys.exit(main())
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@asynccontextmanager
async def serving(*flags: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """The server process, once it logged that it listens, and its URL."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        ENTRY,
        "serve-reference",
        "--port",
        str(port),
        *flags,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        while b"reference server listening" not in (line := await process.stderr.readline()):
            assert line, "the server exited before listening"
        yield process, f"http://127.0.0.1:{port}"
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_serves_health_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    async with asyncio.timeout(60):
        async with serving("--profiler-dir", str(tmp_path)) as (process, url):
            async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as response:
                assert response.status == 200
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 0


async def test_crash_on_route_exits_1(tmp_path: Path) -> None:
    async with asyncio.timeout(60):
        flags = ("--dialect", "sglang", "--crash-on", "/start_profile")
        async with serving(*flags) as (process, url):
            async with aiohttp.ClientSession() as http:
                with pytest.raises(aiohttp.ClientError):
                    await http.post(f"{url}/start_profile")
            assert await process.wait() == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--vllm-version", "latest"], "--vllm-version: vllm_version must look like X.Y"),
        ([], "profiler_dir is required"),
        (["--dialect", "sglang", "--launch-max-iterations", "2"], "vLLM launch options"),
        (["--no-profiling", "--fail-route", "health"], "--fail-route: a route path starts"),
        (["--no-profiling", "--port", "70000"], "--port must be 0-65535"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(flags: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", ENTRY, "serve-reference", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("aprof serve-reference: ")
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_port_in_use_is_one_line() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-c", ENTRY, "serve-reference", "--no-profiling", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    assert re.search(
        r"^aprof serve-reference: cannot serve on 127\.0\.0\.1:\d+: ", result.stderr, re.M
    )
    assert "Traceback" not in result.stderr
