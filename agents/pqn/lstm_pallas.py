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
#: and Triton's pipeline stages and warps per program (bench/update_cost.py --lstm-kernel pallas/R/U/K/S/W).
MAX_ROWS, MAX_UNITS, MAX_CHUNK, MIN_BLOCK = 64, 32, 64, 16
NUM_WARPS, NUM_STAGES = 4, 2
#: The backward's hidden-unit block: its matmul contracts over 4H, not H (bench: pallas/R/U/K/S/W/BWD_UNITS).
MAX_BWD_UNITS = 32


def _block(n: int, largest: int) -> int:
    """The largest power of two <= ``largest`` dividing ``n`` (a multiple of ``MIN_BLOCK``)."""
    b = largest
    while n % b:
        b //= 2
    return b


def _gate_grads(dh, dc, i, f, g, o, c_prev, tanh_c):
    """Gradients w.r.t. the pre-activations of gates i, f, g, o given the step's total dh and dc."""
    return dc * g * i * (1.0 - i), dc * c_prev * f * (1.0 - f), dc * i * (1.0 - g ** 2), dh * tanh_c * o * (1.0 - o)


def _fwd_kernel(t_ref, keep_ref, x_ref, w_ref, b_ref, h_src, c_src, *refs, bb, bn, bk, first):
    """Step ``t``: ``h_{t-1}`` is ``hq[t]`` (in the matmuls' dtype), ``c_{t-1}`` is ``cs[t]``; writes ``hq[t + 1]``,
    ``cs[t + 1]``, ``hs[t]`` and the gates of step ``t``. ``first`` (``t = 0``): ``h_src``, ``c_src`` are ``h0``
    and ``c0``, also written to ``hq[0]`` and ``cs[0]``, and the buffers are new (never filled: every element is
    written before it is read); otherwise they are the buffers, aliased in place."""
    hq_ref, cs_ref, hs_ref, g_ref = refs[-4:]
    t = t_ref[0]
    rows, cols = pl.ds(pl.program_id(0) * bb, bb), pl.ds(pl.program_id(1) * bn, bn)
    keep = keep_ref[t, rows][:, None]
    h_prev = (lambda ks: h_src[rows, ks]) if first else (lambda ks: h_src[t, rows, ks])

    def chunk(kk, acc):
        h = h_prev(pl.ds(kk * bk, bk))
        return tuple(a + jnp.dot(h, w_ref[pl.ds(kk * bk, bk), k, cols], preferred_element_type=jnp.float32)
                     for k, a in enumerate(acc))

    acc = jax.lax.fori_loop(0, w_ref.shape[0] // bk, chunk, (jnp.zeros((bb, bn), jnp.float32),) * 4)
    # a reset row multiplies zeros: keep * (h @ W) is (keep * h) @ W exactly, keep being 0 or 1
    z = [keep * a + b_ref[k, cols][None, :] + x_ref[t, rows, k, cols].astype(jnp.float32)
         for k, a in enumerate(acc)]
    i, f, g, o = jax.nn.sigmoid(z[0]), jax.nn.sigmoid(z[1]), jnp.tanh(z[2]), jax.nn.sigmoid(z[3])
    c_prev = c_src[rows, cols] if first else c_src[t, rows, cols]
    c = f * c_prev * keep + i * g
    h = o * jnp.tanh(c)
    if first:
        hq_ref[0, rows, cols] = h_src[rows, cols]
        cs_ref[0, rows, cols] = c_prev
    hs_ref[t, rows, cols] = h
    hq_ref[t + 1, rows, cols] = h.astype(hq_ref.dtype)
    cs_ref[t + 1, rows, cols] = c
    for k, v in enumerate((i, f, g, o)):
        g_ref[t, rows, k, cols] = v.astype(g_ref.dtype)


def _bwd_kernel(t_ref, keep_ref, wt_ref, g_ref, cs_ref, dhs_ref, dc_ref, dz_src, dz_ref, dc_out, *, bb, bn, bk, first):
    """Step ``t`` (>= 1): ``dh_{t-1}`` from ``dz_t``, then ``dc`` and ``dz`` of step ``t - 1`` (``cs[t]`` is
    ``c_{t-1}``). ``first`` (``t = T - 1``): ``dz_src`` is ``dz_{T-1} [B, 4, H]``, also written to the new buffer."""
    t = t_ref[0]
    rows, cols = pl.ds(pl.program_id(0) * bb, bb), pl.ds(pl.program_id(1) * bn, bn)
    keep_t, keep_p = keep_ref[t, rows][:, None], keep_ref[t - 1, rows][:, None]
    dz_t = (lambda k, ks: dz_src[rows, k, ks]) if first else (lambda k, ks: dz_src[t, rows, k, ks])

    def chunk(kk, acc):
        ks = pl.ds(kk * bk, bk)
        for k in range(4):
            acc = acc + jnp.dot(dz_t(k, ks), wt_ref[k, ks, cols], preferred_element_type=jnp.float32)
        return acc

    dh_prev = jax.lax.fori_loop(0, wt_ref.shape[1] // bk, chunk, jnp.zeros((bb, bn), jnp.float32))
    if first:
        for k in range(4):
            dz_ref[t, rows, k, cols] = dz_t(k, cols)
    dh = dhs_ref[t - 1, rows, cols] + keep_t * dh_prev
    i, f, g, o = (g_ref[t - 1, rows, k, cols].astype(jnp.float32) for k in range(4))
    tanh_c = jnp.tanh(cs_ref[t, rows, cols])
    dc = keep_t * dc_ref[rows, cols] * g_ref[t, rows, 1, cols].astype(jnp.float32) + dh * o * (1.0 - tanh_c ** 2)
    for k, v in enumerate(_gate_grads(dh, dc, i, f, g, o, cs_ref[t - 1, rows, cols] * keep_p, tanh_c)):
        dz_ref[t - 1, rows, k, cols] = v.astype(dz_ref.dtype)
    dc_out[rows, cols] = dc


def _step_call(kernel, shapes, B, H, units, first, aliases):
    """A ``pallas_call`` of ``kernel`` on the (row blocks, hidden-unit blocks) grid, refs unblocked; ``aliases``:
    the buffers it updates in place (none for the ``first`` step, which creates them)."""
    bb, bn, bk = _block(B, MAX_ROWS), _block(H, units), _block(H, MAX_CHUNK)
    return pl.pallas_call(functools.partial(kernel, bb=bb, bn=bn, bk=bk, first=first), out_shape=shapes,
                          grid=(B // bb, H // bn), input_output_aliases=aliases,
                          compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES),
                          interpret=jax.default_backend() == "cpu")


def _forward(kernel_h, bias_h, x_proj, keep, carry, dtype, unroll):
    """``(c, h)`` after the last step, ``hs [T, B, H]``, ``hq [T + 1, B, H]`` (``h0`` then every ``h``, in
    ``dtype``), ``cs [T + 1, B, H]`` (``c0`` then every ``c``) and the gates ``[T, B, 4, H]`` (in ``dtype``)."""
    (T, B, G), (c0, h0), f32 = x_proj.shape, carry, jnp.float32
    H = G // 4
    shapes = (jax.ShapeDtypeStruct((T + 1, B, H), dtype), jax.ShapeDtypeStruct((T + 1, B, H), f32),
              jax.ShapeDtypeStruct((T, B, H), f32), jax.ShapeDtypeStruct((T, B, 4, H), dtype))
    call = functools.partial(_step_call, _fwd_kernel, shapes, B, H, MAX_UNITS)
    args = (keep.astype(f32), x_proj.reshape(T, B, 4, H), kernel_h.astype(dtype).reshape(H, 4, H),
            bias_h.reshape(4, H).astype(f32))
    bufs = call(True, {})(jnp.zeros((1,), jnp.int32), *args, h0.astype(dtype), c0.astype(f32))

    def step(bufs, t):
        return call(False, {5: 0, 6: 1, 7: 2, 8: 3})(t[None], *args, *bufs), None

    (hq, cs, hs, gates), _ = jax.lax.scan(step, bufs, jnp.arange(1, T, dtype=jnp.int32), unroll=unroll)
    return (cs[-1], hs[-1]), hs, hq, cs, gates


def _lstm_fwd(kernel_h, bias_h, x_proj, resets, carry, dtype, unroll):
    carry_out, hs, *res = _forward(kernel_h, bias_h, x_proj, ~resets, carry, dtype, unroll)
    return (carry_out, hs), (kernel_h, resets, *res)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _lstm(kernel_h, bias_h, x_proj, resets, carry, dtype, unroll):
    return _lstm_fwd(kernel_h, bias_h, x_proj, resets, carry, dtype, unroll)[0]


def _lstm_bwd(dtype, unroll, res, cotangents):
    kernel_h, resets, hq, cs, gates = res
    (dc_last, dh_last), dhs = cotangents
    T, B, H = dhs.shape
    f32, keep = jnp.float32, (~resets).astype(jnp.float32)
    dh = dhs[-1] + dh_last
    tanh_c = jnp.tanh(cs[-1])
    i, f, g, o = (gates[-1, :, k].astype(f32) for k in range(4))
    dc = dc_last + dh * o * (1.0 - tanh_c ** 2)
    dz = jnp.stack(_gate_grads(dh, dc, i, f, g, o, cs[-2] * keep[-1][:, None], tanh_c), 1).astype(dtype)
    wt = kernel_h.T.astype(dtype)
    if T > 1:
        shapes = (jax.ShapeDtypeStruct((T, B, 4, H), dtype), jax.ShapeDtypeStruct((B, H), f32))
        call = functools.partial(_step_call, _bwd_kernel, shapes, B, H, MAX_BWD_UNITS)
        args = (keep, wt.reshape(4, H, H), gates, cs, dhs.astype(f32))
        dz, dc = call(True, {})(jnp.full((1,), T - 1, jnp.int32), *args, dc, dz)

        def step(state, t):
            dz, dc = state
            return call(False, {7: 0})(t[None], *args, dc, dz), None

        (dz, dc), _ = jax.lax.scan(step, (dz, dc), jnp.arange(T - 2, 0, -1, dtype=jnp.int32), unroll=unroll)
    dz = (dz if T > 1 else dz[None]).reshape(T, B, 4 * H)
    dh0 = jnp.matmul(dz[0], wt, preferred_element_type=f32) * keep[0][:, None]
    dc0 = dc * gates[0, :, 1].astype(f32) * keep[0][:, None]
    h_prev = hq[:-1] * keep[..., None].astype(dtype)  # what each step's matmul read
    d_kernel = jnp.einsum("tbh,tbg->hg", h_prev, dz, preferred_element_type=f32)
    return d_kernel.astype(kernel_h.dtype), dz.sum(axis=(0, 1), dtype=f32), dz, None, (dc0, dh0)


_lstm.defvjp(_lstm_fwd, _lstm_bwd)


def lstm_scan_pallas(kernel_h, bias_h, x_proj, resets, carry, dtype=jnp.float32, unroll: int = 1):
    """:func:`agents.pqn.network.lstm_scan` with one fused Pallas kernel per step (rows and units zero-padded
    to multiples of ``MIN_BLOCK``)."""
    T, B, G = x_proj.shape
    H = G // 4
    x_proj = x_proj.astype(dtype)  # read in dtype, as the scan reads it
    Bp, Hp = -(-B // MIN_BLOCK) * MIN_BLOCK, -(-H // MIN_BLOCK) * MIN_BLOCK
    pad_gates = lambda a, rows: jnp.pad(a.reshape(*a.shape[:-1], 4, H),  # noqa: E731
                                        [(0, 0)] * (a.ndim - 2) + [(0, rows), (0, 0), (0, Hp - H)]
                                        ).reshape(*a.shape[:-2], a.shape[-2] + rows, 4 * Hp)
    (c, h), hs = _lstm(pad_gates(kernel_h, Hp - H), pad_gates(bias_h[None], 0)[0], pad_gates(x_proj, Bp - B),
                       jnp.pad(resets, [(0, 0), (0, Bp - B)]),
                       tuple(jnp.pad(v, [(0, Bp - B), (0, Hp - H)]) for v in carry), dtype, unroll)
    return (c[:B, :H], h[:B, :H]), hs[:, :B, :H]
