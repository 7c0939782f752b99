"""No module reaches into another project module's private names (issue 17, "Done when").

Read from the source with ``ast`` (nothing is imported): a ``from agents.x import _name`` or an
``F._name`` where ``F`` is an imported project module is a reach into another module's insides;
such a helper is made public (named without the underscore) where another module needs it.
"""

from __future__ import annotations

import ast
from pathlib import Path

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
