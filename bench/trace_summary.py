"""Where a GPU program's time goes, kernel by kernel, from a ``jax.profiler`` trace.

    python bench/trace_summary.py TRACE_DIR [--iterations N] [--top 25]

Reads the newest ``perfetto_trace.json.gz`` under ``TRACE_DIR`` and prints, per iteration, the GPU kernels'
time by kind, by calls and the ``--top`` kernels, and the device's busy fraction.
"""

import argparse
import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from common import int_arg

#: Kernel kinds, matched in order on the kernel's name (case-insensitive).
KINDS = (
    ("matmul", re.compile(r"gemm|xmma|nvjet|cutlass|cublas|cudnn|matmul|triton_dot|dot_|wgmma|gemv")),
    ("copy / memset", re.compile(r"memcpy|memset|copy|dynamic_update_slice|dynamic-update-slice|transpose")),
    ("reduction", re.compile(r"reduce|reduction|scatter")),
    ("fused elementwise", re.compile(r"fusion|elementwise|convert|broadcast|select|concatenate|slice")),
)


def kernel_kind(name: str) -> str:
    """The kind of a kernel from its name (:data:`KINDS`), else ``other``."""
    return next((kind for kind, pattern in KINDS if pattern.search(name.lower())), "other")


def call_bucket(calls: float) -> str:
    """The frequency bucket of a kernel run ``calls`` times per iteration."""
    return ">= 1,000" if calls >= 1000 else "100-999" if calls >= 100 else "0-99"


def device_kernels(events: Iterable[dict]) -> list[dict]:
    """The complete (``ph == "X"``) events of the trace's device processes (``/device:GPU:*``)."""
    events = list(events)
    names = {e["pid"]: str(e.get("args", {}).get("name", "")) for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    devices = {pid for pid, name in names.items() if "/device:" in name and "/device:CPU" not in name}
    return [e for e in events if e.get("ph") == "X" and e.get("pid") in devices and "dur" in e]


def summarise(kernels: list[dict], iterations: int = 1) -> dict:
    """Per iteration: ``{"busy_us", "span_us", "count", "kinds": {kind: (us, calls)}, "names": {...}}``."""
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    names: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in kernels:
        for table, key in ((kinds, kernel_kind(e["name"])), (names, e["name"])):
            table[key][0] += float(e["dur"])
            table[key][1] += 1
    span = (max(float(e["ts"]) + float(e["dur"]) for e in kernels) - min(float(e["ts"]) for e in kernels)
            if kernels else 0.0)
    per = float(iterations)
    return {"busy_us": sum(float(e["dur"]) for e in kernels) / per, "span_us": span / per,
            "count": len(kernels) / per, "kinds": {k: (us / per, n / per) for k, (us, n) in kinds.items()},
            "names": {k: (us / per, n / per) for k, (us, n) in names.items()}}


def format_summary(summary: dict, top: int = 25) -> str:
    """Markdown tables of :func:`summarise`'s result, largest first."""
    busy = summary["busy_us"]
    if not summary["count"]:
        return "# no device kernels in the trace (the CPU backend records none)"
    lines = [f"# per iteration: {summary['count']:,.0f} kernels, {busy / 1e3:,.1f} ms of kernel time over a "
             f"{summary['span_us'] / 1e3:,.1f} ms span (device busy {busy / max(summary['span_us'], 1e-9):.0%})",
             "", "| kind | ms | share | calls |", "|---|---|---|---|"]
    for kind, (us, n) in sorted(summary["kinds"].items(), key=lambda kv: -kv[1][0]):
        lines.append(f"| {kind} | {us / 1e3:,.1f} | {us / busy:.1%} | {n:,.0f} |")
    buckets: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for us, n in summary["names"].values():
        buckets[call_bucket(n)] = [a + b for a, b in zip(buckets[call_bucket(n)], (us, n, 1))]
    lines += ["", "| calls per iteration of a kernel | ms | share | calls | kernels |", "|---|---|---|---|---|"]
    for bucket in map(call_bucket, (1000, 100, 0)):
        if bucket in buckets:
            us, n, k = buckets[bucket]
            lines.append(f"| {bucket} | {us / 1e3:,.1f} | {us / busy:.1%} | {n:,.0f} | {k} |")
    lines += ["", f"| kernel (top {top}) | kind | ms | share | calls | mean us |", "|---|---|---|---|---|---|"]
    for name, (us, n) in sorted(summary["names"].items(), key=lambda kv: -kv[1][0])[:top]:
        short = name if len(name) <= 90 else name[:87] + "..."
        lines.append(f"| `{short}` | {kernel_kind(name)} | {us / 1e3:,.2f} | {us / busy:.1%} | {n:,.0f} | "
                     f"{us / max(n, 1e-9):,.1f} |")
    return "\n".join(lines)


def report(trace_dir: str | Path, iterations: int = 1, top: int = 25) -> str:
    """The tables of the newest ``perfetto_trace.json.gz`` under ``trace_dir``, per iteration."""
    found = sorted(Path(trace_dir).rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {trace_dir}: record one with "
                                "jax.profiler.trace(DIR, create_perfetto_trace=True)")
    data = json.loads(gzip.decompress(found[-1].read_bytes()))
    events = data["traceEvents"] if isinstance(data, dict) else data
    return format_summary(summarise(device_kernels(events), iterations), top)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace_dir")
    p.add_argument("--iterations", type=int_arg(1), default=1, help="iterations the trace holds")
    p.add_argument("--top", type=int_arg(1), default=25, help="kernels listed")
    args = p.parse_args(argv)
    try:
        print(report(args.trace_dir, args.iterations, args.top))
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
