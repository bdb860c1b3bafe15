"""The HTTP control endpoint of a real profiler, over real requests to 127.0.0.1: the token
guard, capture requests decided by the run, the status, and what may go wrong at open."""

from __future__ import annotations

import asyncio
import gzip
import json
import secrets
import socket
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

import aprof
from aprof._control.messages import MAX_REQUEST_BYTES
from aprof.testing import RecordingTarget

MakeConfig = Callable[..., aprof.ProfilerConfig]
LIMIT_S = 10
"""Every request and wait of these tests is bounded by this."""


@pytest.fixture
def token() -> str:
    return secrets.token_hex(16)  # 32 characters


@pytest.fixture
def token_file(tmp_path: Path, token: str) -> Path:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    return path


@pytest.fixture
def http_config(make_config: MakeConfig, token_file: Path) -> Callable[..., aprof.ProfilerConfig]:
    """A config with the endpoint on a free port, no step selected, on_step windows, each
    step ending once its captures have stopped (the next one never waits behind them)."""

    def build(**http: Any) -> aprof.ProfilerConfig:
        return make_config(
            global_profiler={"steps": [], "wait_for_stops": True},
            rollout={"start": "on_step", "forward_steps": None},
            control={"http": {"port": 0, "token_file": str(token_file), **http}},
        )

    return build


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=LIMIT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        yield session


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def url(prof: aprof.Profiler, path: str) -> str:
    address = prof._control.http
    assert address is not None and address.startswith("127.0.0.1:")
    return f"http://{address}{path}"


async def test_endpoint_listens_on_loopback_and_says_where(
    http_config: MakeConfig, client: aiohttp.ClientSession, token: str
) -> None:
    """Port 0 becomes a free port on 127.0.0.1, written to control/endpoint.json and the
    status; GET /status answers the run's status; it stops listening when the run closes."""
    async with aprof.Profiler(http_config()) as prof:
        await prof.flush()
        written = json.loads((prof.save_path / "control" / "endpoint.json").read_text())
        assert written == {"address": prof._control.http}
        host, port = written["address"].rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        async with client.get(url(prof, "/status"), headers=bearer(token)) as resp:
            assert resp.status == 200
            status = aprof_status(await resp.json())
        assert status["run_id"] == prof.run_id
        assert status["state"] == "running"
        assert status["http"] == written["address"]
        assert status["problems"] == []
        address = written["address"]
    with pytest.raises(aiohttp.ClientConnectionError):
        async with client.get(f"http://{address}/status", headers=bearer(token)):
            pass


def aprof_status(data: dict[str, Any]) -> dict[str, Any]:
    assert data["schema"] == "aprof.status/1"
    return data


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer not-the-token-at-all-0000000000"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer " + "\u00e9" * 32},
    ],
    ids=["none", "wrong", "basic", "empty", "not-ascii"],
)
async def test_requests_without_the_token_are_refused_and_change_nothing(
    http_config: MakeConfig, client: aiohttp.ClientSession, headers: dict[str, str]
) -> None:
    target = RecordingTarget("replica_0", replica=0)
    async with aprof.Profiler(http_config()) as prof:
        prof.add_target(target)
        async with client.post(url(prof, "/capture"), json={"next": 2}, headers=headers) as resp:
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"] == "Bearer"
            assert "Authorization" in (await resp.json())["error"]
        async with client.get(url(prof, "/status"), headers=headers) as resp:
            assert resp.status == 401
        assert prof._control.status().planned == []
        for n in (1, 2):
            async with prof.step(n):
                pass
    assert target.calls == []
    assert prof.manifest.windows == []


@pytest.mark.parametrize("scheme", ["Bearer", "bearer"])
async def test_accepted_capture_opens_windows_on_the_next_steps(
    http_config: MakeConfig, client: aiohttp.ClientSession, token: str, scheme: str
) -> None:
    target = RecordingTarget("replica_0", replica=0)
    async with aprof.Profiler(http_config()) as prof:
        prof.add_target(target)
        body = {"id": "from-http", "next": 2}
        headers = {"Authorization": f"{scheme} {token}"}
        async with client.post(url(prof, "/capture"), json=body, headers=headers) as resp:
            assert resp.status == 200
            answer = await resp.json()
        assert answer["schema"] == "aprof.capture-answer/1"
        assert answer["id"] == "from-http"
        assert answer["accepted"] is True
        assert answer["steps"] == [1, 2]
        assert answer["targets"] == ["replica_0"]
        assert answer["requested_by"] == "on_demand"
        async with client.get(url(prof, "/status"), headers=bearer(token)) as resp:
            planned = (await resp.json())["planned"]
        assert [p["step"] for p in planned] == [1, 2]
        for n in (1, 2, 3):
            async with prof.step(n):
                pass
    windows = [(w.step, w.target, w.requested_by, w.state) for w in prof.manifest.windows]
    assert windows == [
        (1, "replica_0", "on_demand", "done"),
        (2, "replica_0", "on_demand", "done"),
    ]
    assert [w.step for w in target.starts] == [1, 2]
    saved = json.loads((prof.save_path / "control" / "answers" / "from-http.json").read_text())
    assert saved["accepted"] is True and saved["steps"] == [1, 2]


async def test_a_request_for_a_step_begun_already_is_refused_with_409(
    http_config: MakeConfig, client: aiohttp.ClientSession, token: str
) -> None:
    target = RecordingTarget("replica_0", replica=0)
    async with aprof.Profiler(http_config()) as prof:
        prof.add_target(target)
        async with (
            prof.step(1),
            client.post(url(prof, "/capture"), json={"steps": [1]}, headers=bearer(token)) as resp,
        ):
            assert resp.status == 409
            answer = await resp.json()
    assert answer["accepted"] is False
    assert "began already" in answer["reason"]
    assert target.calls == [] and prof.manifest.windows == []


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b'{"next": 0}', "next"),
        (b'{"next": 1, "replicas": [0, 0]}', "replicas"),
        (b'{"next": 1, "colour": "red"}', "colour"),
        (b'{"steps": "1-x"}', "steps"),
        (b"[1, 2]", "JSON object"),
        (b"{not json", "not a JSON document"),
        (b"\xff\xfe", "not a JSON document"),
        (b"[" * 10_000 + b"]" * 10_000, "not a JSON document"),
    ],
    ids=[
        "next-zero",
        "replicas-twice",
        "unknown-field",
        "bad-steps",
        "a-list",
        "garbage",
        "not-utf8",
        "deep",
    ],
)
async def test_a_malformed_body_is_answered_400_naming_what_is_wrong(
    http_config: MakeConfig,
    client: aiohttp.ClientSession,
    token: str,
    body: bytes,
    named: str,
) -> None:
    async with aprof.Profiler(http_config()) as prof:
        headers = {**bearer(token), "Content-Type": "application/json"}
        async with client.post(url(prof, "/capture"), data=body, headers=headers) as resp:
            assert resp.status == 400
            answer = await resp.json()
        assert prof._control.status().planned == []
    assert answer["accepted"] is False
    assert answer["reason"].startswith("malformed request")
    assert named in answer["reason"]


async def test_a_malformed_request_is_answered_under_its_own_id(
    http_config: MakeConfig, client: aiohttp.ClientSession, token: str
) -> None:
    async with aprof.Profiler(http_config()) as prof:
        body = {"id": "mine", "next": -1}
        async with client.post(url(prof, "/capture"), json=body, headers=bearer(token)) as resp:
            assert resp.status == 400
            answer = await resp.json()
    assert answer["id"] == "mine" and "next" in answer["reason"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_an_oversized_body_is_answered_413_unread(
    http_config: MakeConfig, client: aiohttp.ClientSession, token: str, chunked: bool
) -> None:
    body = b'{"next": 1, "pad": "' + b"x" * MAX_REQUEST_BYTES + b'"}'

    async def stream() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 4096):
            yield body[i : i + 4096]

    async with aprof.Profiler(http_config()) as prof:
        data: Any = stream() if chunked else body
        async with client.post(url(prof, "/capture"), data=data, headers=bearer(token)) as resp:
            assert resp.status == 413
            assert str(MAX_REQUEST_BYTES) in (await resp.json())["error"]
        assert prof._control.status().planned == []
        # The endpoint goes on answering.
        async with client.get(url(prof, "/status"), headers=bearer(token)) as resp:
            assert resp.status == 200


async def test_other_paths_and_methods_are_aiohttps_404_and_405(
    http_config: MakeConfig, client: aiohttp.ClientSession, token: str
) -> None:
    async with aprof.Profiler(http_config()) as prof:
        async with client.get(url(prof, "/nothing"), headers=bearer(token)) as resp:
            assert resp.status == 404
        async with client.get(url(prof, "/capture"), headers=bearer(token)) as resp:
            assert resp.status == 405
        async with client.post(url(prof, "/status"), headers=bearer(token)) as resp:
            assert resp.status == 405


async def test_a_bug_answers_500_and_the_run_goes_on(
    http_config: MakeConfig,
    client: aiohttp.ClientSession,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = RecordingTarget("replica_0", replica=0)
    async with aprof.Profiler(http_config()) as prof:
        prof.add_target(target)

        def broken() -> Any:
            raise RuntimeError("a bug")

        endpoint = prof._control._endpoint
        assert endpoint is not None
        monkeypatch.setattr(endpoint, "_status", broken)
        with capture_logs() as logs:
            async with client.get(url(prof, "/status"), headers=bearer(token)) as resp:
                assert resp.status == 500
                assert "error" in await resp.json()
        failed = [e for e in logs if e["event"] == "control endpoint failed"]
        assert failed and failed[0]["error"] == "RuntimeError: a bug"
        async with prof.step(1):
            pass
    assert prof.manifest.windows == []


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "cannot read"),
        ("", "is empty"),
        ("  \n\t", "is empty"),
        ("short-token", "shorter than 16"),
        ("has a space in it, and more", "spaces or control characters"),
        ("x" * 5000, "cannot read"),
    ],
    ids=["missing", "empty", "blank", "short", "space", "too-large"],
)
async def test_a_bad_token_file_fails_the_open(
    make_config: MakeConfig, tmp_path: Path, content: str | None, why: str
) -> None:
    path = tmp_path / "bad-token"
    if content is not None:
        path.write_text(content)
    cfg = make_config(
        global_profiler={"steps": []},
        control={"http": {"port": 0, "token_file": str(path)}},
    )
    prof = aprof.Profiler(cfg)
    with pytest.raises(aprof.ConfigError) as caught:
        async with prof:
            pytest.fail("the profiler opened")
    assert caught.value.key == "control.http.token_file"
    assert why in caught.value.reason
    assert prof._control.http is None


async def test_a_token_file_that_is_a_folder_fails_the_open(
    make_config: MakeConfig, tmp_path: Path
) -> None:
    cfg = make_config(control={"http": {"port": 0, "token_file": str(tmp_path)}})
    with pytest.raises(aprof.ConfigError, match="not a regular file"):
        async with aprof.Profiler(cfg):
            pytest.fail("the profiler opened")


async def test_a_port_taken_is_a_problem_and_the_run_goes_on(
    http_config: MakeConfig, client: aiohttp.ClientSession, token: str
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        target = RecordingTarget("replica_0", replica=0)
        async with aprof.Profiler(http_config(port=port)) as prof:
            prof.add_target(target)
            assert prof._control.http is None
            status = prof._control.status()
            assert status.http is None
            assert any(
                "control endpoint" in p and f"127.0.0.1:{port}" in p for p in status.problems
            )
            # Capture requests still reach the run another way.
            assert prof.capture(next=1).accepted
            async with prof.step(1):
                pass
            await prof.flush()
            written = json.loads((prof.save_path / "control" / "status.json").read_text())
            assert any("control endpoint" in p for p in written["problems"])
        assert not (prof.save_path / "control" / "endpoint.json").exists()
    assert [(w.step, w.requested_by) for w in prof.manifest.windows] == [(1, "on_demand")]


def _bomb(size: int) -> bytes:
    """``size`` zero bytes gzip-compressed, built a MiB at a time (memory flat)."""
    stream = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    return b"".join(stream.compress(zeros) for _ in range(size >> 20)) + stream.flush()


async def test_a_gzip_bomb_without_the_token_is_refused_before_its_body(
    http_config: MakeConfig,
) -> None:
    """Its headers alone are answered 401 and the connection closed: the body, never sent,
    is never read nor inflated."""
    async with aprof.Profiler(http_config()) as prof:
        host, port = (prof._control.http or "").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /capture HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Encoding: gzip\r\nContent-Length: 60000\r\n\r\n"
        )
        async with asyncio.timeout(LIMIT_S):
            answer = await reader.read()  # until the endpoint closes the connection
        writer.close()
        assert answer.startswith(b"HTTP/1.1 401")
        assert prof._control.status().planned == []
        endpoint = prof._control._endpoint
        assert endpoint is not None and endpoint._server is not None
        assert endpoint._server.counts.unauthorized == 1


async def test_a_gzip_bomb_with_the_token_is_413_and_memory_stays_flat(
    http_config: MakeConfig, client: aiohttp.ClientSession, token: str
) -> None:
    bomb = _bomb(48 << 20)  # 48 MiB of zeros in some 48 KiB
    assert len(bomb) < MAX_REQUEST_BYTES
    headers = {**bearer(token), "Content-Encoding": "gzip", "Content-Type": "application/json"}
    async with aprof.Profiler(http_config()) as prof:
        tracemalloc.start()
        try:
            async with client.post(url(prof, "/capture"), data=bomb, headers=headers) as resp:
                assert resp.status == 413
                assert "inflated" in (await resp.json())["error"]
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 8 << 20
        assert prof._control.status().planned == []


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_compressed_capture_request_is_taken(
    http_config: MakeConfig, client: aiohttp.ClientSession, token: str, encoding: str
) -> None:
    data = json.dumps({"id": "packed", "next": 1}).encode()
    body = gzip.compress(data) if encoding == "gzip" else zlib.compress(data)
    headers = {**bearer(token), "Content-Encoding": encoding, "Content-Type": "application/json"}
    async with aprof.Profiler(http_config()) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        async with client.post(url(prof, "/capture"), data=body, headers=headers) as resp:
            assert resp.status == 200
            assert (await resp.json())["id"] == "packed"


@pytest.mark.parametrize(
    ("encoding", "body", "status", "says"),
    [
        ("br", b"{}", 415, "content encoding 'br'"),
        ("gzip", b"not gzip", 400, "not a valid gzip stream"),
    ],
    ids=["brotli", "broken-gzip"],
)
async def test_a_body_in_another_or_a_broken_coding_is_refused(
    http_config: MakeConfig,
    client: aiohttp.ClientSession,
    token: str,
    encoding: str,
    body: bytes,
    status: int,
    says: str,
) -> None:
    headers = {**bearer(token), "Content-Encoding": encoding, "Content-Type": "application/json"}
    async with aprof.Profiler(http_config()) as prof:
        async with client.post(url(prof, "/capture"), data=body, headers=headers) as resp:
            assert resp.status == status
            data = await resp.json()
        assert says in (data["reason"] if status == 400 else data["error"])
        assert prof._control.status().planned == []
