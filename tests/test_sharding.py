"""Device layouts for seeds and envs (agents.sharding): refused before compiling, placed by axis."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from agents.sharding import check_layout, make_mesh, shard_leading


@pytest.mark.parametrize("seeds, envs, devices, visible, match", [
    (3, 8, 2, 2, "num_seeds=3 is not divisible by num_devices=2"),
    (2, 8, 4, 2, "only 2 device"),
    (1, 7, 2, 2, "num_envs=7 is not divisible by 2"),
    (1, 8, 0, 2, "must be >= 1"),
])
def test_bad_layouts_are_refused_with_the_numbers(seeds, envs, devices, visible, match):
    with pytest.raises(ValueError, match=match):
        check_layout(seeds, envs, devices, visible)


def test_good_layouts_pass():
    check_layout(6, 64, 2, 2)
    check_layout(1, 64, 2, 2)
    check_layout(1, 7, 1, 1)


def test_shard_leading_places_seed_and_env_axes():
    mesh = make_mesh(1)
    tree = {"params": jnp.zeros((3, 5)), "envs": jnp.zeros((12, 2)), "pool": jnp.zeros((7,)), "key": jnp.zeros(())}
    out = shard_leading(tree, mesh, sizes=(3, 12))
    assert out["params"].sharding.spec == jax.sharding.PartitionSpec("devices")
    assert out["pool"].sharding.spec == jax.sharding.PartitionSpec()
