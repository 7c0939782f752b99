"""What a resumed or evaluated run takes from its own files and what from its command line
(:func:`parse_with_base`, :data:`OUTSIDE_FIELDS`), and the config and warnings of an ``--eval-only`` evaluation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from agents.run.run_dir import CorruptFileError, RunDir


#: Config fields that say where a run connects or what it reads outside its folder -> their flag: a resumed run
#: takes them from its files only when its command line names them again (anyone may have changed the files).
OUTSIDE_FIELDS: dict[str, str] = {
    "llm.base_url": "--llm.base-url", "llm.template": "--llm.template", "llm.model": "--llm.model",
    "oir.oracle_pool": "--oir.oracle-pool", "eval.instruction_files": "--eval.instruction-files",
}


def named_on_command_line(argv: Sequence[str], field: str) -> bool:
    """Whether ``argv`` passes the flag of config field ``field`` (``"llm.base_url"``: ``--llm.base-url ...``)."""
    part, _, name = field.partition(".")
    spellings = {f"--{part}.{name}", f"--{part}.{name.replace('_', '-')}"}
    return any(a.partition("=")[0] in spellings for a in argv)


def _points_outside(field: str, value: Any, default: Any) -> bool:
    if field == "llm.template":  # a packaged template's name is data; a file path is read
        from oir_gym.relabel.prompts import TEMPLATE_NAMES

        return value not in TEMPLATE_NAMES and value != default
    if field == "llm.model":  # a model name is data; a local folder is read (transformers, llama.cpp, vLLM)
        return bool(value) and (str(value).startswith(("/", ".", "~")) or Path(str(value)).expanduser().exists())
    return value != default


def outside_references(cfg: Any) -> dict[str, Any]:
    """The fields of :data:`OUTSIDE_FIELDS` that ``cfg`` sets to a server or file of its own, with their values."""
    out: dict[str, Any] = {}
    for field in OUTSIDE_FIELDS:
        part, name = field.split(".")
        section = getattr(cfg, part, None)
        if hasattr(section, name) and _points_outside(field, getattr(section, name), getattr(type(section)(), name)):
            out[field] = getattr(section, name)
    return out


def _repeat(refs: Mapping[str, Any]) -> str:
    """The flags that pass ``refs`` (field -> value) again, quoted for a shell."""
    import shlex

    parts = []
    for field, value in refs.items():
        values = value if isinstance(value, (tuple, list)) else [value]
        parts.append(" ".join([OUTSIDE_FIELDS[field], *(shlex.quote(str(v)) for v in values)]))
    return " ".join(parts)


def eval_only_config(cfg: Any, *, final_sets: bool) -> Any:
    """The config an ``--eval-only`` evaluation runs with: ``eval.final_sets`` only when the command line names them
    (``final_sets``); the training labels (``oir.oracle``, its pool), which it does not read, canonical."""
    changes: dict[str, Any] = {"oir.oracle": "canonical", **({} if final_sets else {"eval.final_sets": ()})}
    if hasattr(cfg.oir, "oracle_pool"):
        changes["oir.oracle_pool"] = ""
    return cfg.replace(**changes)


def label_pool(cfg: Any) -> str | None:
    """The wording pool file the run's labels came from (``""``: the packaged pool), or None when they use none."""
    from oir_gym.relabel.oracle import USES_POOL

    if cfg.run.method != "oir" or cfg.oir.oracle not in USES_POOL:
        return None
    return getattr(cfg.oir, "oracle_pool", "")


def pool_overlap_warning(pool_file: str, instruction_files: Sequence[str]) -> str | None:
    """One warning line naming the texts of ``instruction_files`` within cosine 0.85 of a wording of the run's label
    pool (``""``: the packaged one), or None."""
    import numpy as np

    from oir_gym import get_encoder
    from oir_gym.instructions import load_instruction_files
    from oir_gym.relabel.oracle import MAX_EVAL_COSINE, load_pool

    texts = list(dict.fromkeys(i.text for items in load_instruction_files(instruction_files).values() for i in items))
    if not texts:
        return None
    pool = load_pool(pool_file or None)
    words = list(pool.owner())
    enc = get_encoder()
    sim = np.asarray(enc.encode(texts), np.float32) @ np.asarray(enc.encode(words), np.float32).T
    close = [(texts[i], words[int(sim[i].argmax())], float(sim[i].max())) for i in range(len(texts))
             if sim[i].max() >= MAX_EVAL_COSINE]
    if not close:
        return None
    shown = "; ".join(f"{t!r} ({c:.2f} to {w!r})" for t, w, c in close[:8]) + (" ..." if len(close) > 8 else "")
    return (f"warning: {len(close)} of the {len(texts)} texts of your instruction files are within cosine "
            f"{MAX_EVAL_COSINE} of a wording of the run's label pool ({pool.source}), so they are not held out from "
            f"what it was trained on: {shown}")


def eval_plan(cfg: Any) -> str:
    """What an evaluation of ``cfg`` runs, in words: its sets and episodes."""
    from oir_gym.instructions import load_instruction_files

    ev = cfg.eval
    sets = list(dict.fromkeys([*ev.sets, *ev.final_sets, *load_instruction_files(ev.instruction_files)]))
    return f"the sets {', '.join(sets)} ({ev.final_episodes} episode(s) per instruction)"


def parse_with_base(argv: list[str], description: str | None, options_type: type, cli: Any, load_config: Any) -> Any:
    """The command line as ``options_type`` (parsed by ``cli``): ``--resume`` / ``--eval-only`` start from the run's
    saved config (``load_config``; flags override it), otherwise from the preset named first. A module-path LLM
    backend or a field of :data:`OUTSIDE_FIELDS` pointing outside is taken from the files only when the flags
    name it: ``--resume`` refuses, ``--eval-only`` warns and keeps the default."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--run-dir", "--run_dir")
    pre.add_argument("--resume", action="store_true")
    pre.add_argument("--eval-only", "--eval_only")
    pre.add_argument("--llm.backend", dest="llm_backend")
    known, _ = pre.parse_known_args(argv)
    if (known.resume or known.eval_only) and known.run_dir and (Path(known.run_dir) / "config.json").is_file():
        file = Path(known.run_dir) / "config.json"
        try:
            base = load_config(RunDir(known.run_dir).read_config())
        except (ValueError, CorruptFileError) as e:
            raise SystemExit(f"error: {file}: {e}") from None
        if known.eval_only is None:  # an evaluation starts no LLM (the recipe replaces the backend)
            from agents.run.config import check_saved_backend

            try:
                check_saved_backend(base.llm, file, on_command_line=known.llm_backend is not None)
            except ValueError as e:
                raise SystemExit(f"error: {e}") from None
        refs = {f: v for f, v in outside_references(base).items() if not named_on_command_line(argv, f)}
        if refs:
            names = ", ".join(f"{f}={v!r}" for f, v in refs.items())
            if known.eval_only is None:
                raise SystemExit(
                    f"error: {file} sets {names}: a resumed run takes where it connects and what it reads outside "
                    "its folder from its command line only, never from its files (anyone who can write the folder "
                    f"can change them); repeat {_repeat(refs)} to use them again, or pass other values")
            print(f"warning: --eval-only does not use {names} of {file} (an evaluation takes files from its command "
                  f"line only; pass {_repeat(refs)} to use them)", file=sys.stderr, flush=True)
            base = base.replace(**{f: getattr(type(getattr(base, f.split('.')[0]))(), f.split(".")[1]) for f in refs})
        return cli(options_type, argv, base=base, description=description)
    return cli(options_type, argv, description=description)
