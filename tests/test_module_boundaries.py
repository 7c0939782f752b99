"""No module reaches into another project module's private names (issue 17, "Done when").

Read from the source with ``ast`` (nothing is imported): a ``from agents.x import _name`` or an
``F._name`` where ``F`` is an imported project module is a reach into another module's insides;
such a helper is made public (named without the underscore) where another module needs it.

No import circle either (issue 26): the import graph, read the same way (typing-only and
function-level imports included), has no strongly connected component of two modules or more.
"""

from __future__ import annotations

import ast
import subprocess
import sys
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


# ---------------------------------------------------------------- agents/ in four packages
#: What each package of agents/ may import from agents/ (issue 38): tools -> pqn, sb3 -> run. The
#: driver (run) reaches a trainer only through its registry of module names (agents.run.train.TRAINERS).
ALLOWED = {"run": {"run"}, "pqn": {"pqn", "run"}, "sb3": {"sb3", "run"}, "tools": {"tools", "pqn", "sb3", "run"}}


def wrong_way_imports(root: Path = ROOT) -> list[str]:
    """``importer -> imported`` for every import (anywhere in a module: a function body, a typing
    block) from one of agents/' four packages that goes against :data:`ALLOWED` (an old top-level
    path such as ``agents.policy`` counts as wrong from inside a package)."""
    graph = import_graph("agents", root)
    bad = []
    for mod, deps in sorted(graph.items()):
        parts = mod.split(".")
        if len(parts) < 3 or parts[1] not in ALLOWED:
            continue
        for dep in sorted(deps):
            dparts = dep.split(".")
            if dep not in ("agents", f"agents.{parts[1]}") and (len(dparts) < 2 or dparts[1] not in ALLOWED[parts[1]]):
                bad.append(f"{mod} -> {dep}")
    return bad


def test_agents_packages_import_one_way():
    graph = import_graph("agents")
    assert {m.split(".")[1] for m in graph if m.count(".") >= 2} == set(ALLOWED)
    bad = wrong_way_imports()
    assert not bad, "imports against tools -> pqn, sb3 -> run:\n" + "\n".join(bad)


def test_the_direction_check_sees_a_function_level_import(tmp_path):
    for pkg in ALLOWED:
        (tmp_path / "agents" / pkg).mkdir(parents=True)
        (tmp_path / "agents" / pkg / "__init__.py").write_text("")
    (tmp_path / "agents" / "__init__.py").write_text("")
    (tmp_path / "agents" / "run" / "train.py").write_text("def f():\n    from agents.pqn import recipe\n")
    (tmp_path / "agents" / "pqn" / "recipe.py").write_text("from agents.run.train import f\n")
    (tmp_path / "agents" / "tools" / "policy.py").write_text("from agents.pqn import recipe\nimport agents.sb3\n")
    assert wrong_way_imports(tmp_path) == ["agents.run.train -> agents.pqn.recipe"]


# ---------------------------------------------------------------- size fences
MAX_FUNCTION_LINES = 150
MAX_FILE_LINES = 900
#: Files allowed over MAX_FILE_LINES, each with its reason (as few as possible).
FILE_EXEMPT: dict[str, str] = {}


def oversized(root: Path = ROOT) -> list[str]:
    """Every function or method over :data:`MAX_FUNCTION_LINES` lines and every file of oir_gym/ or
    agents/ over :data:`MAX_FILE_LINES` (but :data:`FILE_EXEMPT`)."""
    found = []
    for path in sorted(p for d in PROJECT for p in (root / d).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        if text.count("\n") > MAX_FILE_LINES and rel not in FILE_EXEMPT:
            found.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text, filename=rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    found.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    return found


def test_no_function_over_150_lines_and_no_file_over_900():
    found = oversized()
    assert not found, "split these (or, for a file, give an exemption its reason):\n" + "\n".join(found)
    assert all((ROOT / f).is_file() for f in FILE_EXEMPT), "an exemption names a file that is gone"


#: The library's source (what issue 38 set): the same features must not grow back into more lines.
MAX_SOURCE_LINES = 22_000
SOURCE_DIRS = ("oir_gym", "agents", "examples", "bench")
#: oir_gym/ files stay under this (an LLM backend may exceed it: it holds its protocol's defences).
MAX_PACKAGE_FILE_LINES = 600


def source_lines(root: Path = ROOT) -> int:
    """Lines of every ``.py`` file under :data:`SOURCE_DIRS` (``wc -l``)."""
    return sum(p.read_text().count("\n") for d in SOURCE_DIRS for p in (root / d).rglob("*.py"))


def test_source_stays_within_its_line_budget():
    n = source_lines()
    assert n <= MAX_SOURCE_LINES, f"{n:,} source lines; the budget is {MAX_SOURCE_LINES:,}: cut before adding"


def test_no_library_file_over_600_lines_but_a_backend():
    long = [f"{p.relative_to(ROOT)}: {n}" for p in sorted((ROOT / "oir_gym").rglob("*.py"))
            if (n := p.read_text().count("\n")) > MAX_PACKAGE_FILE_LINES and "backends" not in p.parts]
    assert not long, "split or cut these oir_gym files:\n" + "\n".join(long)


def test_the_driver_main_stays_short():
    tree = ast.parse((ROOT / "agents/run/train.py").read_text())
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert main.end_lineno - main.lineno + 1 < 100


@pytest.mark.parametrize("old, new, name", [
    ("agents.policy", "agents.tools.policy", "load_policy"), ("agents.train", "agents.pqn.recipe", "pqn_main"),
    ("agents.checkpoint", "agents.run.checkpoint", "load_checkpoint"), ("agents.sb3_agents", "agents.sb3.models",
    "make_model"), ("agents.config", "agents.pqn.config", "TrainConfig"), ("agents.oir", "agents.pqn.trainer", "Trainer"),
])
def test_an_old_import_path_warns_and_gives_the_same_objects(old, new, name):
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to .*{new}"):
        shim = importlib.import_module(old)
    assert getattr(shim, name) is getattr(importlib.import_module(new), name)


def test_every_agents_import_names_an_existing_module():
    """An import of a moved module's old path inside the packages (say ``agents.sharding`` in a
    function body) would fail only when that line runs: none is left."""
    graph = import_graph("agents")
    missing = []
    for path in sorted((ROOT / "agents").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            missing += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                        if n.startswith("agents.") and n not in graph]
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)


def test_importing_oir_gym_registers_the_env_and_imports_neither_jax_nor_craftax():
    """Craftax's import starts JAX's backend: ``import oir_gym`` leaves it to the first use of a name, so a
    script can still set up ``jax.distributed`` (or JAX's config) after importing the package."""
    code = ("import sys, gymnasium as gym, oir_gym\n"
            "assert 'OIR-CraftaxClassic-v0' in gym.registry\n"
            "assert not {'jax', 'craftax'} & set(sys.modules), sorted({'jax', 'craftax'} & set(sys.modules))\n"
            "assert oir_gym.InstructionCraftax.__name__ == 'InstructionCraftax' and 'jax' in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
