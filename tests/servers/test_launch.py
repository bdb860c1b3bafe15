"""Launch preparation (``launch_spec``, ``aprof launch-args``) and the process launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import aprof
import servers.process as process_module
from aprof.cli import main
from aprof.testing import assert_windows
from servers import SGLangServer, VLLMServer
from servers.launch import ENGINES, LaunchSpec, launch_spec
from servers.process import LaunchedServer, LaunchError, free_port, launch
from servers.reference import forward_step_numbers

# A delay of 1 step is vLLM's delay_iterations=2 (a value D skips D - 1 steps).
BOUNDED = {"rollout": {"delay": 1, "forward_steps": 4}}


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    return tmp_path / "traces"


def _cfg(**sections: Any) -> aprof.ProfilerConfig:
    return aprof.load_config({**BOUNDED, **sections})


def _contents(*contents: str) -> dict[str, Any]:
    return {"tool_config": {"torch": {"contents": list(contents)}}}


# ---------------------------------------------------------------------------------------------
# launch_spec: exporting the request spans to aprof's receiver (otel)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "vllm-ascend"])
def test_vllm_exports_its_spans_over_otlp_http_to_the_receiver(engine: str) -> None:
    spec = launch_spec(engine, _cfg(), version="0.32.0", otel_endpoint="http://10.0.0.2:4318/")
    assert spec.args[-2:] == ["--otlp-traces-endpoint", "http://10.0.0.2:4318/v1/traces"]
    assert spec.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert spec.env["OTEL_BSP_SCHEDULE_DELAY"] == "500"
    assert "--collect-detailed-traces" not in spec.args  # costly: only when asked
    detailed = launch_spec(
        engine, _cfg(otel={"detailed": True}), version="0.32.0", otel_endpoint="http://h:1"
    )
    assert detailed.args[-2:] == ["--collect-detailed-traces", "all"]


def test_the_receivers_address_comes_from_the_config_when_its_port_is_fixed() -> None:
    cfg = _cfg(otel={"receive": True, "host": "::1", "port": 4318})
    spec = launch_spec("sglang", cfg, version="0.5.23")
    assert spec.args[-3:] == [
        "--enable-trace",
        "--otlp-traces-endpoint",
        "http://[::1]:4318/v1/traces",
    ]
    assert spec.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert spec.env["SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS"] == "500"
    with pytest.raises(aprof.ConfigError, match=r"otel\.port: 0 picks a free port"):
        launch_spec("vllm", _cfg(otel={"receive": True}), version="0.32.0")
    plain = launch_spec("vllm", _cfg(), version="0.32.0")
    assert not [a for a in plain.args if "otlp" in a] and "OTEL_BSP_SCHEDULE_DELAY" not in plain.env


def test_the_reference_server_says_it_sends_no_spans() -> None:
    spec = launch_spec("reference", _cfg(), version="0.32.0", otel_endpoint="http://h:1")
    assert "the reference server sends no OpenTelemetry spans" in spec.notes
    assert not [a for a in spec.args if "otlp" in a]


def test_launch_args_prints_the_otel_flags(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["launch-args", "--engine", "vllm", "--version", "0.32.0"]
    assert main([*argv, "--otel-endpoint", "http://127.0.0.1:4318"]) == 0
    out = capsys.readouterr().out
    assert "export OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf" in out
    assert "--otlp-traces-endpoint http://127.0.0.1:4318/v1/traces" in out


# ---------------------------------------------------------------------------------------------
# launch_spec: vLLM by era
# ---------------------------------------------------------------------------------------------


def test_vllm_0_9_has_only_the_directory_variable(traces: Path) -> None:
    spec = launch_spec("vllm", _cfg(), version="0.9.2", profiler_dir=traces)
    assert spec.env == {"VLLM_TORCH_PROFILER_DIR": str(traces)}
    assert spec.args == []
    assert spec.launch_window is None
    assert any("cannot bound" in note for note in spec.notes)
    assert any("0.10.2" in note for note in spec.notes)


def test_vllm_era_a_maps_contents_to_environment_booleans(traces: Path) -> None:
    cfg = _cfg(**_contents("cpu", "cuda", "shapes"))
    spec = launch_spec("vllm", cfg, version="0.11.0", profiler_dir=traces)
    assert spec.env == {
        "VLLM_TORCH_PROFILER_DIR": str(traces),
        "VLLM_TORCH_PROFILER_WITH_STACK": "0",
        "VLLM_TORCH_PROFILER_RECORD_SHAPES": "1",
        "VLLM_TORCH_PROFILER_WITH_PROFILE_MEMORY": "0",
    }
    assert spec.args == []
    assert spec.launch_window is None


def test_vllm_0_12_bounds_windows_at_launch_through_the_environment(traces: Path) -> None:
    cfg = _cfg(**_contents("cpu", "cuda", "stack", "memory"))
    spec = launch_spec("vllm", cfg, version="0.12.0", profiler_dir=traces)
    assert spec.env == {
        "VLLM_TORCH_PROFILER_DIR": str(traces),
        "VLLM_TORCH_PROFILER_WITH_STACK": "1",
        "VLLM_TORCH_PROFILER_RECORD_SHAPES": "0",
        "VLLM_TORCH_PROFILER_WITH_PROFILE_MEMORY": "1",
        "VLLM_TORCH_PROFILER_USE_GZIP": "1",
        "VLLM_TORCH_PROFILER_DISABLE_ASYNC_LLM": "1",
        "VLLM_PROFILER_DELAY_ITERS": "2",
        "VLLM_PROFILER_MAX_ITERS": "4",
    }
    assert spec.args == []
    assert spec.launch_window == (2, 4)


def _era_c_flags(traces: Path) -> list[str]:
    return [
        "--profiler-config.profiler=torch",
        f"--profiler-config.torch_profiler_dir={traces}",
        "--profiler-config.torch_profiler_with_stack=false",
        "--profiler-config.torch_profiler_record_shapes=false",
        "--profiler-config.torch_profiler_with_memory=false",
        "--profiler-config.torch_profiler_use_gzip=true",
        "--profiler-config.ignore_frontend=true",
    ]


def test_vllm_era_b_gives_the_flags_and_the_environment_bridge(traces: Path) -> None:
    spec = launch_spec("vllm", _cfg(), version="0.13.0", profiler_dir=traces)
    assert spec.args == [
        *_era_c_flags(traces),
        "--profiler-config.delay_iterations=2",
        "--profiler-config.max_iterations=4",
    ]
    assert spec.env == {
        "VLLM_TORCH_PROFILER_DIR": str(traces),
        "VLLM_TORCH_PROFILER_WITH_STACK": "0",
        "VLLM_TORCH_PROFILER_RECORD_SHAPES": "0",
        "VLLM_TORCH_PROFILER_WITH_PROFILE_MEMORY": "0",
        "VLLM_TORCH_PROFILER_USE_GZIP": "1",
        "VLLM_TORCH_PROFILER_DISABLE_ASYNC_LLM": "1",
        "VLLM_PROFILER_DELAY_ITERS": "2",
        "VLLM_PROFILER_MAX_ITERS": "4",
    }
    assert spec.launch_window == (2, 4)


def test_vllm_era_c_uses_flags_only(traces: Path) -> None:
    cfg = _cfg(rollout={"forward_steps": 3}, tool_config={"torch": {"gzip": False}})
    spec = launch_spec("vllm", cfg, version="0.16.0", profiler_dir=traces)
    flags = _era_c_flags(traces)
    flags[-2] = "--profiler-config.torch_profiler_use_gzip=false"
    assert spec.env == {}
    assert spec.args == [*flags, "--profiler-config.max_iterations=3"]
    assert spec.launch_window == (0, 3)


def test_vllm_0_31_names_the_one_activity_asked_for(traces: Path) -> None:
    spec = launch_spec("vllm", _cfg(**_contents("cpu")), version="0.31.0", profiler_dir=traces)
    assert '--profiler-config.torch_profiler_activities=["CPU"]' in spec.args
    older = launch_spec("vllm", _cfg(**_contents("cpu")), version="0.30.0", profiler_dir=traces)
    assert not any("activities" in arg for arg in older.args)
    assert any("activities" in note for note in older.notes)


def test_vllm_0_32_leaves_bounds_to_each_call(traces: Path) -> None:
    spec = launch_spec("vllm", _cfg(), version="0.32.0", profiler_dir=traces)
    assert spec.env == {}
    assert spec.args == _era_c_flags(traces)  # both activities: the platform default
    assert spec.launch_window is None
    assert spec.notes == ()


def test_vllm_nsys_uses_the_cuda_profiler_mode(traces: Path) -> None:
    cfg = _cfg(global_profiler={"tool": "nsys"})
    assert launch_spec("vllm", cfg, version="0.12.0").env == {
        "VLLM_TORCH_CUDA_PROFILE": "1",
        "VLLM_PROFILER_DELAY_ITERS": "2",
        "VLLM_PROFILER_MAX_ITERS": "4",
    }
    spec = launch_spec("vllm", cfg, version="0.32.0")
    assert spec.args == ["--profiler-config.profiler=cuda"]
    assert any("nsys profile" in note for note in spec.notes)
    with pytest.raises(ValueError, match=r"nsys needs vLLM >= 0\.12"):
        launch_spec("vllm", cfg, version="0.11.0")


def test_vllm_without_profiling_adds_nothing(traces: Path) -> None:
    spec = launch_spec("vllm", _cfg(), version="0.12.0", profiling=False, model="m")
    assert (spec.env, spec.args, spec.profiler_dir, spec.launch_window) == ({}, [], None, None)
    assert spec.command[-4:] == ["--host", "127.0.0.1", "--port", "8000"]


def test_vllm_command_runs_the_module_entry_point(traces: Path) -> None:
    spec = launch_spec(
        "vllm",
        _cfg(),
        version="0.32.0",
        profiler_dir=traces,
        model="/models/tiny",
        port=8011,
        server_args=["--dtype", "float32"],
        python="/venv/bin/python",
    )
    assert spec.command == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/tiny",
        "--host",
        "127.0.0.1",
        "--port",
        "8011",
        "--dtype",
        "float32",
        *spec.args,
    ]
    assert spec.base_url == "http://127.0.0.1:8011"
    assert launch_spec("vllm", _cfg(), version="0.32.0").command == []  # no model


# ---------------------------------------------------------------------------------------------
# launch_spec: vLLM-Ascend, SGLang, reference
# ---------------------------------------------------------------------------------------------


def test_vllm_ascend_old_tags_read_the_directory_variable(traces: Path) -> None:
    cfg = _cfg(global_profiler={"tool": "npu"})
    spec = launch_spec("vllm-ascend", cfg, version="0.13.0", profiler_dir=traces)
    assert spec.env == {"VLLM_TORCH_PROFILER_DIR": str(traces)}
    assert spec.args == []
    assert spec.launch_window is None
    assert any("not configurable" in note for note in spec.notes)


@pytest.mark.parametrize("version", ["0.18.0", "0.32.0", "0.34.0"])
def test_vllm_ascend_bounds_at_launch_in_every_era(traces: Path, version: str) -> None:
    contents = ["npu", "cpu", "module", "memory", "shapes"]
    cfg = _cfg(global_profiler={"tool": "npu"}, tool_config={"npu": {"contents": contents}})
    spec = launch_spec("vllm-ascend", cfg, version=version, profiler_dir=traces)
    assert spec.env == {}
    assert spec.args == [
        "--profiler-config.profiler=torch",
        f"--profiler-config.torch_profiler_dir={traces}",
        "--profiler-config.torch_profiler_with_stack=true",
        "--profiler-config.torch_profiler_with_memory=true",
        "--profiler-config.ignore_frontend=true",
        "--profiler-config.delay_iterations=2",
        "--profiler-config.max_iterations=4",
    ]
    assert spec.launch_window == (2, 4)
    assert spec.notes == ("vLLM-Ascend ignores record_shapes",)


def test_sglang_gets_environment_and_idle_and_metrics_flags(traces: Path) -> None:
    spec = launch_spec("sglang", _cfg(), version="0.5.23", profiler_dir=traces, model="m")
    assert spec.env == {
        "SGLANG_TORCH_PROFILER_DIR": str(traces),
        "SGLANG_PROFILE_WITH_STACK": "false",
        "SGLANG_PROFILE_RECORD_SHAPES": "false",
    }
    # Observed on 0.5.23: an idle scheduler busy-loops without --sleep-on-idle; the forward
    # counter is on /metrics only with --enable-metrics.
    assert spec.args == ["--sleep-on-idle", "--enable-metrics"]
    assert spec.command[-2:] == ["--sleep-on-idle", "--enable-metrics"]
    assert spec.notes == ()
    assert spec.dialect == "sglang"
    assert spec.launch_window is None  # num_steps per call
    assert spec.command[1:5] == ["-m", "sglang.launch_server", "--model-path", "m"]
    assert spec.port == 30000
    assert (spec.with_stack, spec.record_shapes) == (False, False)
    stacks = launch_spec("sglang", _cfg(**_contents("cpu", "stack", "shapes")), version="0.5.23")
    assert set(stacks.env) == {"SGLANG_TORCH_PROFILER_DIR"}
    assert (stacks.with_stack, stacks.record_shapes) == (True, True)
    adapter = stacks.adapter()
    assert isinstance(adapter, SGLangServer)
    assert (adapter.with_stack, adapter.record_shapes, adapter.version) == (True, True, (0, 5, 23))


def test_sglang_before_0_5_gets_the_flags_as_a_note() -> None:
    spec = launch_spec("sglang", _cfg(), version="0.4.10")
    assert spec.args == []
    (note,) = spec.notes
    assert "--sleep-on-idle" in note and "--enable-metrics" in note


def test_sglang_npu_reads_the_npu_contents(traces: Path) -> None:
    contents = ["npu", "cpu", "memory"]
    cfg = _cfg(global_profiler={"tool": "npu"}, tool_config={"npu": {"contents": contents}})
    spec = launch_spec("sglang-npu", cfg, version="0.5.23", profiler_dir=traces)
    assert spec.env["SGLANG_TORCH_PROFILER_DIR"] == str(traces)
    assert spec.notes == ("SGLang-NPU does not support the memory option",)


@pytest.mark.parametrize(
    ("engine", "tool", "message"),
    [
        ("vllm", "npu", "use engine vllm-ascend"),
        ("sglang", "npu", "use engine sglang-npu"),
        ("sglang", "torch_memory", "worker tool"),
        ("vllm-ascend", "nsys", "torch_npu"),
    ],
)
def test_a_tool_the_engine_cannot_run_is_refused(engine: Any, tool: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        launch_spec(engine, _cfg(global_profiler={"tool": tool}), version="0.32.0")


def test_reference_flags_follow_the_dialect_and_era(traces: Path) -> None:
    old = launch_spec("reference", _cfg(), version="0.20", profiler_dir=traces, port=9000)
    assert old.args == [
        "--profiler-dir",
        str(traces),
        "--launch-delay-iterations",
        "2",
        "--launch-max-iterations",
        "4",
    ]
    assert old.command == [
        sys.executable,
        *("-P", "-m", "aprof", "serve-reference", "--host", "127.0.0.1", "--port", "9000"),
        *("--dialect", "vllm", "--vllm-version", "0.20.0"),
        *old.args,
    ]
    assert old.launch_window == (2, 4)
    new = launch_spec("reference", _cfg(), version="0.32.0", profiler_dir=traces)
    assert new.args == ["--profiler-dir", str(traces)]
    assert new.launch_window is None
    off = launch_spec("reference", _cfg(), version="0.32.0", profiling=False)
    assert off.args == ["--no-profiling"]
    assert off.command[-1] == "--no-profiling"
    sglang = launch_spec("reference", _cfg(), version="0.5.23", dialect="sglang")
    assert "--vllm-version" not in sglang.command
    assert sglang.command[sglang.command.index("--dialect") + 1] == "sglang"


def test_profiler_dir_defaults_under_save_path_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spec = launch_spec("vllm", {"global_profiler": {"save_path": "out"}}, version="0.32.0")
    assert spec.profiler_dir == tmp_path / "out" / "server_traces"


def test_launch_spec_never_touches_the_callers_environment(tmp_path: Path) -> None:
    before = dict(os.environ)
    specs = [
        launch_spec(engine, _cfg(), version=version, profiler_dir=tmp_path)
        for engine in ("vllm", "sglang", "reference")
        for version in ("0.9.2", "0.11.0", "0.12.0", "0.14.0", "0.20.0", "0.32.0")
    ]
    specs += [
        launch_spec(engine, _cfg(global_profiler={"tool": "npu"}), version=version)
        for engine in ("vllm-ascend", "sglang-npu")
        for version in ("0.13.0", "0.15.0", "0.18.0")
    ]
    assert any(spec.env for spec in specs)
    assert dict(os.environ) == before


@pytest.mark.parametrize(
    ("engine", "version", "message"),
    [("tgi", "1.0", "engine: expected one of"), ("vllm", "latest", "expected X.Y")],
)
def test_bad_engine_or_version_is_refused(engine: Any, version: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        launch_spec(engine, None, version=version)


def test_adapter_carries_what_the_spec_knows(traces: Path) -> None:
    spec = launch_spec("vllm", _cfg(), version="0.32.0", profiler_dir=traces, port=8123)
    target = spec.adapter(replica=2)
    assert isinstance(target, VLLMServer)
    assert (target.name, target.replica, target.version) == ("replica_2", 2, (0, 32, 0))
    npu = launch_spec("sglang-npu", _cfg(global_profiler={"tool": "npu"}), version="0.5.23")
    sglang_target = npu.adapter(replica=0)
    assert isinstance(sglang_target, SGLangServer)
    assert sglang_target.npu


# ---------------------------------------------------------------------------------------------
# aprof launch-args
# ---------------------------------------------------------------------------------------------


def _cli(*argv: str) -> int:
    return main(["launch-args", *argv])


def test_cli_prints_exports_and_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "profile.yaml"
    config.write_text("rollout: {forward_steps: 4}\ntool_config: {torch: {contents: [cpu]}}\n")
    traces = tmp_path / "my traces"
    argv = ["--engine", "vllm", "--version", "0.13.0", "--profiler-dir", str(traces)]
    assert _cli(*argv, str(config)) == 0
    assert capsys.readouterr().out.splitlines() == [
        "# choosing activities needs vLLM >= 0.31: the platform default is used",
        f"export VLLM_TORCH_PROFILER_DIR='{traces}'",
        "export VLLM_TORCH_PROFILER_WITH_STACK=0",
        "export VLLM_TORCH_PROFILER_RECORD_SHAPES=0",
        "export VLLM_TORCH_PROFILER_WITH_PROFILE_MEMORY=0",
        "export VLLM_TORCH_PROFILER_USE_GZIP=1",
        "export VLLM_TORCH_PROFILER_DISABLE_ASYNC_LLM=1",
        "export VLLM_PROFILER_MAX_ITERS=4",
        "--profiler-config.profiler=torch "
        f"'--profiler-config.torch_profiler_dir={traces}' "
        "--profiler-config.torch_profiler_with_stack=false "
        "--profiler-config.torch_profiler_record_shapes=false "
        "--profiler-config.torch_profiler_with_memory=false "
        "--profiler-config.torch_profiler_use_gzip=true "
        "--profiler-config.ignore_frontend=true "
        "--profiler-config.max_iterations=4",
    ]


def test_cli_output_is_shell_ready(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traces = tmp_path / "a b'c"
    argv = ["--engine", "vllm", "--version", "0.32.0", "--profiler-dir", str(traces)]
    assert _cli(*argv, "--model", "m", "--command") == 0
    script = capsys.readouterr().out
    # The printed command line, word by word, as the shell reads it back.
    shown = subprocess.run(
        ["bash", "-c", 'eval "set -- $(tail -n 1)"; printf "%s\\n" "$@"'],
        input=script,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.splitlines()
    assert f"--profiler-config.torch_profiler_dir={traces}" in shown
    assert shown[:4] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"]


def test_cli_exports_survive_the_shell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traces = tmp_path / "a b'c $HOME"
    assert _cli("--engine", "sglang", "--version", "0.5.23", "--profiler-dir", str(traces)) == 0
    script = capsys.readouterr().out
    seen = subprocess.run(
        ["bash", "-c", script + 'printf %s "$SGLANG_TORCH_PROFILER_DIR"'],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert seen == str(traces)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "vllm", "--version", "x.y"], "expected X.Y"),
        (["--engine", "vllm", "--version", "0.12", "missing.yaml"], "missing.yaml: cannot read"),
        (["--engine", "sglang", "--version", "0.5", "--command"], "--command needs --model"),
    ],
)
def test_cli_bad_input_is_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli(*argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("aprof launch-args: ")
    assert message in lines[0]


def test_cli_bad_config_value_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("rollout: {forward_steps: -1}\n")
    assert _cli("--engine", "vllm", "--version", "0.12", str(config)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rollout.forward_steps" in err


def test_cli_lists_every_engine() -> None:
    with pytest.raises(SystemExit):
        main(["launch-args", "--engine", "tgi", "--version", "1"])
    assert ENGINES == ("vllm", "vllm-ascend", "sglang", "sglang-npu", "reference")


# ---------------------------------------------------------------------------------------------
# launch: a stand-in server process, then the reference server
# ---------------------------------------------------------------------------------------------

FAKE_SERVER = r"""
import argparse, http.server, json, os, signal, subprocess, sys

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--exit", type=int)
parser.add_argument("--status", type=int, default=200)
parser.add_argument("--ignore-term", action="store_true")
parser.add_argument("--env-file")
parser.add_argument("--child-pid-file")
args = parser.parse_args()
if args.exit is not None:
    print("boom: the model could not be loaded", flush=True)
    sys.exit(args.exit)
if args.env_file:
    with open(args.env_file, "w") as f:
        json.dump(dict(os.environ), f)
if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if args.child_pid_file:
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    with open(args.child_pid_file, "w") as f:
        f.write(str(child.pid))


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(args.status)
        self.end_headers()

    def log_message(self, *_):
        pass


print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
"""


def _fake_spec(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> LaunchSpec:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    port = free_port()
    command = [sys.executable, str(script), "--port", str(port), *flags]
    return LaunchSpec(engine="vllm", version="0.32.0", env=env or {}, command=command, port=port)


def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for its reaper counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


async def test_launch_gives_the_child_the_spec_env_and_stops_it(tmp_path: Path) -> None:
    env_file = tmp_path / "env.json"
    spec = _fake_spec(tmp_path, "--env-file", str(env_file), env={"APROF_TEST_VAR": "a b"})
    before = dict(os.environ)
    async with await launch(spec, log_path=tmp_path / "logs" / "server.log") as server:
        async with aiohttp.ClientSession() as http, http.get(f"{server.base_url}/health") as r:
            assert r.status == 200
        assert server.process.returncode is None
    assert server.process.returncode == -signal.SIGTERM
    child_env = json.loads(env_file.read_text())
    assert child_env["APROF_TEST_VAR"] == "a b"
    assert child_env["PATH"] == os.environ["PATH"]
    assert dict(os.environ) == before
    log = (tmp_path / "logs" / "server.log").read_text()
    assert log.startswith("# aprof launch: ") and "serving" in log


async def test_a_server_that_exits_early_raises_with_its_log_tail(tmp_path: Path) -> None:
    spec = _fake_spec(tmp_path, "--exit", "3")
    with pytest.raises(LaunchError) as caught:
        await launch(spec, log_path=tmp_path / "server.log", health_timeout_s=60)
    message = str(caught.value)
    assert "exited with code 3 before it was healthy" in message
    assert "boom: the model could not be loaded" in message


async def test_a_server_never_healthy_is_stopped_and_reported(tmp_path: Path) -> None:
    spec = _fake_spec(tmp_path, "--status", "503")
    with pytest.raises(LaunchError, match=r"not healthy at .*/health after 0.5s") as caught:
        await launch(spec, log_path=tmp_path / "server.log", health_timeout_s=0.5)
    assert "serving" in str(caught.value)


async def test_a_server_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    spec = _fake_spec(tmp_path, "--ignore-term")
    server = await launch(spec, log_path=tmp_path / "server.log", stop_timeout_s=0.5)
    await server.aclose()
    assert server.process.returncode == -signal.SIGKILL
    await server.aclose()  # a second close does nothing


async def test_children_left_in_the_process_group_are_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    spec = _fake_spec(tmp_path, "--child-pid-file", str(pid_file))
    server = await launch(spec, log_path=tmp_path / "server.log", stop_timeout_s=0.5)
    child = int(pid_file.read_text())
    assert not _gone(child)
    await server.aclose()
    assert server.process.returncode == -signal.SIGTERM
    assert _gone(child)


async def test_process_group_scan_runs_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checking for leftover children scans all of /proc: never on the event loop's thread."""
    threads: list[int] = []
    scan = process_module._group_alive

    def recording(group: int) -> bool:
        threads.append(threading.get_ident())
        return scan(group)

    monkeypatch.setattr(process_module, "_group_alive", recording)
    server = await launch(_fake_spec(tmp_path), log_path=tmp_path / "server.log")
    await server.aclose()
    assert threads and threading.get_ident() not in threads


async def test_log_tail_of_a_failed_launch_is_read_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []
    tail = process_module._tail

    def recording(path: Path, lines: int) -> str:
        threads.append(threading.get_ident())
        return tail(path, lines)

    monkeypatch.setattr(process_module, "_tail", recording)
    with pytest.raises(LaunchError, match="boom"):
        await launch(_fake_spec(tmp_path, "--exit", "3"), log_path=tmp_path / "server.log")
    assert threads and threading.get_ident() not in threads


async def test_a_spec_without_command_or_program_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pass model="):
        await launch(LaunchSpec(engine="vllm", version="0.32"), log_path=tmp_path / "x.log")
    missing = LaunchSpec(engine="vllm", version="0.32", command=[str(tmp_path / "nope")])
    with pytest.raises(LaunchError, match="cannot start"):
        await launch(missing, log_path=tmp_path / "x.log")


async def _profile_step_one(
    tmp_path: Path, version: str, rollout: dict[str, int], *, max_tokens: int
) -> tuple[aprof.Profiler, LaunchedServer]:
    """Launch the reference server (vLLM dialect ``version``) as ``launch_spec`` prepares it for
    ``rollout``, and profile global step 1 (one completion of ``max_tokens``) through the
    adapter of its spec, saving under ``tmp_path/"profile"``; both are closed on return."""
    cfg = aprof.load_config(
        {
            "global_profiler": {"steps": [1], "save_path": str(tmp_path / "profile")},
            "rollout": rollout,
            "timeouts": {"start_s": 30, "stop_s": 30},
        }
    )
    spec = launch_spec("reference", cfg, version=version, port=free_port())
    server = await launch(spec, log_path=tmp_path / "server.log", health_timeout_s=60)
    async with server, aprof.Profiler(cfg) as prof:
        prof.add_target(server.adapter(replica=0))
        body = {"model": "reference", "prompt": "hello", "max_tokens": max_tokens}
        url = f"{server.base_url}/v1/completions"
        async with (
            prof.step(1),
            aiohttp.ClientSession() as http,
            prof.request(replica=0),
            http.post(url, json=body) as response,
        ):
            assert response.status == 200, await response.text()
    return prof, server


@pytest.mark.parametrize(("version", "enforced_by"), [("0.32.0", "server"), ("0.20.0", "server")])
async def test_reference_server_launched_and_profiled(
    tmp_path: Path, version: str, enforced_by: str
) -> None:
    """The reference server as a real subprocess, profiled through the adapter of its spec
    (per-call bounds at 0.32, launch-time bounds at 0.20)."""
    prof, server = await _profile_step_one(tmp_path, version, {"forward_steps": 2}, max_tokens=6)
    assert_windows(
        prof.manifest,
        [
            {
                "step": 1,
                "state": "done",
                "forward_steps.requested": 2,
                "forward_steps.enforced_by": enforced_by,
            }
        ],
    )
    files = [f.path for f in prof.manifest.windows[0].files]
    assert files and all(f.startswith("step_1/rollout/replica_0/") for f in files), files
    assert server.process.returncode is not None


# ---------------------------------------------------------------------------------------------
# Launch-time bounds with a delay: vLLM's delay_iterations D skips D - 1 steps
# ---------------------------------------------------------------------------------------------

DELAYED = {"rollout": {"delay": 2, "forward_steps": 3}}


@pytest.mark.parametrize("engine", ["vllm", "reference"])
async def test_a_delayed_launch_window_is_accepted_by_its_adapter(
    tmp_path: Path, engine: Any
) -> None:
    """vLLM 0.20 bounds captures only at launch; the adapter of the spec checks every window
    against those bounds before it sends anything, and refuses one that differs."""
    cfg = aprof.load_config(DELAYED)
    spec = launch_spec(engine, cfg, version="0.20.0", profiler_dir=tmp_path, port=free_port())
    target = spec.adapter(replica=0)
    assert isinstance(target, VLLMServer)
    window = aprof.Window(
        step=1,
        target=target.name,
        kind="rollout",
        delay=cfg.rollout.delay,
        forward_steps=cfg.rollout.forward_steps,
        dir=tmp_path,
        prefix="step_1-replica_0",
    )
    await target.open(aprof.TimeoutsConfig(connect_s=5))
    try:
        assert target.enforces_window
        # Accepted, the start goes on to its request, which finds no server listening.
        with pytest.raises(aiohttp.ClientConnectorError):
            await target.start(window)
    finally:
        await target.aclose()


async def test_reference_server_launched_with_a_delay_records_the_window(tmp_path: Path) -> None:
    """The launch-time bounds of a delayed window, applied by a real reference server process
    playing vLLM 0.20, record exactly the window's forward steps."""
    prof, _ = await _profile_step_one(tmp_path, "0.20", DELAYED["rollout"], max_tokens=12)
    assert_windows(
        prof.manifest,
        [
            {
                "step": 1,
                "state": "done",
                "forward_steps.requested": 3,
                "forward_steps.enforced_by": "server",
            }
        ],
    )
    files = [tmp_path / "profile" / f.path for f in prof.manifest.windows[0].files]
    workers = [f for f in files if ".pt.trace.json" in f.name and "async_llm" not in f.name]
    assert len(workers) == 1, files
    assert len(forward_step_numbers(workers[0])) == 3
