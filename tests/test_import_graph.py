"""The project's modules import one another as docs/architecture.md says: without a circle,
each layer only from the layers its row of the table names, the CLI through the folders' doors,
the examples through public names, and no ``_name`` across packages.

Read from the source with ``ast``, nothing imported: every import statement of the packages
``aprof``, ``agentloop`` and ``servers`` (at module level or inside a function; not under
``if TYPE_CHECKING:``) is an edge to the project module it loads. ``from pkg import x`` loads
the submodule ``pkg.x`` when there is one, else reads ``x`` from ``pkg`` itself: an edge to the
package. Loading ``a.b.c`` also runs ``a`` and ``a.b`` first; those implicit edges are left out.
"""

from __future__ import annotations

import ast
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("aprof", "agentloop", "servers")
ARCHITECTURE = ROOT / "docs" / "architecture.md"

Graph = dict[str, dict[str, int]]
"""Module -> {module it imports: line of the first such import}."""


@dataclass(frozen=True)
class Import:
    """One name (or module) one module of the project imports from another."""

    importer: str
    module: str
    """The project module it loads."""
    name: str | None
    """The name read from it (``from module import name``), ``None`` for ``import module``."""
    line: int

    def __str__(self) -> str:
        what = f"from {self.module} import {self.name}" if self.name else f"import {self.module}"
        return f"{self.importer} (line {self.line}): {what}"


def modules_of(root: Path, packages: Iterable[str]) -> dict[str, Path | None]:
    """Every module of `packages` under `root`: its dotted name and its .py file.

    Compiled extensions and stub-only modules are there too (without a file: they import
    nothing the graph can see), so ``from pkg import _ext`` resolves to the extension.
    """
    found: dict[str, Path | None] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            parts = list(path.relative_to(root).parent.parts)
            stem = path.name.split(".", 1)[0]
            if path.suffix == ".py":
                if stem != "__init__":
                    parts.append(stem)
                found[".".join(parts)] = path
            elif path.suffix in (".pyi", ".so", ".pyd"):
                found.setdefault(".".join([*parts, stem]), None)
    return found


def import_graph(root: Path, packages: Iterable[str]) -> Graph:
    """The edges between the project's modules, read from the source."""
    modules = modules_of(root, packages)
    graph: Graph = {name: {} for name in modules}
    for imp in imports(root, modules):
        graph[imp.importer].setdefault(imp.module, imp.line)
    return graph


def imports(root: Path, modules: Mapping[str, Path | None]) -> Iterator[Import]:
    """Every import of a project module by one of ``modules`` (itself excluded)."""
    for name, path in modules.items():
        if path is None:
            continue
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _runtime_imports(tree.body):
            for target, imported in _targets(node, name, is_package, modules):
                if target != name:
                    yield Import(name, target, imported, node.lineno)


def _runtime_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements in `body` at any depth, except those under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(reversed(node.orelse))  # the else branch runs
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _is_type_checking(test: ast.expr) -> bool:
    """The test is exactly ``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _targets(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: Mapping[str, object]
) -> Iterator[tuple[str, str | None]]:
    """The project modules ``node`` loads, each with the name it reads there (if any)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in modules:
                yield alias.name, None
        return
    base = _absolute(node, module, is_package)
    if base is None:
        return
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in modules:
            yield sub, None
        elif base in modules:
            yield base, alias.name


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str | None:
    """The module a ``from ... import`` reads from, relative imports resolved."""
    if node.level == 0:
        return node.module
    parts = module.split(".")
    package = parts if is_package else parts[:-1]
    if node.level - 1 > len(package):
        return None
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def cycles(graph: Graph) -> list[list[str]]:
    """One cycle ``[a, b, ..., a]`` through each strongly connected group of modules."""
    return sorted(_cycle_in(graph, group) for group in circles(graph))


def circles(graph: Graph) -> list[set[str]]:
    """The groups of modules that import one another, each through the others."""
    return [group for group in _groups(graph) if len(group) > 1]


def _groups(graph: Graph) -> list[set[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group: set[str] = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    groups.append(group)
    return groups


def _cycle_in(graph: Graph, group: set[str]) -> list[str]:
    """A shortest cycle through the group's first module (by name), staying in the group."""
    start = min(group)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for nxt in sorted(graph[node]):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if nxt in group and nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")


def show(graph: Graph, cycle: list[str]) -> str:
    """``a -> b -> a``, then where each import is."""
    lines = [" -> ".join(cycle)]
    for a, b in pairwise(cycle):
        lines.append(f"    {a} imports {b} (line {graph[a][b]})")
    return "\n".join(lines)


# --- the layers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    """One row of docs/architecture.md's layer table."""

    name: str
    where: tuple[str, ...]
    """Its files (``aprof/_errors.py``) and folders (``aprof/_core/``), from the root."""
    may_import: frozenset[str]
    """The other layers it may import."""


def layer_table(text: str) -> list[Layer]:
    """The layers of the table whose header starts ``| layer | where |``, bottom up.

    ``where`` holds backticked paths; ``may import`` names layers, comma-separated (other
    words, such as "nothing of the project", name none).
    """
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| layer | where |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows.append((cells[0], tuple(re.findall(r"`([^`]+)`", cells[1])), cells[-1]))
    names = {name for name, _, _ in rows}
    return [
        Layer(name, where, frozenset(w.strip() for w in may.split(",")) & names)
        for name, where, may in rows
    ]


def layer_of(module: str, path: Path | None, root: Path, layers: list[Layer]) -> Layer | None:
    """The layer whose files or folders hold ``module`` (the most specific one)."""
    file = (
        path.relative_to(root).as_posix()
        if path is not None
        else module.replace(".", "/")  # a compiled module: its folder says
    )
    best: tuple[int, Layer] | None = None
    for layer in layers:
        for where in layer.where:
            hit = file.startswith(where) if where.endswith("/") else file == where
            if hit and (best is None or len(where) > best[0]):
                best = (len(where), layer)
    return None if best is None else best[1]


def layer_breaks(root: Path, packages: Iterable[str], layers: list[Layer]) -> list[str]:
    """Every module in no layer, and every import of a layer its row does not name."""
    modules = modules_of(root, packages)
    found = {m: layer_of(m, p, root, layers) for m, p in modules.items()}
    breaks = [f"{m} is in no layer of the table" for m, layer in found.items() if layer is None]
    for imp in imports(root, modules):
        mine, theirs = found[imp.importer], found[imp.module]
        if mine is None or theirs is None or mine is theirs:
            continue
        if theirs.name not in mine.may_import:
            breaks.append(f"{imp}: layer {mine.name!r} may not import layer {theirs.name!r}")
    return breaks


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _package_of(module: str, modules: Mapping[str, Path | None]) -> str:
    path = modules.get(module)
    is_package = path is not None and path.name == "__init__.py"
    return module if is_package else module.rpartition(".")[0]


def private_name_imports(root: Path, packages: Iterable[str]) -> list[str]:
    """Imports of a ``_name`` defined in another package (its folder) than the importer's."""
    modules = modules_of(root, packages)
    return [
        f"{imp}: a private name of another package"
        for imp in imports(root, modules)
        if imp.name is not None
        and _private(imp.name)
        and _package_of(imp.importer, modules) != _package_of(imp.module, modules)
    ]


def cli_reaches_behind_doors(root: Path, packages: Iterable[str]) -> list[str]:
    """Imports by ``aprof/cli/`` (and ``aprof/__main__.py``) of a private module of aprof that
    is not a folder's door, or of a ``_name``: the CLI uses public names and doors only."""
    modules = modules_of(root, packages)
    breaks = []
    for imp in imports(root, modules):
        if not (imp.importer.startswith("aprof.cli") or imp.importer == "aprof.__main__"):
            continue
        if imp.module.startswith("aprof.cli"):
            continue  # its own modules
        parts = imp.module.split(".")
        behind = any(_private(p) for p in parts[:-1])
        door = modules.get(imp.module) is not None and modules[imp.module].name == "__init__.py"  # type: ignore[union-attr]
        if behind or (_private(parts[-1]) and not door):
            breaks.append(f"{imp}: the CLI uses public names and the doors of aprof's folders")
        elif imp.name is not None and _private(imp.name):
            breaks.append(f"{imp}: a private name")
    return breaks


def example_private_imports(folder: Path) -> list[str]:
    """Imports by the scripts in ``folder`` of a private module or name of the project."""
    breaks = []
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _runtime_imports(tree.body):
            if isinstance(node, ast.Import):
                pairs = [(alias.name, None) for alias in node.names]
            else:
                pairs = [(node.module or "", alias.name) for alias in node.names]
            for module, name in pairs:
                if module.split(".")[0] not in PACKAGES:
                    continue
                if any(_private(p) for p in module.split(".")) or (name and _private(name)):
                    what = f"from {module} import {name}" if name else f"import {module}"
                    breaks.append(f"{path.name} (line {node.lineno}): {what}: not a public name")
    return breaks


# --- the project -------------------------------------------------------------------------


def test_the_project_has_no_import_cycle() -> None:
    graph = import_graph(ROOT, PACKAGES)
    groups = sorted(circles(graph), key=min)
    report = []
    for group in groups:
        cycle = _cycle_in(graph, group)
        report.append(show(graph, cycle))
        if len(group) > len(cycle) - 1:  # more circles run through the same modules
            report.append(f"    (with it in one circle: {', '.join(sorted(group))})")
    assert not groups, f"{len(groups)} import cycle(s):\n" + "\n".join(report)


def test_the_graph_sees_the_project() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert {"aprof", "aprof._config", "agentloop", "servers"} <= set(graph)
    assert "aprof._config" in graph["aprof"]  # the front door's re-export
    assert "aprof._errors" in graph["aprof._config.load"]


def test_config_and_verl_do_not_import_each_other_back() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert "aprof._config" in graph["aprof.verl._config"]
    assert not any(m.startswith("aprof.verl") for m in graph["aprof._config.load"])


def test_every_import_follows_the_layer_table() -> None:
    layers = layer_table(ARCHITECTURE.read_text(encoding="utf-8"))
    assert [layer.name for layer in layers][:2] == ["foundation", "config"]
    breaks = layer_breaks(ROOT, PACKAGES, layers)
    assert not breaks, "\n".join(breaks)


def test_no_private_name_crosses_a_package() -> None:
    breaks = private_name_imports(ROOT, PACKAGES)
    assert not breaks, "\n".join(breaks)


def test_the_cli_uses_public_names_and_doors_only() -> None:
    breaks = cli_reaches_behind_doors(ROOT, PACKAGES)
    assert not breaks, "\n".join(breaks)


def test_the_examples_use_public_names_only() -> None:
    breaks = example_private_imports(ROOT / "examples")
    assert not breaks, "\n".join(breaks)


def test_at_most_eight_private_modules_lie_flat_in_aprof() -> None:
    flat = sorted(p.name for p in (ROOT / "aprof").glob("_*.py") if not p.name.startswith("__"))
    assert len(flat) <= 8, flat


@pytest.mark.parametrize(
    ("file", "planted", "says"),
    [
        (
            "aprof/cli/report.py",
            "from aprof._report.text import render as _planted",
            "aprof.cli.report (line {line}): from aprof._report.text import render: "
            "the CLI uses public names",
        ),
        (
            "aprof/cli/merge.py",
            "from aprof._errors import describe as _planted",
            "aprof.cli.merge (line {line}): from aprof._errors import describe: the CLI",
        ),
    ],
)
def test_a_private_import_planted_in_the_cli_is_named_with_its_line(
    tmp_path: Path, file: str, planted: str, says: str
) -> None:
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    assert not cli_reaches_behind_doors(tmp_path, PACKAGES)  # the copy is as clean as main
    target = tmp_path / file
    lines = target.read_text(encoding="utf-8").splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("from aprof"))
    target.write_text("\n".join([*lines[:at], planted, *lines[at:]]) + "\n", encoding="utf-8")
    breaks = cli_reaches_behind_doors(tmp_path, PACKAGES)
    assert len(breaks) == 1 and breaks[0].startswith(says.format(line=at + 1)), breaks


# --- the reader, on a made-up tree -------------------------------------------------------


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_edges_follow_python_import_rules(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": (
                "from typing import TYPE_CHECKING\n"
                "import os\n"
                "from pkg import b, NAME\n"  # a submodule, and a name of the package
                "if TYPE_CHECKING:\n"
                "    from pkg import c\n"
                "else:\n"
                "    from pkg import d\n"
                "def f():\n"
                "    from .sub import e\n"
                "    import pkg.sub.f\n"
            ),
            "pkg/b.py": "",
            "pkg/c.py": "",
            "pkg/d.py": "from . import _ext\n",
            "pkg/_ext.pyi": "",
            "pkg/sub/__init__.py": "from .. import b\nfrom . import e\n",
            "pkg/sub/e.py": "",
            "pkg/sub/f.py": "",
        },
    )
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg"] == {"pkg.a": 1}
    assert set(graph["pkg.a"]) == {"pkg.b", "pkg", "pkg.d", "pkg.sub.e", "pkg.sub.f"}
    assert set(graph["pkg.d"]) == {"pkg._ext"}
    assert set(graph["pkg.sub"]) == {"pkg.b", "pkg.sub.e"}
    assert graph["pkg._ext"] == {}


def test_a_cycle_is_shown_in_import_order(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "import pkg.b\n",
            "pkg/b.py": "\n\nfrom pkg import A\n",  # a name the front door re-exports
            "pkg/c.py": "from pkg import d\n",
            "pkg/d.py": "def f():\n    from pkg import c\n",
        },
    )
    graph = import_graph(tmp_path, ["pkg"])
    found = cycles(graph)
    assert found == [["pkg", "pkg.a", "pkg.b", "pkg"], ["pkg.c", "pkg.d", "pkg.c"]]
    assert show(graph, found[0]).splitlines() == [
        "pkg -> pkg.a -> pkg.b -> pkg",
        "    pkg imports pkg.a (line 1)",
        "    pkg.a imports pkg.b (line 1)",
        "    pkg.b imports pkg (line 3)",
    ]


def test_the_table_is_read_and_a_layer_break_named(tmp_path: Path) -> None:
    table = (
        "| layer | where | what it holds | may import |\n"
        "|---|---|---|---|\n"
        "| base | `pkg/_base.py` | the base | nothing of the project |\n"
        "| middle | `pkg/_mid/` | the middle | base |\n"
        "| top | `pkg/__init__.py`, `pkg/cli/` | the top | middle, base |\n"
    )
    layers = layer_table("# Layers\n\n" + table + "\nafter the table\n")
    assert [(x.name, x.where, set(x.may_import)) for x in layers] == [
        ("base", ("pkg/_base.py",), set()),
        ("middle", ("pkg/_mid/",), {"base"}),
        ("top", ("pkg/__init__.py", "pkg/cli/"), {"middle", "base"}),
    ]
    write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg._mid.a import A\n",
            "pkg/_base.py": "\nfrom pkg._mid import a\n",  # down to up: a break
            "pkg/_mid/__init__.py": "",
            "pkg/_mid/a.py": "from pkg import _base\nA = 1\n",
            "pkg/cli/__init__.py": "from pkg._mid import a\n",
            "pkg/stray.py": "",
        },
    )
    assert layer_breaks(tmp_path, ["pkg"], layers) == [
        "pkg.stray is in no layer of the table",
        "pkg._base (line 2): import pkg._mid.a: layer 'base' may not import layer 'middle'",
    ]
    # The CLI imports a module behind the door of pkg/_mid/.
    assert cli_reaches_behind_doors(tmp_path, ["pkg"]) == []  # it is pkg.cli, not aprof.cli
