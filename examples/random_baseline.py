"""Evaluate a uniform random policy with the evaluation protocol: the floor every agent should beat.

    python examples/random_baseline.py --episodes 8 --horizon 300
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--horizon", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the evaluation JSON here")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    import oir_gym
    from oir_gym import functional as F
    from oir_gym.encoder import get_encoder
    from oir_gym.evaluation import EvalConfig, eval_instructions, evaluate_jax, make_jax_evaluator
    from oir_gym.instruction_registry import InstructionRegistry

    oir_gym.enable_compilation_cache()
    cfg = EvalConfig(episodes=args.episodes, horizon=args.horizon)
    texts, achs, sets = eval_instructions(cfg)
    registry = InstructionRegistry(get_encoder())
    rows = registry.rows(texts, achs)

    def random_policy(params, carry, obs, done, key):
        return carry, jax.random.randint(key, (obs["obs"].shape[0],), 0, 17)

    evaluator = make_jax_evaluator(random_policy, jnp.zeros, len(texts) * cfg.episodes, cfg.horizon)
    res = evaluate_jax(evaluator, jax.random.PRNGKey(args.seed), None, F.EnvParams(table=registry.device_table()),
                       rows, cfg, texts, achs, sets)
    print(res.to_markdown())
    if args.out:
        Path(args.out).write_text(json.dumps(res.to_dict(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
