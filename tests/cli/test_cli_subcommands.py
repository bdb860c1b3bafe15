"""The `aprof` command line loads only the subcommand it runs, and every subcommand is declared
the one way: a line of `SUBCOMMANDS` and a module with a docstring, `arguments` and `run`. Every
subcommand (and kind of one, `export hta`) has a line in `aprof --help` and examples in its own
`--help` that the real parser takes."""

from __future__ import annotations

import json
import os
import pkgutil
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import aprof.cli
from aprof.cli import SUBCOMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("servers", "servers.reference", "agentloop")
KINDS = [name for name in SUBCOMMANDS if " " in name]
COMMANDS = [name for name in SUBCOMMANDS if name not in KINDS]

# Prints which of HEAVY (and which subcommand modules) are loaded after `import aprof.cli`,
# after parsing `validate`'s arguments, and after running it.
PROBE = """
import json, sys
heavy = {heavy!r}
def loaded():
    return sorted(m for m in sys.modules if m in heavy or m.startswith("aprof.cli."))
seen = {{}}
import aprof.cli
seen["import"] = loaded()
aprof.cli.build_parser("validate").parse_args(["validate", sys.argv[1]])
seen["parse"] = loaded()
code = aprof.cli.main(["validate", sys.argv[1]])
seen["run"] = loaded()
print(json.dumps(seen), file=sys.stderr)
sys.exit(code)
"""


def test_validate_loads_neither_servers_nor_agent_loops(tmp_path: Path) -> None:
    config = tmp_path / "profile.yaml"
    config.write_text("global_profiler: {steps: [1]}\n")
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stderr.splitlines()[-1])
    assert seen == {
        "import": [],  # no subcommand module, no server, no agent loop
        "parse": ["aprof.cli.validate"],
        "run": ["aprof.cli.validate"],
    }


def test_help_lists_every_subcommand_without_loading_one() -> None:
    # In a fresh process: this one may have loaded subcommands in other tests. 80 columns: each
    # line of SUBCOMMANDS must fit on one line of a common terminal.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, aprof.cli\n"
            "try:\n"
            "    aprof.cli.main(['--help'])\n"
            "except SystemExit:\n"
            "    print(sorted(m for m in sys.modules if m.startswith('aprof.cli.')))",
        ],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    help_text, loaded = done.stdout.rsplit("\n", 2)[:2]
    assert loaded == "[]"
    flat = " ".join(help_text.split())  # argparse puts a long name's help on the next line
    lines = help_text.splitlines()
    for name, summary in SUBCOMMANDS.items():  # `export hta` too, below the subcommands
        assert f"{name} {summary}" in flat
        assert any(line.endswith(f" {summary}") for line in lines), f"{name}: wrapped"


def test_every_subcommand_module_is_declared() -> None:
    """A module of aprof.cli not starting with `_` is a subcommand listed in SUBCOMMANDS."""
    modules = {
        m.name for m in pkgutil.iter_modules(aprof.cli.__path__) if not m.name.startswith("_")
    }
    assert modules == {name.replace("-", "_") for name in COMMANDS}


def help_of(name: str, capsys: pytest.CaptureFixture[str]) -> str:
    """What `aprof <name> --help` prints (``name`` a line of SUBCOMMANDS), after exiting 0."""
    with pytest.raises(SystemExit) as exit:
        build_parser(name.split()[0]).parse_args([*name.split(), "--help"])
    assert exit.value.code == 0
    return capsys.readouterr().out


def examples_in(help_text: str) -> list[list[str]]:
    """The `aprof` command lines of the help's examples block, split as the shell splits them.

    The block ends the description: the options follow it.
    """
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.fullmatch("examples?:", line))
    end = lines.index("", start)
    assert lines[end + 1] in ("positional arguments:", "options:"), "not the description's end"
    return [shlex.split(line) for line in lines[start + 1 : end] if line.startswith("  aprof ")]


@pytest.mark.parametrize("name", COMMANDS)
def test_subcommand_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each subcommand's --help shows its module's docstring and its options."""
    out = help_of(name, capsys)
    assert out.startswith(f"usage: aprof {name} ")
    assert f"aprof {name}" in out.split("\n\n")[1]  # the docstring's first line, `` removed
    assert "``" not in out


@pytest.mark.parametrize("name", COMMANDS)
def test_subcommand_kinds_are_lines_of_subcommands(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The kinds a subcommand's parser takes (`export`'s KIND) are the lines `<name> <kind>`."""
    out = help_of(name, capsys)
    positionals = out.partition("\npositional arguments:\n")[2].split("\n\n")[0]
    listed = re.findall(r"^ {4}(\S+) ", positionals, re.MULTILINE)
    assert {f"{name} {kind}" for kind in listed} == {k for k in KINDS if k.startswith(f"{name} ")}


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_help_examples_parse(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each subcommand's (and kind's) --help ends its description with examples of it that the
    real parser takes, so an example cannot drift from the options."""
    examples = examples_in(help_of(name, capsys))
    assert any(example[1:][: len(name.split())] == name.split() for example in examples)
    for example in examples:
        try:
            build_parser(example[1]).parse_args(example[1:])
        except SystemExit:
            pytest.fail(f"{shlex.join(example)}: {capsys.readouterr().err.strip()}")


def test_unknown_subcommand_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        aprof.cli.main(["valdate", "x.yaml"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'valdate'" in err
