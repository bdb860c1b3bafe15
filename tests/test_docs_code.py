"""The docs' code runs: every fenced block of README.md and docs/ marked ``run`` is executed.

A block's info string is ``LANG [run] [file=NAME] [setup=NAME]``:

- ``python run``: the block in a fresh interpreter; top-level ``await`` is allowed, as in
  ``python -m asyncio``.
- ``bash run``: the block under ``bash -e``, with this interpreter's ``aprof`` and ``python``
  first on PATH.
- ``yaml run`` / ``json run``: the block is loaded as a configuration (``aprof.load_config``).
- ``file=NAME``: the block is written to NAME when reached, for the blocks after it.
- ``setup=NAME``: the stand-ins of ``SETUPS[NAME]`` (below, or ``tests/docs_setups/NAME.py``)
  run first in the same interpreter: the names a fragment uses without defining them (a
  target, a step count, a training step).

The blocks of one page run in order in one temporary folder (the cwd), with the repository on
PYTHONPATH and ``examples/`` linked in, so that a page reads as one session from a checkout.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import aprof

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
BLOCK_TIMEOUT_S = 120
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`]*)$")
RUNNERS = {"python", "bash", "yaml", "json"}

# Runs each block's code object; one event loop for all of them when any awaits at top level.
PYTHON_DRIVER = """
import ast, asyncio, inspect, sys
codes = [
    compile(open(path).read(), name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    for path, name in zip(sys.argv[1::2], sys.argv[2::2])
]
namespace = {"__name__": "__main__"}
if any(code.co_flags & inspect.CO_COROUTINE for code in codes):
    async def main():
        for code in codes:
            result = eval(code, namespace)
            if inspect.iscoroutine(result):
                await result
    asyncio.run(main())
else:
    for code in codes:
        eval(code, namespace)
"""

# Stand-ins for the names the docs' fragments leave to the reader's program.
PROFILE_YAML = """
from pathlib import Path

if not Path("profile.yaml").exists():
    Path("profile.yaml").write_text("global_profiler: {steps: [1, 2], save_path: outputs/profile}")
"""
SETUPS = {
    "program": PROFILE_YAML
    + """
import asyncio
import aprof
from aprof.testing import RecordingTarget

num_steps = 2
my_server = target = RecordingTarget("replica_0", replica=0)


async def run_agent_loops():
    async with prof.request(replica=0):
        await asyncio.sleep(0)


async def train_step():
    await asyncio.sleep(0)


async def rollout(n):
    return [n]


def train(batch):
    pass
""",
    "worker": """
from pathlib import Path

import aprof

num_steps = 2
config = cfg = aprof.load_config({"global_profiler": {"steps": [1, 2], "save_path": "out"}})
directory = Path("out/tool")
directory.mkdir(parents=True, exist_ok=True)
""",
    "run": """
from pathlib import Path

import aprof
from aprof.testing import RecordingTarget

save_path = Path("outputs/profile")
cfg = {"global_profiler": {"steps": [1], "save_path": str(save_path)}}
with aprof.BlockingProfiler(cfg) as run:
    run.add_target(RecordingTarget("replica_0", replica=0))
    for n in (1, 2):
        with run.step(n):
            pass
""",
}
# Longer stand-ins live in docs_setups/, one file each, named for the setup.
SETUPS.update(
    {f.stem: f.read_text() for f in sorted((REPO / "tests" / "docs_setups").glob("*.py"))}
)


@dataclass
class Block:
    """One fenced block: where it is, its info string's parts and its text."""

    page: Path
    line: int
    lang: str
    text: str
    run: bool = False
    file: str | None = None
    setup: str | None = None
    unknown: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, in order."""
    found: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, words = opening["indent"], opening["info"].split()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i].removeprefix(indent))
            i += 1
        i += 1
        block = Block(page, start, words[0] if words else "", "\n".join(body) + "\n")
        for word in words[1:]:
            key, _, value = word.partition("=")
            if word == "run":
                block.run = True
            elif key in ("file", "setup") and value:
                setattr(block, key, value)
            else:
                block.unknown.append(word)
        found.append(block)
    return found


def marked(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.run or b.file]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run_block(block: Block, folder: Path) -> None:
    """Run one block in ``folder``; fail the test with its output when it fails."""
    if block.lang in ("yaml", "json"):
        # A block's text holds a newline, so load_config reads it as YAML (JSON included).
        aprof.load_config(folder / block.file if block.file else block.text)
        return
    script = folder / f".block-{block.line}.{'py' if block.lang == 'python' else 'sh'}"
    script.write_text(block.text, encoding="utf-8")
    if block.lang == "python":
        parts = [str(script), block.where]
        if block.setup is not None:
            setup = folder / f".setup-{block.line}.py"
            setup.write_text(SETUPS[block.setup], encoding="utf-8")
            parts = [str(setup), f"setup {block.setup}", *parts]
        command = [sys.executable, "-c", PYTHON_DRIVER, *parts]
    else:
        command = ["bash", "-e", str(script)]
    try:
        done = subprocess.run(
            command,
            cwd=folder,
            env=environment(),
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where}: still running after {BLOCK_TIMEOUT_S}s")
    if done.returncode != 0:
        pytest.fail(
            f"{block.where}: {shlex.join(command[:2])} ... exited {done.returncode}\n"
            f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
        )


RUNNABLE = [page for page in PAGES if any(b.run for b in blocks(page))]


@pytest.mark.parametrize("page", RUNNABLE, ids=[str(p.relative_to(REPO)) for p in RUNNABLE])
def test_page_code_runs(page: Path, tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(REPO / "examples")
    for block in marked(page):
        if block.file:
            (tmp_path / block.file).write_text(block.text, encoding="utf-8")
        if block.run:
            run_block(block, tmp_path)


def test_info_strings_are_understood() -> None:
    wrong = [
        f"{b.where}: {problem}"
        for page in PAGES
        for b in blocks(page)
        for problem in (
            *(f"unknown word {w!r}" for w in b.unknown),
            *([f"{b.lang!r} blocks cannot run"] if b.run and b.lang not in RUNNERS else []),
            *([f"no setup {b.setup!r}"] if b.setup and b.setup not in SETUPS else []),
            *([f"setup on a {b.lang!r} block"] if b.setup and b.lang != "python" else []),
        )
    ]
    assert not wrong


def test_the_tutorials_run() -> None:
    # Each tutorial is code that runs: a page there with nothing marked is a slip.
    tutorials = sorted((REPO / "docs" / "tutorials").glob("*.md"))
    assert tutorials
    assert set(tutorials) <= set(RUNNABLE)
