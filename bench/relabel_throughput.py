"""Relabeling throughput of the offline LLM backends: speed, ``paper`` vs ``segments`` prompts, cache.

Synthetic trajectories are relabeled by ``HindsightRelabeler`` with in-process backends. Tables: speed per
backend; per template, throughput, tokens, candidates, grounding and echo share; cache hit rates.

    python bench/relabel_throughput.py --quick
    python bench/relabel_throughput.py --n-paper 4 --n-segments 16 --iterations 12 --envs 16
    python bench/relabel_throughput.py --isolation transformers --n-segments 8   # child process vs in process
    python bench/relabel_throughput.py --backend transformers llama_cpp --n-paper 1 --n-segments 8
"""

import argparse
import json
import os
import time
from collections import Counter
from types import SimpleNamespace

from common import int_arg
from oir_gym.diversity import echo_share
from oir_gym.encoder import get_encoder
from oir_gym.relabel import HindsightRelabeler, LlamaCppBackend, LRUCache, TransformersBackend, load_template
from oir_gym.relabel.config import CacheSettings, LLMSettings, PromptSettings, RelabelerConfig, SelectionSettings
from oir_gym.relabel.segments import KEY_MODES, behaviour_key, is_idle
from oir_gym.relabel.synthetic import WOOD_TABLE_PICKAXE, make_trajectory, random_trajectories, training_run


def bench_template(template: str, trajs, backend, encoder, k: int) -> dict:
    cfg = RelabelerConfig(prompt=PromptSettings(template=template), cache=CacheSettings(size=0),
                          selection=SelectionSettings(k=k))
    # warm-up on a short trajectory: model load, grammar, encoder phrases, template prefix in the KV cache
    HindsightRelabeler(cfg, llm=backend, encoder=encoder).relabel([make_trajectory(WOOD_TABLE_PICKAXE, 8)])
    rl = HindsightRelabeler(cfg, llm=backend, encoder=encoder)
    t0 = time.perf_counter()
    results = [rl.relabel([t])[0] for t in trajs]  # one at a time: no in-batch de-duplication
    wall = time.perf_counter() - t0
    s, n = rl.stats(), len(trajs)
    return {"template": template, "n": n, "traj_per_s": n / wall, "tokens": s["prompt_tokens_mean"],
            "method": s["prompt_token_method"], "llm_s": s["latency_per_prompt_s"],
            "llm_cands": s["candidates_llm"] / n,
            "llm_ok": sum(r.error is None and any(c.source == "llm" for c in r.candidates) for r in results) / n,
            "grounded": s["grounded_fraction"], "errors": s["errors"],
            "echo": echo_share([c.text for r in results for c in r.candidates if c.source == "llm"],
                               rl.template.examples()),
            "example": results[0].instructions}


def print_isolation(backend: str, kwargs: dict, n: int, length: int, k: int, seed: int) -> None:
    """The same backend in a child process and in this process, interleaved: a table and their ratio."""
    encoder = get_encoder()
    trajs = [t for t in random_trajectories(4 * n, length, seed=seed) if not is_idle(t)][:n]
    modes = {name: HindsightRelabeler(RelabelerConfig(
        llm=LLMSettings(backend=backend, backend_kwargs=kwargs, isolate=iso), cache=CacheSettings(size=0),
        selection=SelectionSettings(k=k, use_rules=False)), encoder=encoder)
             for name, iso in (("in process", False), ("child process", True))}
    for rl in modes.values():  # warm-up: model load, grammar, encoder phrases
        rl.relabel([make_trajectory(WOOD_TABLE_PICKAXE, 8)])
    wall = dict.fromkeys(modes, 0.0)
    before = {name: rl.stats() for name, rl in modes.items()}
    for i, t in enumerate(trajs):
        for name in (list(modes) if i % 2 == 0 else list(modes)[::-1]):
            t0 = time.perf_counter()
            modes[name].relabel([t])
            wall[name] += time.perf_counter() - t0
    print(f"\n## LLM in a child process vs in process ({backend}, {kwargs or 'defaults'}, k={k}, "
          f"{len(trajs)} {length}-step trajectories each, interleaved)\n")
    print("| mode | trajectories | traj/s | LLM s/traj | LLM candidates/traj | errors |\n|---|---|---|---|---|---|")
    for name, rl in modes.items():
        s, s0 = rl.stats(), before[name]
        llm_s = ((s["latency_mean_s"] * s["calls"] - s0["latency_mean_s"] * s0["calls"])
                 / max(s["calls"] - s0["calls"], 1))
        print(f"| {name} | {len(trajs)} | {len(trajs) / wall[name]:.3f} | {llm_s:.3f} "
              f"| {(s['candidates_llm'] - s0['candidates_llm']) / len(trajs):.2f} | {s['errors'] - s0['errors']} |")
        rl.close()
    print(f"\nchild-process / in-process throughput: {wall['in process'] / wall['child process']:.3f}x")


def make_llm(name: str, args) -> tuple:
    """``(backend, label, load seconds)`` for ``--backend`` ``name``, loaded."""
    t0 = time.perf_counter()
    if name == "llama_cpp":
        be = LlamaCppBackend(args.model_path, n_threads=args.n_threads, seed=args.seed)
        be.count_tokens("warm")  # loads the model
        label = f"llama.cpp, {args.n_threads} thread(s)"
    else:
        be = TransformersBackend(args.model_path, num_threads=args.n_threads, seed=args.seed, dtype=args.dtype).load()
        label = f"transformers {args.dtype or 'float32'}, {args.n_threads} thread(s)"
    return be, label, time.perf_counter() - t0


def bench_speed(llms: list, prompts: list[str], schema: dict, n: int, batch: int) -> list[dict]:
    """Token rates and call times per backend: 1-token calls on ``n`` prompts, full answers on ``n`` others."""
    first, full, batched = prompts[:n], prompts[n:2 * n], prompts[2 * n:2 * n + batch]
    rows = [Counter() for _ in llms]
    for be, _, _ in llms:  # warm-up: grammar compile, first-call allocations
        be.generate(prompts[-1:], schema=schema)
    for p, q in zip(first, full):
        for (be, _, _), r in zip(llms, rows):
            be.max_tokens = 1
            t0 = time.perf_counter()
            be.generate([p], schema=schema)
            t1 = time.perf_counter()
            be.max_tokens = None
            (out,) = be.generate([q], schema=schema)
            t2 = time.perf_counter()
            r.update(prompt_tokens=be.count_tokens(p), full_prompt_tokens=be.count_tokens(q), prefill_s=t1 - t0,
                     full_s=t2 - t1, gen_tokens=max(0, be.count_tokens(out[0]) - be.count_tokens("")))
    for (be, _, _), r in zip(llms, rows):
        t0 = time.perf_counter()
        be.generate(batched, schema=schema)
        r["batch_s_per_traj"] = (time.perf_counter() - t0) / len(batched)
        # generation time = full calls less their prompt processing (at the measured prompt rate)
        prefill_full = r["full_prompt_tokens"] * r["prefill_s"] / max(1, r["prompt_tokens"])
        r["gen_s"] = max(1e-9, r["full_s"] - prefill_full)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (about a minute on 2 CPU cores)")
    ap.add_argument("--n-paper", type=int_arg(0), default=4, help="trajectories relabeled with the paper template")
    ap.add_argument("--n-segments", type=int_arg(0), default=16, help="trajectories of the segments template")
    ap.add_argument("--iterations", type=int_arg(1), default=12, help="simulated training iterations (cache run)")
    ap.add_argument("--envs", type=int_arg(1), default=16, help="trajectories per iteration (cache run)")
    ap.add_argument("--sim-iterations", type=int_arg(1), default=60, help="iterations of the keys-only cache run")
    ap.add_argument("--sim-envs", type=int_arg(1), default=64, help="envs of the keys-only cache simulation")
    ap.add_argument("--length", type=int_arg(1), default=128)
    ap.add_argument("--k", type=int_arg(1), default=4)
    ap.add_argument("--backend", nargs="+", default=["transformers"], choices=["transformers", "llama_cpp"])
    ap.add_argument("--n-threads", type=int_arg(1), default=1, help="LLM CPU threads (default 1, the relabeler's)")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="transformers weights on CPU")
    ap.add_argument("--n-speed", type=int_arg(1), default=4, help="segments prompts of the speed table")
    ap.add_argument("--batch", type=int_arg(1), default=4, help="prompts per call in the batched column")
    ap.add_argument("--model-path", default=None, help="GGUF file (default: packaged Gemma 3 270M)")
    ap.add_argument("--skip-cache", action="store_true", help="leave out the cache tables")
    ap.add_argument("--seed", type=int_arg(0), default=0)
    ap.add_argument("--isolation", metavar="BACKEND", default=None, help="only compare BACKEND (a name or "
                    "'module:Class') in a child process with it in this process, on --n-segments trajectories")
    ap.add_argument("--isolation-kwargs", default="{}", help="JSON constructor arguments for --isolation's backend")
    args = ap.parse_args(argv)
    if args.quick:
        vars(args).update(n_paper=1, n_segments=4, iterations=6, envs=8, sim_iterations=30, sim_envs=32, n_speed=2)
    if args.isolation:
        print_isolation(args.isolation, json.loads(args.isolation_kwargs), args.n_segments, args.length, args.k,
                        args.seed)
        return

    encoder, llms = get_encoder(), [make_llm(name, args) for name in args.backend]
    backend = llms[0][0]
    pool = [t for t in random_trajectories(96, args.length, seed=args.seed) if not is_idle(t)]
    tpl = load_template("segments")
    n_speed = args.n_speed
    speed = bench_speed(llms, [tpl.render(t, args.k) for t in pool[-(2 * n_speed + args.batch + 1):]],
                        tpl.schema(args.k), n_speed, args.batch)
    model_file = backend.model_path if isinstance(backend, LlamaCppBackend) else backend.model
    print(f"\n## LLM speed ({os.path.basename(model_file)}, segments prompts, k={args.k}, grammar-constrained, "
          f"{n_speed} + {n_speed} prompts, timed calls interleaved)\n")
    print(f"| backend | load (s) | prompt tokens/s | generated tokens/s | s per call (1 prompt) "
          f"| s per trajectory, {args.batch} prompts per call | prompt tokens/call | generated tokens/call |\n"
          + "|---" * 8 + "|")
    for (be, label, load_s), r in zip(llms, speed):
        print(f"| {label} | {load_s:.1f} | {r['prompt_tokens'] / r['prefill_s']:.0f} "
              f"| {r['gen_tokens'] / r['gen_s']:.1f} | {r['full_s'] / n_speed:.2f} | {r['batch_s_per_traj']:.2f} "
              f"| {r['full_prompt_tokens'] / n_speed:.0f} | {r['gen_tokens'] / n_speed:.0f} |")

    for be, label, _ in llms:
        rows = [bench_template(template, pool[:n], be, encoder, args.k)
                for template, n in (("paper", args.n_paper), ("segments", args.n_segments)) if n > 0]
        print(f"\n## Relabeling throughput ({label}, k={args.k}, {args.length}-step trajectories, one per call)\n")
        print("| template | trajectories | traj/s | prompt tokens/traj | LLM s/traj | LLM candidates/traj "
              "| trajs keeping an LLM candidate | grounded fraction | errors | LLM echo share |\n" + "|---" * 10 + "|")
        for r in rows:
            print(f"| {r['template']} | {r['n']} | {r['traj_per_s']:.3f} | {r['tokens']:.0f} ({r['method']}) "
                  f"| {r['llm_s']:.2f} | {r['llm_cands']:.2f} | {r['llm_ok']:.0%} | {r['grounded']:.2f} "
                  f"| {r['errors']} | {r['echo']:.2f} |")
        if len(rows) == 2 and rows[1]["tokens"]:
            print(f"\nprompt length ratio paper/segments: {rows[0]['tokens'] / rows[1]['tokens']:.1f}x; "
                  f"throughput ratio segments/paper: {rows[1]['traj_per_s'] / rows[0]['traj_per_s']:.1f}x")
        for r in rows:
            print(f"example ({r['template']}): {r['example']}")

    if args.skip_cache:
        return
    # cache hit rate of each key mode over a long simulated run (keys only, no LLM needed)
    sim = training_run(args.sim_iterations, args.sim_envs, args.length, seed=args.seed + 2, texts=False)
    print(f"\n## Cache key modes over a simulated training run ({args.sim_iterations} iterations x "
          f"{args.sim_envs} envs, competence rising 0 -> 1, LRU capacity 4096, keys only)\n")
    print("| cache_key | trajectories | idle (skipped) | distinct keys | hit rate (incl. in-batch duplicates) | "
          "hit rate, 2nd half of the run |\n|---|---|---|---|---|---|")
    for mode in KEY_MODES:
        cache, hits = LRUCache(4096), []  # per lookup: (in the 2nd half, hit)
        for it, batch in enumerate(sim):
            for key in (behaviour_key(t, mode) for t in batch if not is_idle(t)):
                hits.append((it >= len(sim) // 2, cache.get(key) is not None))
                cache.put(key, [])
        rate = [sum(h) / max(1, len(h)) for h in ([h for _, h in hits], [h for late, h in hits if late])]
        print(f"| {mode} | {sum(len(b) for b in sim)} | {sum(is_idle(t) for b in sim for t in b)} | {len(cache)} "
              f"| {rate[0]:.0%} | {rate[1]:.0%} |")

    # the relabeler's own cache statistics over a (shorter) run with the model
    label = "scripted stub LLM (--quick)" if args.quick else "the offline model"
    stub = SimpleNamespace(generate=lambda prompts, n=1, schema=None:  # its answers do not change hit rates
                           [['{"Mid-Level": ["collect wood"], "High-Level": []}'] * n for _ in prompts])
    rl = HindsightRelabeler(RelabelerConfig(prompt=PromptSettings(template="segments"),
                                            selection=SelectionSettings(k=args.k)),
                            llm=stub if args.quick else backend, encoder=encoder)
    t0 = time.perf_counter()
    for batch in training_run(args.iterations, args.envs, args.length, seed=args.seed + 1):
        rl.relabel(batch)
    wall, s = time.perf_counter() - t0, rl.stats()
    print(f"\n## Relabeler cache over a simulated training run ({args.iterations} iterations x {args.envs} envs, "
          f"segments template, cache_key=behaviour, lock-step, {label})\n")
    print("| trajectories | idle (skipped) | LLM prompts | cache hits | in-batch duplicates | hit rate | "
          "traj/s (with cache) | grounded fraction |\n" + "|---" * 8 + "|")
    print(f"| {s['trajectories']} | {s['skipped_idle']} | {s['prompts']} | {s['cache_hits']} | {s['batch_dedup']} "
          f"| {s['cache_hit_rate']:.0%} | {s['trajectories'] / wall:.2f} | {s['grounded_fraction']:.2f} |")


if __name__ == "__main__":
    main()
