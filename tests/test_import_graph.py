"""The project's modules import one another without a circle.

Read from the source with ``ast``, nothing imported: every import statement of the packages
``aprof``, ``agentloop`` and ``servers`` (at module level or inside a function; not under
``if TYPE_CHECKING:``) is an edge to the project module it loads. ``from pkg import x`` loads
the submodule ``pkg.x`` when there is one, else reads ``x`` from ``pkg`` itself: an edge to the
package. Loading ``a.b.c`` also runs ``a`` and ``a.b`` first; those implicit edges are left out.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("aprof", "agentloop", "servers")

Graph = dict[str, dict[str, int]]
"""Module -> {module it imports: line of the first such import}."""


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
    for name, path in modules.items():
        if path is None:
            continue
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _runtime_imports(tree.body):
            for target in _targets(node, name, is_package, modules):
                if target != name:
                    graph[name].setdefault(target, node.lineno)
    return graph


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
) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in modules:
                yield alias.name
        return
    base = _absolute(node, module, is_package)
    if base is None:
        return
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in modules:
            yield sub
        elif base in modules:
            yield base


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
    assert "aprof._errors" in graph["aprof._config"]


def test_config_and_verl_do_not_import_each_other_back() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert "aprof._config" in graph["aprof._verl"]
    assert "aprof._verl" not in graph["aprof._config"]


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
