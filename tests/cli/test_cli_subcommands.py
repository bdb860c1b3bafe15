"""The `aprof` command line loads only the subcommand it runs, and every subcommand is declared
the one way: a line of `SUBCOMMANDS` and a module with a docstring, `arguments` and `run`."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import aprof.cli
from aprof.cli import SUBCOMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("servers", "servers.reference", "agentloop")

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
    # In a fresh process: this one may have loaded subcommands in other tests.
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
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    help_text, loaded = done.stdout.rsplit("\n", 2)[:2]
    assert loaded == "[]"
    flat = " ".join(help_text.split())  # argparse wraps the help column
    for name, summary in SUBCOMMANDS.items():
        assert f"{name} {summary}" in flat


def test_every_subcommand_module_is_declared() -> None:
    """A module of aprof.cli not starting with `_` is a subcommand listed in SUBCOMMANDS."""
    modules = {
        m.name for m in pkgutil.iter_modules(aprof.cli.__path__) if not m.name.startswith("_")
    }
    assert modules == {name.replace("-", "_") for name in SUBCOMMANDS}


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_subcommand_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each subcommand's --help shows its module's docstring and its options."""
    with pytest.raises(SystemExit) as exit:
        build_parser(name).parse_args([name, "--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: aprof {name} ")
    assert f"aprof {name}" in out.split("\n\n")[1]  # the docstring's first line, `` removed
    assert "``" not in out


def test_unknown_subcommand_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        aprof.cli.main(["valdate", "x.yaml"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'valdate'" in err
