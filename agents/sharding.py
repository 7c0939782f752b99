"""Seeds (and envs) spread over devices with ``jax.sharding``, in one program.

The trainer keeps every per-seed array with the seed axis first (parameters and optimiser state
``[S, ...]``) and the env batch of all seeds as one axis ``[S * E, ...]`` in which seed ``s`` owns
envs ``[s*E, (s+1)*E)``. Sharding both leading axes over a one-axis :class:`~jax.sharding.Mesh`
of ``D`` devices gives each device ``S/D`` whole seeds with their envs: the jitted rollout, update
and evaluation then run side by side on every device with no traffic between them except the
(tiny) world pool and the host transfers. When there are fewer seeds than devices
(``S < D``), parameters are replicated and only the env axis is split, so one seed's envs spread
over the devices (``E`` must then divide by ``D``).

Multi-host: call :func:`initialize_distributed` (``jax.distributed.initialize``) at the top of the
program on every host; a cluster scheduler sets the coordinator address, the process count and
the process id (SLURM and Open MPI are detected by JAX itself; otherwise set
``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``). The mesh then spans
``jax.devices()`` of every host.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "devices"


def check_layout(num_seeds: int, num_envs: int, num_devices: int, visible: Optional[int] = None) -> None:
    """Refuse a device layout that cannot hold the run, before anything is compiled.

    Raises:
        ValueError: naming the numbers and the fix.
    """
    visible = len(jax.devices()) if visible is None else visible
    if num_devices < 1:
        raise ValueError(f"num_devices={num_devices} must be >= 1 (--run.num-devices 0 means every visible device)")
    if num_devices > visible:
        raise ValueError(f"num_devices={num_devices} but only {visible} device(s) are visible "
                         f"({jax.default_backend()}); use --run.num-devices {visible} or fewer")
    if num_seeds >= num_devices:
        if num_seeds % num_devices:
            fit = max(d for d in range(1, num_devices + 1) if num_seeds % d == 0)
            raise ValueError(f"num_seeds={num_seeds} is not divisible by num_devices={num_devices}: every device "
                             f"runs whole seeds; use a multiple of {num_devices} seeds (--run.num-seeds) or "
                             f"--run.num-devices {fit}")
    elif num_envs % num_devices:
        raise ValueError(f"num_seeds={num_seeds} < num_devices={num_devices}, so each seed's envs are split over the "
                         f"devices, but num_envs={num_envs} is not divisible by {num_devices}; use a multiple of "
                         f"{num_devices} envs (--pqn.num-envs) or --run.num-devices {num_seeds}")


def make_mesh(num_devices: Optional[int] = None) -> Mesh:
    """A one-axis mesh over the first ``num_devices`` devices (default: all)."""
    devices = jax.devices()
    n = len(devices) if num_devices is None else int(num_devices)
    return Mesh(np.asarray(devices[:n]), (AXIS,))


def leading_sharding(mesh: Mesh, shape: tuple[int, ...]) -> NamedSharding:
    """Split the leading axis over the mesh when it divides evenly, else replicate."""
    n = mesh.devices.size
    if len(shape) >= 1 and shape[0] % n == 0 and shape[0] >= n:
        return NamedSharding(mesh, PartitionSpec(AXIS))
    return NamedSharding(mesh, PartitionSpec())


def shard_leading(tree: Any, mesh: Mesh, sizes: tuple[int, ...]) -> Any:
    """Place a pytree on the mesh: leaves whose leading axis is one of ``sizes`` (e.g. ``S`` and
    ``S * E``) are split along it, every other leaf is replicated."""
    n = mesh.devices.size

    def put(x):
        x = jax.numpy.asarray(x) if not isinstance(x, jax.Array) else x
        if x.ndim >= 1 and x.shape[0] in sizes and x.shape[0] % n == 0:
            return jax.device_put(x, NamedSharding(mesh, PartitionSpec(AXIS)))
        return jax.device_put(x, NamedSharding(mesh, PartitionSpec()))

    return jax.tree_util.tree_map(put, tree)


def initialize_distributed() -> bool:
    """Join a multi-host run when the environment describes one; returns whether it did.

    Reads ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` (or lets JAX
    detect SLURM / Open MPI when ``OIR_GYM_DISTRIBUTED=auto``). Single-host runs need nothing.
    """
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        jax.distributed.initialize(
            coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
            process_id=int(os.environ["JAX_PROCESS_ID"]),
        )
        return True
    if os.environ.get("OIR_GYM_DISTRIBUTED") == "auto":
        jax.distributed.initialize()
        return True
    return False
