"""docs/verl.md's commands, run as the doc writes them.

The one command (compose ``job.yaml``, ``aprof launch-args --verl``, ``main_ppo`` with the
printed overrides) runs literally in bash, its ``<your overrides>`` the ones
``examples/verl_ppo.py`` builds for a one-step sync run on CPU. The doc's other lines are
checked without a run of their own: each ``examples/verl_ppo.py`` line parses with the
example's own arguments (``test_verl_ppo.py`` runs every mode), each ``aprof`` subcommand
exists. A line of the doc's bash blocks that none of these covers fails the test.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
from verl_runs import EXAMPLE, RUN_S, windows

DOC = Path(__file__).resolve().parents[2] / "docs" / "verl.md"
YOURS = "<your overrides>"
"""Where the doc's one command takes the user's own verl overrides."""
OTHER_RUN = "verl.trainer.main_ppo"
WAIT_S = 25 * 60
"""The longest this test waits for another verl run on the machine to end before its own."""
POLL_S = 30.0
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


def wait_for_other_runs() -> None:
    """Return once no verl run is going on this machine (one takes ~6 GB); fail after
    WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while subprocess.run(["pgrep", "-f", OTHER_RUN], capture_output=True).returncode == 0:
        if time.monotonic() > deadline:
            pytest.fail(f"another verl run ({OTHER_RUN}) kept going for {WAIT_S} s")
        time.sleep(POLL_S)


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


@pytest.fixture(scope="module")
def one_command(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    """The doc's one command, run by bash as written (in a fresh folder), for a one-step
    sync run on CPU with step 1 profiled: its exit status and its save_path."""
    (block,) = ONE_COMMAND
    ex = example()
    out = tmp_path_factory.mktemp("docs")
    args = example_args(["--mode", "sync", "--out", str(out), "--steps", "1", "--num-steps", "1"])
    args.out = args.out.resolve()
    ex.make_assets(args.out / "assets")
    env = ex.environment(args)
    # `python` and `aprof` are this environment's, as they are for the user who installed it.
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    yours = shlex.join(ex.verl_overrides(args, args.out / "assets"))
    script = "\n".join(
        ["set -euo pipefail", f"cd {shlex.quote(str(out))}"]
        + [line.replace(YOURS, yours) for line in block]
    )
    wait_for_other_runs()
    code: int = ex.run(["bash", "-c", script], env, out / "verl.log", RUN_S)
    return code, args.out / "profile"


def test_the_one_command_runs_verl_with_aprof_and_captures_step_1(
    one_command: tuple[int, Path],
) -> None:
    code, save_path = one_command
    log = (save_path.parent / "verl.log").read_text(errors="replace")
    assert code == 0, f"the doc's command exited {code}:\n{log[-4000:]}"
    assert (save_path / "manifest.json").is_file(), log[-4000:]
    done = [w for w in windows(save_path, 1) if w.state == "done"]
    assert done, f"no done window of step 1: {windows(save_path, 1)}"
