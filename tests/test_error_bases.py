"""Every exception ``servers`` and ``agentloop`` define is an ``aprof.AprofError`` and keeps its
built-in base, so ``except aprof.AprofError`` and the ``except ValueError`` / ``except
RuntimeError`` written before both catch it.

The modules are walked with ``pkgutil`` and ``inspect``: an error class added anywhere in
either package (the reference server's included) is checked without being listed here.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
from types import ModuleType

import pytest

import agentloop
import aprof
import servers
from servers.versions import parse_version


def modules(package: ModuleType) -> list[ModuleType]:
    """``package`` and every module below it, imported."""
    found = [package]
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        found.append(importlib.import_module(info.name))
    return found


def error_classes(package: ModuleType) -> dict[str, type[BaseException]]:
    """Every exception class defined in ``package`` or below it, by qualified name."""
    return {
        f"{cls.__module__}.{cls.__qualname__}": cls
        for module in modules(package)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == module.__name__
    }


@pytest.mark.parametrize(
    ("package", "some"),
    [
        (servers, {"servers._errors.ServerError", "servers.reference.prompts.BadPrompt"}),
        (agentloop, {"agentloop._errors.LLMError", "agentloop._errors.BadAnswer"}),
    ],
    ids=["servers", "agentloop"],
)
def test_every_error_defined_is_an_aprof_error(package: ModuleType, some: set[str]) -> None:
    classes = error_classes(package)
    assert some <= set(classes)  # the walk sees the package, its reference server included
    strays = sorted(name for name, cls in classes.items() if not issubclass(cls, aprof.AprofError))
    assert not strays, f"not an aprof.AprofError: {strays}"


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (servers.ServerError, Exception),
        (servers.AnswerTooLargeError, Exception),
        (servers.LaunchError, RuntimeError),
        (servers.ProfilingDisabledError, RuntimeError),
        (servers.SessionConflictError, RuntimeError),
        (servers.VersionError, ValueError),
        (servers.UnsupportedError, ValueError),
        (agentloop.LLMError, Exception),
        (agentloop.CalculatorError, ValueError),
        (agentloop.PromptError, ValueError),
    ],
    ids=lambda e: e.__name__,
)
def test_public_errors_keep_their_builtin_base(
    error: type[BaseException], builtin: type[BaseException]
) -> None:
    assert issubclass(error, aprof.AprofError) and issubclass(error, builtin)


@pytest.mark.parametrize("package", [servers, agentloop], ids=lambda p: p.__name__)
def test_the_front_door_exports_every_public_error(package: ModuleType) -> None:
    public = {
        name.rsplit(".", 1)[1]
        for name in error_classes(package)
        if ".reference." not in name and not name.rsplit(".", 1)[1].startswith("_")
    }
    internal = {"BadAnswer"}  # raised to LLMClient only, which turns it into an LLMError
    assert public - internal <= set(package.__all__)
    for name in public - internal:
        assert getattr(package, name).__module__ == f"{package.__name__}._errors"


def test_errors_raised_at_users_are_the_named_ones() -> None:
    with pytest.raises(servers.VersionError, match="not a version"):
        parse_version("latest")
    with pytest.raises(agentloop.CalculatorError):
        agentloop.evaluate("1 / 0")
    with pytest.raises(aprof.UsageError):
        agentloop.ReplicaBalancer(1).release(0)


async def test_client_errors_raised_at_users_are_the_named_ones() -> None:
    llm = agentloop.LLMClient(["http://127.0.0.1:1"])  # nothing listens there; nothing is sent
    with pytest.raises(aprof.UsageError):
        await llm.generate("hi", max_tokens=1)
    async with llm:
        with pytest.raises(agentloop.PromptError, match="at least one token ID"):
            await llm.generate([], max_tokens=1)
        with pytest.raises(agentloop.PromptError, match="integers >= 0"):
            await llm.generate([3, -1], max_tokens=1)


def test_errors_with_fields_pickle() -> None:
    # Ray ships exceptions between processes.
    errors: list[BaseException] = [
        servers.ServerError("GET", "http://h/x", 302, "moved", "http://h/y"),
        servers.AnswerTooLargeError("GET", "http://h/x", 200, 1024),
        agentloop.LLMError(0, "http://h/v1/completions", "status", "boom", 500),
    ]
    for error in errors:
        again = pickle.loads(pickle.dumps(error))
        assert (type(again), str(again), again.args) == (type(error), str(error), error.args)
