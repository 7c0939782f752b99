"""PQN-RNN (Gallici et al. 2024) conditioned on instructions, for InstructionCraftax.

Read top to bottom: network -> acting -> Q(lambda) targets -> loss/update. The OIR
training loop that wraps it (rollouts, relabeling, instruction buffer, evaluation, checkpoints)
is in :mod:`agents.oir`; the hyperparameters are :class:`agents.config.PQNConfig` (the ``pqn`` part
of a run's :class:`~agents.config.TrainConfig`).

The network: LayerNorm on the input (obs features ++ instruction embedding), an MLP of
``num_layers`` Dense+LayerNorm+ReLU blocks, one LSTM layer, a linear Q head on the LSTM output
(as in purejaxql's PQN-RNN: the tanh-bounded LSTM output keeps the initial Q-values small, so
the max over actions does not start far above the largest possible return of 1). Targets are
Q(lambda) returns recomputed for every minibatch from the same forward pass (stop-gradient), as
in purejaxql; the loss is the squared error to them, optimised by RAdam with gradient clipping
and linear LR decay.
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

from agents.config import PQNConfig


# ----------------------------------------------------------------------------- network
def matmul(x, w, dtype=jnp.float32):
    """``x @ w`` with both cast to ``dtype``, accumulated and returned in float32."""
    return jnp.matmul(x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)


class SequenceLSTM(nn.Module):
    """An LSTM over a ``[T, B, F]`` sequence with flax's ``OptimizedLSTMCell`` parameters and math.

    The input projection ``x @ W_i`` of every step is one matmul before the scan, which then only
    multiplies the hidden state (``h @ W_h + b``): the cell, called once per step, does both at
    every step. The carry is ``(c, h)``, zeroed where ``resets [T, B]`` (episode starts).
    ``dtype``: the matmuls' input type (``bfloat16``: half the bytes; float32 accumulation, float32
    gates and carry).
    """

    features: int
    unroll: int = 1
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, carry, x, resets):
        gates = ("i", "f", "g", "o")
        w_i = [DenseParams(self.features, use_bias=False, kernel_init=nn.initializers.lecun_normal(),
                           name=f"i{g}")(x[0])[0] for g in gates]
        w_h = [DenseParams(self.features, use_bias=True, kernel_init=nn.initializers.orthogonal(),
                           bias_init=nn.initializers.zeros_init(), name=f"h{g}")(carry[1]) for g in gates]
        mm = functools.partial(matmul, dtype=self.dtype)
        x_proj = mm(x, jnp.concatenate(w_i, axis=-1))  # [T, B, 4H]
        kernel_h = jnp.concatenate([k for k, _ in w_h], axis=-1).astype(self.dtype)
        bias_h = jnp.concatenate([b for _, b in w_h], axis=-1)

        def step(carry, inp):
            xp_t, reset_t = inp
            c, h = (jnp.where(reset_t[:, None], 0.0, v) for v in carry)
            z = mm(h, kernel_h) + bias_h + xp_t
            i, f, g, o = jnp.split(z, 4, axis=-1)
            c = nn.sigmoid(f) * c + nn.sigmoid(i) * jnp.tanh(g)
            h = nn.sigmoid(o) * jnp.tanh(c)
            return (c, h), h

        return jax.lax.scan(step, carry, (x_proj, resets), unroll=self.unroll)


class QNetwork(nn.Module):
    """Instruction-conditioned recurrent Q-network.

    ``__call__(carry, obs_features [T, B, D], instruction [T, B, 384], resets [T, B])`` returns
    ``(carry, q [T, B, A])``; the LSTM carry is zeroed where ``resets`` (episode starts).
    ``dtype``: the input type of the hidden layers' and the LSTM's matmuls (``pqn.compute_dtype``);
    parameters, norms, gates and Q-values stay float32.
    """

    num_actions: int
    hidden_size: int = 512
    num_layers: int = 1
    norm_input: bool = True
    unroll: int = 1
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, carry, obs, instruction, resets):
        x = jnp.concatenate([obs, instruction], axis=-1)
        if self.norm_input:
            x = nn.LayerNorm()(x)
        for _ in range(self.num_layers):
            x = nn.relu(nn.LayerNorm()(nn.Dense(self.hidden_size, dtype=self.dtype)(x).astype(jnp.float32)))
        # the parameters of flax's OptimizedLSTMCell under its name (checkpoints load either way)
        carry, y = SequenceLSTM(self.hidden_size, self.unroll, self.dtype, name="OptimizedLSTMCell_0")(carry, x, resets)
        return carry, nn.Dense(self.num_actions)(y)

    def initial_carry(self, batch: int):
        z = jnp.zeros((batch, self.hidden_size))
        return (z, z)


def make_network(cfg: PQNConfig, num_actions: int) -> QNetwork:
    """The Q-network of ``cfg`` for ``num_actions`` actions."""
    return QNetwork(num_actions, cfg.hidden_size, cfg.num_layers, cfg.norm_input, cfg.scan_unroll,
                    jnp.dtype(cfg.compute_dtype))


def make_optimizer(cfg: PQNConfig, num_updates: int):
    """RAdam with global-norm clipping; the learning rate decays linearly to 0 over ``num_updates``
    (when ``cfg.lr_linear_decay``)."""
    steps = num_updates * cfg.num_epochs * cfg.num_minibatches
    lr = optax.linear_schedule(cfg.lr, 0.0, steps) if cfg.lr_linear_decay else cfg.lr
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.radam(learning_rate=lr))


def create_train_state(key, cfg: PQNConfig, net: QNetwork, obs_dim: int, emb_dim: int,
                       num_updates: int, tx: optax.GradientTransformation | None = None) -> TrainState:
    """Initial parameters and optimiser state for ``obs_dim``-feature observations and ``emb_dim``
    instructions. ``tx`` (default :func:`make_optimizer`): pass one optimiser object to states that
    must share a pytree structure (a jitted update compiled for one then serves the other)."""
    carry = net.initial_carry(1)
    params = net.init(key, carry, jnp.zeros((1, 1, obs_dim)), jnp.zeros((1, 1, emb_dim)), jnp.zeros((1, 1), bool))
    return TrainState.create(apply_fn=net.apply, params=params, tx=tx or make_optimizer(cfg, num_updates))


def create_train_states(keys, cfg: PQNConfig, net: QNetwork, obs_dim: int, emb_dim: int, num_updates: int,
                        tx: optax.GradientTransformation | None = None) -> TrainState:
    """One :func:`create_train_state` per key of ``keys [S, 2]``, stacked on a leading seed axis
    (the same values as ``jax.vmap`` of it, and as each key's own call).

    The seeds are initialised one after another (``jax.lax.map``), never as a batch: the LSTM's
    orthogonal initialiser is a QR decomposition, and jaxlib 0.10's CPU LAPACK kernels split a
    batch of matrices over XLA's intra-op thread pool, then block the pool thread that called them
    until the pieces finish. The four gates' batched QRs run side by side, so on a small CPU (a pool
    of 2 threads) every pool thread waits for pieces that no thread is left to run, forever: the
    first update of the ``paper`` and ``fast`` presets (3 seeds, LSTM 512) never returned. One
    matrix per call runs on its calling thread. Initialising is a one-off of milliseconds.
    """
    return jax.lax.map(lambda k: create_train_state(k, cfg, net, obs_dim, emb_dim, num_updates, tx), keys)


# ----------------------------------------------------------------------------- acting
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


# ----------------------------------------------------------------------------- targets
def q_lambda_targets(rewards, dones, next_q_max, gamma: float, lam: float, cuts=None, q_taken=None):
    """Q(lambda) returns, computed backwards over the rollout.

    ``G_t = r_t + gamma * (1 - d_t) * ((1 - lam) * max_a Q(s_{t+1}, a) + lam * G_{t+1})`` with
    ``G_T`` taken as ``max_a Q(s_T, a)`` (the bootstrap at the end of the rollout).

    Args:
        rewards, dones: ``[T, B]``; ``dones[t]`` ends the episode after step t (no bootstrap).
        next_q_max: ``[T, B]``, ``max_a Q(s_{t+1}, a)``.
        cuts: optional ``[T, B]`` bool: step t has no target of its own (in a relabeled copy: the
            episode ended after it for a reason that is not this row's, or it follows the copy's
            own first success in that episode). ``G_t`` is then ``q_taken[t]`` (``Q(s_t, a_t)``,
            under a stop-gradient), which earlier steps bootstrap from; the caller masks step t.
    """
    if cuts is None:
        cuts, q_taken = jnp.zeros(rewards.shape, bool), jnp.zeros_like(rewards)

    def body(g_next, inp):
        r, d, q_next, c, q_a = inp
        g = r + gamma * (1.0 - d) * ((1.0 - lam) * q_next + lam * g_next)
        g = jnp.where(c, q_a, g)
        return g, g

    _, g = jax.lax.scan(body, next_q_max[-1], (rewards, dones.astype(jnp.float32), next_q_max, cuts, q_taken),
                        reverse=True)
    return g


# ----------------------------------------------------------------------------- update
def update(train_state: TrainState, cfg: PQNConfig, key, batch: dict[str, jax.Array]):
    """One PQN update on a batch of trajectories.

    ``batch`` holds ``[T, N]`` arrays (N trajectories: originals and relabeled copies):
    ``obs [T, N, D]``, ``instr [T, N, 384]``, ``next_obs_last [N, D]`` and ``next_instr_last``
    (the observation after the last step), ``actions``, ``rewards``, ``dones``, ``resets``
    (episode starts, for the LSTM), ``weights`` (0 masks padding rows), ``carry0`` (LSTM state
    at the rollout start), and optionally ``cuts`` (steps without a target of their own, see
    :func:`q_lambda_targets`; they are left out of the loss).

    Each minibatch runs the network once over its ``T + 1`` observations (the rollout plus the
    observation after it); the Q(lambda) targets come from that same pass under a
    stop-gradient, so they follow the parameters through the epochs (purejaxql's PQN-RNN does
    the same). All ``T`` steps are trained; the extra observation only bootstraps.
    """
    apply = train_state.apply_fn
    obs_ext = jnp.concatenate([batch["obs"], batch["next_obs_last"][None]], axis=0)
    instr_ext = jnp.concatenate([batch["instr"], batch["next_instr_last"][None]], axis=0)
    resets_ext = jnp.concatenate([batch["resets"], batch["dones"][-1:]], axis=0)

    n = batch["actions"].shape[1]
    mb = n // cfg.num_minibatches

    def loss_fn(params, idx):
        sel = lambda x, axis=1: jnp.take(x, idx, axis=axis)  # noqa: E731
        carry0 = jax.tree_util.tree_map(lambda c: c[idx], batch["carry0"])
        _, q_ext = apply(params, carry0, sel(obs_ext), sel(instr_ext), sel(resets_ext))
        q_next = jax.lax.stop_gradient(q_ext[1:]).max(-1)
        q_a = jnp.take_along_axis(q_ext[:-1], sel(batch["actions"])[..., None], axis=-1)[..., 0]
        cuts = sel(batch["cuts"]) if "cuts" in batch else jnp.zeros(q_a.shape, bool)
        targets = q_lambda_targets(sel(batch["rewards"]), sel(batch["dones"]), q_next, cfg.gamma, cfg.lam,
                                   cuts, jax.lax.stop_gradient(q_a))
        w = sel(batch["weights"], axis=0)[None, :]
        err = (q_a - targets) ** 2 * (1.0 - cuts.astype(q_a.dtype))
        # the normaliser counts every step of the valid rows, cut or not, so a cut changes no scale
        loss = 0.5 * jnp.sum(err * w) / jnp.maximum(jnp.sum(w) * q_a.shape[0], 1.0)
        return loss, (q_a.mean(), targets.mean())

    def epoch(carry, k):
        ts = carry
        perm = jax.random.permutation(k, n).reshape(cfg.num_minibatches, mb)

        def minibatch(ts, idx):
            (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(ts.params, idx)
            return ts.apply_gradients(grads=grads), (loss,) + aux

        ts, out = jax.lax.scan(minibatch, ts, perm)
        return ts, out

    train_state, (losses, qs, tgt) = jax.lax.scan(epoch, train_state, jax.random.split(key, cfg.num_epochs))
    return train_state, {"loss": losses.mean(), "q_mean": qs.mean(), "target_mean": tgt.mean()}
