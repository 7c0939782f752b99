"""Host cost of grounding: ``HindsightRelabeler.relabel`` (rules) in ``cosine`` and ``bound`` mode.

Synthetic trajectories relabeled in each mode, timed calls interleaved after one warm-up call.

    python bench/grounding_cost.py --n 64 --length 128 --repeats 7
"""

import argparse
import statistics

from common import int_arg, interleaved
from oir_gym.encoder import get_encoder
from oir_gym.relabel import HindsightRelabeler
from oir_gym.relabel.synthetic import random_trajectories


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int_arg(1), default=64, help="trajectories per call")
    p.add_argument("--length", type=int_arg(1), default=128, help="steps per trajectory")
    p.add_argument("--k", type=int_arg(1), default=64, help="candidates kept per trajectory (64: all)")
    p.add_argument("--repeats", type=int_arg(1), default=5)
    a = p.parse_args(argv)
    trajs = random_trajectories(a.n, a.length, seed=0, texts=False)
    rel = {m: HindsightRelabeler.rules(k=a.k, encoder=get_encoder(), grounding=m) for m in ("cosine", "bound")}
    kept = {m: sum(len(x.candidates) for x in r.relabel(trajs)) for m, r in rel.items()}  # warms the encoder
    times = interleaved({m: lambda r=r: r.relabel(trajs) for m, r in rel.items()}, a.repeats)
    print(f"\n{a.n} trajectories x {a.length} steps, rule relabeler, {a.repeats} timed calls per mode\n")
    print("| grounding | median s / call | min s / call | ms / trajectory (median) | candidates kept |\n"
          "|---|---|---|---|---|")
    for m in rel:
        med = statistics.median(times[m])
        print(f"| {m} | {med:.4f} | {min(times[m]):.4f} | {1000 * med / a.n:.2f} | {kept[m]} |")
    for r in rel.values():
        r.close()


if __name__ == "__main__":
    main()
