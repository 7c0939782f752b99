"""Compare two runs' metrics.jsonl key by key (sps, time and time/* skipped) and their eval_final.json.

    python compare.py A_metrics.jsonl B_metrics.jsonl   # eval_final.json is read beside each file
"""
import json, math, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b), (len(a), len(b))
skip = {"sps", "time"}
common = {k for k in set().union(*a) & set().union(*b) if k not in skip and not k.startswith("time/")}
n = diff = 0; worst = (0.0, None)
for x, y in zip(a, b):
    for k in common:
        if k in x or k in y:
            n += 1
            if x.get(k) != y.get(k):
                diff += 1
                if isinstance(x.get(k), (int, float)) and isinstance(y.get(k), (int, float)):
                    r = abs(x[k] - y[k]) / max(abs(x[k]), abs(y[k]), 1e-30)
                    worst = max(worst, (r, (x["update"], k)))
print(f"{len(a)} rows, {len(common)} common keys ({sorted(k for k in set().union(*b) - set().union(*a) - skip if not k.startswith('time/'))} only in the 2nd), "
      f"{n} values compared, {diff} differ, max rel diff {worst[0]:.3g} at {worst[1]}")
ea, eb = (json.load(open(p.replace("metrics.jsonl", "eval_final.json"))) for p in sys.argv[1:3])
print("eval_final.json", "equal" if ea == eb else "differs")
