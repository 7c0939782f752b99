"""A run over several processes (hosts) joined by ``jax.distributed``: each trains ``num_seeds / P`` whole seeds
with its own checkpoints (``RUN_DIR/process{p}/``, on a file system every host sees); they meet once per update
in :func:`allgather_json`, and process 0 writes the run's merged files.
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
    """ValueError naming the fix unless the processes split ``num_seeds`` into whole seeds each."""
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
    """Where process ``index`` keeps its checkpoints (the run directory itself for a one-process run)."""
    return Path(run_dir) if processes == 1 else Path(run_dir) / f"process{index}"


class ProcessLost(RuntimeError):
    """A collective of a multi-process run failed: another process stopped (the message is one line)."""


def allgather_json(obj: Any) -> list[Any]:
    """``obj`` (JSON-able) of every process, in process order (every process calls it); :class:`ProcessLost` when
    a collective fails."""
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
    """The newest checkpoint update every process holds (``held``: each one's updates), or None."""
    if not held:
        return None
    common = set(held[0]).intersection(*held[1:])
    return max(common) if common else None


def _is_seed_key(key: str) -> bool:
    head = key.split("/", 1)[0]
    return head.startswith("seed") and head[4:].isdigit()


def merge_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One metrics row from every process's row of the same update: per-seed columns from their owner, ``sps``
    summed, ``time`` and ``time/*`` the slowest, every other column the mean (ValueError: different updates)."""
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
    """Join a multi-host run described by ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``
    (or JAX's own detection with ``OIR_GYM_DISTRIBUTED=auto``); returns whether it did."""
    if not (os.environ.get("JAX_COORDINATOR_ADDRESS") or os.environ.get("OIR_GYM_DISTRIBUTED") == "auto"):
        return False
    import jax

    if not os.environ.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across processes
    env = os.environ
    jax.distributed.initialize(**({} if not env.get("JAX_COORDINATOR_ADDRESS") else dict(
        coordinator_address=env["JAX_COORDINATOR_ADDRESS"], num_processes=int(env["JAX_NUM_PROCESSES"]),
        process_id=int(env["JAX_PROCESS_ID"]))))
    return True
