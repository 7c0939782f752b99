"""No module reaches into another project module's private names (issue 17, "Done when").

Read from the source with ``ast`` (nothing is imported): a ``from agents.x import _name`` or an
``F._name`` where ``F`` is an imported project module is a reach into another module's insides;
such a helper is made public (named without the underscore) where another module needs it.

No import circle either (issue 26): the import graph, read the same way (typing-only and
function-level imports included), has no strongly connected component of two modules or more.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("agents", "oir_gym")
SOURCES = ("agents", "oir_gym", "examples", "bench")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private_reaches(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line name`` of every private name this file takes from another project module."""
    here = module_name(path, root)
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name -> project module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] in PROJECT and node.module != here:
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{path.relative_to(root)}:{node.lineno} from {node.module} import {a.name}")
                else:  # `from oir_gym import functional as F` binds a module
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PROJECT and a.name != here:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f"{path.relative_to(root)}:{node.lineno} {node.value.id}.{node.attr}")
    return found


def test_no_module_takes_a_private_name_from_another_project_module():
    files = [p for d in SOURCES for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 40  # the scan saw the project
    reaches = [r for p in files for r in private_reaches(p)]
    assert not reaches, "private names used across modules (make them public):\n" + "\n".join(reaches)


def test_the_scan_finds_both_kinds_of_reach(tmp_path):
    """The check itself can fail: a private import and a module-alias access are both reported."""
    pkg = tmp_path / "agents"
    pkg.mkdir()
    src = pkg / "probe.py"
    src.write_text("from agents.run_dir import _hidden\nfrom oir_gym import functional as F\nF._tree_select\n"
                   "from oir_gym.text import Observation\nself_ok = Observation\n")
    assert private_reaches(src, tmp_path) == ["agents/probe.py:1 from agents.run_dir import _hidden",
                                    "agents/probe.py:3 F._tree_select"]


# ---------------------------------------------------------------- import circles
def import_graph(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """``module -> project modules it imports`` for every module under ``root/package``, read with
    ``ast``: every import counts, wherever it stands (a function body, ``if TYPE_CHECKING:``),
    since a typing-only import is still an arrow a reader has to follow. ``from pkg import name``
    counts as an import of ``pkg.name`` when that is a module, else of ``pkg``."""
    files = sorted((root / package).rglob("*.py"))
    modules = {module_name(p, root) for p in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        here = module_name(path, root)
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against this module's package
                    base = here.split(".") if is_pkg else here.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in modules:  # `import a.b.c` of a non-module name: its module
                    t = t.rpartition(".")[0]
                if t and t != here:
                    deps.add(t)
        graph[here] = deps
    # a package's __init__ runs before any of its modules: importing a.b imports a first
    for m in list(graph):
        parts = m.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent in graph and parent != m:
                graph[m].add(parent)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _without_package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without the arrows from a package's ``__init__`` down to its own modules (it
    re-exports them: that arrow and the implicit module -> parent arrow are one relation, not a
    circle a reader has to untangle)."""
    return {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}


def test_oir_gym_has_no_import_circle():
    graph = _without_package_edges(import_graph("oir_gym"))
    assert len(graph) > 40
    found = circles(graph)
    assert not found, "import circles in oir_gym/ (typing-only imports count):\n" + \
        "\n".join(", ".join(c) for c in found)


def test_agents_has_no_import_circle():
    """The training methods are built from an ``agents.pqn.methods.MethodContext`` (no import of
    ``agents.pqn.trainer``), and the legacy converter, which builds a Trainer, lives outside
    ``agents.run.checkpoint``."""
    found = circles(_without_package_edges(import_graph("agents")))
    assert not found, "import circles in agents/:\n" + "\n".join(", ".join(c) for c in found)


def test_the_circle_check_sees_typing_only_and_function_level_imports(tmp_path):
    """The check itself can fail: a circle closed by an ``if TYPE_CHECKING:`` import or an import
    inside a function is reported; a package re-exporting its own module is not a circle."""
    pkg = tmp_path / "oir_gym"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from oir_gym.a import A\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from oir_gym.b import B\nA = 1\n")
    (pkg / "b.py").write_text("def f():\n    from oir_gym import a\nB = 2\n")
    (pkg / "sub" / "__init__.py").write_text("from .c import C\n")
    (pkg / "sub" / "c.py").write_text("C = 3\n")
    graph = _without_package_edges(import_graph("oir_gym", tmp_path))
    assert circles(graph) == [["oir_gym.a", "oir_gym.b"]]
    (pkg / "a.py").write_text("A = 1\n")
    assert circles(_without_package_edges(import_graph("oir_gym", tmp_path))) == []
