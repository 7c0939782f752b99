"""PQN-RNN (Gallici et al. 2024) conditioned on instructions, for InstructionCraftax.

Read top to bottom: config -> network -> acting -> Q(lambda) targets -> loss/update. The OIR
training loop that wraps it (rollouts, relabeling, instruction buffer, evaluation, checkpoints)
is in :mod:`agents.oir`.

The network: LayerNorm on the input (obs features ++ instruction embedding), an MLP of
``num_layers`` Dense+LayerNorm+ReLU blocks, one LSTM layer, a linear Q head on the LSTM output
(as in purejaxql's PQN-RNN: the tanh-bounded LSTM output keeps the initial Q-values small, so
the max over actions does not start far above the largest possible return of 1). Targets are
Q(lambda) returns recomputed for every minibatch from the same forward pass (stop-gradient), as
in purejaxql; the loss is the squared error to them, optimised by RAdam with gradient clipping
and linear LR decay.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training.train_state import TrainState


# ----------------------------------------------------------------------------- config
@dataclass
class PQNConfig:
    """Every hyperparameter of a run. ``PRESETS`` holds the paper's values and the CPU default."""

    method: str = "oir"  # gt | cosine | oir | ellm
    relabeler: str = "rules"  # rules | llm | both    (method oir)
    ellm_proposer: str = "rules"  # rules | llm    (method ellm; llm uses llm_backend/llm_base_url/llm_model)
    ellm_timeout: float = 10.0  # seconds an update waits for the LLM's goals before the rules answer
    # ellm: "any" pays when a caption matches any goal proposed for the env (Du et al.; issue #6),
    # "pinned" only the goal the env is conditioned on
    ellm_reward: str = "any"
    total_timesteps: int = 200_000
    num_envs: int = 16
    num_steps: int = 64
    num_seeds: int = 1
    seed: int = 0
    # exploration
    eps_start: float = 1.0
    eps_finish: float = 0.1
    eps_decay: float = 0.1  # fraction of training over which epsilon decays linearly
    # optimisation
    lr: float = 3e-4
    lr_linear_decay: bool = True
    max_grad_norm: float = 0.5
    num_epochs: int = 2
    num_minibatches: int = 4
    gamma: float = 0.99
    lam: float = 0.5
    # network
    hidden_size: int = 128
    num_layers: int = 1
    norm_input: bool = True
    scan_unroll: int = 1  # LSTM time steps per loop iteration (GPU: fewer loop round trips; same maths)
    # environment
    obs_mode: str = "paper"
    delta: float = 0.9
    max_episode_steps: int = 10_000
    # OIR
    buffer_size: int = 10  # B_max
    tau_low: float = 0.1
    tau_high: float = 0.9
    k: int = 4  # candidates per trajectory (oir); goals proposed per env (ellm)
    # Relabeled instructions that paid no reward on their own trajectory ("ungrounded", e.g. "collect
    # wood then place table", below delta against every caption). The paper's Alg. 1 keeps them all
    # (True). By default (False) they are neither training rows (zero-reward copies of exactly the
    # trajectories where their events happened, next to the copies that pay) nor buffer entries (they
    # can never succeed as episode instructions, and their R = 0 ranks them ahead of every
    # failing-but-learnable instruction).
    keep_ungrounded: bool = False
    # A relabeled copy pays its instruction's first match in each original episode, where its
    # episode ends (the paper's reward); the rest of that original episode has no target (False).
    # True pays every later match too, as a new relabeled episode each (before the change: a
    # "collect drink" copy of an agent at the water then pays about 30 times per row).
    relabel_every_match: bool = False
    # Which K relabeled instructions a trajectory contributes. False (the paper's): the relabeler's
    # first K (rules: the trajectory's events in the order they happened, so "wake up" and "collect
    # wood" fill most slots). True: the rule relabeler returns every grounded event, and slots go
    # round by round to the instruction with the fewest rows so far in the update, so rare events
    # ("place table") are kept wherever they happen. An extension, not in the paper.
    relabel_balance: bool = False
    llm_backend: str = "transformers"  # transformers | llama_cpp | openai | vllm
    llm_base_url: str = "http://127.0.0.1:8000/v1"
    llm_model: str = ""
    llm_template: str = "segments"
    llm_lag: int = 16  # rollouts kept for late LLM answers (answers older than this are dropped)
    llm_per_update: int = 2  # trajectories per seed sent to the LLM each update (most eventful first)
    # evaluation and bookkeeping
    eval_every: int = 25  # updates
    eval_episodes: int = 2
    eval_horizon: int = 300
    eval_epsilon: float = 0.0  # 0 = greedy evaluation (the paper does not say)
    checkpoint_every: int = 25  # updates
    table_capacity: int = 256

    @property
    def batch_steps(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return max(1, self.total_timesteps // self.batch_steps)

    def validate(self) -> "PQNConfig":
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        need(self.method in METHODS, f"method={self.method!r}; expected one of {METHODS}")
        need(self.relabeler in RELABELERS, f"relabeler={self.relabeler!r}; expected one of {RELABELERS}")
        need(self.ellm_proposer in ELLM_PROPOSERS,
             f"ellm_proposer={self.ellm_proposer!r}; expected one of {ELLM_PROPOSERS}")
        need(self.ellm_timeout >= 0, f"ellm_timeout={self.ellm_timeout} must be >= 0")
        need(self.ellm_reward in ("any", "pinned"), f"ellm_reward={self.ellm_reward!r}; expected 'any' or 'pinned'")
        need(self.obs_mode in ("paper", "symbolic"), f"obs_mode={self.obs_mode!r}; expected 'paper' or 'symbolic'")
        need(not (self.relabel_balance and self.keep_ungrounded),
             "relabel_balance spreads slots over grounded instructions only; it cannot be combined with "
             "keep_ungrounded=True")
        for name in ("total_timesteps", "num_envs", "num_steps", "num_seeds", "num_epochs", "num_minibatches",
                     "hidden_size", "num_layers", "buffer_size", "k", "eval_every", "eval_episodes",
                     "eval_horizon", "checkpoint_every", "max_episode_steps", "llm_lag", "llm_per_update",
                     "scan_unroll"):
            need(int(getattr(self, name)) >= 1, f"{name}={getattr(self, name)!r} must be >= 1")
        need(0 < self.lr < 1, f"lr={self.lr} must be in (0, 1)")
        need(0 <= self.gamma <= 1 and 0 <= self.lam <= 1, f"gamma={self.gamma}, lam={self.lam} must be in [0, 1]")
        need(0 <= self.eps_finish <= self.eps_start <= 1, "need 0 <= eps_finish <= eps_start <= 1")
        need(0 < self.eps_decay <= 1, f"eps_decay={self.eps_decay} must be in (0, 1]")
        need(-1 < self.delta <= 1, f"delta={self.delta} is outside (-1, 1]")
        need(0 <= self.eval_epsilon <= 1, f"eval_epsilon={self.eval_epsilon} must be in [0, 1]")
        need(0 <= self.tau_low < self.tau_high, f"need 0 <= tau_low ({self.tau_low}) < tau_high ({self.tau_high})")
        rows = self.num_envs * (1 + (self.k if self.method == "oir" else 0))
        need(rows % self.num_minibatches == 0,
             f"num_minibatches={self.num_minibatches} must divide the {rows} trajectories of an update "
             f"(num_envs x (1 + k) for oir)")
        need(self.total_timesteps >= self.batch_steps,
             f"total_timesteps={self.total_timesteps} is less than one update ({self.batch_steps} steps)")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PQNConfig":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}")
        return cls(**d)


METHODS = ("gt", "cosine", "oir", "ellm")
RELABELERS = ("rules", "llm", "both")
ELLM_PROPOSERS = ("rules", "llm")

PRESETS: dict[str, dict[str, Any]] = {
    # Sized for a 2-core CPU: compile + train + evaluation in a few minutes; relabeling with the
    # offline Gemma 3 270M (background worker) merged with rule instructions.
    "cpu": dict(relabeler="both", total_timesteps=98_304, eval_every=48, eval_episodes=1, checkpoint_every=16),
    # Table "Hyperparameters used in Craftax-Classic" of the paper.
    "paper": dict(
        total_timesteps=10_000_000, num_envs=64, num_steps=128, num_epochs=8, num_minibatches=4,
        lr=1e-5, gamma=0.99, lam=0.5, eps_start=1.0, eps_finish=0.1, eps_decay=0.1, hidden_size=512,
        num_layers=1, max_grad_norm=0.5, buffer_size=10, delta=0.9, k=4, eval_every=50, llm_per_update=64,
        eval_episodes=4, eval_horizon=1000, checkpoint_every=20, scan_unroll=8,
    ),
}


# ----------------------------------------------------------------------------- network
class QNetwork(nn.Module):
    """Instruction-conditioned recurrent Q-network.

    ``__call__(carry, obs_features [T, B, D], instruction [T, B, 384], resets [T, B])`` returns
    ``(carry, q [T, B, A])``; the LSTM carry is zeroed where ``resets`` (episode starts).
    """

    num_actions: int
    hidden_size: int = 512
    num_layers: int = 1
    norm_input: bool = True
    unroll: int = 1

    @nn.compact
    def __call__(self, carry, obs, instruction, resets):
        x = jnp.concatenate([obs, instruction], axis=-1)
        if self.norm_input:
            x = nn.LayerNorm()(x)
        for _ in range(self.num_layers):
            x = nn.relu(nn.LayerNorm()(nn.Dense(self.hidden_size)(x)))
        cell = nn.OptimizedLSTMCell(self.hidden_size)

        def scan_fn(cell, carry, inp):
            x_t, reset_t = inp
            zero = jax.tree_util.tree_map(jnp.zeros_like, carry)
            carry = jax.tree_util.tree_map(lambda z, c: jnp.where(reset_t[:, None], z, c), zero, carry)
            carry, y = cell(carry, x_t)
            return carry, y

        scan = nn.scan(scan_fn, variable_broadcast="params", split_rngs={"params": False}, unroll=self.unroll)
        carry, y = scan(cell, carry, (x, resets))
        return carry, nn.Dense(self.num_actions)(y)

    def initial_carry(self, batch: int):
        z = jnp.zeros((batch, self.hidden_size))
        return (z, z)


def make_network(cfg: PQNConfig, num_actions: int) -> QNetwork:
    return QNetwork(num_actions, cfg.hidden_size, cfg.num_layers, cfg.norm_input, cfg.scan_unroll)


def make_optimizer(cfg: PQNConfig):
    steps = cfg.num_updates * cfg.num_epochs * cfg.num_minibatches
    lr = optax.linear_schedule(cfg.lr, 0.0, steps) if cfg.lr_linear_decay else cfg.lr
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.radam(learning_rate=lr))


def create_train_state(key, cfg: PQNConfig, net: QNetwork, obs_dim: int, emb_dim: int) -> TrainState:
    carry = net.initial_carry(1)
    params = net.init(key, carry, jnp.zeros((1, 1, obs_dim)), jnp.zeros((1, 1, emb_dim)), jnp.zeros((1, 1), bool))
    return TrainState.create(apply_fn=net.apply, params=params, tx=make_optimizer(cfg))


# ----------------------------------------------------------------------------- acting
def epsilon(cfg: PQNConfig, env_steps):
    """Linear decay from eps_start to eps_finish over eps_decay * total_timesteps."""
    frac = jnp.clip(env_steps / (cfg.eps_decay * cfg.total_timesteps), 0.0, 1.0)
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
