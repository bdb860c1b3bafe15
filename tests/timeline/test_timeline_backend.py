"""Which recorder runs: the C one where it is built, the pure-Python twin with
``APROF_NO_EXTENSIONS`` set; said by ``aprof.timeline_backend()`` and in the manifest."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

import aprof

MakeConfig = Callable[..., aprof.ProfilerConfig]

C_BUILT = importlib.util.find_spec("aprof._timeline._recorder") is not None


def backend_with(value: str | None) -> str:
    """``aprof.timeline_backend()`` of a fresh interpreter with ``APROF_NO_EXTENSIONS`` at
    ``value`` (unset for ``None``)."""
    env = {k: v for k, v in os.environ.items() if k != "APROF_NO_EXTENSIONS"}
    if value is not None:
        env["APROF_NO_EXTENSIONS"] = value
    done = subprocess.run(
        [sys.executable, "-c", "import aprof; print(aprof.timeline_backend())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.parametrize("value", ["1", "yes", "true"])
def test_aprof_no_extensions_runs_the_python_twin(value: str) -> None:
    assert backend_with(value) == "python"


@pytest.mark.parametrize("value", [None, "", "0"])
def test_without_the_variable_the_c_recorder_runs_where_it_is_built(value: str | None) -> None:
    assert backend_with(value) == ("c" if C_BUILT else "python")


def test_the_public_request_type_is_the_running_recorders() -> None:
    module = "pyrecorder" if aprof.timeline_backend() == "python" else "_recorder"
    assert sys.modules[f"aprof._timeline.{module}"].Request is aprof.Request


async def test_the_manifest_names_the_recorder_of_each_timeline_file(
    make_config: MakeConfig,
) -> None:
    async with aprof.Profiler(make_config()) as prof:
        with prof.span("turn"):
            pass
        await prof.flush()
    [entry] = aprof.load_manifest(prof.save_path).timeline
    assert entry.recorder == aprof.timeline_backend()
