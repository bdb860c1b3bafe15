"""Bad config inputs: each gives one one-line ``aprof.ConfigError`` or a valid config.

A curated list (alias bombs, a huge file, ``/dev/zero``, a FIFO, a folder, NUL characters,
5000-digit integers, deep nesting, duplicate keys, out-of-range timeouts), a wrong value of
every type at every key of the real schema and an unknown key in every section, plus
hypothesis-generated trees, texts and file contents. Each goes through ``aprof.load_config``
in a thread bounded by ``LOAD_S``; any other exception is lost as an escape. A sample of the
files also goes through the real command line, ``python -m aprof validate FILE``: one line
on stderr, a non-zero exit, no traceback.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import aprof
from faults.tally import Faults

pytestmark = pytest.mark.faults

LOAD_S = 20.0
"""Bound on one ``load_config`` (a slow 2-core machine parses 1 MiB of YAML in seconds)."""
CLI_S = 60.0
"""Bound on one ``aprof validate`` process."""
HUGE_INT = 10**5000  # past Python's 4300 digits for int <-> str: built, never printed

# -- running one input --------------------------------------------------------------------------


@dataclass
class Outcome:
    """What ``load_config`` did with one input."""

    config: aprof.ProfilerConfig | None = None
    error: BaseException | None = None


def load_bounded(source: object) -> Outcome:
    """``aprof.load_config(source)`` in a daemon thread; fails the test past ``LOAD_S``."""
    outcome = Outcome()

    def run() -> None:
        try:
            outcome.config = aprof.load_config(source)  # type: ignore[arg-type]
        except BaseException as exc:  # everything is judged by the caller
            outcome.error = exc

    thread = threading.Thread(target=run, name="load_config", daemon=True)
    thread.start()
    thread.join(LOAD_S)
    if thread.is_alive():
        pytest.fail(f"load_config did not return within {LOAD_S:g}s for {describe(source)}")
    return outcome


def describe(source: object) -> str:
    """A short, printable name of an input (some cannot be printed whole)."""
    try:
        text = repr(source)
    except ValueError:  # an int of more than 4300 digits
        text = f"<{type(source).__name__} that cannot be printed>"
    return text if len(text) <= 120 else text[:117] + "..."


def judge(faults: Faults, source: object, *, bad: bool | None = None) -> Outcome:
    """Count ``source`` as tried and check what came out: a config or one clear line;
    ``bad=True`` also asks for an error, ``bad=False`` for a config."""
    faults.count("configs")
    outcome = load_bounded(source)
    error = outcome.error
    if error is not None and type(error) is not aprof.ConfigError:
        faults.check("escaped", False, f"{describe(source)}: {type(error).__name__}: {error}")
        return outcome
    faults.check("escaped", True, "")
    if isinstance(error, aprof.ConfigError):
        line = str(error)
        assert line.strip() and "\n" not in line and "\r" not in line, repr(line)
        assert error.reason, repr(line)
        assert bad is not False, f"{describe(source)} was refused: {line}"
    else:
        assert bad is not True, f"{describe(source)} loaded"
    return outcome


# -- the curated list -------------------------------------------------------------------------

Make = Callable[[Path], object]


def write(name: str, data: str | bytes) -> Make:
    """A file named ``name`` holding ``data``; its path is the input."""

    def make(folder: Path) -> Path:
        path = folder / name
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return path

    return make


def alias_bomb() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join([*lines, "rollout: {start: *a9}"]) + "\n"


def many_aliases() -> str:
    return "x: &x 1\nrollout: {replicas: [" + ", ".join(["*x"] * 101) + "]}\n"


def fifo(folder: Path) -> Path:
    path = folder / "fifo.yaml"
    os.mkfifo(path)
    return path


def folder_(folder: Path) -> Path:
    path = folder / "dir.yaml"
    path.mkdir()
    return path


def link_loop(folder: Path) -> Path:
    (folder / "loop_a.yaml").symlink_to(folder / "loop_b.yaml")
    (folder / "loop_b.yaml").symlink_to(folder / "loop_a.yaml")
    return folder / "loop_a.yaml"


def link_to(target: str) -> Make:
    def make(folder: Path) -> Path:
        path = folder / "link.yaml"
        path.symlink_to(target)
        return path

    return make


def past_a_file(folder: Path) -> Path:
    (folder / "file").write_text("x")
    return folder / "file" / "x.yaml"


def deep_mapping(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = {}
    inner = data.setdefault("rollout", {})
    for _ in range(200):
        inner = inner.setdefault("x", {})
    return data


def recursive(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = {"rollout": {}}
    data["rollout"]["again"] = data
    return data


def text(value: str) -> Make:
    return lambda _: value


def data(value: object) -> Make:
    return lambda _: value


DEEP = 100_000
CURATED: dict[str, tuple[Make, bool | None]] = {
    # name: (input, must it be refused?)
    "alias_bomb_file": (write("bomb.yaml", alias_bomb()), True),
    "alias_bomb_text": (text(alias_bomb()), True),
    "aliases_over_the_limit": (write("aliases.yaml", many_aliases()), True),
    "huge_file": (write("huge.yaml", "#" * (1024**2 + 1)), True),
    "huge_json_file": (write("huge.json", '{"a": "' + "x" * 1024**2 + '"}'), True),
    "huge_text": (text("# " + "x" * (1024**2 + 1) + "\n"), True),
    "dev_zero": (data("/dev/zero"), True),
    "dev_zero_by_link": (link_to("/dev/zero"), True),
    "fifo": (fifo, True),
    "folder": (folder_, True),
    "link_loop": (link_loop, True),
    "dangling_link": (link_to("/nonexistent/aprof.yaml"), True),
    "missing_file": (data("/nonexistent/profile.yaml"), True),
    "name_too_long": (data("/tmp/" + "n" * 300 + ".yaml"), True),
    "not_a_folder_on_the_way": (past_a_file, True),
    "proc_mem": (data("/proc/self/mem"), True),
    "not_utf8": (write("latin1.yaml", b"rollout: {start: \xe9t\xe9}\n"), True),
    "utf16": (write("utf16.yaml", "rollout: {}\n".encode("utf-16")), True),
    "nul_in_save_path_mapping": (data({"global_profiler": {"save_path": "a\0b"}}), True),
    "nul_in_save_path_yaml": (write("nul.yaml", 'global_profiler: {save_path: "a\\0b"}\n'), True),
    "nul_in_save_path_json": (
        write("nul.json", '{"global_profiler": {"save_path": "a\\u0000b"}}'),
        True,
    ),
    "nul_in_process_name": (data({"timeline": {"process": "d\0x"}}), True),
    "digits_5000_yaml": (write("digits.yaml", f"rollout: {{delay: {'9' * 5000}}}\n"), True),
    "digits_5000_json": (write("digits.json", f'{{"rollout": {{"delay": {"9" * 5000}}}}}'), True),
    "digits_5000_mapping": (data({"rollout": {"delay": HUGE_INT}}), True),
    "digits_5000_steps": (data({"global_profiler": {"steps": [1, HUGE_INT]}}), True),
    "digits_5000_timeout": (data({"timeouts": {"stop_s": -HUGE_INT}}), True),
    "digits_5000_float_yaml": (
        write("float.yaml", f"timeouts: {{start_s: {'9' * 5000}.5}}\n"),
        True,
    ),
    "digits_5000_range": (data({"global_profiler": {"steps": "1-" + "9" * 5000}}), True),
    "deep_json": (write("deep.json", "[" * DEEP + "]" * DEEP), True),
    "deep_yaml_flow": (write("deep.yaml", "a: " + "[" * DEEP + "]" * DEEP + "\n"), True),
    "deep_yaml_block": (text("".join("  " * i + f"k{i}:\n" for i in range(200))), True),
    "deep_mapping": (deep_mapping, True),
    "recursive_mapping": (recursive, True),
    "duplicate_keys_json": (write("dup.json", '{"rollout": {"delay": 1, "delay": 2}}'), True),
    "duplicate_keys_yaml": (write("dup.yaml", "rollout:\n  delay: 1\n  delay: 2\n"), True),
    "duplicate_sections_yaml": (text("rollout: {}\nstrict: true\nrollout: {}\n"), True),
    "json_nan_and_infinity": (
        write("nan.json", '{"timeouts": {"start_s": NaN, "stop_s": Infinity}}'),
        True,
    ),
    "json_exponent": (write("exp.json", '{"timeouts": {"start_s": 1e999999}}'), True),
    "yaml_python_tag": (text("strict: !!python/object/apply:os.system [ls]\n"), True),
    "yaml_bad_timestamp": (text("strict: !!timestamp 2001-02-30\n"), True),
    "yaml_set": (text("rollout: !!set {a, b}\n"), True),
    "yaml_binary_path": (text("global_profiler: {save_path: !!binary aGVsbG8=}\n"), True),
    "yaml_unhashable_key": (text("? [a, b]\n: c\n"), True),
    "yaml_two_documents": (text("strict: true\n---\nstrict: false\n"), True),
    "yaml_tab": (text("rollout:\n\tdelay: 1\n"), True),
    "yaml_merge_alias": (text("base: &b {delay: 1}\nrollout: {<<: *b}\n"), True),
    "nul_in_path_str": (data("a\0b.yaml"), True),
    "nul_in_path_pathlike": (data(Path("a\0b.yaml")), True),
    "top_list": (text("- 1\n- 2\n"), True),
    "top_scalar": (text("hello: [\n"), True),
    "top_bytes": (data(b"rollout: {}"), True),
    "top_int": (data(5), True),
    "top_object": (data(object()), True),
    "non_string_keys": (data({"rollout": {1: 2}}), True),
    "tuple_key": (data({("rollout",): {}}), True),
    "steps_over_the_limit": (data({"global_profiler": {"steps": list(range(1, 100_002))}}), True),
    "steps_range_too_long": (data({"global_profiler": {"steps": "1-99999999999999"}}), True),
    "steps_reversed": (data({"global_profiler": {"steps": "3-1"}}), True),
    "steps_every_zero": (data({"global_profiler": {"steps": {"every": 0}}}), True),
    "steps_twice": (data({"global_profiler": {"steps": "1-3,2"}}), True),
    "replicas_twice": (data({"rollout": {"replicas": [0, 0]}}), True),
    "role_name_path": (data({"roles": {"../actor": {}}}), True),
    "home_of_nobody": (data({"global_profiler": {"save_path": "~no_such_user_x/p"}}), True),
    "empty_file": (write("empty.yaml", b""), False),
    "comments_only": (write("comments.yaml", "# nothing\n"), False),
    "utf8_bom": (write("bom.yaml", b"\xef\xbb\xbfrollout: {start: on_step}\n"), False),
    "null_sections": (text("rollout:\nroles:\n  actor:\n"), False),
}


@pytest.mark.parametrize("name", list(CURATED))
def test_curated_input(tmp_path: Path, faults: Faults, name: str) -> None:
    """A known-bad (or odd but valid) input: one line of ConfigError, or the config."""
    make, bad = CURATED[name]
    judge(faults, make(tmp_path), bad=bad)
    faults.assert_nothing_lost()


# -- every key of the schema -------------------------------------------------------------------

WRONG: list[object] = [
    None,
    True,
    0,
    -1,
    1.5,
    math.nan,
    math.inf,
    "",
    "x",
    "1-3",
    [],
    [1, "a"],
    {},
    {"a": 1},
    10**30,
    HUGE_INT,
    b"x",
    object(),
]
"""Values of every type, wrong for most keys (valid for some: those load)."""


def leaf_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The dotted path of every key of ``model``, sections and their keys (a role: ``actor``)."""
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        yield path
        annotation = info.annotation
        options = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
        for option in options:
            if isinstance(option, type) and issubclass(option, BaseModel):
                yield from leaf_paths(option, path)
            elif get_origin(option) is dict:
                role = get_args(option)[1]
                yield from leaf_paths(role, (*path, "actor"))


def nested(path: tuple[str, ...], value: object) -> dict[str, Any]:
    """``{path[0]: {path[1]: ... value}}``; a key inside a schedule gets the ``active`` every
    schedule needs beside it, so that the key itself is judged."""
    out: Any = value
    for i in range(len(path) - 1, -1, -1):
        inner, out = out, {path[i]: out}
        if path[i] == "schedule" and i + 1 < len(path) and path[i + 1] != "active":
            inner.setdefault("active", 1)
    return out  # type: ignore[no-any-return]


KEYS = sorted(set(leaf_paths(aprof.ProfilerConfig)))


@pytest.mark.parametrize("key", [".".join(k) for k in KEYS])
def test_wrong_values_at_every_key(faults: Faults, key: str) -> None:
    """Every key of the real schema given values of every type, and an unknown key beside
    it: each loads or gives one line of ConfigError; a refusal names that key's path."""
    path = tuple(key.split("."))
    for value in WRONG:
        outcome = judge(faults, nested(path, value))
        if isinstance(outcome.error, aprof.ConfigError):
            assert str(outcome.error).startswith(path[0]), (key, describe(value), outcome.error)
    parent = path[:-1]
    siblings = {p[len(parent)] for p in KEYS if p[: len(parent)] == parent and len(p) > len(parent)}
    for unknown in {"bogus", path[-1][:-1], path[-1] + "s"} - siblings:
        judge(faults, nested((*parent, unknown), 1), bad=True)
    faults.assert_nothing_lost()


@pytest.mark.parametrize("key", ["connect_s", "start_s", "stop_s", "poll_s"])
def test_timeouts_out_of_range(faults: Faults, key: str) -> None:
    """Every timeout at, past and far past its bounds, and of every wrong kind."""
    for value in (0, 0.0, -0.0, -1, 1e-9, 1e9, 1e308, math.nan, math.inf, -math.inf, "5", True):
        judge(faults, {"timeouts": {key: value}}, bad=True)
    for value in (0.01, 60):
        judge(faults, {"timeouts": {key: value}}, bad=False)
    faults.assert_nothing_lost()


# -- generated inputs ------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
trees = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)
sections = st.sampled_from(sorted({k[0] for k in KEYS}))
fields = st.sampled_from(KEYS)
GENERATED = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@GENERATED
@given(st.dictionaries(sections, trees, max_size=3))
def test_generated_trees(faults: Faults, tree: dict[str, Any]) -> None:
    """Random trees under the real sections: a config or one line of ConfigError."""
    judge(faults, tree)
    faults.assert_nothing_lost()


@GENERATED
@given(fields, trees)
def test_generated_values_at_real_keys(faults: Faults, key: tuple[str, ...], value: object) -> None:
    """A random value at a random real key: a config or one line of ConfigError."""
    judge(faults, nested(key, value))
    faults.assert_nothing_lost()


@GENERATED
@given(st.text(max_size=200))
def test_generated_texts(faults: Faults, source: str) -> None:
    """Random text as YAML (or a path): a config or one line of ConfigError."""
    judge(faults, source)
    faults.assert_nothing_lost()


@GENERATED
@given(st.binary(max_size=200), st.sampled_from([".yaml", ".json", ""]))
def test_generated_files(tmp_path: Path, faults: Faults, content: bytes, suffix: str) -> None:
    """Random bytes in a file: a config or one line of ConfigError."""
    path = tmp_path / f"generated{suffix}"
    path.write_bytes(content)
    judge(faults, path)
    faults.assert_nothing_lost()


# -- the command line --------------------------------------------------------------------------

CLI_SAMPLE = [
    "alias_bomb_file",
    "dev_zero",
    "fifo",
    "nul_in_save_path_yaml",
    "digits_5000_json",
    "deep_json",
]


def test_validate_command_line(tmp_path: Path, faults: Faults) -> None:
    """``python -m aprof validate FILE`` on a sample of the bad files: a non-zero exit and
    one line on stderr, never a traceback; all processes bounded."""
    procs = []
    for name in CLI_SAMPLE:
        folder = tmp_path / name
        folder.mkdir()
        source = CURATED[name][0](folder)
        assert isinstance(source, (str, Path)), name
        faults.count("configs")
        proc = subprocess.Popen(
            [sys.executable, "-m", "aprof", "validate", str(source)],
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append((name, proc))
    try:
        for name, proc in procs:
            out, err = proc.communicate(timeout=CLI_S)
            lines = err.splitlines()
            clean = "Traceback" not in err
            faults.check("escaped", clean, f"aprof validate ({name}) printed a traceback: {err}")
            assert proc.returncode not in (0, None), (name, proc.returncode, out)
            assert len(lines) == 1 and lines[0].startswith("aprof validate: "), (name, err)
            assert out == "", (name, out)
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=CLI_S)
    faults.assert_nothing_lost()
