"""Prepare an inference-server launch for profiling.

:func:`launch_spec` turns an aprof config into the environment variables and command-line
arguments that enable profiling on a given engine and version (vLLM eras, vLLM-Ascend, SGLang,
SGLang-NPU, the embedded reference server). It never touches ``os.environ``: the spec carries
the variables, and ``servers.process.launch`` hands them to the child process only.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args
from urllib.parse import quote

from aprof import ConfigError, ProfilerConfig, load_config
from aprof._http_server import load_token
from servers._errors import UnsupportedError
from servers.sglang import SGLangServer
from servers.versions import Version, parse_version, version_text
from servers.vllm import VLLMServer, delay_iterations

if TYPE_CHECKING:
    from aprof._config import ConfigSource

Engine = Literal["vllm", "vllm-ascend", "sglang", "sglang-npu", "reference"]
Dialect = Literal["vllm", "sglang"]
ENGINES: tuple[Engine, ...] = get_args(Engine)
DEFAULT_PORTS: dict[Engine, int] = {
    "vllm": 8000,
    "vllm-ascend": 8000,
    "sglang": 30000,
    "sglang-npu": 30000,
    "reference": 8000,
}


@dataclass(frozen=True)
class LaunchSpec:
    """A server launch prepared for profiling."""

    engine: Engine
    version: str
    """The engine's version (for ``reference``: the vLLM version its vLLM dialect plays)."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables to set in the server's environment, on top of the launching process's."""
    args: list[str] = field(default_factory=list)
    """Profiling arguments to append to the server's command line."""
    command: list[str] = field(default_factory=list)
    """The whole command line, ``args`` included; empty when no model was given."""
    profiler_dir: Path | None = None
    """Where the server writes traces not sent elsewhere per capture; ``None``: profiling off."""
    host: str = "127.0.0.1"
    port: int = 8000
    dialect: Dialect = "vllm"
    """The HTTP profiling dialect the server speaks."""
    launch_window: tuple[int, int] | None = None
    """``(delay_iterations, max_iterations)`` the server applies to every capture, when the
    version bounds captures only at launch (vLLM 0.12-0.31, vLLM-Ascend); in vLLM's terms:
    ``delay_iterations`` D skips D - 1 steps (``servers.vllm.delay_iterations``)."""
    notes: tuple[str, ...] = ()
    """Settings of the config this engine and version cannot apply at launch, and why."""
    with_stack: bool = False
    """SGLang: ``with_stack`` the adapter sends in each start (``stack`` in the contents)."""
    record_shapes: bool = False
    """SGLang: ``record_shapes`` the adapter sends in each start (``shapes`` in the contents)."""

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the server."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def adapter(self, *, replica: int = 0, api_key: str | None = None) -> VLLMServer | SGLangServer:
        """The capture target that drives this server's profiling, with the version, trace
        folder and launch-time bounds this spec knows."""
        if self.dialect == "vllm":
            return VLLMServer(
                self.base_url,
                replica=replica,
                api_key=api_key,
                version=self.version,
                profiler_dir=self.profiler_dir,
                launch_window=self.launch_window,
            )
        return SGLangServer(
            self.base_url,
            replica=replica,
            api_key=api_key,
            npu=self.engine == "sglang-npu",
            version=self.version if self.engine != "reference" else None,
            with_stack=self.with_stack,
            record_shapes=self.record_shapes,
        )

    def shell(self, *, command: bool = False) -> str:
        """``export K=V`` lines and the arguments (or the whole command), shell-quoted."""
        lines = [f"# {note}" for note in self.notes]
        lines += [f"export {key}={shlex.quote(value)}" for key, value in self.env.items()]
        words = self.command if command else self.args
        if words:
            lines.append(shlex.join(words))
        return "".join(f"{line}\n" for line in lines)


def launch_spec(
    engine: Engine,
    cfg: ConfigSource = None,
    *,
    version: str,
    profiler_dir: str | os.PathLike[str] | None = None,
    profiling: bool = True,
    model: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    dialect: Dialect = "vllm",
    server_args: Sequence[str] = (),
    python: str = sys.executable,
    otel_endpoint: str | None = None,
) -> LaunchSpec:
    """Prepare a launch of ``engine`` at ``version`` that profiles as ``cfg`` says.

    ``profiler_dir`` (default ``<save_path>/server_traces``, made absolute) is where the
    server writes its traces; ``profiling=False`` prepares a launch without profiling.
    ``model`` (with ``host``, ``port`` and extra ``server_args``) completes ``command``;
    ``dialect`` picks the reference server's dialect; ``python`` is the interpreter the
    command runs (vLLM and SGLang need theirs). With ``otel.receive`` (or ``otel_endpoint``
    given: the base URL of aprof's receiver, ``prof.otel_endpoint``; by default
    ``http://<otel.host>:<otel.port>``) the server also exports its request spans there.
    With ``otel.token_file`` the server's exporter bears its token
    (``OTEL_EXPORTER_OTLP_TRACES_HEADERS``).
    Raises ValueError on an unknown engine, VersionError on a malformed version,
    UnsupportedError for a tool the engine (at that version) cannot run, ConfigError on a bad
    config (``otel.port`` 0 without ``otel_endpoint``, an unreadable ``otel.token_file``).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
    config = load_config(cfg)
    directory = Path(profiler_dir or config.global_profiler.save_path / "server_traces")
    if engine != "reference":
        dialect = "vllm" if engine.startswith("vllm") else "sglang"
    prep = _Prep(engine, config, parse_version(version), directory.absolute(), dialect)
    if profiling:
        _PREPARE[engine](prep)
    elif engine == "reference":
        prep.args.append("--no-profiling")
    if otel_endpoint is not None or config.otel.receive:
        _otel(prep, otel_endpoint or _receiver_of(config))
    port = DEFAULT_PORTS[engine] if port is None else port
    command = _command(prep, python, model, host, port, list(server_args))
    return LaunchSpec(
        engine=engine,
        version=version,
        env=prep.env,
        args=prep.args,
        command=command + prep.args if command else [],
        profiler_dir=prep.directory if profiling else None,
        host=host,
        port=port,
        dialect=dialect,
        launch_window=prep.launch_window,
        notes=tuple(prep.notes),
        with_stack=prep.with_stack,
        record_shapes=prep.record_shapes,
    )


# ---------------------------------------------------------------------------------------------
# Per-engine preparation
# ---------------------------------------------------------------------------------------------


@dataclass
class _Prep:
    """The inputs of one preparation and what it has produced so far."""

    engine: Engine
    config: ProfilerConfig
    version: Version
    directory: Path
    dialect: Dialect
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    launch_window: tuple[int, int] | None = None
    notes: list[str] = field(default_factory=list)
    with_stack: bool = False
    record_shapes: bool = False

    @property
    def tool(self) -> str:
        return self.config.global_profiler.tool

    def contents(self) -> set[str]:
        """The capture contents of the configured tool; UnsupportedError if the engine cannot
        run it."""
        if self.tool == "npu":
            if self.engine in ("vllm", "sglang"):
                suffix = "ascend" if self.engine == "vllm" else "npu"
                raise UnsupportedError(f"tool npu: use engine {self.engine}-{suffix}")
            return set(self.config.tool_config.npu.contents)
        if self.tool == "torch_memory":
            raise UnsupportedError(
                f"tool torch_memory is a worker tool: {self.engine} cannot run it"
            )
        if self.tool == "nsys" and self.engine in ("vllm-ascend", "sglang-npu"):
            raise UnsupportedError(f"tool nsys: {self.engine} profiles with torch_npu (tool npu)")
        return set(self.config.tool_config.torch.contents)

    def bounds(self, delay_key: str, max_key: str) -> dict[str, int]:
        """Launch-time window bounds from the rollout config, in vLLM's terms (a delay of D
        steps is ``delay_iterations`` D + 1); they apply to every capture."""
        rollout = self.config.rollout
        if rollout.forward_steps is None and not rollout.delay:
            return {}
        delay = delay_iterations(rollout.delay)
        self.launch_window = (delay, rollout.forward_steps or 0)
        bounds = {delay_key: delay} if delay else {}
        if rollout.forward_steps is not None:
            bounds[max_key] = rollout.forward_steps
        return bounds


# No front-end (API-server) profiler: it ignores the window's bounds (it runs until the stop)
# and vLLM 0.32 starts and stops it on different executor threads, which torch 2.13 answers
# with a segfault of the server's process (observed). The workers' traces hold the engine.
_NO_FRONTEND = {"ignore_frontend": True}


def _flag(key: str, value: object) -> str:
    # vLLM reads each dotted value as JSON, falling back to the raw text (paths, names).
    text = value if isinstance(value, str) else json.dumps(value)
    return f"--profiler-config.{key}={text}"


def _bit(on: bool) -> str:
    # "1"/"0": era A reads `!= "0"`, the 0.13-0.15 bridge reads `== "1"`; both agree on these.
    return "1" if on else "0"


def _vllm(prep: _Prep) -> None:
    contents = prep.contents()
    nsys = prep.tool == "nsys"
    if nsys and prep.version < (0, 12, 0):
        raise UnsupportedError("tool nsys needs vLLM >= 0.12 (its cuda profiler mode)")
    if nsys:
        prep.notes.append(
            "run the server under `nsys profile --capture-range=cudaProfilerApi "
            "--capture-range-end repeat` with VLLM_WORKER_MULTIPROC_METHOD=spawn"
        )
    # Bounds go in at launch only where the version has them only there (0.12-0.31).
    at_launch = (0, 12, 0) <= prep.version < (0, 32, 0)
    if prep.version < (0, 12, 0) and prep.config.rollout.forward_steps is not None:
        prep.notes.append("vLLM < 0.12 cannot bound a capture: aprof stops it by polling")
    if prep.version < (0, 16, 0):  # read directly up to 0.12, bridged in 0.13-0.15
        env = {"VLLM_TORCH_CUDA_PROFILE": "1"} if nsys else _vllm_env(prep, contents)
        if at_launch:
            bounds = prep.bounds("VLLM_PROFILER_DELAY_ITERS", "VLLM_PROFILER_MAX_ITERS")
            env.update({key: str(value) for key, value in bounds.items()})
        prep.env.update(env)
    if prep.version >= (0, 13, 0):
        settings: dict[str, object] = (
            {"profiler": "cuda"} if nsys else _vllm_settings(prep, contents)
        )
        if at_launch:
            settings.update(prep.bounds("delay_iterations", "max_iterations"))
        prep.args += [_flag(key, value) for key, value in settings.items()]
    if not nsys and prep.version < (0, 31, 0) and not {"cpu", "cuda"} <= contents:
        prep.notes.append("choosing activities needs vLLM >= 0.31: the platform default is used")


def _vllm_env(prep: _Prep, contents: set[str]) -> dict[str, str]:
    env = {"VLLM_TORCH_PROFILER_DIR": str(prep.directory)}
    if prep.version >= (0, 10, 2):
        env["VLLM_TORCH_PROFILER_WITH_STACK"] = _bit("stack" in contents)
        env["VLLM_TORCH_PROFILER_RECORD_SHAPES"] = _bit("shapes" in contents)
        env["VLLM_TORCH_PROFILER_WITH_PROFILE_MEMORY"] = _bit("memory" in contents)
    else:
        prep.notes.append("vLLM < 0.10.2 has no stack/shapes/memory settings")
    if prep.version >= (0, 12, 0):
        env["VLLM_TORCH_PROFILER_USE_GZIP"] = _bit(prep.config.tool_config.torch.gzip)
        env["VLLM_TORCH_PROFILER_DISABLE_ASYNC_LLM"] = "1"  # see _NO_FRONTEND
    return env


def _vllm_settings(prep: _Prep, contents: set[str]) -> dict[str, object]:
    settings: dict[str, object] = {
        "profiler": "torch",
        "torch_profiler_dir": str(prep.directory),
        "torch_profiler_with_stack": "stack" in contents,
        "torch_profiler_record_shapes": "shapes" in contents,
        "torch_profiler_with_memory": "memory" in contents,
        "torch_profiler_use_gzip": prep.config.tool_config.torch.gzip,
        **_NO_FRONTEND,
    }
    # Both activities are the platform default: name them only when one was left out, so a
    # CPU-only server is never asked for CUDA.
    activities = [name.upper() for name in ("cpu", "cuda") if name in contents]
    if prep.version >= (0, 31, 0) and len(activities) == 1:
        settings["torch_profiler_activities"] = activities
    return settings


def _vllm_ascend(prep: _Prep) -> None:
    contents = prep.contents()
    if prep.version < (0, 16, 0):  # these tags read VLLM_TORCH_PROFILER_DIR (bridged in 0.14-0.15)
        prep.env["VLLM_TORCH_PROFILER_DIR"] = str(prep.directory)
    if prep.version < (0, 14, 0):
        prep.notes.append(
            "vLLM-Ascend < 0.14 runs a fixed torch_npu profiler: contents and bounds are not "
            "configurable (0.13 also records memory)"
        )
        return
    settings: dict[str, object] = {
        "profiler": "torch",
        "torch_profiler_dir": str(prep.directory),
        # vLLM-Ascend turns with_stack into torch_npu's with_modules.
        "torch_profiler_with_stack": bool({"stack", "module"} & contents),
        "torch_profiler_with_memory": "memory" in contents,
        **_NO_FRONTEND,
        # The Ascend worker refuses per-call bounds, so they always go in at launch.
        **prep.bounds("delay_iterations", "max_iterations"),
    }
    prep.args += [_flag(key, value) for key, value in settings.items()]
    if "shapes" in contents:
        prep.notes.append("vLLM-Ascend ignores record_shapes")


_SGLANG_OBSERVED: Version = (0, 5, 0)
"""The SGLang releases whose launch flags were checked (on 0.5.23)."""


def _sglang(prep: _Prep) -> None:
    contents = prep.contents()
    # The per-call output_dir wins; this is the folder of captures started by anyone else.
    prep.env["SGLANG_TORCH_PROFILER_DIR"] = str(prep.directory)
    # Both default to on, which bloats traces; "false" forces them off whatever a call asks.
    if "stack" not in contents:
        prep.env["SGLANG_PROFILE_WITH_STACK"] = "false"
    if "shapes" not in contents:
        prep.env["SGLANG_PROFILE_RECORD_SHAPES"] = "false"
    prep.with_stack, prep.record_shapes = "stack" in contents, "shapes" in contents
    if prep.version >= _SGLANG_OBSERVED:
        # --sleep-on-idle: an idle scheduler busy-loops without it, and a capture left open
        # on an idle server grew to 20 GB in seconds (0.5.23, observed). --enable-metrics:
        # the forward counter (sglang:cuda_graph_passes_total) that delays and counts need.
        prep.args += ["--sleep-on-idle", "--enable-metrics"]
    else:
        prep.notes.append(
            "add --sleep-on-idle and --enable-metrics if this SGLang has them (checked on 0.5.x): "
            "an idle scheduler busy-loops, and the adapter reads its forward counter from /metrics"
        )
    if prep.tool == "nsys":
        prep.notes.append(
            "run the server under `nsys profile --capture-range=cudaProfilerApi "
            "--capture-range-end=stop`; captures then ask for the CUDA_PROFILER activity"
        )
    if prep.engine == "sglang-npu" and "memory" in contents:
        prep.notes.append("SGLang-NPU does not support the memory option")


_SPANS_EVERY_MS = "500"
"""How often the engines' span exporters send (their default, 5 s, would let a step's spans
arrive well after the step)."""


def _receiver_of(config: ProfilerConfig) -> str:
    """The base URL of aprof's OTLP receiver as the config fixes it."""
    otel = config.otel
    if otel.port == 0:
        raise ConfigError(
            "otel.port",
            "0 picks a free port once the profiler is open: pass "
            "otel_endpoint=prof.otel_endpoint, or set otel.port",
        )
    host = f"[{otel.host}]" if ":" in otel.host else otel.host
    return f"http://{host}:{otel.port}"


def _otel(prep: _Prep, endpoint: str) -> None:
    """The engine's flags and environment to export its request spans to ``endpoint``,
    over OTLP/HTTP protobuf (the engines' exporters default to gRPC, which aprof does not
    take)."""
    url = endpoint.rstrip("/") + "/v1/traces"
    if prep.engine == "reference":
        prep.notes.append("the reference server sends no OpenTelemetry spans")
        return
    prep.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    token_file = prep.config.otel.token_file
    if token_file is not None:
        token = load_token(token_file, "otel.token_file").decode("ascii")
        # The OTel exporters read headers from the environment, values URL-encoded (the spec's
        # W3C Baggage format): the space of "Bearer <token>" is %20.
        prep.env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] = "authorization=" + quote(
            f"Bearer {token}", safe=""
        )
        prep.notes.append("OTEL_EXPORTER_OTLP_TRACES_HEADERS holds otel.token_file's token")
    if prep.engine.startswith("vllm"):
        prep.env["OTEL_BSP_SCHEDULE_DELAY"] = _SPANS_EVERY_MS  # the SDK's batch processor
        prep.args += ["--otlp-traces-endpoint", url]
        if prep.config.otel.detailed:
            # Model forward and execute times per request; vLLM warns they may cost.
            prep.args += ["--collect-detailed-traces", "all"]
        return
    prep.env["SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS"] = _SPANS_EVERY_MS
    prep.args += ["--enable-trace", "--otlp-traces-endpoint", url]
    if prep.config.otel.detailed:
        prep.notes.append("otel.detailed is vLLM's --collect-detailed-traces: SGLang has none")


def _reference(prep: _Prep) -> None:
    prep.args += ["--profiler-dir", str(prep.directory)]
    if prep.dialect == "vllm" and (0, 12, 0) <= prep.version < (0, 32, 0):
        bounds = prep.bounds("--launch-delay-iterations", "--launch-max-iterations")
        for flag, value in bounds.items():
            prep.args += [flag, str(value)]


_PREPARE: dict[Engine, Callable[[_Prep], None]] = {
    "vllm": _vllm,
    "vllm-ascend": _vllm_ascend,
    "sglang": _sglang,
    "sglang-npu": _sglang,
    "reference": _reference,
}


def _command(
    prep: _Prep, python: str, model: str | None, host: str, port: int, server_args: list[str]
) -> list[str]:
    where = ["--host", host, "--port", str(port)]
    if prep.engine == "reference":
        # -P (no working folder on sys.path): the server imports the installed aprof even when
        # launched from a folder holding one (a clone); PYTHONPATH and user site still count.
        command = [python, "-P", "-m", "aprof", "serve-reference", *where]
        command += ["--dialect", prep.dialect]
        if prep.dialect == "vllm":
            command += ["--vllm-version", version_text(prep.version)]
        if model is not None:
            command += ["--model-name", model]
        return command + server_args
    if model is None:
        return []
    if prep.engine.startswith("vllm"):
        # The module entry point: the `vllm` script fails under CPU builds' distribution name.
        entry = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    else:
        entry = [python, "-m", "sglang.launch_server", "--model-path", model]
    return entry + where + server_args
