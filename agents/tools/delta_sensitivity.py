"""What the cosine reward pays for at each threshold delta, before any training.

Per evaluation set and delta: how many instructions get their own caption event rewarded and how
many other events are rewarded too; then the original set's wrongly rewarded events.

    python examples/delta_sensitivity.py --out results/reference/delta_sensitivity.json --plot docs/img/delta_sensitivity.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


DELTAS = (0.5, 0.6, 0.7, 0.8, 0.9)


def compute(deltas=DELTAS, encoder=None) -> dict:
    """Per set: recall, wrong events per instruction, share with a wrong event, and the wrong events."""
    import numpy as np

    from oir_gym.captions import EVENT_NAMES, VOCAB
    from oir_gym.encoder import get_encoder
    from oir_gym.instruction_registry import InstructionRegistry
    from oir_gym.instructions import SET_NAMES, get_instruction_set
    from oir_gym.reward import threshold_confusion

    registry = InstructionRegistry(encoder or get_encoder(), capacity=1)
    out: dict = {"deltas": [float(d) for d in deltas], "sets": {}}
    for name in SET_NAMES:
        instructions = get_instruction_set(name)
        sims = registry.similarity_to_events(registry.encoder.encode([i.text for i in instructions]))
        targets = np.array([VOCAB.achievement_of_event.index(i.achievement_index) for i in instructions])
        c = threshold_confusion(sims, targets, deltas)
        out["sets"][name] = {
            "recall": c["recall"].round(4).tolist(),
            "wrong_per_instruction": c["wrong_per_instruction"].round(4).tolist(),
            "any_wrong": c["any_wrong"].round(4).tolist(),
            "wrong_events": {f"{d:g}": {i.text: [EVENT_NAMES[e] for e in np.flatnonzero(c["wrong"][k, n])]
                                        for n, i in enumerate(instructions) if c["wrong"][k, n].any()}
                             for k, d in enumerate(deltas)},
        }
    return out


def table(res: dict) -> str:
    """Markdown table: one row per set and delta."""
    lines = ["| set | delta | own event rewarded | other events rewarded per instruction | instructions with another event rewarded |",
             "|---|---|---|---|---|"]
    for name, s in res["sets"].items():
        for k, d in enumerate(res["deltas"]):
            lines.append(f"| {name} | {d:g} | {s['recall'][k]:.2f} | {s['wrong_per_instruction'][k]:.2f} | "
                         f"{s['any_wrong'][k]:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deltas", type=float, nargs="+", default=list(DELTAS))
    p.add_argument("--out", default=None, help="write the numbers (and every wrongly rewarded event) as JSON")
    p.add_argument("--plot", default=None, help="write the recall / wrong-event curves as PNG")
    p.add_argument("--list", type=float, nargs="*", default=[0.7, 0.9],
                   help="list the original set's wrongly rewarded events at these deltas")
    args = p.parse_args(argv)
    if any(not -1 < d <= 1 for d in args.deltas):
        p.error(f"--deltas must lie in (-1, 1], got {args.deltas}")

    res = compute(sorted(args.deltas))
    print(table(res))
    for d in args.list:
        wrong = res["sets"]["original"]["wrong_events"].get(f"{d:g}")
        if wrong is None:
            continue
        print(f"\noriginal set, delta {d:g}: " + ("; ".join(f"'{t}' also pays for {', '.join(w)}" for t, w in wrong.items())
                                                  or "every instruction pays for its own event only"))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
        print(f"\nwrote {args.out}")
    if args.plot:
        from oir_gym import analysis

        analysis.plot_threshold_confusion(res["sets"], res["deltas"], args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
