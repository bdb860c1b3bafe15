"""docs/verl.md's commands, run as the doc writes them.

The one command (compose ``job.yaml``, ``aprof launch-args --verl``, ``main_ppo`` with the
printed overrides) runs literally in bash, its ``<your overrides>`` the ones
``examples/verl_ppo.py`` builds for a sync run on CPU: the first two lines as written, the
third expanded by bash as written and held to be the very command the example runs, which
``test_verl_ppo.py`` runs in every mode (a training run of its own here would cost CI minutes
and test nothing more). The doc's other lines are checked without a run of their own: each
``examples/verl_ppo.py`` line parses with the example's own arguments, each ``aprof``
subcommand exists. A line of the doc's bash blocks that none of these covers fails the test.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from verl_runs import EXAMPLE

DOC = Path(__file__).resolve().parents[2] / "docs" / "verl.md"
YOURS = "<your overrides>"
"""Where the doc's one command takes the user's own verl overrides."""
RUN_EXAMPLE = ["python", "examples/verl_ppo.py"]
NOT_RUN = ("pip install ",)
"""Doc lines no test can run: they change the environment the tests run in."""


def bash_blocks(text: str) -> list[list[str]]:
    """The lines of each ```bash block of ``text``, a backslash-continued line as one."""
    blocks: list[list[str]] = []
    block: list[str] | None = None
    for line in text.splitlines():
        if block is None:
            if line.strip() == "```bash":
                block = []
            continue
        if line.strip() == "```":
            blocks.append(block)
            block = None
        elif block and block[-1].endswith("\\"):
            block[-1] = block[-1][:-1] + line.strip()
        elif line.strip():
            block.append(line.strip())
    return blocks


BLOCKS = bash_blocks(DOC.read_text())
ONE_COMMAND = [block for block in BLOCKS if any(YOURS in line for line in block)]
LINES = [line for block in BLOCKS if block not in ONE_COMMAND for line in block]
EXAMPLE_LINES = [line for line in LINES if shlex.split(line, comments=True)[:2] == RUN_EXAMPLE]
APROF_LINES = [line for line in LINES if shlex.split(line, comments=True)[:1] == ["aprof"]]


@functools.cache
def example() -> ModuleType:
    """``examples/verl_ppo.py`` as a module."""
    spec = importlib.util.spec_from_file_location("verl_ppo_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Parsed(Exception):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.namespace = args


def example_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` as the example's ``main`` parses it, with nothing of the example run: its own
    parser is stopped right after parsing. Fails the test when the example refuses it."""
    parse = argparse.ArgumentParser.parse_args

    def parse_and_stop(
        self: argparse.ArgumentParser,
        args: list[str] | None = None,
        namespace: argparse.Namespace | None = None,
    ) -> argparse.Namespace:
        raise _Parsed(parse(self, args, namespace))

    argparse.ArgumentParser.parse_args = parse_and_stop  # type: ignore[method-assign,assignment]
    try:
        example().main(argv)
    except _Parsed as parsed:
        return parsed.namespace
    except SystemExit as exc:
        pytest.fail(f"examples/verl_ppo.py refuses {shlex.join(argv)} (exit {exc.code})")
    finally:
        argparse.ArgumentParser.parse_args = parse  # type: ignore[method-assign]
    raise AssertionError("the example's main() did not parse its arguments")


def test_the_doc_has_one_command_of_three_lines() -> None:
    assert len(ONE_COMMAND) == 1, ONE_COMMAND
    assert len(ONE_COMMAND[0]) == 3, ONE_COMMAND[0]


def test_every_line_of_the_docs_bash_blocks_is_checked() -> None:
    checked = set(EXAMPLE_LINES) | set(APROF_LINES)
    unchecked = [line for line in LINES if line not in checked and not line.startswith(NOT_RUN)]
    assert not unchecked, f"docs/verl.md has commands no test checks: {unchecked}"
    assert EXAMPLE_LINES and APROF_LINES


@pytest.mark.parametrize("line", EXAMPLE_LINES)
def test_each_example_line_parses_with_the_examples_own_arguments(line: str) -> None:
    example_args(shlex.split(line, comments=True)[2:])


@pytest.mark.parametrize("line", APROF_LINES)
def test_each_aprof_subcommand_exists(line: str) -> None:
    sub = shlex.split(line, comments=True)[1]
    done = subprocess.run(
        [sys.executable, "-m", "aprof", sub, "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{line}: {done.stderr}"


def test_the_one_command_is_the_command_the_example_runs(tmp_path: Path) -> None:
    (block,) = ONE_COMMAND
    compose, launch_args, train = block
    ex = example()
    argv = ["--mode", "sync", "--out", str(tmp_path), "--steps", "2", "--num-steps", "3"]
    args = example_args(argv)
    args.out = args.out.resolve()
    ex.make_assets(args.out / "assets")
    env = ex.environment(args)
    # `python` and `aprof` are this environment's, as they are for the user who installed it.
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    overrides = ex.verl_overrides(args, args.out / "assets")
    yours = shlex.join(overrides)
    # The third line's words, as bash expands them, NUL-separated.
    script = "\n".join(
        [
            "set -euo pipefail",
            f"cd {shlex.quote(str(tmp_path))}",
            compose.replace(YOURS, yours),
            launch_args,
            "printf '%s\\0' " + train.replace(YOURS, yours),
        ]
    )
    done = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    words = done.stdout.decode().split("\0")[:-1]
    expected = [*overrides, *ex.aprof_overrides(overrides, env, args.out)]
    assert words[:3] == ["python", "-m", "verl.trainer.main_ppo"], words[:3]
    assert words[3:] == expected
