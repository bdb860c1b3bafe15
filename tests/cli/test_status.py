"""`aprof status` in a real subprocess (and `--watch` in a real terminal, tmux's): a live run,
a finished one, one without a status (its manifest instead), nothing, and a killed run; and
its last steps: the accounting of a real run's last steps, in text and in ``--json``, live and
ended, and what status does when the accounting cannot be had (a damaged timeline, a damaged
manifest, no manifest, no timeline, any failure); ``--watch`` reads it again at most every
``ACCOUNTING_EVERY_S`` seconds."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import aprof
import aprof._report
import aprof.cli
from aprof._accounting import ledger_file
from aprof.cli import status as status_cli
from aprof.testing import RecordingTarget

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
MakeConfig = Callable[..., aprof.ProfilerConfig]


def status(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``aprof status ARGS`` in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "aprof", "status", *map(str, args)],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def shown(*args: str | Path) -> str:
    """What ``aprof status ARGS`` prints, which exits 0 with nothing on stderr."""
    done = status(*args)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def as_json(save_path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(shown(save_path, "--json"))
    return data


def line(text: str, key: str) -> str:
    """The value of the summary line ``key:`` in ``text``."""
    [found] = re.findall(rf"^{re.escape(key)}:\s+(.*)$", text, re.MULTILINE)
    return str(found)


def run_config(make_config: MakeConfig, steps: list[int]) -> aprof.ProfilerConfig:
    return make_config(
        global_profiler={"steps": steps},
        rollout={"replicas": [0], "start": "on_step", "forward_steps": None},
        roles={"actor": {"enable": True}},
        triggers={"slow_step": {"baseline_steps": 5}},
    )


async def finish_a_run(make_config: MakeConfig) -> Path:
    """A run of 3 steps, 1 and 2 profiled, 3 forward steps in each rollout window."""
    replica = RecordingTarget("replica_0", replica=0)
    async with aprof.Profiler(run_config(make_config, [1, 2])) as prof:
        prof.add_target(replica)
        prof.add_target(RecordingTarget("actor", kind="role", counter=False))
        for n in (1, 2, 3):
            async with prof.step(n):
                if n < 3:
                    await replica.wait_calls("start", n)
                    replica.advance(3)
    return prof.save_path


# -- a live run ---------------------------------------------------------------------------------


async def test_a_live_run_shows_alive_its_step_and_planned_captures(
    make_config: MakeConfig,
) -> None:
    async with aprof.Profiler(run_config(make_config, [])) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        async with prof.step(1):
            await prof.flush()
            text = await asyncio.to_thread(shown, prof.save_path)
            assert line(text, "run") == prof.manifest.run_id
            assert line(text, "state") == f"running (pid {os.getpid()} on {socket.gethostname()})"
            assert line(text, "step").startswith("1 (open for ")
            assert "open windows: none" in text
            assert "last finished windows: none" in text
            assert "planned captures: none" in text
            data = await asyncio.to_thread(as_json, prof.save_path)
            assert data["alive"] is True and data["source"] == "status"
            assert (data["state"], data["step"], data["pid"]) == ("running", 1, os.getpid())
            assert data["windows"] == data["recent"] == data["planned"] == []
            assert [t["name"] for t in data["triggers"]] == ["slow_step"]

            answer = prof.capture(next=1)
            assert answer.accepted and answer.steps == [2]
            await prof.flush()
            text = await asyncio.to_thread(shown, prof.save_path)
            assert re.search(r"^planned captures \(1\):$", text, re.MULTILINE)
            assert re.search(r"^  2\s+replica_0\s+on_demand$", text, re.MULTILINE), text
            data = await asyncio.to_thread(as_json, prof.save_path)
            assert data["planned"] == [
                {"step": 2, "targets": ["replica_0"], "requested_by": ["on_demand"]}
            ]
    data = await asyncio.to_thread(as_json, prof.save_path)
    assert (data["alive"], data["state"], data["liveness"]) == (False, "ended", "ended")


# -- a finished run -----------------------------------------------------------------------------


async def test_a_finished_run_shows_ended_and_its_windows(make_config: MakeConfig) -> None:
    save_path = await finish_a_run(make_config)
    text = await asyncio.to_thread(shown, save_path)
    assert line(text, "state") == "ended"
    assert line(text, "step") == "none open (last step 3)"
    assert line(text, "config steps") == "1-2"
    assert "open windows: none" in text
    recent = re.findall(r"^  ([12])\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+config$", text, re.MULTILINE)
    assert sorted(recent) == [
        ("1", "actor", "role", "done", "-"),
        ("1", "replica_0", "rollout", "done", "3"),
        ("2", "actor", "role", "done", "-"),
        ("2", "replica_0", "rollout", "done", "3"),
    ]
    # The trigger's baseline: the one unprofiled step so far, of the 5 it needs (no median yet).
    assert re.search(r"^  slow_step\s+1/5\s+-\s+-\s+\S+s\s+0\s+0\s+-$", text, re.MULTILINE), text
    data = await asyncio.to_thread(as_json, save_path)
    assert (data["alive"], data["source"], data["state"]) == (False, "status", "ended")
    assert {(w["step"], w["target"], w["phase"], w["forward_steps"]) for w in data["recent"]} == {
        (1, "actor", "done", None),
        (1, "replica_0", "done", 3),
        (2, "actor", "done", None),
        (2, "replica_0", "done", 3),
    }
    [trigger] = data["triggers"]
    assert (trigger["baseline"], trigger["baseline_steps"], trigger["fired"]) == (1, 5, 0)


async def test_a_run_without_a_status_is_read_from_its_manifest(make_config: MakeConfig) -> None:
    save_path = await finish_a_run(make_config)
    shutil.rmtree(save_path / "control")
    text = await asyncio.to_thread(shown, save_path)
    assert line(text, "state") == "ended (no control/status.json: read from manifest.json)"
    assert line(text, "run") == aprof.load_manifest(save_path).run_id
    assert line(text, "last step") == "2"
    assert "planned captures: unknown (no status)" in text
    assert len(re.findall(r"^  [12]\s+\S+\s+\S+\s+done\s", text, re.MULTILINE)) == 4
    data = await asyncio.to_thread(as_json, save_path)
    assert (data["alive"], data["source"], data["state"]) == (False, "manifest", "ended")
    assert data["pid"] is None and data["step"] is None
    assert {(w["step"], w["target"], w["phase"]) for w in data["recent"]} == {
        (1, "actor", "done"),
        (1, "replica_0", "done"),
        (2, "actor", "done"),
        (2, "replica_0", "done"),
    }


async def test_an_unreadable_status_falls_back_to_the_manifest(make_config: MakeConfig) -> None:
    save_path = await finish_a_run(make_config)
    (save_path / "control" / "status.json").write_text('{"schema": "aprof.status/99"}')
    text = await asyncio.to_thread(shown, save_path)
    assert line(text, "state") == "ended (control/status.json unreadable: read from manifest.json)"
    assert re.search(r"^  control/status.json cannot be read: ", text, re.MULTILINE), text
    data = await asyncio.to_thread(as_json, save_path)
    assert data["source"] == "manifest" and len(data["recent"]) == 4


def test_nothing_at_the_path_is_one_line_and_exit_1(tmp_path: Path) -> None:
    for where in (tmp_path / "missing", tmp_path):
        done = status(where)
        assert done.returncode == 1
        assert done.stdout == ""
        assert done.stderr.count("\n") == 1
        assert done.stderr.startswith(f"aprof status: no run at {where}")
    done = status(tmp_path / "missing", "--json")
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (1, "", 1)


@pytest.mark.parametrize("value", ["0.01", "61", "nan", "soon"])
def test_a_bad_interval_is_a_usage_error(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        aprof.cli.main(["status", str(tmp_path), "--watch", "--interval", value])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--interval" in err, err


# -- a killed run -------------------------------------------------------------------------------


def _status_file(save_path: Path, **fields: Any) -> None:
    path = save_path / "control" / "status.json"
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def dead_pid() -> int:
    """The id of a process that has ended (and been waited for)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert child.wait(timeout=60) == 0
    return child.pid


async def test_a_killed_run_is_shown_ended_with_its_process_gone(make_config: MakeConfig) -> None:
    save_path = await finish_a_run(make_config)
    pid = dead_pid()
    # What a run killed during step 3 leaves: a status that still says running.
    _status_file(save_path, state="running", pid=pid, host=socket.gethostname(), step=3)
    text = await asyncio.to_thread(shown, save_path)
    assert line(text, "state") == f"ended (its process {pid} is gone: killed?)"
    data = await asyncio.to_thread(as_json, save_path)
    assert (data["alive"], data["state"], data["pid"]) == (False, "running", pid)

    # On another host its process cannot be looked for: the status is taken at its word.
    _status_file(save_path, host=f"not-{socket.gethostname()}")
    text = await asyncio.to_thread(shown, save_path)
    assert "cannot check its process" in line(text, "state")
    assert (await asyncio.to_thread(as_json, save_path))["alive"] is True


# -- --watch in a terminal ----------------------------------------------------------------------

TMUX = shutil.which("tmux")
TRIES = 600
"""Looks at the screen, 0.1 s apart (a minute: a loaded CI machine starts Python slowly),
before a test gives up waiting for what it expects."""


class Tmux:
    """A tmux server of this test alone (its own socket), with one session ``status``."""

    def __init__(self, config: Path, rc: Path) -> None:
        assert TMUX is not None
        self.rc = rc
        self._base = [TMUX, "-L", f"aprof-status-{uuid.uuid4().hex[:12]}", "-f", str(config)]
        config.write_text("set-option -g remain-on-exit on\n")  # keep the pane to read its end
        self.env = {**ENV, "TERM": os.environ.get("TERM") or "xterm-256color"}
        self.env.pop("TMUX", None)

    def __call__(self, *args: str) -> str:
        done = subprocess.run(
            [*self._base, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, f"tmux {' '.join(args)}: {done.stderr}"
        return done.stdout

    def start(self, *command: str) -> None:
        """Run ``command`` in the session's pane; its exit status goes to ``self.rc``."""
        # tmux's own #{pane_dead_status} is not set everywhere: the shell writes the status.
        # `trap : INT` keeps the shell alive through Ctrl-C (the command gets it, untrapped).
        script = 'trap : INT; "$@"; echo $? > "$0"'
        size = ("-x", "120", "-y", "40")
        self("new-session", "-d", "-s", "status", *size, "sh", "-c", script, str(self.rc), *command)

    def screen(self) -> str:
        return self("capture-pane", "-p", "-J", "-S", "-200", "-t", "status")

    async def wait_for(self, pattern: str) -> str:
        """The screen once it matches ``pattern`` (a regex), polled; fails after ``TRIES``."""
        screen = ""
        for _ in range(TRIES):
            screen = self.screen()
            if re.search(pattern, screen, re.MULTILINE):
                return screen
            await asyncio.sleep(0.1)
        pytest.fail(f"the screen never showed {pattern!r}:\n{screen}")

    async def wait_exit(self) -> int:
        """The exit status of the pane's command once it has ended, polled."""
        for _ in range(TRIES):
            text = self.rc.read_text() if self.rc.exists() else ""
            if text.endswith("\n"):
                return int(text)
            await asyncio.sleep(0.1)
        pytest.fail(f"the command did not end after Ctrl-C:\n{self.screen()}")

    def kill(self) -> None:
        subprocess.run([*self._base, "kill-server"], env=self.env, capture_output=True, timeout=30)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    if TMUX is None:
        pytest.skip("tmux is not installed: --watch needs a real terminal to be tested in")
    server = Tmux(tmp_path / "tmux.conf", tmp_path / "rc")
    try:
        yield server
    finally:
        server.kill()


def watch_command(save_path: Path) -> tuple[str, ...]:
    return (sys.executable, "-m", "aprof", "status", "--watch", "--interval", "0.2", str(save_path))


async def stop_with_ctrl_c(tmux: Tmux) -> str:
    """Press Ctrl-C; the screen once the watch has ended, which it did cleanly."""
    tmux("send-keys", "-t", "status", "C-c")
    assert await tmux.wait_exit() == 0
    screen = tmux.screen()
    assert "Traceback" not in screen and "KeyboardInterrupt" not in screen, screen
    return screen


async def test_watch_shows_a_finished_run_until_ctrl_c(make_config: MakeConfig, tmux: Tmux) -> None:
    save_path = await finish_a_run(make_config)
    run_id = aprof.load_manifest(save_path).run_id
    tmux.start(*watch_command(save_path))
    screen = await tmux.wait_for(re.escape(run_id))
    assert re.search(r"^state\s+ended\s*$", screen, re.MULTILINE), screen
    assert "last finished windows (4)" in screen
    screen = await stop_with_ctrl_c(tmux)
    assert run_id in screen  # what it showed last stays on the screen


async def test_watch_follows_a_live_run_to_its_end(make_config: MakeConfig, tmux: Tmux) -> None:
    async with aprof.Profiler(run_config(make_config, [])) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        async with prof.step(1):
            await prof.flush()
            tmux.start(*watch_command(prof.save_path))
            await tmux.wait_for(re.escape(prof.manifest.run_id))
            await tmux.wait_for(r"^state\s+running \(pid")
            await tmux.wait_for(r"^step\s+1 \(open for")
            prof.capture(next=1)
            await prof.flush()
            await tmux.wait_for(r"^ *2 +replica_0 +on_demand")
    # The run has closed: the watch says so and keeps showing it.
    screen = await tmux.wait_for(r"^state\s+ended\s*$")
    assert re.search(r"^step\s+none open \(last step 1\)", screen, re.MULTILINE), screen
    assert not tmux.rc.exists()  # still watching
    await stop_with_ctrl_c(tmux)


async def test_watch_shows_names_and_errors_as_written_not_as_markup(
    make_config: MakeConfig,
) -> None:
    from rich.console import Console

    from aprof.cli.status import from_status, look, screen_of

    save_path = await finish_a_run(make_config)
    view = look(save_path)
    assert view.status is not None
    odd = "[/x] [Errno 2] [bold]no"
    view = from_status(save_path, view.status.model_copy(update={"problems": [odd]}))
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(screen_of(view, 0.5))
    assert odd in console.export_text()


# -- the last steps' accounting --------------------------------------------------------------

REQUESTS = 3
"""Requests per step (one more inside the trainer stage)."""


def section(text: str) -> list[str]:
    """The rows of the ``last steps`` table of ``text`` (its header first)."""
    match = re.search(r"^last steps \((\d+)\):\n((?:  .*\n)+)", text, re.MULTILINE)
    assert match is not None, text
    rows = [line.strip() for line in match.group(2).splitlines()]
    assert len(rows) == int(match.group(1)) + 1
    return rows


def accounted_config(make_config: MakeConfig, **sections: Any) -> aprof.ProfilerConfig:
    return make_config(
        global_profiler={"steps": [2]},
        rollout={"replicas": [0], "start": "on_step", "forward_steps": None},
        **sections,
    )


async def one_step(prof: aprof.Profiler, n: int) -> None:
    """Step ``n``: requests to replica 0, then a trainer stage with one more request in it
    (rollout, train and their overlap each take some time)."""
    async with prof.step(n):
        for _ in range(REQUESTS):
            async with prof.request(replica=0):
                await asyncio.sleep(0.001)  # a request that lasts, not a wait for anything
        with prof.stage("update"):
            async with prof.request(replica=0):
                await asyncio.sleep(0.001)


async def a_run(make_config: MakeConfig, steps: int, **sections: Any) -> Path:
    """A closed run of ``steps`` steps, step 2 profiled (replica 0)."""
    async with aprof.Profiler(accounted_config(make_config, **sections)) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        for n in range(1, steps + 1):
            await one_step(prof, n)
    return prof.save_path


def check_steps(last: list[dict[str, Any]], steps: list[int]) -> None:
    """``last`` are the accounts of ``steps``, each whole: its phases add up to its wall."""
    assert [s["step"] for s in last] == steps
    for account in last:
        phases = account["phases"]
        total = phases["rollout_s"] + phases["train_s"] - phases["overlap_s"] + phases["idle_s"]
        assert total == pytest.approx(account["wall_s"], abs=1e-3), account
        assert phases["rollout_s"] > 0 and phases["train_s"] > 0 and phases["overlap_s"] > 0
        assert account["requests"]["count"] == REQUESTS + 1
        assert account["profiled"] is (account["step"] == 2)


# -- a run's last steps ------------------------------------------------------------------------


async def test_an_ended_run_shows_its_last_five_steps(make_config: MakeConfig) -> None:
    save_path = await a_run(make_config, 7)
    data = await asyncio.to_thread(as_json, save_path)
    assert data["accounting_error"] is None
    check_steps(data["last_steps"], [3, 4, 5, 6, 7])

    text = await asyncio.to_thread(shown, save_path)
    header, *rows = section(text)
    assert header.split() == [
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
    ]
    assert [row.split()[0] for row in rows] == ["3", "4", "5", "6", "7"]
    for row in rows:
        cells = r"\d+\s+\S+s(\s+\d+%){4}\s+4\s+\S+s\s+\S+s \(\d+%\)"
        assert re.fullmatch(cells + r"(\s+\d+\.\dx (rollout|train|idle))?", row), row


async def test_a_short_run_shows_all_its_steps_the_profiled_one_marked(
    make_config: MakeConfig,
) -> None:
    save_path = await a_run(make_config, 3)
    check_steps((await asyncio.to_thread(as_json, save_path))["last_steps"], [1, 2, 3])
    _, first, second, third = section(await asyncio.to_thread(shown, save_path))
    assert (first.split()[0], second.split()[:2], third.split()[0]) == ("1", ["2", "profiled"], "3")


async def test_a_live_run_shows_the_steps_written_so_far(make_config: MakeConfig) -> None:
    async with aprof.Profiler(accounted_config(make_config)) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        for n in (1, 2):
            await one_step(prof, n)
        async with prof.step(3):
            await prof.flush()
            data = await asyncio.to_thread(as_json, prof.save_path)
            assert data["alive"] is True and data["step"] == 3
            check_steps(data["last_steps"], [1, 2])  # step 3 has not ended
            _, *rows = section(await asyncio.to_thread(shown, prof.save_path))
            assert [row.split()[0] for row in rows] == ["1", "2"]


# -- when there is no accounting ---------------------------------------------------------------


async def test_a_damaged_timeline_costs_its_steps_not_status(make_config: MakeConfig) -> None:
    save_path = await a_run(make_config, 3)
    [timeline] = aprof.load_manifest(save_path).timeline  # the driver's, the run's only one
    (save_path / timeline.path).write_bytes(b"\x00not a trace{" * 100)
    # The timeline writer's ledgers beside it still account for every step...
    data = await asyncio.to_thread(as_json, save_path)
    assert [s["step"] for s in data["last_steps"]] == [1, 2, 3]
    # ... and once they are damaged too, the accounting skips the unreadable timeline:
    # nothing is left of the run's steps.
    ledgers = (save_path / timeline.path).with_name(ledger_file(timeline.process))
    ledgers.write_bytes(b"\x00not a ledger\n")
    data = await asyncio.to_thread(as_json, save_path)
    assert (data["last_steps"], data["accounting_error"]) == ([], None)
    assert data["source"] == "status" and data["state"] == "ended"
    text = await asyncio.to_thread(shown, save_path)
    assert re.search(
        r"^last steps: none accounted: its 1 timeline file\(s\) hold no ended step, "
        r"or cannot be read$",
        text,
        re.MULTILINE,
    ), text
    assert re.search(r"^state:\s+ended$", text, re.MULTILINE)


async def test_a_damaged_manifest_makes_the_accounting_unavailable(
    make_config: MakeConfig,
) -> None:
    save_path = await a_run(make_config, 3)
    (save_path / "manifest.json").write_text("{not json")
    data = await asyncio.to_thread(as_json, save_path)  # the status still reads
    assert data["source"] == "status" and data["last_steps"] is None
    assert isinstance(data["accounting_error"], str) and "\n" not in data["accounting_error"]
    text = await asyncio.to_thread(shown, save_path)
    [line] = re.findall(r"^last steps: accounting unavailable: .+$", text, re.MULTILINE)
    assert line.endswith(data["accounting_error"])


async def test_without_a_manifest_there_is_no_section(make_config: MakeConfig) -> None:
    save_path = await a_run(make_config, 3)
    (save_path / "manifest.json").unlink()
    data = await asyncio.to_thread(as_json, save_path)
    assert data["source"] == "status"
    assert (data["last_steps"], data["accounting_error"]) == (None, None)
    assert "last steps" not in await asyncio.to_thread(shown, save_path)


async def test_a_run_without_a_timeline_says_so(make_config: MakeConfig) -> None:
    save_path = await a_run(make_config, 2, timeline={"enable": False})
    data = await asyncio.to_thread(as_json, save_path)
    assert (data["last_steps"], data["accounting_error"]) == ([], None)
    text = await asyncio.to_thread(shown, save_path)
    assert re.search(r"^last steps: no timeline \(", text, re.MULTILINE), text


async def test_any_failure_of_the_accounting_is_one_line(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    save_path = await a_run(make_config, 2)

    def broken(save_path: Path) -> tuple[object, ...]:
        raise RuntimeError("the ledger broke\nsecond line")

    monkeypatch.setattr(aprof._report, "accounting", broken)
    capsys.readouterr()
    assert aprof.cli.main(["status", str(save_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^last steps: accounting unavailable: the ledger broke$", out, re.MULTILINE)
    assert re.search(r"^state:\s+ended$", out, re.MULTILINE)
    assert aprof.cli.main(["status", str(save_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["last_steps"], data["accounting_error"]) == (None, "the ledger broke")


# -- --watch reads it at most every ACCOUNTING_EVERY_S -----------------------------------------


def test_watch_reads_the_accounting_at_most_every_accounting_every_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[Path] = []

    def counted(save_path: Path) -> tuple[object, ...]:
        reads.append(save_path)
        raise RuntimeError(f"read {len(reads)}")

    monkeypatch.setattr(aprof._report, "accounting", counted)
    (tmp_path / "manifest.json").write_text("{}")
    now = [100.0]
    accountant = status_cli.Accountant(tmp_path, clock=lambda: now[0])
    every = status_cli.ACCOUNTING_EVERY_S
    assert every == 10.0
    first = accountant()
    assert first is not None and first.error == "read 1"
    for later in (0.0, 1.0, every - 0.01):
        now[0] = 100.0 + later
        assert accountant() is first  # kept between reads
    now[0] = 100.0 + every
    second = accountant()
    assert second is not None and second.error == "read 2"
    assert reads == [tmp_path, tmp_path]
