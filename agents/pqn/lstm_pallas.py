"""The LSTM recurrence as one fused Pallas kernel per time step (``pqn.lstm_kernel="pallas"``), with
:func:`agents.pqn.network.lstm_scan`'s signature, outputs and gradient; each program of the grid (row
blocks, hidden-unit blocks) writes step ``t`` into the ``[T, ...]`` buffers the loop carries in place.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

#: Largest row block, hidden-unit block and contraction chunk (powers of two; Triton's dot needs >= 16),
#: and Triton's warps and pipeline stages per program (bench/update_cost.py --lstm-kernel pallas/R/U/K/S/W).
MAX_ROWS, MAX_UNITS, MAX_CHUNK, MIN_BLOCK = 64, 32, 64, 16
NUM_WARPS, NUM_STAGES = 4, 2


def _block(n: int, largest: int) -> int:
    """The largest power of two <= ``largest`` dividing ``n`` (a multiple of ``MIN_BLOCK``)."""
    b = largest
    while n % b:
        b //= 2
    return b


def _entering(carry0, seq, keep):
    """What entered each step: ``carry0`` then ``seq[:-1]``, zeroed where not ``keep``."""
    return jnp.concatenate([carry0[None], seq[:-1]], axis=0) * keep[..., None]


def _gate_grads(dh, dc, i, f, g, o, c_prev, tanh_c):
    """Gradients w.r.t. the pre-activations of gates i, f, g, o given the step's total dh and dc."""
    return dc * g * i * (1.0 - i), dc * c_prev * f * (1.0 - f), dc * i * (1.0 - g ** 2), dh * tanh_c * o * (1.0 - o)


def _fwd_kernel(t_ref, keep_ref, x_ref, w_ref, b_ref, h0_ref, c0_ref, hs_in, cs_in, g_in, hs_ref, cs_ref, g_ref,
                *, bb, bn, bk, dtype):
    del g_in  # aliased with g_ref: written only
    t = t_ref[0]
    rows, cols = pl.ds(pl.program_id(0) * bb, bb), pl.ds(pl.program_id(1) * bn, bn)
    first, tp = t == 0, jnp.maximum(t - 1, 0)
    keep = keep_ref[t, rows][:, None]

    def chunk(kk, acc):
        ks = pl.ds(kk * bk, bk)
        h = (jnp.where(first, h0_ref[rows, ks], hs_in[tp, rows, ks]) * keep).astype(dtype)
        return tuple(a + jnp.dot(h, w_ref[ks, k, cols], preferred_element_type=jnp.float32)
                     for k, a in enumerate(acc))

    acc = jax.lax.fori_loop(0, h0_ref.shape[-1] // bk, chunk, (jnp.zeros((bb, bn), jnp.float32),) * 4)
    z = [a + b_ref[k, cols][None, :] + x_ref[t, rows, k, cols] for k, a in enumerate(acc)]
    i, f, g, o = jax.nn.sigmoid(z[0]), jax.nn.sigmoid(z[1]), jnp.tanh(z[2]), jax.nn.sigmoid(z[3])
    c = f * jnp.where(first, c0_ref[rows, cols], cs_in[tp, rows, cols]) * keep + i * g
    hs_ref[t, rows, cols] = o * jnp.tanh(c)
    cs_ref[t, rows, cols] = c
    for k, v in enumerate((i, f, g, o)):
        g_ref[t, rows, k, cols] = v.astype(dtype).astype(jnp.float32)  # stored in dtype, as the scan stores them


def _bwd_kernel(t_ref, keep_ref, wt_ref, g_ref, cs_ref, c0_ref, dhs_ref, dc_ref, dz_in, dz_ref, dc_out,
                *, bb, bn, bk, dtype):
    """Step ``t`` (>= 1): ``dh_prev`` from ``dz_t``, then ``dc`` and ``dz`` of step ``t - 1``."""
    t = t_ref[0]
    rows, cols = pl.ds(pl.program_id(0) * bb, bb), pl.ds(pl.program_id(1) * bn, bn)
    keep_t, keep_p = keep_ref[t, rows][:, None], keep_ref[t - 1, rows][:, None]

    def chunk(kk, acc):
        ks = pl.ds(kk * bk, bk)
        for k in range(4):
            acc = acc + jnp.dot(dz_in[t, rows, k, ks].astype(dtype), wt_ref[k, ks, cols],
                                preferred_element_type=jnp.float32)
        return acc

    dh_prev = jax.lax.fori_loop(0, c0_ref.shape[-1] // bk, chunk, jnp.zeros((bb, bn), jnp.float32))
    dh = dhs_ref[t - 1, rows, cols] + keep_t * dh_prev
    i, f, g, o = (g_ref[t - 1, rows, k, cols] for k in range(4))
    c_prev = jnp.where(t == 1, c0_ref[rows, cols], cs_ref[jnp.maximum(t - 2, 0), rows, cols]) * keep_p
    tanh_c = jnp.tanh(cs_ref[t - 1, rows, cols])
    dc = keep_t * dc_ref[rows, cols] * g_ref[t, rows, 1, cols] + dh * o * (1.0 - tanh_c ** 2)
    for k, v in enumerate(_gate_grads(dh, dc, i, f, g, o, c_prev, tanh_c)):
        dz_ref[t - 1, rows, k, cols] = v
    dc_out[rows, cols] = dc


def _step_call(kernel, shapes, B, H, dtype, aliases):
    """A ``pallas_call`` of ``kernel`` on the (row blocks, hidden-unit blocks) grid, refs unblocked."""
    bb, bn, bk = _block(B, MAX_ROWS), _block(H, MAX_UNITS), _block(H, MAX_CHUNK)
    return pl.pallas_call(functools.partial(kernel, bb=bb, bn=bn, bk=bk, dtype=dtype), out_shape=shapes,
                          grid=(B // bb, H // bn), input_output_aliases=aliases,
                          compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES),
                          interpret=jax.default_backend() == "cpu")


def _forward(kernel_h, bias_h, x_proj, keep, carry, dtype, unroll):
    T, B, G = x_proj.shape
    H = G // 4
    c0, h0 = carry
    f32 = jnp.float32
    shapes = (jax.ShapeDtypeStruct((T, B, H), f32),) * 2 + (jax.ShapeDtypeStruct((T, B, 4, H), f32),)
    call = _step_call(_fwd_kernel, shapes, B, H, dtype, {7: 0, 8: 1, 9: 2})
    w, b, x = kernel_h.astype(dtype).reshape(H, 4, H), bias_h.reshape(4, H).astype(f32), x_proj.reshape(T, B, 4, H)
    keep = keep.astype(f32)

    def step(bufs, t):
        return call(t[None], keep, x, w, b, h0.astype(f32), c0.astype(f32), *bufs), None

    bufs = tuple(jnp.zeros(s.shape, f32) for s in shapes)
    (hs, cs, gates), _ = jax.lax.scan(step, bufs, jnp.arange(T, dtype=jnp.int32), unroll=unroll)
    return (cs[-1], hs[-1]), hs, cs, gates


def _lstm_fwd(kernel_h, bias_h, x_proj, resets, carry, dtype, unroll):
    carry_out, hs, cs, gates = _forward(kernel_h, bias_h, x_proj, ~resets, carry, dtype, unroll)
    return (carry_out, hs), (kernel_h, resets, carry, hs, cs, gates)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _lstm(kernel_h, bias_h, x_proj, resets, carry, dtype, unroll):
    return _lstm_fwd(kernel_h, bias_h, x_proj, resets, carry, dtype, unroll)[0]


def _lstm_bwd(dtype, unroll, res, cotangents):
    kernel_h, resets, (c0, h0), hs, cs, gates = res
    (dc_last, dh_last), dhs = cotangents
    T, B, H = hs.shape
    f32, keep = jnp.float32, (~resets).astype(jnp.float32)
    c_prev_last = (c0 if T == 1 else cs[-2]) * keep[-1][:, None]
    dh = dhs[-1] + dh_last
    tanh_c = jnp.tanh(cs[-1])
    i, f, g, o = (gates[-1, :, k] for k in range(4))
    dc = dc_last + dh * o * (1.0 - tanh_c ** 2)
    dz = jnp.zeros((T, B, 4, H), f32).at[-1].set(jnp.stack(_gate_grads(dh, dc, i, f, g, o, c_prev_last, tanh_c), 1))
    wt = kernel_h.T.astype(dtype)
    call = _step_call(_bwd_kernel, (jax.ShapeDtypeStruct((T, B, 4, H), f32), jax.ShapeDtypeStruct((B, H), f32)),
                      B, H, dtype, {8: 0})
    args = (keep, wt.reshape(4, H, H), gates, cs, c0.astype(f32), dhs.astype(f32))

    def step(state, t):
        dz, dc = state
        return call(t[None], *args, dc, dz), None

    (dz, dc), _ = jax.lax.scan(step, (dz, dc.astype(f32)), jnp.arange(T - 1, 0, -1, dtype=jnp.int32),
                               unroll=unroll)
    dz = dz.reshape(T, B, 4 * H).astype(dtype)  # stacked in dtype, as the scan stacks it
    dh0 = jnp.matmul(dz[0], wt, preferred_element_type=f32) * keep[0][:, None]
    dc0 = dc * gates[0, :, 1] * keep[0][:, None]
    h_prev = _entering(h0, hs, keep)
    d_kernel = jnp.einsum("tbh,tbg->hg", h_prev.astype(dtype), dz, preferred_element_type=f32)
    return d_kernel.astype(kernel_h.dtype), dz.sum(axis=(0, 1), dtype=f32), dz.astype(f32), None, (dc0, dh0)


_lstm.defvjp(_lstm_fwd, _lstm_bwd)


def lstm_scan_pallas(kernel_h, bias_h, x_proj, resets, carry, dtype=jnp.float32, unroll: int = 1):
    """:func:`agents.pqn.network.lstm_scan` with one fused Pallas kernel per step (rows and units zero-padded
    to multiples of ``MIN_BLOCK``)."""
    T, B, G = x_proj.shape
    H = G // 4
    x_proj = x_proj.astype(dtype).astype(jnp.float32)  # read in dtype, as the scan reads it; the kernels take float32
    Bp, Hp = -(-B // MIN_BLOCK) * MIN_BLOCK, -(-H // MIN_BLOCK) * MIN_BLOCK
    pad_gates = lambda a, rows: jnp.pad(a.reshape(*a.shape[:-1], 4, H),  # noqa: E731
                                        [(0, 0)] * (a.ndim - 2) + [(0, rows), (0, 0), (0, Hp - H)]
                                        ).reshape(*a.shape[:-2], a.shape[-2] + rows, 4 * Hp)
    (c, h), hs = _lstm(pad_gates(kernel_h, Hp - H), pad_gates(bias_h[None], 0)[0], pad_gates(x_proj, Bp - B),
                       jnp.pad(resets, [(0, 0), (0, Bp - B)]),
                       tuple(jnp.pad(v, [(0, Bp - B), (0, Hp - H)]) for v in carry), dtype, unroll)
    return (c[:B, :H], h[:B, :H]), hs[:, :B, :H]
