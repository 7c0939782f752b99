"""PQN-RNN (Gallici et al. 2024) conditioned on instructions: network, acting, Q(lambda) targets, update.

The network: LayerNorm on the input (obs features ++ instruction embedding), ``num_layers``
Dense+LayerNorm+ReLU blocks, one LSTM layer and a linear Q head, as in purejaxql's PQN-RNN; the loss
is the squared error to Q(lambda) targets from the same forward pass (stop-gradient), optimised by RAdam.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.linen.recurrent import DenseParams
from flax.training.train_state import TrainState

from agents.pqn.config import PQNConfig
from agents.pqn.lstm_pallas import lstm_scan_pallas


def matmul(x, w, dtype=jnp.float32):
    """``x @ w`` with both cast to ``dtype``, accumulated and returned in float32 (the gradient in ``dtype`` too)."""
    if jnp.dtype(dtype) == jnp.float32:
        return jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32), preferred_element_type=jnp.float32)
    return _low_precision_matmul(x, w, jnp.dtype(dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _low_precision_matmul(x, w, dtype):
    """:func:`matmul` below float32; its gradient casts the cotangent to ``dtype`` (JAX's would multiply in float32)."""
    return jnp.matmul(x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)


def _low_precision_matmul_fwd(x, w, dtype):
    return _low_precision_matmul(x, w, dtype), (x, w)


def _low_precision_matmul_bwd(dtype, res, g):
    x, w = res
    gd, lead = g.astype(dtype), tuple(range(x.ndim - 1))
    dx = jax.lax.dot_general(gd, w.astype(dtype), (((g.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    dw = jax.lax.dot_general(x.astype(dtype), gd, ((lead, lead), ((), ())), preferred_element_type=jnp.float32)
    return dx.astype(x.dtype), dw.astype(w.dtype)


_low_precision_matmul.defvjp(_low_precision_matmul_fwd, _low_precision_matmul_bwd)


def lstm_forward(kernel_h, bias_h, x_proj, resets, carry, dtype, unroll):
    """The LSTM recurrence over ``x_proj [T, B, 4H]`` with JAX's gradient: ``((c, h), (hs, gates, cs))``,
    every step's ``h``, gates ``i, f, g, o`` (after their nonlinearities; stored in ``dtype``) and cell."""
    kernel = kernel_h.astype(dtype)  # cast once, not in every step

    def step(carry, inp):
        xp_t, reset_t = inp
        c_prev, h_prev = (jnp.where(reset_t[:, None], 0.0, v) for v in carry)
        z = matmul(h_prev, kernel, dtype) + bias_h + xp_t
        zi, zf, zg, zo = jnp.split(z, 4, axis=-1)
        i, f, g, o = nn.sigmoid(zi), nn.sigmoid(zf), jnp.tanh(zg), nn.sigmoid(zo)
        c = f * c_prev + i * g
        h = o * jnp.tanh(c)
        return (c, h), (h, jnp.concatenate([i, f, g, o], axis=-1).astype(dtype), c)

    return jax.lax.scan(step, carry, (x_proj, resets), unroll=unroll)


def _entering(carry0, seq, resets):
    """What entered each step: ``carry0`` then ``seq[:-1]``, zeroed where ``resets``."""
    prev = jnp.concatenate([carry0[None], seq[:-1]], axis=0)
    return jnp.where(resets[..., None], 0.0, prev)


def lstm_scan(kernel_h, bias_h, x_proj, resets, carry, dtype=jnp.float32, unroll: int = 1):
    """An LSTM over ``x_proj [T, B, 4H]`` (gates i, f, g, o; read in ``dtype``) from ``carry = (c, h)``, zeroed
    where ``resets [T, B]``: returns ``((c, h), hs [T, B, H])``. Its written-out gradient computes ``dW_h`` as
    one matmul after the backward loop, not one per step inside it (same maths as autodiff)."""
    return _lstm_scan(kernel_h, bias_h, x_proj.astype(dtype), resets, carry, dtype, unroll)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _lstm_scan(kernel_h, bias_h, x_proj, resets, carry, dtype, unroll):
    carry, (hs, *_) = lstm_forward(kernel_h, bias_h, x_proj, resets, carry, dtype, unroll)
    return carry, hs


def _lstm_scan_fwd(kernel_h, bias_h, x_proj, resets, carry, dtype, unroll):
    carry_out, (hs, gates, cs) = lstm_forward(kernel_h, bias_h, x_proj, resets, carry, dtype, unroll)
    return (carry_out, hs), (kernel_h, resets, carry, hs, gates, cs)


def _lstm_scan_bwd(dtype, unroll, res, cotangents):
    kernel_h, resets, (c0, h0), hs, gates, cs = res
    (dc_last, dh_last), dhs = cotangents
    h_prev, c_prev = _entering(h0, hs, resets), _entering(c0, cs, resets)
    kernel_t = kernel_h.T.astype(dtype)

    def step(carry, inp):
        dc_next, dh_next = carry
        dh_t, reset_t, c_prev_t, gates_t, c_t = inp
        i, f, g, o = jnp.split(gates_t.astype(jnp.float32), 4, axis=-1)
        dh = dh_t + dh_next
        tanh_c = jnp.tanh(c_t)
        dc = dc_next + dh * o * (1.0 - tanh_c ** 2)
        dz = jnp.concatenate([dc * g * i * (1.0 - i), dc * c_prev_t * f * (1.0 - f), dc * i * (1.0 - g ** 2),
                              dh * tanh_c * o * (1.0 - o)], axis=-1)
        dh_prev = matmul(dz, kernel_t, dtype)
        dc_prev = dc * f
        keep = ~reset_t[:, None]  # a reset carry came from zeros, not from the step before
        # stacked in the matmuls' dtype: dW_h and the input projection's gradient multiply it in that dtype
        return (jnp.where(keep, dc_prev, 0.0), jnp.where(keep, dh_prev, 0.0)), dz.astype(dtype)

    (dc0, dh0), dz = jax.lax.scan(step, (dc_last, dh_last), (dhs, resets, c_prev, gates, cs), reverse=True,
                                  unroll=unroll)
    d_kernel = jnp.einsum("tbh,tbg->hg", h_prev.astype(dtype), dz, preferred_element_type=jnp.float32)
    d_bias = dz.sum(axis=(0, 1), dtype=jnp.float32)
    return d_kernel.astype(kernel_h.dtype), d_bias, dz, None, (dc0, dh0)


_lstm_scan.defvjp(_lstm_scan_fwd, _lstm_scan_bwd)


class SequenceLSTM(nn.Module):
    """An LSTM over ``[T, B, F]`` with flax's ``OptimizedLSTMCell`` parameters and maths, the input
    projection hoisted out of the scan; the carry ``(c, h)`` is zeroed where ``resets [T, B]``.
    ``dtype``: the matmuls' input type; ``grad``: ``"hoisted"`` (:func:`lstm_scan`) or ``"autodiff"``;
    ``kernel`` (hoisted only): ``"scan"`` or ``"pallas"`` (:func:`agents.pqn.lstm_pallas.lstm_scan_pallas`, for
    sequences of more than one step)."""

    features: int
    unroll: int = 1
    dtype: Any = jnp.float32
    grad: str = "hoisted"
    kernel: str = "scan"

    @nn.compact
    def __call__(self, carry, x, resets):
        gates = ("i", "f", "g", "o")
        w_i = [DenseParams(self.features, use_bias=False, kernel_init=nn.initializers.lecun_normal(),
                           name=f"i{g}")(x[0])[0] for g in gates]
        w_h = [DenseParams(self.features, use_bias=True, kernel_init=nn.initializers.orthogonal(),
                           bias_init=nn.initializers.zeros_init(), name=f"h{g}")(carry[1]) for g in gates]
        # [T, B, 4H], kept in the matmuls' dtype: each step reads it once, and memory bounds a step's time
        x_proj = matmul(x, jnp.concatenate(w_i, axis=-1), self.dtype).astype(self.dtype)
        kernel_h = jnp.concatenate([k for k, _ in w_h], axis=-1)
        bias_h = jnp.concatenate([b for _, b in w_h], axis=-1)
        if self.grad == "hoisted":
            # one step (acting, evaluation) stays the scan's: a kernel per step fuses nothing there
            lstm = lstm_scan_pallas if self.kernel == "pallas" and x.shape[0] > 1 else lstm_scan
            return lstm(kernel_h, bias_h, x_proj, resets, carry, self.dtype, self.unroll)
        carry, (hs, *_) = lstm_forward(kernel_h, bias_h, x_proj, resets, carry, self.dtype, self.unroll)
        return carry, hs


class QNetwork(nn.Module):
    """``(carry, obs [T, B, D], instruction [T, B, 384], resets [T, B]) -> (carry, q [T, B, A])``."""

    num_actions: int
    hidden_size: int = 512
    num_layers: int = 1
    norm_input: bool = True
    unroll: int = 1
    dtype: Any = jnp.float32
    grad: str = "hoisted"
    lstm_kernel: str = "scan"

    @nn.compact
    def __call__(self, carry, obs, instruction, resets):
        x = jnp.concatenate([obs, instruction], axis=-1)
        if self.norm_input:
            x = nn.LayerNorm()(x)
        for _ in range(self.num_layers):
            x = nn.relu(nn.LayerNorm()(nn.Dense(self.hidden_size, dtype=self.dtype)(x).astype(jnp.float32)))
        # the parameters of flax's OptimizedLSTMCell under its name (checkpoints load either way)
        carry, y = SequenceLSTM(self.hidden_size, self.unroll, self.dtype, self.grad, self.lstm_kernel,
                                name="OptimizedLSTMCell_0")(carry, x, resets)
        return carry, nn.Dense(self.num_actions)(y)

    def initial_carry(self, batch: int):
        z = jnp.zeros((batch, self.hidden_size))
        return (z, z)


def resolve_lstm_kernel(setting: str, num_devices: int = 1) -> str:
    """The recurrence ``pqn.lstm_kernel`` names: ``auto`` is the Pallas kernel on one GPU, else the scan (a CPU
    would interpret the kernel; a program spread over devices would gather every seed to run it)."""
    gpu = jax.default_backend() == "gpu" and num_devices == 1
    return setting if setting != "auto" else "pallas" if gpu else "scan"


def make_network(cfg: PQNConfig, num_actions: int, num_devices: int = 1) -> QNetwork:
    """The Q-network of ``cfg`` for ``num_actions`` actions (its program spread over ``num_devices``)."""
    return QNetwork(num_actions, cfg.hidden_size, cfg.num_layers, cfg.norm_input, cfg.scan_unroll,
                    jnp.dtype(cfg.compute_dtype), lstm_kernel=resolve_lstm_kernel(cfg.lstm_kernel, num_devices))


def make_optimizer(cfg: PQNConfig, num_updates: int):
    """RAdam with global-norm clipping; the learning rate optionally decays linearly to 0."""
    steps = num_updates * cfg.num_epochs * cfg.num_minibatches
    lr = optax.linear_schedule(cfg.lr, 0.0, steps) if cfg.lr_linear_decay else cfg.lr
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.radam(learning_rate=lr))


def create_train_state(key, cfg: PQNConfig, net: QNetwork, obs_dim: int, emb_dim: int,
                       num_updates: int, tx: optax.GradientTransformation | None = None) -> TrainState:
    """Initial parameters and optimiser state (``tx``: default :func:`make_optimizer`)."""
    carry = net.initial_carry(1)
    params = net.init(key, carry, jnp.zeros((1, 1, obs_dim)), jnp.zeros((1, 1, emb_dim)), jnp.zeros((1, 1), bool))
    return TrainState.create(apply_fn=net.apply, params=params, tx=tx or make_optimizer(cfg, num_updates))


def create_train_states(keys, cfg: PQNConfig, net: QNetwork, obs_dim: int, emb_dim: int, num_updates: int,
                        tx: optax.GradientTransformation | None = None) -> TrainState:
    """One :func:`create_train_state` per key of ``keys [S, 2]``, stacked (``lax.map``: batched QRs deadlock on CPU)."""
    return jax.lax.map(lambda k: create_train_state(k, cfg, net, obs_dim, emb_dim, num_updates, tx), keys)


def epsilon(cfg: PQNConfig, total_timesteps: int, env_steps):
    """Linear decay from eps_start to eps_finish over ``eps_decay * total_timesteps`` env steps."""
    frac = jnp.clip(env_steps / (cfg.eps_decay * total_timesteps), 0.0, 1.0)
    return cfg.eps_start + frac * (cfg.eps_finish - cfg.eps_start)


def eps_greedy(key, q, eps):
    """Epsilon-greedy actions from ``q [B, A]``."""
    k1, k2 = jax.random.split(key)
    greedy = jnp.argmax(q, axis=-1)
    rand = jax.random.randint(k1, greedy.shape, 0, q.shape[-1])
    return jnp.where(jax.random.uniform(k2, greedy.shape) < eps, rand, greedy)


def q_lambda_targets(rewards, dones, next_q_max, gamma: float, lam: float, cuts=None, q_taken=None):
    """Q(lambda) returns ``G_t = r_t + gamma (1 - d_t) ((1 - lam) max_a Q(s_{t+1}, a) + lam G_{t+1})``,
    ``G_T = max_a Q(s_T, a)``, over ``[T, B]``; where ``cuts``, ``G_t = q_taken[t]``."""
    if cuts is None:
        cuts, q_taken = jnp.zeros(rewards.shape, bool), jnp.zeros_like(rewards)
    # G_t = a_t * G_{t+1} + b_t: an associative scan of log(T) depth instead of T sequential steps
    not_done = gamma * (1.0 - dones.astype(jnp.float32))
    a = jnp.where(cuts, 0.0, not_done * lam)
    b = jnp.where(cuts, q_taken, rewards + not_done * (1.0 - lam) * next_q_max)
    b = b.at[-1].add(a[-1] * next_q_max[-1])  # G_T: the bootstrap max_a Q(s_T, a)

    def compose(later, earlier):  # (G_{t+1} from G_T) then (G_t from G_{t+1})
        return earlier[0] * later[0], earlier[0] * later[1] + earlier[1]

    _, g = jax.lax.associative_scan(compose, (a, b), reverse=True)
    return g


def update(train_state: TrainState, cfg: PQNConfig, key, batch: dict[str, jax.Array]):
    """One PQN update on a batch of N trajectories (:func:`agents.pqn.trainer.build_batch`'s keys; optional
    ``cuts`` are left out of the loss); returns ``(train_state, {loss, q_mean, target_mean})``."""
    apply = train_state.apply_fn
    n = batch["actions"].shape[1]
    mb = n // cfg.num_minibatches

    def loss_fn(params, idx):
        sel = lambda x, axis=1: jnp.take(x, idx, axis=axis)  # noqa: E731
        carry0 = jax.tree_util.tree_map(lambda c: c[idx], batch["carry0"])
        carry, q = apply(params, carry0, sel(batch["obs"]), sel(batch["instr"]), sel(batch["resets"]))
        # the bootstrap state s_T as one more step from the sequence's carry (no gradient flows through it):
        # the recurrence stays T long, so a scan unroll dividing T needs no remainder copies of [T, B, ...]
        no_grad = jax.lax.stop_gradient
        _, q_last = apply(no_grad(params), no_grad(carry), sel(batch["next_obs_last"], 0)[None],
                          sel(batch["next_instr_last"], 0)[None], sel(batch["dones"][-1:]))
        q_next = no_grad(jnp.concatenate([q[1:], q_last], axis=0)).max(-1)
        q_a = jnp.take_along_axis(q, sel(batch["actions"])[..., None], axis=-1)[..., 0]
        cuts = sel(batch["cuts"]) if "cuts" in batch else jnp.zeros(q_a.shape, bool)
        targets = q_lambda_targets(sel(batch["rewards"]), sel(batch["dones"]), q_next, cfg.gamma, cfg.lam,
                                   cuts, no_grad(q_a))
        w = sel(batch["weights"], axis=0)[None, :]
        err = (q_a - targets) ** 2 * (1.0 - cuts.astype(q_a.dtype))
        # the normaliser counts every step of the valid rows, cut or not, so a cut changes no scale
        loss = 0.5 * jnp.sum(err * w) / jnp.maximum(jnp.sum(w) * q_a.shape[0], 1.0)
        return loss, (q_a.mean(), targets.mean())

    def minibatch(ts, idx):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(ts.params, idx)
        return ts.apply_gradients(grads=grads), (loss,) + aux

    def epoch(ts, k):
        perm = jax.random.permutation(k, n)
        if not cfg.skip_padding:
            return jax.lax.scan(minibatch, ts, perm.reshape(cfg.num_minibatches, mb))
        # the rows that train first (in perm's order), then the padding; only minibatches holding a row run
        valid = batch["weights"] > 0
        order = perm[jnp.argsort(~valid[perm], stable=True)]
        runs = jnp.maximum(1, (jnp.sum(valid) + mb - 1) // mb)

        def step(i, carry):
            ts, total = carry
            ts, out = minibatch(ts, jax.lax.dynamic_slice_in_dim(order, i * mb, mb))
            return ts, tuple(a + b for a, b in zip(total, out))

        ts, total = jax.lax.fori_loop(0, runs, step, (ts, (jnp.float32(0),) * 3))
        ts = ts.replace(opt_state=advance_schedule(ts.opt_state, cfg.num_minibatches - runs))
        return ts, tuple(t / runs for t in total)

    train_state, (losses, qs, tgt) = jax.lax.scan(epoch, train_state, jax.random.split(key, cfg.num_epochs))
    return train_state, {"loss": losses.mean(), "q_mean": qs.mean(), "target_mean": tgt.mean()}


def advance_schedule(opt_state: Any, steps) -> Any:
    """``opt_state`` with its learning-rate schedule ``steps`` further on (the optimiser's own count unchanged)."""
    is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
    return jax.tree_util.tree_map(lambda s: s._replace(count=s.count + steps) if is_schedule(s) else s, opt_state,
                                  is_leaf=is_schedule)
