"""Run a prepared server launch as a subprocess: start it, wait until healthy, stop it.

:func:`launch` starts a :class:`~servers.launch.LaunchSpec`'s command in its own process group
with the spec's variables added to a copy of ``os.environ``, its output in a log file, and
waits (bounded) for ``GET /health``; :class:`LaunchedServer` stops the whole group (SIGTERM,
then SIGKILL after a bound). Preparing the launch is ``servers.launch``'s part.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import socket
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import aiohttp
import structlog

from aprof import _http
from servers._errors import LaunchError
from servers.launch import LaunchSpec
from servers.sglang import SGLangServer
from servers.vllm import VLLMServer

_HEALTH_POLL_S = 0.2
_HEALTH_CALL_S = 5.0  # one /health request, connecting included
_GROUP_POLL_S = 0.05
_LOG_TAIL_LINES = 40

logger = structlog.get_logger("aprof.servers")


class LaunchedServer:
    """A running server process; ``await aclose()`` (or ``async with``) stops it."""

    def __init__(
        self,
        spec: LaunchSpec,
        process: asyncio.subprocess.Process,
        log_path: Path,
        stop_timeout_s: float,
    ) -> None:
        self.spec = spec
        self.process = process
        self.log_path = log_path
        self._stop_timeout_s = stop_timeout_s
        self._closing: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        """The server's process id (also its process group id)."""
        return self.process.pid

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the server."""
        return self.spec.base_url

    def adapter(self, *, replica: int = 0, api_key: str | None = None) -> VLLMServer | SGLangServer:
        """The capture target for this server (see :meth:`LaunchSpec.adapter`)."""
        return self.spec.adapter(replica=replica, api_key=api_key)

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's log."""
        return _tail(self.log_path, lines)

    async def aclose(self) -> None:
        """Stop the server: SIGTERM to its process group, then SIGKILL after the stop bound."""
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(
                _terminate(self.process, self._stop_timeout_s)
            )
        try:
            await asyncio.shield(self._closing)
        except asyncio.CancelledError:
            # The caller gave up waiting: leave nothing running behind it.
            _signal_group(self.process.pid, signal.SIGKILL)
            raise
        logger.info("server stopped", engine=self.spec.engine, pid=self.pid)

    async def __aenter__(self) -> LaunchedServer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def launch(
    spec: LaunchSpec,
    *,
    log_path: str | os.PathLike[str],
    health_timeout_s: float = 240.0,
    stop_timeout_s: float = 30.0,
    cwd: str | os.PathLike[str] | None = None,
) -> LaunchedServer:
    """Start ``spec.command`` with ``os.environ`` plus ``spec.env``, its output in ``log_path``,
    and wait until ``GET /health`` answers 200.

    Raises LaunchError (with the log's tail) if the process exits first or is not healthy
    within ``health_timeout_s``; the process is stopped then. ``stop_timeout_s`` bounds each
    phase of the stop (SIGTERM, then SIGKILL).
    """
    if not spec.command:
        raise ValueError("the spec has no command: pass model= to launch_spec")
    log = Path(log_path)
    out = await asyncio.to_thread(_open_log, log, spec.command)
    with out:
        try:
            process = await asyncio.create_subprocess_exec(
                *spec.command,
                env={**os.environ, **spec.env},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                cwd=cwd,
                start_new_session=True,  # its own process group: the stop reaches its children
            )
        except OSError as exc:
            raise LaunchError(f"cannot start {spec.command[0]}: {exc.strerror or exc}") from exc
    server = LaunchedServer(spec, process, log, stop_timeout_s)
    logger.info("server launched", engine=spec.engine, pid=process.pid, log=str(log))
    try:
        await _wait_healthy(server, health_timeout_s)
    except BaseException:
        await server.aclose()
        raise
    logger.info("server healthy", engine=spec.engine, pid=process.pid, url=spec.base_url)
    return server


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (for tests and local launches)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


async def _wait_healthy(server: LaunchedServer, timeout_s: float) -> None:
    url = f"{server.base_url}/health"
    exited = asyncio.ensure_future(server.process.wait())
    try:
        async with asyncio.timeout(timeout_s), _http.session(connect_s=_HEALTH_CALL_S) as session:
            while not exited.done():
                if await _healthy(session, url):
                    return
                await asyncio.wait({exited}, timeout=_HEALTH_POLL_S)
    except TimeoutError:
        tail = await asyncio.to_thread(server.log_tail)  # file reads stay off the event loop
        raise LaunchError(
            f"{server.spec.engine} server (pid {server.pid}) not healthy at {url} after "
            f"{timeout_s:g}s; last lines of {server.log_path}:\n{tail}"
        ) from None
    finally:
        exited.cancel()
    tail = await asyncio.to_thread(server.log_tail)
    raise LaunchError(
        f"{server.spec.engine} server exited with code {server.process.returncode} before it "
        f"was healthy; last lines of {server.log_path}:\n{tail}"
    )


async def _healthy(session: aiohttp.ClientSession, url: str) -> bool:
    bounds = _http.client_timeout(_HEALTH_CALL_S, total_s=_HEALTH_CALL_S)
    try:
        async with _http.send(session, "GET", url, timeout=bounds) as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False  # not listening yet, or busy starting


async def _terminate(process: asyncio.subprocess.Process, grace_s: float) -> None:
    group = process.pid
    _signal_group(group, signal.SIGTERM)
    if not await _exits(process, grace_s):
        logger.warning("server ignored SIGTERM; killing it", pid=group, grace_s=grace_s)
        _signal_group(group, signal.SIGKILL)
        if not await _exits(process, grace_s):
            # Stuck in the kernel (uninterruptible I/O): nothing more can be done from here,
            # and a close must not raise for it.
            logger.error("server did not exit after SIGKILL", pid=group, grace_s=grace_s)
            return
    # Children (engine cores, workers) share the group and may still be shutting down.
    if await _group_lingers(group, grace_s):
        logger.warning("server's child processes outlived it; killing them", pid=group)
        _signal_group(group, signal.SIGKILL)
        if await _group_lingers(group, grace_s):
            logger.warning("server's process group survived SIGKILL", pid=group)


async def _exits(process: asyncio.subprocess.Process, within_s: float) -> bool:
    """True once ``process`` has exited, False if it is still running after ``within_s``."""
    try:
        async with asyncio.timeout(within_s):
            await process.wait()
    except TimeoutError:
        return False
    return True


def _signal_group(group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


async def _group_lingers(group: int, grace_s: float) -> bool:
    """True if a live (non-zombie) process of ``group`` is still there after ``grace_s``."""
    # They are not our children: nothing signals their exit, so poll.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    # The check scans /proc: a worker thread keeps it off the event loop.
    while await asyncio.to_thread(_group_alive, group):
        if loop.time() >= deadline:
            return True
        await asyncio.sleep(_GROUP_POLL_S)
    return False


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for stat in proc.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # Fields after the ")" that ends the command name: state, ppid, pgrp, ...
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == group:
                return True
    return False


def _open_log(path: Path, command: list[str]) -> BinaryIO:
    path.parent.mkdir(parents=True, exist_ok=True)
    out = path.open("ab")
    out.write(f"# aprof launch: {shlex.join(command)}\n".encode())
    out.flush()
    return out


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return f"(log unreadable: {exc.strerror or exc})"
    return "\n".join(text.splitlines()[-lines:])
