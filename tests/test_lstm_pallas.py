"""The fused Pallas LSTM (``pqn.lstm_kernel="pallas"``) against the scan it replaces: same outputs, final
carry and gradients (Pallas's interpreter on a CPU; the same kernels compile through Triton on a GPU)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.pqn import network as pqn
from agents.pqn.config import TrainConfig
from agents.pqn.lstm_pallas import lstm_scan_pallas

TOL = {"float32": dict(atol=2e-5, rtol=2e-5), "bfloat16": dict(atol=2e-2, rtol=2e-2)}


def _inputs(seed: int, reset_rate: float, T: int, B: int, H: int, lead: tuple[int, ...] = ()):
    k = jax.random.split(jax.random.PRNGKey(seed), 6)
    return (jax.random.normal(k[0], (*lead, H, 4 * H)) / np.sqrt(H), jax.random.normal(k[1], (*lead, 4 * H)) * 0.1,
            jax.random.normal(k[2], (*lead, T, B, 4 * H)), jax.random.uniform(k[3], (*lead, T, B)) < reset_rate,
            (jax.random.normal(k[4], (*lead, B, H)), jax.random.normal(k[5], (*lead, B, H))))


def _grads(kernel_h, bias_h, x_proj, resets, carry, dtype_is_bf16=False):
    """Outputs ``(c, h, hs)``, loss and gradients (w.r.t. kernel_h, bias_h, x_proj, carry) of the scan and of
    the Pallas kernel."""
    dtype = jnp.bfloat16 if dtype_is_bf16 else jnp.float32

    def loss(fn, *a):  # every output used: the sequence and the final carry
        (c, h), hs = fn(a[0], a[1], a[2], resets, a[3], dtype, 2)
        return jnp.sum(jnp.sin(hs)) + jnp.sum(c ** 2) + jnp.sum(h), (c, h, hs)

    return tuple(jax.value_and_grad(lambda *a, fn=fn: loss(fn, *a), argnums=(0, 1, 2, 3), has_aux=True)(
        kernel_h, bias_h, x_proj, carry) for fn in (pqn.lstm_scan, lstm_scan_pallas))


_both = jax.jit(_grads, static_argnums=5)


def _assert_same(got, want, tol):
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **tol)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2 ** 16), reset_rate=st.sampled_from([0.0, 0.3, 1.0]), bf16=st.booleans())
def test_pallas_lstm_equals_the_scan_in_outputs_carry_and_gradients(seed, reset_rate, bf16):
    args = _inputs(seed, reset_rate, T=5, B=16, H=32)
    want, got = _both(*args, bf16)
    _assert_same(got, want, TOL["bfloat16" if bf16 else "float32"])


@pytest.mark.slow
def test_pallas_lstm_under_vmap_equals_the_scan_per_seed():
    args = _inputs(7, 0.3, T=4, B=16, H=32, lead=(2,))
    want, got = jax.jit(jax.vmap(_grads, in_axes=(0, 0, 0, 0, 0, None)), static_argnums=5)(*args, False)
    _assert_same(got, want, TOL["float32"])


@pytest.mark.slow
def test_pallas_lstm_pads_shapes_that_do_not_tile():
    """Rows and hidden units that are no multiple of 16 are padded, and the padding leaves no trace."""
    args = _inputs(3, 0.3, T=3, B=5, H=20)
    want, got = _both(*args, False)
    _assert_same(got, want, TOL["float32"])


@pytest.mark.slow
def test_lstm_kernel_config_selects_the_pallas_recurrence_with_the_same_q_values():
    cfg = dataclasses.replace(TrainConfig().pqn, hidden_size=16)
    scan, fused = pqn.make_network(cfg, 5), pqn.make_network(dataclasses.replace(cfg, lstm_kernel="pallas"), 5)
    assert fused.lstm_kernel == "pallas"
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    obs, instr = jax.random.normal(k[0], (3, 4, 6)), jax.random.normal(k[1], (3, 4, 384))
    resets = jnp.zeros((3, 4), bool).at[1, 2].set(True)
    carry = scan.initial_carry(4)
    params = scan.init(k[2], carry, obs, instr, resets)
    _assert_same(fused.apply(params, carry, obs, instr, resets), scan.apply(params, carry, obs, instr, resets),
                 TOL["float32"])


def test_an_unknown_lstm_kernel_is_refused():
    cfg = TrainConfig()
    cfg.pqn.lstm_kernel = "cuda"
    with pytest.raises(ValueError, match="lstm_kernel"):
        cfg.validate()


def test_auto_picks_the_pallas_kernel_on_one_gpu_and_the_scan_elsewhere(monkeypatch):
    assert TrainConfig().pqn.lstm_kernel == "auto"
    assert pqn.resolve_lstm_kernel("auto") == "scan"  # this suite runs on a CPU: the kernel would be interpreted
    assert (pqn.resolve_lstm_kernel("scan"), pqn.resolve_lstm_kernel("pallas", 4)) == ("scan", "pallas")  # named: as named
    # no GPU here: the backend's name is what the choice reads, so it is set (the one fault a CPU cannot produce)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert (pqn.resolve_lstm_kernel("auto", 1), pqn.resolve_lstm_kernel("auto", 2)) == ("pallas", "scan")
    assert pqn.make_network(TrainConfig().pqn, 5).lstm_kernel == "pallas"
