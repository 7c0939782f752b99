"""Train a Stable-Baselines3 agent (RecurrentPPO, QR-DQN or DQN) on Craftax-Classic with OIR relabeling.

    python examples/train_sb3.py --algo qrdqn --relabeler rules          # CPU-sized defaults
    python examples/train_sb3.py --algo dqn --relabeler both --total-timesteps 200000 --device cuda
    python examples/train_sb3.py --algo recurrent_ppo --relabeler llm    # curriculum only (on-policy)
    python examples/train_sb3.py --algo qrdqn --hp learning_rate=3e-4 --hp buffer_size=20000
    python examples/train_sb3.py --run-dir runs/x --resume               # continue from the checkpoint

The relabeler is attached with ``oir_gym.sb3.HindsightRelabelCallback``: QR-DQN and DQN get the
relabeled transitions in their replay buffer, RecurrentPPO the instruction-buffer curriculum only
(see docs/sb3.md). ``--relabeler none`` trains on the 22 original instructions (cosine or, with
``--reward gt``, ground-truth reward).

Writes ``--run-dir`` (agents/run_dir.py, the format of ``train_pqn.py``): config.json,
metrics.jsonl / metrics.csv, TensorBoard events in tb/ (if installed), model.zip + state.json
(checkpoint; --resume loads only the model.zip whose sha256 the run recorded: an SB3 zip holds
pickled objects, so a foreign one is code), eval_*.json, eval_final.md, PNG plots and, last,
complete.json. SIGINT and SIGTERM save a checkpoint before exiting.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents import sb3_agents  # noqa: E402
from agents.config import LLMConfig, check_saved_backend  # noqa: E402
from agents.llm import LLMCheckError  # noqa: E402
from agents.run_dir import CorruptFileError, RunDir, RunDirError  # noqa: E402

#: LLM settings the SB3 trainer has no use for (PQN's trajectories-per-update budget)
LLM_UNUSED = ("per_update",)

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _bool(s: str) -> bool:
    if s.lower() in _TRUE:
        return True
    if s.lower() in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean ({'/'.join(_TRUE)} or {'/'.join(_FALSE)}), got {s!r}")


def _hp(s: str) -> tuple[str, object]:
    if "=" not in s:
        raise argparse.ArgumentTypeError(f"--hp expects key=value, got {s!r}")
    k, v = s.split("=", 1)
    try:
        val = ast.literal_eval(v)
    except (ValueError, SyntaxError):
        val = v
    return k.strip(), val


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", default=None, help="output folder (default runs/sb3_<algo>_<relabeler>_<time>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace the run in --run-dir (its outputs are removed)")
    p.add_argument("--hp", type=_hp, action="append", default=[], metavar="KEY=VALUE",
                   help="override an SB3 constructor argument (repeatable; values parsed as Python literals)")
    for f in dataclasses.fields(sb3_agents.SB3Config):
        if f.name == "hyperparams":
            continue
        if f.name == "llm":  # the LLM part shared with train_pqn.py: the same --llm.* flags
            for lf in dataclasses.fields(LLMConfig):
                if lf.name in LLM_UNUSED:
                    continue
                names = ["--llm." + lf.name.replace("_", "-")]
                if lf.name in ("backend", "model", "base_url", "template"):
                    names.append("--llm-" + lf.name.replace("_", "-"))  # the flags of earlier versions
                typ = float if lf.name == "call_timeout" else str
                p.add_argument(*names, dest="llm." + lf.name, type=typ, default=None,
                               help=f"(default {lf.default!r}; as train_pqn.py's {names[0]})")
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        if f.name == "asynchronous":
            p.add_argument(flag, type=_bool, default=None, help="relabel in a background worker (default: LLM yes, rules no)")
            continue
        if f.name == "eval_instructions":
            p.add_argument(flag, action="append", default=None, metavar="FILE",
                           help="JSON file of named instruction sets to evaluate too (repeatable; docs/evaluation.md)")
            continue
        typ = {int: int, float: float, bool: _bool, str: str}[type(default)]
        kw = {"choices": sb3_agents.ALGOS} if f.name == "algo" else {}
        if f.name == "relabeler":
            kw = {"choices": sb3_agents.RELABELERS}
        if f.name == "oracle":
            from oir_gym.relabel.oracle import ORACLES

            kw = {"choices": ORACLES}
        p.add_argument(flag, type=typ, default=None, help=f"(default {default!r})", **kw)
    return p.parse_args(argv)


def build_config(args, saved: dict | None = None) -> sb3_agents.SB3Config:
    """The run's config: the saved one (``--resume``) or the defaults, updated with the given flags."""
    values = dict(saved or {})
    values.pop("resolved_hyperparams", None)
    for f in dataclasses.fields(sb3_agents.SB3Config):
        if f.name == "hyperparams":
            continue
        if f.name == "llm":
            llm = dict(values.get("llm") or {})
            for lf in dataclasses.fields(LLMConfig):
                v = getattr(args, "llm." + lf.name, None)
                if v is not None:
                    llm[lf.name] = v
            values["llm"] = llm
            continue
        v = getattr(args, f.name)
        if v is not None:
            values[f.name] = v
    hp = dict(values.get("hyperparams", {}))
    for k, v in args.hp:
        if k.startswith("policy_kwargs."):
            hp.setdefault("policy_kwargs", {})[k.split(".", 1)[1]] = v
        else:
            hp[k] = v
    values["hyperparams"] = hp
    return sb3_agents.SB3Config.from_dict(values).validate()


def _sigterm(signum, frame):  # schedulers and `docker stop` send SIGTERM: checkpoint as for Ctrl-C
    raise KeyboardInterrupt


def main(argv=None) -> int:
    import oir_gym

    args = parse_args(argv)
    saved = None
    try:
        if args.resume:
            if args.run_dir is None:
                raise RunDirError("--resume needs --run-dir (the run to continue)")
            if not args.overwrite and (Path(args.run_dir) / "config.json").is_file():
                saved = RunDir(args.run_dir).read_config()
        cfg = build_config(args, saved)
        if saved is not None:  # a module path in the run's file is never imported unless given here
            check_saved_backend(cfg.llm, Path(args.run_dir) / "config.json",
                                on_command_line=getattr(args, "llm.backend") is not None)
    except (ValueError, RunDirError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir or f"runs/sb3_{cfg.algo}_{cfg.relabeler}_{time.strftime('%Y%m%d-%H%M%S')}")
    oir_gym.enable_compilation_cache()
    signal.signal(signal.SIGTERM, _sigterm)
    t0 = time.time()
    try:
        sb3_agents.train(cfg, run_dir, resume=args.resume, overwrite=args.overwrite,
                         print_fn=lambda s: print(s, flush=True))
    except (RunDirError, sb3_agents.UntrustedModelError, CorruptFileError, LLMCheckError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted; continue with: python examples/train_sb3.py --run-dir {run_dir} --resume", flush=True)
        return 130
    print(f"\ndone in {time.time() - t0:.0f}s; outputs in {run_dir}/", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
