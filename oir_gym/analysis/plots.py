"""Figures from metrics rows (pyplot-free matplotlib Figures) and captions on video frames."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from oir_gym.analysis.runs import metrics_path, read_jsonl
from oir_gym.analysis.tables import (
    EVAL_METRICS, evaluated_sets, gain_sets, pooled_curves, pool_series, pooled_points, time_curves,
)
from oir_gym.metrics import mean_and_stderr


def save_figure(fig, out: str | Path) -> Path:
    """Lay out a figure and write it (PNG by ``out``'s suffix); returns ``out`` as a Path."""
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return Path(out)


def plot_learning_curves(runs: dict[str, Sequence[str | Path | list[dict]]], out: str | Path,
                         set_name: str = "original") -> Path:
    """Eval metrics vs env steps, one line per method with an s.e. band over seeds; ``runs[method]`` lists
    run directories, ``metrics.jsonl`` files or metrics rows, pooled as seeds."""
    fig, axes = _grid(3, 3, (5, 4))
    for label, paths in runs.items():
        steps, curves = pooled_curves([d if isinstance(d, list) else read_jsonl(metrics_path(d)) for d in paths],
                                      set_name)
        for ax, m in zip(axes, EVAL_METRICS):
            _band(ax, steps, curves[m], label)
    for ax, m in zip(axes, EVAL_METRICS):
        ax.set(title=f"{m.replace('_', ' ')} ({set_name})", xlabel="env steps")
        ax.grid(alpha=0.3)
    axes[0].legend()
    return save_figure(fig, out)


#: Below this many points a line also marks each point (a one-point series draws nothing without one).
MARKER_BELOW = 40


def _marker(n: int) -> str | None:
    return "." if n < MARKER_BELOW else None


def training_figure(metrics: list[dict]):
    """Loss, training success, epsilon and throughput vs env steps of one run, one axes per logged key."""
    keys = [k for k in ("loss", "train/success_rate", "train/reward_per_step", "curriculum/unpayable_step_frac",
                        "epsilon", "sps") if any(k in r and "env_steps" in r for r in metrics)]
    fig, axes = _grid(max(len(keys), 1), max(len(keys), 1), (4.0, 3.2))
    if not keys:
        _note(axes[0], "no training metrics logged (loss, train/success_rate, epsilon, sps)")
    rows = [r for r in metrics if "env_steps" in r]
    for ax, k in zip(axes, keys):
        steps, vals = zip(*[(r["env_steps"], r[k]) for r in rows if k in r])
        ax.plot(steps, vals, marker=_marker(len(steps)))
        ax.set(title=k, xlabel="env steps")
        ax.grid(alpha=0.3)
    return fig


def plot_training(metrics: list[dict], out: str | Path) -> Path:
    """Write :func:`training_figure` to ``out``."""
    return save_figure(training_figure(metrics), out)


def instruction_bars_figure(results: dict[str, Iterable[dict]], set_name: str = "original",
                            episodes: int | None = None):
    """Per-instruction success rates of ``set_name`` (else the first set), one bar per method;
    ``results[method]`` lists per-seed :meth:`oir_gym.evaluation.EvalResult.to_dict` dicts."""
    results = {m: list(r) for m, r in results.items()}
    methods = list(results)
    first = results[methods[0]]
    if set_name not in first[0]:
        set_name = next(iter(first[0]))
    texts = first[0][set_name]["texts"]
    fig, (ax,) = _grid(1, 1, (max(10, len(texts) * 0.6), 4.5))
    width = 0.8 / max(len(methods), 1)
    x = np.arange(len(texts))
    for i, m in enumerate(methods):
        rates = np.array([r[set_name]["rates"] for r in results[m]])
        mean, se = mean_and_stderr(rates, axis=0)
        ax.bar(x + i * width, np.atleast_1d(mean), width, yerr=np.atleast_1d(se) if len(rates) > 1 else None,
               label=f"{m} ({len(rates)} seed{'s' * (len(rates) != 1)})")
    ax.set_xticks(x + width * (len(methods) - 1) / 2)
    ax.set_xticklabels(texts, rotation=60, ha="right", fontsize=8)
    ax.set(ylabel="success rate", ylim=(0, 1))
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    eps = f", {episodes} episode{'s' * (episodes != 1)} per instruction" if episodes is not None else ""
    n = len(texts)
    ax.set_title(f"success per instruction: set '{set_name}' ({n} instruction{'s' * (n != 1)}{eps})")
    return fig


def plot_instruction_bars(results: dict[str, Iterable[dict]], out: str | Path, set_name: str = "original",
                          episodes: int | None = None) -> Path:
    """Write :func:`instruction_bars_figure` to ``out``."""
    return save_figure(instruction_bars_figure(results, set_name, episodes), out)


def plot_tsne(groups: dict[str, Sequence[str]], out: str | Path, encoder=None, seed: int = 0,
              reference: Sequence[str] | None = None) -> Path:
    """t-SNE of instruction embeddings, one colour per group (e.g. OIR vs ELLM), with the 22
    achievements (``reference``, default :data:`oir_gym.instructions.ORIGINAL_INSTRUCTIONS`) marked."""
    from sklearn.manifold import TSNE

    from oir_gym.encoder import get_encoder
    from oir_gym.instructions import ORIGINAL_INSTRUCTIONS

    enc = encoder or get_encoder()
    reference = list(reference or ORIGINAL_INSTRUCTIONS)
    pairs = [(g, t) for g, ts in [*groups.items(), ("achievements", reference)] for t in dict.fromkeys(ts)]
    names, texts = [g for g, _ in pairs], [t for _, t in pairs]
    if len(texts) < 5:
        raise ValueError(f"need at least 5 instructions for a t-SNE, got {len(texts)}")
    emb = enc.encode(texts)
    xy = TSNE(n_components=2, perplexity=min(30, max(2, len(texts) // 4)), random_state=seed, init="pca").fit_transform(emb)
    fig, (ax,) = _grid(1, 1, (7, 6))
    for g in dict.fromkeys(names):
        idx = [i for i, n in enumerate(names) if n == g]
        marker, size = ("*", 120) if g == "achievements" else ("o", 18)
        ax.scatter(xy[idx, 0], xy[idx, 1], s=size, marker=marker, label=f"{g} ({len(idx)})", alpha=0.8)
    ax.legend()
    ax.set_title("instructions in embedding space (t-SNE)")
    return save_figure(fig, out)


def plot_metric_vs_param(values: dict[str, list[dict]], out: str | Path, set_name: str = "original",
                         xlabel: str = "delta") -> Path:
    """Final metrics (mean +- s.e. over seeds) against a swept parameter (e.g. the delta ablation)."""
    xs = list(values)
    fig, axes = _grid(3, 3, (13 / 3, 3.6))
    for ax, k in zip(axes, EVAL_METRICS):
        stats = [mean_and_stderr(np.array([r[set_name][k] for r in values[x]], dtype=float)) for x in xs]
        ax.errorbar(range(len(xs)), [m for m, _ in stats], yerr=[s for _, s in stats], marker="o", capsize=4)
        ax.set(xticks=range(len(xs)), xticklabels=xs, xlabel=xlabel, title=f"{k.replace('_', ' ')} ({set_name})")
        ax.grid(alpha=0.3)
    return save_figure(fig, out)


def plot_threshold_confusion(curves: dict[str, dict[str, Sequence[float]]], deltas: Sequence[float],
                             out: str | Path) -> Path:
    """Recall and wrongly rewarded events against delta, one line per set of
    :func:`oir_gym.reward.threshold_confusion` results."""
    fig, axes = _grid(2, 2, (5, 3.6))
    titles = {"recall": "own event rewarded (fraction of instructions)",
              "wrong_per_instruction": "other events rewarded (per instruction)"}
    for ax, (key, title) in zip(axes, titles.items()):
        for name, c in curves.items():
            ax.plot(deltas, c[key], marker="o", label=name)
        ax.set_xlabel("delta")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend()
    return save_figure(fig, out)


def plot_time_to_target(runs: dict[str, Sequence[list[dict]]], out: str | Path, target: float | None = None,
                        set_name: str = "original") -> Path:
    """Mean success (over seeds, s.e. band) against wall-clock seconds, one line per method."""
    fig, (ax,) = _grid(1, 1, (7, 4))
    for name, rs in runs.items():
        times, _, vals = time_curves(rs, set_name)
        _band(ax, times / 60, vals, name)
    if target is not None:
        ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:.2f}")
    ax.set(xlabel="wall clock (min, compile included)", ylabel=f"mean success ({set_name})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out)


#: Where the relabeling panel reads a quantity, in order of preference: ``(key, how, what)`` (:func:`_series`).
RELABEL_ROWS = (("relabel/rows", "value", "PQN: rows per seed"),
                ("relabel/rows_added", "increment", "SB3: transitions per metrics row"))
RELABEL_NOVELTY = (("relabel/new_instructions", "value", "texts offered to a buffer for the first time"),
                   ("ellm/distinct_goals", "increment", "goals proposed for the first time"),
                   ("relabel/buffer_inserted", "increment", "SB3: texts written to the buffer per metrics row"))


def _grid(n: int, ncols: int = 3, cell: tuple[float, float] = (4.6, 3.4)):
    """A figure with ``n`` axes, ``ncols`` to a row, without pyplot (a notebook's figures stay untouched)."""
    from matplotlib.figure import Figure

    ncols = max(1, min(ncols, n))
    nrows = -(-n // ncols)
    fig = Figure(figsize=(cell[0] * ncols, cell[1] * nrows))
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in axes[n:]:
        fig.delaxes(ax)
    return fig, axes[:n]


def _band(ax, steps: np.ndarray, vals: np.ndarray, label: str, color: str | None = None, ls: str = "-") -> None:
    """The mean over the columns of ``vals [n, k]`` as a line, ± its s.e. as a band when k > 1 (NaN rows left out)."""
    keep = np.isfinite(vals).all(axis=1)
    steps, vals = np.asarray(steps)[keep], vals[keep]
    if len(steps) == 0:
        return
    mean, se = mean_and_stderr(vals.T, axis=0)
    mean, se = np.atleast_1d(mean), np.atleast_1d(se)
    (line,) = ax.plot(steps, mean, marker=_marker(len(steps)), label=label, color=color, ls=ls)
    if vals.shape[1] > 1:
        ax.fill_between(steps, mean - se, mean + se, alpha=0.2, color=line.get_color())


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="grey", wrap=True)


def _per_set_figure(runs: dict[str, Sequence[list[dict]]], sets: Sequence[str], key: str,
                    ylim: tuple[float, float] | None, ylabel: str, title: str):
    """One axes per set, one line per method, y fixed to ``ylim`` (None: :func:`symmetric_limits`)."""
    fig, axes = _grid(len(sets))
    for ax, s in zip(axes, sets):
        for i, (label, rows) in enumerate(runs.items()):  # a method keeps its colour on every axes
            steps, vals = pooled_points(rows, key.format(s))
            if len(steps):
                _band(ax, steps, vals, f"{label} ({vals.shape[1]} seed{'s' * (vals.shape[1] != 1)})", f"C{i}")
        if ylim is None or ylim[0] < 0:
            ax.axhline(0, color="grey", lw=0.8, ls="--", label="_zero")
        if not [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]:
            _note(ax, "not evaluated")
        ax.set(title=s, xlabel="env steps", ylabel=ylabel)
        ax.grid(alpha=0.3)
    for ax in axes:  # each set on its own scale: a set's small gains stay readable beside another's large ones
        ax.set_ylim(*(ylim or symmetric_limits([ax])))
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    return fig


#: The smallest half-span of :func:`symmetric_limits` (noise of 0.001 does not fill the frame).
MIN_HALF_SPAN = 0.1


def symmetric_limits(axes, min_half: float = MIN_HALF_SPAN, cap: float = 1.0) -> tuple[float, float]:
    """``(-h, h)`` holding every line and band on ``axes`` with a 10% margin, ``min_half <= h <= cap``, rounded
    up to a multiple of 0.05."""
    top = 0.0
    for ax in axes:
        for ln in ax.get_lines():
            if not ln.get_label().startswith("_"):
                y = np.asarray(ln.get_ydata(), dtype=float)
                top = max(top, float(np.nanmax(np.abs(y), initial=0.0)))
        for coll in ax.collections:  # the ± s.e. bands
            for path in coll.get_paths():
                y = path.vertices[:, 1]
                top = max(top, float(np.nanmax(np.abs(y[np.isfinite(y)]), initial=0.0)))
    half = min(cap, max(min_half, np.ceil(top * 1.1 / 0.05 - 1e-9) * 0.05))
    return -float(half), float(half)


def success_figure(runs: dict[str, Sequence[list[dict]]], sets: Sequence[str] | None = None):
    """Mean success rate against env steps, one axes per set, one line per method (``runs``: its runs' metrics
    rows, pooled as seeds); ValueError without any."""
    sets = list(sets) if sets is not None else evaluated_sets(r for rs in runs.values() for r in rs)
    if not sets:
        raise ValueError("no evaluation in these metrics rows (no eval/<set>/mean_success_rate key)")
    return _per_set_figure(runs, sets, "eval/{}/mean_success_rate", (0.0, 1.0), "mean success rate",
                           "success on every evaluated set (mean over seeds, band ± s.e.)")


def gain_figure(runs: dict[str, Sequence[list[dict]]], sets: Sequence[str] | None = None):
    """``eval/control/<set>/gain`` against env steps, one axes per set; ValueError when no row has the control."""
    sets = list(sets) if sets is not None else gain_sets(r for rs in runs.values() for r in rs)
    if not sets:
        raise ValueError("no instruction-following gain in these metrics rows (no eval/control/<set>/gain key: "
                         "the evaluation ran without its control, see docs/evaluation.md)")
    return _per_set_figure(runs, sets, "eval/control/{}/gain", None, "gain (asked - mismatched)",
                           "instruction-following gain (mean over seeds, band ± s.e.)")


def _series(rows: list[dict], key: str, how: str) -> tuple[np.ndarray, np.ndarray]:
    """``steps, values`` of one metric of a run (``how="increment"``: a running count, differenced)."""
    pts = [(r["env_steps"], float(r[key])) for r in rows if key in r and "env_steps" in r]
    if not pts:
        return np.zeros(0), np.zeros(0)
    steps, vals = (np.asarray(a, dtype=float) for a in zip(*pts))
    if how == "increment":
        step = np.diff(vals, prepend=0.0)
        vals = np.where(step < 0, vals, step)
    return steps, vals


def _pooled_series(rows_list: Sequence[list[dict]], key: str, how: str = "value"):
    """:func:`_series` of several runs, ``steps [n], values [n, runs]``, cut to the shortest run."""
    return pool_series([_series(rows, key, how) for rows in rows_list])


def _first_logged(rows_list: Sequence[list[dict]], specs) -> tuple[str, str, str] | None:
    """The first ``(key, how, what)`` of ``specs`` that every run logged."""
    for spec in specs:
        if rows_list and all(any(spec[0] in r for r in rows) for rows in rows_list):
            return spec
    return None


#: Per-update LLM keys of the PQN trainer's background relabeler (agents/pqn/oir_method.py).
LLM_IN_TIME, LLM_STALE, LLM_PENDING = "relabel/llm_results", "relabel/llm_stale", "relabel/llm_pending"
LLM_LATENCY, LLM_CALLS = "relabel/llm_latency_mean_s", "relabel/llm_calls"
GROUNDED_FRAC = "relabel/grounded_frac"


def has_relabeling(runs: Iterable[list[dict]]) -> bool:
    """Whether some run logged a quantity of the relabeling panel (:func:`relabeling_figure`)."""
    keys = ({k for k, _, _ in RELABEL_ROWS + RELABEL_NOVELTY}
            | {"relabel/llm_offer_share", "ellm/pinned_frac", GROUNDED_FRAC, LLM_IN_TIME, LLM_LATENCY})
    return any(k in r for rows in runs for r in rows for k in keys)


def _logs(rows_list: Sequence[list[dict]], key: str) -> bool:
    return _first_logged(rows_list, [(key, "", "")]) is not None


def relabeling_figure(runs: dict[str, Sequence[list[dict]]]):
    """What relabeling put into training per update (rows, sources, novelty, grounded fraction, LLM answers
    and latency) against env steps, one line per method; ValueError when no run logged any of them."""
    if not has_relabeling(r for rs in runs.values() for r in rs):
        raise ValueError("no relabeling metrics in these metrics rows (relabel/rows, relabel/llm_offer_share, "
                         "relabel/new_instructions, ellm/...): a run without relabeling")
    fig, axes = _grid(6, 3, (5.0, 3.6))
    ax_rows, ax_src, ax_new, ax_grounded, ax_llm, ax_latency = axes
    for i, (label, rows_list) in enumerate(runs.items()):
        c = f"C{i}"  # a method's colour on every axes; the sources differ by line style
        spec = _first_logged(rows_list, RELABEL_ROWS)
        if spec:
            _band(ax_rows, *_pooled_series(rows_list, spec[0], spec[1]), f"{label} ({spec[2]})", c)
        if _logs(rows_list, "relabel/llm_offer_share"):
            steps, llm = _pooled_series(rows_list, "relabel/llm_offer_share")
            _, relabeled = _pooled_series(rows_list, "relabel/rows")
            if relabeled.shape == llm.shape:  # an update without relabeled rows offered nothing
                llm = np.where(relabeled > 0, llm, np.nan)
            _band(ax_src, steps, 1.0 - llm, f"{label}: rules", c)
            if any(LLM_IN_TIME in r for rows in rows_list for r in rows):  # an LLM relabeler ran
                _band(ax_src, steps, llm, f"{label}: LLM", c, "--")
        if _logs(rows_list, "ellm/pinned_frac"):
            _band(ax_src, *_pooled_series(rows_list, "ellm/pinned_frac"), f"{label}: proposer", c, ":")
        spec = _first_logged(rows_list, RELABEL_NOVELTY)
        if spec:
            final = [r["diversity/novelty_share"] for rows in rows_list for r in rows if "diversity/novelty_share" in r]
            share = f"; final novelty share {np.mean(final):.2f}" if final else ""
            _band(ax_new, *_pooled_series(rows_list, spec[0], spec[1]), f"{label} ({spec[2]}{share})", c)
        if _logs(rows_list, GROUNDED_FRAC):
            _band(ax_grounded, *_pooled_series(rows_list, GROUNDED_FRAC), label, c)
        if _logs(rows_list, LLM_IN_TIME):
            _band(ax_llm, *_pooled_series(rows_list, LLM_IN_TIME), f"{label}: in time", c)
            if _logs(rows_list, LLM_STALE):
                _band(ax_llm, *_pooled_series(rows_list, LLM_STALE, "increment"), f"{label}: stale", c, "--")
            if _logs(rows_list, LLM_PENDING):
                _band(ax_llm, *_pooled_series(rows_list, LLM_PENDING), f"{label}: queued", c, ":")
        if _logs(rows_list, LLM_LATENCY):
            steps, latency = _pooled_series(rows_list, LLM_LATENCY)
            _, calls = _pooled_series(rows_list, LLM_CALLS)
            if calls.shape == latency.shape:  # a mean of no call is not a latency of 0 s
                latency = np.where(calls > 0, latency, np.nan)
            _band(ax_latency, steps, latency, label, c)
    titles = {ax_rows: ("relabeled rows per update", "rows", "relabel/rows"),
              ax_src: ("instructions by source (share per update)", "share",
                       "relabel/llm_offer_share or ellm/pinned_frac"),
              ax_new: ("novelty: new instructions per update", "instructions", "relabel/new_instructions"),
              ax_grounded: ("grounded fraction of relabeled candidates", "fraction", GROUNDED_FRAC),
              ax_llm: ("LLM answers per update: in time, stale, queued", "answers", LLM_IN_TIME),
              ax_latency: ("LLM latency (mean per call so far)", "seconds", LLM_LATENCY)}
    for ax, (title, ylabel, key) in titles.items():
        ax.set_title(title, fontsize=10)
        ax.set(xlabel="env steps", ylabel=ylabel)
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=7)
        else:
            _note(ax, f"not logged by this run ({key})")
    for ax in (ax_src, ax_grounded):
        ax.set_ylim(0.0, 1.05)  # a share of 1 stays visible above the frame's edge
    return fig


def rate_events(runs: Iterable[list[dict]]) -> list[str]:
    """The events whose training rates (``rate/<event>``, :mod:`oir_gym.event_rates`) the runs' rows hold."""
    return list(dict.fromkeys(k[5:] for rows in runs for r in rows for k in r if k.startswith("rate/")))


def event_rates_figure(runs: dict[str, Sequence[list[dict]]]):
    """Training rate (``rate/<event>``) of each event against env steps, one axes per event, one line per
    method; ValueError when no row holds a rate."""
    events = rate_events(rows for rs in runs.values() for rows in rs)
    if not events:
        raise ValueError("no training rates (rate/<event>) in these metrics rows")
    fig, axes = _grid(len(events), 6, (3.2, 2.4))
    for ax, event in zip(axes, events):
        for i, (label, rows_list) in enumerate(runs.items()):
            x, values = _pooled_series(rows_list, f"rate/{event}")
            if len(x):
                ax.plot(x, np.maximum(values.mean(axis=1), 1e-3), color=f"C{i}", label=label, lw=1)
        ax.set_yscale("log")
        ax.set_title(event, fontsize=8)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("per 1,000 env steps", fontsize=7)
    if len(runs) > 1:
        axes[0].legend(fontsize=6)
    fig.suptitle("training rates of the achievements and progress events (env steps on x)", fontsize=10)
    return fig


def write_overview_plots(runs: dict[str, Sequence[list[dict]]], out_dir: str | Path) -> list[Path]:
    """Write ``success.png``, ``gain.png``, ``relabeling.png`` and ``event_rates.png`` (each when the rows
    hold its data) into ``out_dir``; returns the paths written."""
    out = Path(out_dir)
    every = [r for rs in runs.values() for r in rs]
    figures = {"success.png": success_figure if evaluated_sets(every) else None,
               "gain.png": gain_figure if gain_sets(every) else None,
               "relabeling.png": relabeling_figure if has_relabeling(every) else None,
               "event_rates.png": event_rates_figure if rate_events(every) else None}
    return [save_figure(make(runs), out / name) for name, make in figures.items() if make is not None]


def caption_frame(frame: np.ndarray, text: str, font_size: int | None = None) -> np.ndarray:
    """A new ``[H, W, 3]`` uint8 ``frame`` with ``text`` wrapped on a dark band across its top (at most a
    third of the height)."""
    from PIL import Image, ImageDraw, ImageFont

    arr = np.asarray(frame)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
        raise ValueError(f"frame must be an [H, W, 3] uint8 RGB image, got shape {arr.shape} and dtype {arr.dtype}")
    h, w = arr.shape[:2]
    size = font_size or max(8, w // 20)
    try:
        font = ImageFont.load_default(size=size)  # a scalable font (Pillow >= 10.1 with FreeType)
    except (TypeError, ImportError, OSError):
        font = ImageFont.load_default()
    img = Image.fromarray(arr).convert("RGBA")
    draw = ImageDraw.Draw(img)
    pad = max(2, size // 4)
    lines: list[str] = []
    for word in " ".join(text.split()).split(" "):
        if lines and draw.textlength(f"{lines[-1]} {word}", font=font) <= w - 2 * pad:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    line_h = size + pad
    max_lines = max(1, (h // 3) // line_h)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] += " ..."
    band = Image.new("RGBA", img.size, (0, 0, 0, 0))
    ImageDraw.Draw(band).rectangle([0, 0, w, len(lines) * line_h + pad], fill=(0, 0, 0, 170))
    img = Image.alpha_composite(img, band)
    draw = ImageDraw.Draw(img)
    for i, line in enumerate(lines):
        draw.text((pad, pad + i * line_h), line, fill=(255, 255, 255, 255), font=font)
    return np.asarray(img.convert("RGB"))
