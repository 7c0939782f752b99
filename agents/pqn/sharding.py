"""Seeds (and envs) spread over devices with ``jax.sharding``: per-seed arrays ``[S, ...]``, the env
batch of all seeds ``[S * E, ...]`` (seed-major); :class:`PerDevice` runs one program per device.
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from agents.pqn.program_cache import prepare

AXIS = "devices"
SEEDS, PARTS = "seeds", "parts"


def check_layout(num_seeds: int, num_envs: int, num_devices: int, visible: Optional[int] = None) -> None:
    """Refuse (``ValueError``, naming the fix) a device layout that cannot hold the run, before compiling."""
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
    elif num_devices % num_seeds:
        raise ValueError(f"num_seeds={num_seeds} < num_devices={num_devices}, so each seed's envs are split over "
                         f"num_devices/num_seeds devices, but {num_devices} is not a multiple of {num_seeds}; use "
                         f"--run.num-seeds {num_devices} or --run.num-devices {num_seeds}")
    elif num_envs % (num_devices // num_seeds):
        parts = num_devices // num_seeds
        raise ValueError(f"num_seeds={num_seeds} < num_devices={num_devices}, so each seed's envs are split over "
                         f"{parts} devices, but num_envs={num_envs} is not divisible by {parts}; use a multiple of "
                         f"{parts} envs (--pqn.num-envs) or --run.num-devices {num_seeds}")


@dataclass(frozen=True)
class Layout:
    """Where a run's ``S`` seeds of ``E`` envs live over ``D`` devices, in ``max(S, D)`` env blocks."""

    num_seeds: int
    num_envs: int
    num_devices: int

    @property
    def seed_shards(self) -> int:
        return min(self.num_seeds, self.num_devices)

    @property
    def parts(self) -> int:
        return self.num_devices // self.seed_shards

    @property
    def blocks(self) -> int:
        return max(self.num_seeds, self.num_devices)

    @property
    def envs_per_block(self) -> int:
        return self.num_seeds * self.num_envs // self.blocks

    @property
    def pool_per_block(self) -> int:
        return max(2 * self.envs_per_block, 16)

    @property
    def local_seeds(self) -> int:
        return self.num_seeds // self.seed_shards

    @property
    def local_envs(self) -> int:
        return self.num_envs // self.parts

    def mesh(self) -> Mesh:
        """The ``("seeds", "parts")`` mesh over this process's first ``D`` devices."""
        devices = np.asarray(jax.local_devices()[: self.num_devices]).reshape(self.seed_shards, self.parts)
        return Mesh(devices, (SEEDS, PARTS))

    #: ``[S, ...]`` (parameters, optimiser state, per-seed keys)
    seed_spec = PartitionSpec(SEEDS)
    #: flat env or block axis ``[S * E, ...]`` / ``[blocks, ...]`` (seed-major, then part)
    flat_spec = PartitionSpec((SEEDS, PARTS))
    #: ``[S, E, ...]`` (recurrent carries, last observations)
    seed_env_spec = PartitionSpec(SEEDS, PARTS)
    #: ``[S, T, E, ...]`` (trajectories)
    traj_spec = PartitionSpec(SEEDS, None, PARTS)

    def runner_specs(self, runner: Any) -> Any:
        """Partition specs of the trainer's runner ``(bstate, obs, carry, done, keys)``."""
        bstate, obs, carry, done, keys = runner
        flat = lambda tree: jax.tree_util.tree_map(lambda _: self.flat_spec, tree)  # noqa: E731
        specs = (flat(bstate), flat(obs), jax.tree_util.tree_map(lambda _: self.seed_env_spec, carry),
                 self.flat_spec, self.flat_spec)
        return type(runner)(*specs) if hasattr(runner, "_fields") else specs  # the runner's own pytree type

    def place(self, tree: Any, specs: Any) -> Any:
        """``jax.device_put`` every leaf of ``tree`` with its spec (a pytree prefix of ``tree``)."""
        mesh = self.mesh()
        shardings = jax.tree_util.tree_map(lambda p: NamedSharding(mesh, p), specs,
                                           is_leaf=lambda x: isinstance(x, PartitionSpec))
        return jax.device_put(tree, shardings)


def _global_shape(local: tuple[int, ...], spec: PartitionSpec, mesh: Mesh) -> tuple[int, ...]:
    shape = list(local)
    for dim, axes in enumerate(spec):
        for ax in (axes if isinstance(axes, tuple) else (axes,) if axes is not None else ()):
            shape[dim] *= mesh.shape[ax]
    return tuple(shape)


def _specs_like(specs: Any, tree: Any) -> list[PartitionSpec]:
    """The spec of every leaf of ``tree`` (``specs`` is a pytree prefix of it)."""
    out: list[PartitionSpec] = []
    jax.tree_util.tree_map(lambda p, sub: out.extend([p] * len(jax.tree_util.tree_leaves(sub))), specs, tree,
                           is_leaf=lambda x: isinstance(x, PartitionSpec))
    return out


class PerDevice:
    """Run ``fn``, written for one device's share of the data, on every device of a mesh side by side
    (each from its own thread; a one-device mesh runs ``jax.jit(fn)``). ``in_specs(*args)`` /
    ``out_specs(*args)``: the global arrays' partition specs (pytree prefixes)."""

    def __init__(self, fn: Callable, mesh: Mesh, in_specs: Callable[..., Any], out_specs: Callable[..., Any],
                 cache: Any = None, name: str = ""):
        self.mesh = mesh
        self.in_specs, self.out_specs = in_specs, out_specs
        self.devices = list(mesh.devices.flat)
        self._jit = jax.jit(fn)
        #: one device: the jitted function, or its executables kept in ``cache`` (a ProgramCache) under ``name``
        self.program = cache.wrap(self._jit, name) if cache is not None else self._jit
        self.compiled: dict[Any, Any] = {}
        self._signature: Any = None
        self._lock = threading.Lock()
        #: one starting thread per device (a shared pool may start two devices from one idle thread)
        self._threads = ([ThreadPoolExecutor(1, thread_name_prefix=f"oir-device{d.id}") for d in self.devices]
                         if len(self.devices) > 1 else [])
        for t in self._threads:  # the idle threads end with this object, not with the process
            weakref.finalize(self, t.shutdown, wait=False)

    def _split(self, args: tuple) -> list[tuple]:
        specs = _specs_like(self.in_specs(*args), args)
        leaves, treedef = jax.tree_util.tree_flatten(args)
        per_dev: list[list] = [[] for _ in self.devices]
        for x, spec in zip(leaves, specs):
            want = NamedSharding(self.mesh, spec)
            if not (isinstance(x, jax.Array) and x.sharding.is_equivalent_to(want, np.ndim(x))):
                x = jax.device_put(x, want)
            shards = {sh.device: sh.data for sh in x.addressable_shards}
            for i, d in enumerate(self.devices):
                per_dev[i].append(shards[d])
        return [jax.tree_util.tree_unflatten(treedef, leaves_d) for leaves_d in per_dev]

    def _compile(self, local_args: list[tuple]) -> None:
        signature = [jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), a) for a in local_args[:1]]
        if self.compiled and signature == self._signature:
            return
        done = [t.submit(lambda a: self._jit.lower(*a).compile(), a) for t, a in zip(self._threads, local_args)]
        self.compiled = {d: f.result() for d, f in zip(self.devices, done)}
        self._signature = signature

    def prepare(self, *args, wait: Callable[[], Any] | None = None) -> None:
        """Compile (or load) the program for ``args`` (:func:`agents.pqn.program_cache.prepare`, ``wait`` as
        there); several devices: one throwaway run."""
        prepare(self.program if len(self.devices) == 1 else self, *args, wait=wait)

    def eval_shape(self, *args) -> Any:
        """The global outputs as :class:`jax.ShapeDtypeStruct` (with shardings); nothing is compiled or run."""
        if len(self.devices) == 1:
            local = self.program.eval_shape(*args)
            specs = [PartitionSpec()] * len(jax.tree_util.tree_leaves(local))  # what jit gives a 1-device mesh
        else:
            local = jax.eval_shape(self._jit, *self._split(args)[0])
            specs = _specs_like(self.out_specs(*args), local)
        leaves, treedef = jax.tree_util.tree_flatten(local)
        return jax.tree_util.tree_unflatten(treedef, [
            jax.ShapeDtypeStruct(_global_shape(x.shape, sp, self.mesh), x.dtype, sharding=NamedSharding(self.mesh, sp))
            for x, sp in zip(leaves, specs)])

    def __call__(self, *args):
        if len(self.devices) == 1:
            return self.program(*args)
        local_args = self._split(args)
        with self._lock:
            self._compile(local_args)
        # one thread per device: a GPU program with host-driven control flow holds the thread that starts it
        futures = [t.submit(self.compiled[d], *a) for t, d, a in zip(self._threads, self.devices, local_args)]
        outs = [f.result() for f in futures]
        flat = [jax.tree_util.tree_flatten(o)[0] for o in outs]
        treedef = jax.tree_util.tree_structure(outs[0])
        specs = _specs_like(self.out_specs(*args), outs[0])
        joined = [jax.make_array_from_single_device_arrays(_global_shape(flat[0][i].shape, spec, self.mesh),
                                                           NamedSharding(self.mesh, spec), [f[i] for f in flat])
                  for i, spec in enumerate(specs)]
        return jax.tree_util.tree_unflatten(treedef, joined)


def placeholder(tree: Any) -> Any:
    """Zeros for a pytree of :class:`jax.ShapeDtypeStruct`, with each leaf's shape, dtype, weak type and sharding."""
    def zeros(x):
        if getattr(x, "weak_type", False):  # a Python scalar's type: jnp.zeros would make it strong
            z = jnp.broadcast_to(jnp.asarray(np.zeros((), x.dtype).item()), x.shape)
        else:
            z = jnp.zeros(x.shape, x.dtype)
        return z if getattr(x, "sharding", None) is None else jax.device_put(z, x.sharding)
    return jax.tree_util.tree_map(zeros, tree)


def make_mesh(num_devices: Optional[int] = None) -> Mesh:
    """A one-axis mesh over the first ``num_devices`` devices (default: all)."""
    devices = jax.devices()
    n = len(devices) if num_devices is None else int(num_devices)
    return Mesh(np.asarray(devices[:n]), (AXIS,))


def shard_leading(tree: Any, mesh: Mesh, sizes: tuple[int, ...]) -> Any:
    """Place a pytree on the mesh: leaves whose leading axis is one of ``sizes`` are split, others replicated."""
    n = mesh.devices.size

    def put(x):
        x = jax.numpy.asarray(x) if not isinstance(x, jax.Array) else x
        if x.ndim >= 1 and x.shape[0] in sizes and x.shape[0] % n == 0:
            return jax.device_put(x, NamedSharding(mesh, PartitionSpec(AXIS)))
        return jax.device_put(x, NamedSharding(mesh, PartitionSpec()))

    return jax.tree_util.tree_map(put, tree)
