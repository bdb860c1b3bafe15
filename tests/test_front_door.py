"""The front door: ``import aprof`` is light, ``__all__`` is exactly the public names, each says
it is ``aprof``'s, and every exception aprof raises on purpose is an ``aprof.AprofError``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from types import ModuleType

import pytest

import aprof
from aprof.testing import RecordingTarget

LOADS_LATER = ("ray", "verl", "aprof.ray", "aprof.verl", "aprof._merge", "aprof._report", "plotly")


def test_import_aprof_loads_neither_ray_nor_verl_nor_the_readers() -> None:
    code = (
        "import sys, aprof\n"
        f"print(' '.join(m for m in {LOADS_LATER!r} if m in sys.modules))\n"
        "aprof.verl.load, aprof.merge, aprof.report\n"
        f"print(' '.join(m for m in {LOADS_LATER!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    before, after = done.stdout.splitlines()
    assert before == ""
    assert set(after.split()) == {"aprof.verl", "aprof._merge", "aprof._report"}


def test_all_is_every_public_name_and_nothing_else() -> None:
    for name in aprof.__all__:
        assert getattr(aprof, name) is not None, name
    public = {
        name
        for name, value in vars(aprof).items()
        if not name.startswith("_") and not isinstance(value, ModuleType)
    }
    public |= {"ray", "verl", "merge", "report", "MergedStep", "RunReport"}  # loaded on use
    assert public - {"annotations", "contextlib", "importlib", "TYPE_CHECKING", "Any"} == (
        set(aprof.__all__) - {"__version__"}
    )
    assert set(dir(aprof)) >= set(aprof.__all__)  # the names loaded on use too


@pytest.mark.parametrize("name", [n for n in aprof.__all__ if n not in ("ray", "verl")])
def test_each_public_class_and_function_is_aprofs(name: str) -> None:
    value = getattr(aprof, name)
    if inspect.isclass(value) or inspect.isfunction(value):
        assert value.__module__ == "aprof", f"{name}.__module__ == {value.__module__!r}"


def test_one_way_to_map_a_verl_config() -> None:
    assert not hasattr(aprof, "from_verl")
    assert isinstance(aprof.verl.load({}).config, aprof.ProfilerConfig)


def _modules() -> list[ModuleType]:
    """aprof and its modules that import without Ray and verl."""
    found = [aprof]
    for info in pkgutil.walk_packages(aprof.__path__, "aprof."):
        if info.name.endswith("__main__") or (
            info.name.startswith(("aprof.verl.", "aprof.cli")) and info.name != "aprof.verl._config"
        ):
            continue  # they import verl, or are programs
        try:
            found.append(importlib.import_module(info.name))
        except ImportError:  # a module of an optional framework
            continue
    return found


def test_every_exception_aprof_defines_is_an_aprof_error() -> None:
    defined = {
        f"{module.__name__}.{name}": value
        for module in _modules()
        for name, value in vars(module).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ in (module.__name__, "aprof")
    }
    assert len(defined) >= 15
    strays = sorted(name for name, cls in defined.items() if not issubclass(cls, aprof.AprofError))
    assert not strays


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (aprof.ConfigError, ValueError),
        (aprof.ManifestError, ValueError),
        (aprof.StepError, ValueError),
        (aprof.TargetError, ValueError),
        (aprof.UnsafeNameError, ValueError),
        (aprof.CaptureError, RuntimeError),
        (aprof.UsageError, RuntimeError),
        (aprof.WorkerGroupError, RuntimeError),
        (aprof.ToolError, RuntimeError),
        (aprof.ToolUnavailableError, RuntimeError),
        (aprof.WindowStateError, RuntimeError),
        (aprof.UnsafePathError, OSError),
        (aprof.NotRegularFileError, OSError),
        (aprof.FileTooLargeError, OSError),
    ],
)
def test_each_error_keeps_its_builtin_base(error: type[Exception], builtin: type) -> None:
    assert issubclass(error, aprof.AprofError) and issubclass(error, builtin)


async def test_a_user_catches_every_misuse_as_an_aprof_error(make_config) -> None:  # type: ignore[no-untyped-def]
    prof = aprof.Profiler(make_config())
    with pytest.raises(aprof.UsageError, match="open the profiler first"):
        async with prof.step(1):
            pass
    async with prof:
        with pytest.raises(aprof.StepError, match="integers >= 1"):
            async with prof.step(0):
                pass
        with pytest.raises(aprof.UsageError, match="opened once"):
            await prof.__aenter__()
        with pytest.raises(aprof.UnsafeNameError, match="not path-safe"):
            prof.add_target(RecordingTarget("a/b", kind="role"))
    with pytest.raises(aprof.UsageError, match="closed"):
        prof.add_target(RecordingTarget("actor", kind="role"))
