"""The Python examples of README.md and docs/quickstart.md run as written.

Each document's ```python blocks are run in order, as one script, in a fresh interpreter whose
``sys.path`` starts with this checkout (so the code under test is this copy of ``oir_gym``).
Compiling the Craftax programs makes each run take 10-40 s on a small CPU; the interpreter gets the
test session's JAX compilation cache folder (``JAX_COMPILATION_CACHE_DIR``: the same programs, compiled
once); :func:`test_snippets_name_only_what_exists` is the fast check.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import oir_gym

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/quickstart.md"]


def python_blocks(doc: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (ROOT / doc).read_text(), re.S | re.M)


def test_every_doc_has_python_examples():
    for doc in DOCS:
        assert python_blocks(doc), f"{doc} has no ```python block"


@pytest.mark.parametrize("doc", DOCS)
def test_snippets_name_only_what_exists(doc):
    """Fast check: the blocks compile and every ``oir_gym.<name>`` they use exists."""
    for block in python_blocks(doc):
        tree = ast.parse(block, filename=doc)
        used = {n.attr for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "oir_gym"}
        missing = sorted(u for u in used if not hasattr(oir_gym, u))
        assert not missing, f"{doc} uses oir_gym.{missing} which does not exist"


DRIVER = """
import sys, traceback
for doc, code in DOCS:
    print(f"=== {doc}", flush=True)
    try:
        exec(compile(code, doc, "exec"), {"__name__": "__main__"})  # a fresh namespace per document
    except BaseException:
        traceback.print_exc()
        print(f"=== {doc} FAILED", flush=True)
        sys.exit(1)
"""


def test_snippets_run_as_written(tmp_path, smoke_run):
    """Every document's blocks, in order (the README's each on its own); one interpreter for all of them
    (the documents then share one compiled env program: about 40 s instead of 70). The README's
    policy example loads ``runs/smoke``, which its text trains first with the smoke preset: the
    test copies the session's smoke run (conftest.py, the same command) into the snippets' working
    folder."""
    import jax

    shutil.copytree(smoke_run, tmp_path / "runs" / "smoke")
    script = tmp_path / "snippets.py"
    # the README's blocks each in a fresh namespace (as pasted into a new interpreter, one after the
    # other); the quickstart's as one script (its text runs them in one session)
    docs = [(f"README.md#{i}", block) for i, block in enumerate(python_blocks("README.md"))]
    docs += [(doc, "\n\n".join(python_blocks(doc))) for doc in DOCS if doc != "README.md"]
    script.write_text(f"DOCS = {docs!r}\n{DRIVER}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if jax.config.jax_compilation_cache_dir:
        env["JAX_COMPILATION_CACHE_DIR"] = str(jax.config.jax_compilation_cache_dir)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"a documented Python example failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    out = proc.stdout.split("=== ")
    assert [part.splitlines()[0] for part in out[1:]] == [label for label, _ in docs]
    readme, quickstart = "".join(out[1:-1]), out[-1]
    assert " -> [" in readme  # the relabeler printed what some episodes achieved
    assert "grounded instructions: [" in quickstart


def _free_names(code: str, filename: str) -> set[str]:
    """Names a block reads that it neither imports nor assigns, and that are not builtins."""
    import builtins

    tree = ast.parse(code, filename=filename)
    bound: set[str] = set()
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else loaded).add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return loaded - bound - set(dir(builtins))


@pytest.mark.parametrize("doc", ["README.md"])
def test_each_readme_block_runs_when_pasted_on_its_own(doc):
    """Each ```python block of the README imports what it uses: pasted into a fresh interpreter (the
    second block, after a training command, typically is) it needs nothing from an earlier block."""
    for i, block in enumerate(python_blocks(doc)):
        free = _free_names(block, f"{doc} block {i}")
        assert not free, f"{doc}, python block {i} uses {sorted(free)} without importing or defining them"
