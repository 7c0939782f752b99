"""A run over several processes (hosts) joined by ``jax.distributed``: seeds split by process.

Every process trains ``num_seeds / P`` whole seeds on its own devices (a local mesh,
:class:`agents.pqn.sharding.Layout`) with its own host loop: its relabeler, buffers and checkpoints
(``RUN_DIR/process{p}/``). Seeds exchange nothing while they train, so nothing crosses hosts inside
an update; the processes meet once per update, in :func:`allgather_json`, to agree on when to stop
and so that process 0 writes the run's one ``metrics.jsonl`` and evaluation files
(:func:`merge_rows`, :func:`merge_evals`). Seed ``g`` (global index) draws the same keys as seed
``g`` of a one-process run (:func:`seed_slice`).

A global mesh over every host's devices would instead make each host-side read (the relabeler's
trajectories, the episode records, the metrics) a cross-host gather, and the per-device rollout
programs (:class:`agents.pqn.sharding.PerDevice`) only run on devices their process holds.

The run directory must be on a file system every host sees (process 0 prepares it and writes the
merged files; each process writes its checkpoints).

When a process dies, the others find out at their next meeting: the collective fails and
:func:`allgather_json` raises :class:`ProcessLost` (one line; ``examples/train_pqn.py`` prints it
and exits at once, before ``jax.distributed``'s exit barrier would wait for the dead process and
abort with a stack dump). Each process keeps its own checkpoints, so they can stop at different
updates; a resume continues every process from :func:`newest_common_update`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np


def process_count() -> int:
    """Processes in this run (1 unless ``jax.distributed`` joined several)."""
    import jax

    return jax.process_count()


def check_processes(num_seeds: int, processes: int) -> None:
    """Refuse a seed count the processes cannot split into whole seeds each.

    Raises:
        ValueError: naming the numbers and the fix.
    """
    if num_seeds % processes:
        fit = processes * max(1, num_seeds // processes)
        raise ValueError(f"num_seeds={num_seeds} is not divisible by the {processes} processes of this run "
                         f"(jax.distributed): every process trains whole seeds; use --run.num-seeds {fit} "
                         f"or a multiple of {processes}")


def seed_slice(num_seeds: int, processes: int, index: int) -> slice:
    """The global seed indices process ``index`` of ``processes`` trains."""
    check_processes(num_seeds, processes)
    per = num_seeds // processes
    return slice(index * per, (index + 1) * per)


def process_dir(run_dir: str | Path, processes: int, index: int) -> Path:
    """Where process ``index`` keeps its checkpoints and per-process files (the run directory
    itself for a one-process run)."""
    return Path(run_dir) if processes == 1 else Path(run_dir) / f"process{index}"


class ProcessLost(RuntimeError):
    """A collective of a multi-process run failed: another process stopped (died, was killed or
    lost its connection). This process cannot go on either; the message is one line."""


def allgather_json(obj: Any) -> list[Any]:
    """``obj`` (JSON-serialisable) of every process, in process order; every process must call it.

    Two ``process_allgather`` collectives (the lengths, then the padded bytes); in a one-process
    run, ``[obj]`` without any collective.

    Raises:
        ProcessLost: a collective failed (another process is gone).
    """
    if process_count() == 1:
        return [obj]
    from jax.experimental.multihost_utils import process_allgather

    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    try:
        lengths = np.asarray(process_allgather(np.asarray([data.size], np.int64))).reshape(-1)
        buf = np.zeros(int(lengths.max()), np.uint8)
        buf[: data.size] = data
        every = np.asarray(process_allgather(buf)).reshape(len(lengths), -1)
    except Exception as e:  # noqa: BLE001 - whatever the transport raises (gloo, NCCL...), the run has lost a process
        import jax

        cause = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ProcessLost(f"process {jax.process_index()} of {process_count()}: another process of this run stopped "
                          f"(a collective failed: {cause[:200]})") from None
    return [json.loads(bytes(every[i, : int(n)]).decode()) for i, n in enumerate(lengths)]


def newest_common_update(held: Sequence[Sequence[int]]) -> int | None:
    """The newest checkpoint update that every process holds (``held``: each process's checkpoint
    updates), or None when they share none. A process that stopped between its save and the
    others' holds a newer one; the run resumes from this one, where every process can."""
    if not held:
        return None
    common = set(held[0]).intersection(*held[1:])
    return max(common) if common else None


def _is_seed_key(key: str) -> bool:
    head = key.split("/", 1)[0]
    return head.startswith("seed") and head[4:].isdigit()


def merge_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One metrics row from the rows every process wrote for the same update.

    Per-seed columns (``seed{g}/...``, global seed indices) are taken from the process that owns
    them; ``update`` and ``env_steps`` must agree; ``sps`` adds up; ``time`` and ``time/*`` take the
    slowest process; every other column is the mean over processes. Each process averages over
    equally many seeds, so seed means (losses, success rates, evaluation means) stay exact;
    per-process counts (``relabel/llm_results``, ``relabel/offers_total``...) become per-process means.

    Raises:
        ValueError: rows of different updates.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("no rows to merge")
    if len(rows) == 1:  # a one-process run's row, as it wrote it
        return dict(rows[0])
    for k in ("update", "env_steps"):
        values = {r.get(k) for r in rows}
        if len(values) > 1:
            raise ValueError(f"processes wrote rows of different {k}: {sorted(values, key=str)}")
    out: dict[str, Any] = {}
    for k in dict.fromkeys(k for r in rows for k in r):  # every column, in first-seen order
        values = [r[k] for r in rows if k in r]
        if k in ("update", "env_steps") or _is_seed_key(k):
            out[k] = values[0]
        elif k == "sps":
            out[k] = float(sum(values))
        elif k == "time" or k.startswith("time/"):
            out[k] = float(max(values))
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[k] = float(sum(values) / len(values))
        else:
            out[k] = values[0]
    return out


def merge_evals(per_process: Sequence[Sequence[Any]]) -> list[Any]:
    """The per-seed evaluation results of every process as one list in global seed order."""
    return [r for results in per_process for r in results]


def initialize_distributed() -> bool:
    """Join a multi-host run when the environment describes one; returns whether it did.

    Reads ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` (or lets JAX
    detect SLURM / Open MPI when ``OIR_GYM_DISTRIBUTED=auto``). Single-host runs need nothing.
    CPU processes exchange through gloo (unless ``JAX_CPU_COLLECTIVES_IMPLEMENTATION`` names another).
    """
    if not (os.environ.get("JAX_COORDINATOR_ADDRESS") or os.environ.get("OIR_GYM_DISTRIBUTED") == "auto"):
        return False
    import jax

    if not os.environ.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across processes
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        jax.distributed.initialize(
            coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
            process_id=int(os.environ["JAX_PROCESS_ID"]),
        )
    else:
        jax.distributed.initialize()
    return True
