"""Every ```python block of README.md and docs/*.md runs as written.

Each page's blocks run in order in one namespace (the README's each in a fresh one: they are pasted on
their own), all pages in one fresh interpreter whose ``sys.path`` starts with this checkout (so the code
under test is this copy of ``oir_gym``; the pages then share one compiled env program). The interpreter
gets the test session's JAX compilation cache folder (``JAX_COMPILATION_CACHE_DIR``: the same
programs, compiled once); :func:`test_snippets_name_only_what_exists` is the fast check.

A block that cannot run on a CPU test machine (it needs a GPU or an LLM server) is marked with an HTML
comment on the line directly above it, ``<!-- no-exec: why -->``; it must still parse. Signatures are
prose or ```text blocks, not ```python.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import oir_gym

ROOT = Path(__file__).resolve().parents[1]
#: ``(indent, code)`` of every fenced python block (also inside a list item), with the line above it.
_BLOCK = re.compile(r"(?:^(?P<above>[^\n]*)\n)?^(?P<indent>[ ]*)```python\n(?P<code>.*?)^(?P=indent)```", re.S | re.M)
_NO_EXEC = re.compile(r"^\s*<!--\s*no-exec:\s*(?P<why>.*?)\s*-->\s*$")
#: at most this many exempt blocks in all the pages: an exemption is for what a CPU cannot run
MAX_NO_EXEC = 2


def pages() -> list[str]:
    """README.md and every docs page with a python block (a new page is covered without a change here)."""
    docs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
    return ["README.md"] + [d for d in docs if _blocks(d)]


def _blocks(doc: str) -> list[tuple[str, str | None]]:
    """``(code, reason)`` of every ```python block of ``doc``; ``reason`` is the block's no-exec comment."""
    out = []
    for m in _BLOCK.finditer((ROOT / doc).read_text()):
        code = textwrap.dedent("".join(line[len(m["indent"]):] + "\n" for line in m["code"].splitlines()))
        why = _NO_EXEC.match(m["above"] or "")
        out.append((code, why["why"] if why else None))
    return out


def python_blocks(doc: str) -> list[str]:
    """The code of every ```python block of ``doc`` (exempt ones included)."""
    return [code for code, _ in _blocks(doc)]


def runnable_blocks(doc: str) -> list[str]:
    return [code for code, why in _blocks(doc) if why is None]


DOCS = pages()


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


def test_pages_have_python_blocks_that_parse_and_few_exemptions():
    assert {"README.md", "docs/quickstart.md", "docs/api.md", "docs/relabeling.md", "docs/sb3.md",
            "docs/evaluation.md"} <= set(DOCS)
    exempt = []
    for doc in DOCS:
        for i, (code, why) in enumerate(_blocks(doc)):
            ast.parse(code, filename=f"{doc} block {i}")  # a signature written as code fails here too
            if why is not None:
                assert why, f"{doc}, python block {i}: a no-exec comment must say why the block cannot run"
                exempt.append(f"{doc}#{i}: {why}")
    assert len(exempt) <= MAX_NO_EXEC, f"too many blocks exempt from running: {exempt}"


def test_the_block_finder_reads_indented_blocks_and_exemptions(tmp_path, monkeypatch):
    page = ("text\n\n```python\nx = 1\n```\n- item\n\n  ```python\n  if x:\n      y = 2\n  ```\n"
            "<!-- no-exec: needs a GPU -->\n```python\nimport jax\n```\n```text\nf(a, b=1)\n```\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "p.md").write_text(page)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _blocks("docs/p.md") == [("x = 1\n", None), ("if x:\n    y = 2\n", None), ("import jax\n", "needs a GPU")]


DRIVER = """
import sys, traceback
if __name__ == "__main__":  # a docs page's worker processes (spawn) import this script again
    for doc, code in DOCS:
        print(f"=== {doc}", flush=True)
        try:
            exec(compile(code, doc, "exec"), {"__name__": "__main__"})  # a fresh namespace per page
        except BaseException:
            traceback.print_exc()
            print(f"=== {doc} FAILED", flush=True)
            sys.exit(1)
"""


@pytest.fixture(scope="module")
def sb3_run(tmp_path_factory) -> Path:
    """An SB3 run directory as ``examples/train_sb3.py smoke --run-dir runs/sb3_smoke`` writes it (config,
    checksummed model.zip, state.json) with an untrained QR-DQN: docs/sb3.md's ``load_sb3_policy`` example
    loads and acts with it; training it (the smoke command) would only cost time here."""
    pytest.importorskip("sb3_contrib")
    from agents.sb3 import models as sb3_agents
    from agents.run.run_dir import RunDir
    from agents.sb3.config import SB3_PRESETS
    from agents.sb3.trainer import SB3
    from oir_gym.sb3 import SB3VecEnv

    cfg = SB3_PRESETS["smoke"][1]()
    run = RunDir.prepare(tmp_path_factory.mktemp("sb3") / "sb3_smoke")
    SB3.write_config(run, cfg)
    venv = SB3VecEnv(oir_gym.InstructionCraftax(num_envs=cfg.sb3.num_envs, seed=0, obs_mode=cfg.env.obs_mode))
    try:
        model = sb3_agents.make_model(cfg.sb3.algo, venv, seed=0, hyperparams=cfg.sb3.hyperparams, device="cpu",
                                      defaults=cfg.sb3.defaults)
        sb3_agents.save_checkpoint(run.path, model, {"update": 0})
    finally:
        venv.close()
    return run.path


def test_snippets_run_as_written(tmp_path, smoke_run, sb3_run):
    """Every page's blocks, in order; one interpreter for all of them. The README's and api.md's examples
    read ``runs/smoke``, which the README trains first with the smoke preset, and docs/sb3.md's
    ``runs/sb3_smoke``, its smoke command's folder: the test copies the session's smoke run
    (conftest.py, the same command) and :func:`sb3_run` into the snippets' working folder."""
    import jax

    shutil.copytree(smoke_run, tmp_path / "runs" / "smoke")
    shutil.copytree(sb3_run, tmp_path / "runs" / "sb3_smoke")
    script = tmp_path / "snippets.py"
    # the README's blocks each in a fresh namespace (as pasted into a new interpreter, one after the
    # other); every other page's as one script (its text runs them in one session)
    docs = [(f"README.md#{i}", block) for i, block in enumerate(runnable_blocks("README.md"))]
    docs += [(doc, "\n\n".join(runnable_blocks(doc))) for doc in DOCS if doc != "README.md" and runnable_blocks(doc)]
    script.write_text(f"DOCS = {docs!r}\n{DRIVER}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if jax.config.jax_compilation_cache_dir:
        env["JAX_COMPILATION_CACHE_DIR"] = str(jax.config.jax_compilation_cache_dir)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"a documented Python example failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    out = {part.splitlines()[0]: part for part in proc.stdout.split("=== ")[1:]}
    assert list(out) == [label for label, _ in docs]
    assert any(" -> [" in out[label] for label in out if label.startswith("README.md#"))  # what episodes achieved
    assert "grounded instructions: [" in out["docs/quickstart.md"]
    assert "calls" in out["docs/api.md"]  # the relabeler's stats


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
