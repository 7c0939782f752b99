"""The OIR training loop (Algorithms 1 and 2 of the paper) around the PQN agent of :mod:`agents.pqn`.

One iteration (``Trainer.iteration``):

1. **Rollout** (jitted, seeds vmapped): ``num_steps`` steps of ``num_envs`` envs with the
   epsilon-greedy policy; per step we keep observations, actions, rewards, dones and the
   transition events.
2. **Relabel** (method ``oir``, host): every env's segment becomes a
   :class:`~oir_gym.trajectory.Trajectory`; the relabeler proposes up to K instructions.
   Rule instructions come back at once; LLM answers run in a background worker and are used
   one iteration later (their rollout is kept), so the loop never waits on the LLM.
3. **Ground** (device): each candidate's rewards and terminations along its trajectory are
   recomputed from the stored events with the env's cosine function (reward at every first
   success, the relabeled episode ends there).
4. **Buffer**: finished episodes' returns are recorded, the candidates are inserted into the
   PLR-style :class:`~oir_gym.buffer.InstructionBuffer`; its contents become the instructions
   new episodes draw uniformly.
5. **Update** (jitted, seeds vmapped): one PQN update on the batch D = originals + relabeled.

Methods ``gt`` and ``cosine`` skip steps 2-4 and train on the 22 original instructions with the
ground-truth or the cosine reward.

Method ``ellm`` (ELLM, Du et al. 2023, on the same PQN backbone) skips steps 2-4 too and instead,
after each rollout, asks a :class:`~oir_gym.proposer.GoalProposer` for up to K goals from every
env's CURRENT textual observation, registers them in the instruction table and pins each env to
one of its goals (drawn uniformly; it applies at the env's next reset). The reward is the env's
cosine reward against that goal and, with ``ellm_reward="any"`` (default), against every other goal
proposed for the env (``EnvState.also_pays``); the update batch is the original trajectories only.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agents import pqn
from oir_gym import functional as F
from oir_gym.buffer import InstructionBuffer
from oir_gym.captions import NUM_EVENTS
from oir_gym.craftax_compat import NUM_ACTIONS
from oir_gym.encoder import get_encoder
from oir_gym.evaluation import EvalConfig, EvalResult, eval_instructions, eval_keys, evaluate_jax_seeds, make_jax_evaluator
from oir_gym.instruction_registry import InstructionRegistry
from oir_gym.instructions import ORIGINAL_INSTRUCTIONS
from oir_gym.observation import obs_dim
from oir_gym.reward import first_per_episode, relabel_rewards
from oir_gym.text import batch_text
from oir_gym.trajectory import Trajectory

CHECKPOINT = "checkpoint.pkl"
#: Generated instructions, written at every checkpoint (for the t-SNE of section 6).
GENERATED_FILES = {"oir": "instructions.json", "ellm": "goals.json"}


# ----------------------------------------------------------------------------- jitted pieces
def make_rollout(cfg: pqn.PQNConfig, net: pqn.QNetwork):
    """``rollout(train_params, runner, env_params, env_steps) -> (runner, traj)``.

    The envs of all seeds form one batch of ``num_seeds * num_envs`` (seed s owns envs
    ``[s*E, (s+1)*E)`` and draws from row s of the table's sample mask), so auto-resets stay a
    real branch taken only when some env finished (under a vmap over seeds, ``lax.cond``
    would turn into a select that generates worlds at every step). The network is vmapped
    over seeds. ``traj`` leaves are ``[S, T, E, ...]``.
    """
    S, E = cfg.num_seeds, cfg.num_envs

    def per_seed(x):
        return x.reshape((S, E) + x.shape[1:])

    def policy(params, carry, obs, done_prev, key, eps):
        def one(p, c, o, i, d, k):
            c, q = net.apply(p, c, o[None], i[None], d[None])
            return c, pqn.eps_greedy(k, q[0], eps)

        carry, action = jax.vmap(one)(params, carry, per_seed(obs["obs"]), per_seed(obs["instruction"]),
                                      per_seed(done_prev), jax.random.split(key, S))
        return carry, action.reshape(S * E)

    def rollout(params, runner, env_params, env_steps):
        def step(c, t):
            bstate, obs, carry, done_prev, key = c
            key, k_act, k_env = jax.random.split(key, 3)
            eps = pqn.epsilon(cfg, env_steps + t * E)
            new_carry, action = policy(params, carry, obs, done_prev, k_act, eps)
            next_obs, bstate, reward, term, trunc, info, _ = F.batch_step(
                k_env, bstate, action, env_params, obs_mode=cfg.obs_mode, pool_refresh=max(1, min(4, S * E)))
            done = term | trunc
            rec = dict(obs=obs["obs"], instr=info.instr, action=action, reward=reward, done=done, reset=done_prev,
                       events=info.events, success=info.success, ep_return=info.ep_return, ep_length=info.ep_length,
                       achievements=info.achievements)
            return (bstate, next_obs, new_carry, done, key), rec

        bstate, obs, carry, done_prev, key = runner
        carry0 = carry
        (bstate, obs, carry, done_prev, key), traj = jax.lax.scan(
            step, (bstate, obs, carry, done_prev, key), jnp.arange(cfg.num_steps))
        # [T, S*E, ...] -> [S, T, E, ...]
        traj = jax.tree_util.tree_map(
            lambda x: jnp.swapaxes(x.reshape((x.shape[0], S, E) + x.shape[2:]), 0, 1), traj)
        traj["carry0"] = carry0
        traj["last_obs"] = per_seed(obs["obs"])
        traj["last_instr"] = per_seed(obs["instruction"])
        traj["last_done"] = per_seed(done_prev)
        return (bstate, obs, carry, done_prev, key), traj

    return rollout


def balanced_choice(candidates: Sequence[Sequence[str]], k: int) -> list[list[str]]:
    """Up to ``k`` instructions per trajectory, spreading the rows over instructions.

    Round by round, each trajectory in turn takes, among its candidates not yet taken, the one
    with the fewest rows so far (ties: the candidate's own order). A frequent instruction then
    fills a trajectory's slots only after the rarer ones it also accomplished.

    Args:
        candidates: per trajectory, its candidate texts in the relabeler's order (no repeats).
        k: slots per trajectory.

    Returns:
        Per trajectory, the chosen texts in the order they were taken.
    """
    counts: Counter = Counter()
    chosen: list[list[str]] = [[] for _ in candidates]
    for _ in range(k):
        for i, cands in enumerate(candidates):
            left = [c for c in cands if c not in chosen[i]]
            if left:
                pick = min(left, key=lambda c: counts[c])  # min keeps the first of equal counts
                chosen[i].append(pick)
                counts[pick] += 1
    return chosen


def build_batch(cfg: pqn.PQNConfig, trajs, table_emb, slots):
    """The update batch D: original trajectories plus relabeled copies (one seed).

    Args:
        trajs: the last ``L`` rollouts stacked on a leading axis, the current one first.
        table_emb: ``[N, D]`` instruction embeddings (originals are rows of the table).
        slots: relabel rows ``src [R]`` (age of the rollout: 0 current, 1 previous...), ``env [R]``,
            ``emb [R, D]``, ``sim [R, E]``, ``valid [R]``.
    """
    cur = jax.tree_util.tree_map(lambda x: x[0], trajs)
    orig = dict(
        obs=cur["obs"], instr=table_emb[cur["instr"]], actions=cur["action"], rewards=cur["reward"],
        dones=cur["done"], resets=cur["reset"], weights=jnp.ones(cfg.num_envs),
        next_obs_last=cur["last_obs"], next_instr_last=cur["last_instr"], carry0=cur["carry0"],
        cuts=jnp.zeros_like(cur["done"]),
    )
    if slots is None:
        return orig
    src, env = slots["src"], slots["env"]
    pick = lambda x: jnp.swapaxes(x[src, :, env], 0, 1)  # [L, T, E, ...] -> [T, R, ...]  # noqa: E731
    T = cfg.num_steps
    events = pick(trajs["events"])  # [T, R, Ev]
    _, match = jax.vmap(relabel_rewards, in_axes=(1, 0, None), out_axes=1)(events, slots["sim"], cfg.delta)
    # The relabeled instruction pays at its first match in each original episode and its episode
    # ends there (the paper's reward); the rest of that original episode belongs to no episode of
    # it, so those steps get no target (a copy would otherwise pay at every drink by the water).
    if cfg.relabel_every_match:
        term, after = match, jnp.zeros_like(match)
    else:
        term, after = first_per_episode(match, pick(trajs["reset"]))
    # Where the trajectory's own instruction succeeded, the env ended the episode and reset. For a
    # relabeled instruction that did not pay there, that step is not a terminal (its value is not 0):
    # the episode was cut for an unrelated reason, so the step gets no target and earlier steps
    # bootstrap from Q(s, a) (pqn.q_lambda_targets). Deaths stay terminal for every instruction.
    own_success = pick(trajs["done"] & trajs["success"]) if "success" in trajs else jnp.zeros_like(term)
    rel = dict(
        obs=pick(trajs["obs"]), instr=jnp.broadcast_to(slots["emb"][None], (T,) + slots["emb"].shape),
        actions=pick(trajs["action"]), rewards=term.astype(jnp.float32), dones=pick(trajs["done"]) | term,
        resets=pick(trajs["reset"]), cuts=(own_success & ~term) | after,
        weights=slots["valid"].astype(jnp.float32), next_obs_last=trajs["last_obs"][src, env],
        next_instr_last=slots["emb"], carry0=jax.tree_util.tree_map(lambda c: c[src, env], trajs["carry0"]),
    )
    cat_axis = dict(obs=1, instr=1, actions=1, rewards=1, dones=1, resets=1, cuts=1, weights=0, next_obs_last=0,
                    next_instr_last=0)
    out = {k: jnp.concatenate([orig[k], rel[k]], axis=cat_axis[k]) for k in cat_axis}
    out["carry0"] = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b], 0), orig["carry0"], rel["carry0"])
    return out


# ----------------------------------------------------------------------------- trainer
@dataclass
class IterationLog:
    update: int
    env_steps: int
    metrics: dict[str, float]


class Trainer:
    """Runs PQN with method ``gt``, ``cosine``, ``oir`` or ``ellm`` for ``cfg.num_seeds`` seeds side by side.

    Args:
        cfg: the run configuration.
        run_dir: where config, metrics, checkpoints, evaluations and plots go.
        relabeler: a :class:`~oir_gym.relabel.HindsightRelabeler` (default: built from
            ``cfg.relabeler``).
        log: callable receiving one progress line per iteration.
        proposer: method ``ellm``: a :class:`~oir_gym.proposer.GoalProposer` (default: built from
            ``cfg.ellm_proposer``).
    """

    def __init__(self, cfg: pqn.PQNConfig, run_dir: str | os.PathLike, relabeler=None,
                 log: Callable[[str], None] = print, proposer=None) -> None:
        self.cfg = cfg.validate()
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.S = cfg.num_seeds
        self.net = pqn.make_network(cfg, NUM_ACTIONS)
        self.encoder = get_encoder()
        capacity = cfg.table_capacity
        if cfg.method == "ellm":  # rows in use (current + pinned goal [+ all K goals] of every env) beside the eval rows
            n_eval = len(eval_instructions(EvalConfig(episodes=cfg.eval_episodes, horizon=cfg.eval_horizon))[0])
            capacity = max(capacity, n_eval + (2 + self._num_also_pays(cfg)) * self.S * cfg.num_envs + 32)
        self.registry = InstructionRegistry(self.encoder, capacity=capacity)

        self.eval_cfg = EvalConfig(episodes=cfg.eval_episodes, horizon=cfg.eval_horizon)
        self.eval_texts, self.eval_achs, self.eval_sets = eval_instructions(self.eval_cfg)
        self.eval_rows = self.registry.rows(self.eval_texts, self.eval_achs)
        self.orig_rows = self.registry.rows(list(ORIGINAL_INSTRUCTIONS), list(range(len(ORIGINAL_INSTRUCTIONS))))

        self.buffers = [
            InstructionBuffer(cfg.buffer_size, cfg.tau_low, cfg.tau_high,
                              initial=list(ORIGINAL_INSTRUCTIONS)[: cfg.buffer_size], seed=cfg.seed + s)
            for s in range(self.S)
        ]
        self.relabeler = relabeler
        if cfg.method == "oir" and self.relabeler is None:
            self.relabeler = make_relabeler(cfg)
        self.async_llm = cfg.method == "oir" and cfg.relabeler in ("llm", "both")
        self.rules = None
        if self.async_llm:
            from oir_gym.relabel import HindsightRelabeler

            self.rules = HindsightRelabeler("rules", k=_rules_k(cfg), delta=cfg.delta, encoder=self.encoder,
                                            cache_size=0, keep_ungrounded=cfg.keep_ungrounded)

        self.base_params = F.EnvParams(
            table=self.registry.device_table(), delta=cfg.delta, max_steps=cfg.max_episode_steps,
            reward_mode=1 if cfg.method == "gt" else 0,
        )
        self._rollout = jax.jit(make_rollout(cfg, self.net))
        self._update = jax.jit(jax.vmap(lambda ts, k, b: pqn.update(ts, cfg, k, b)))
        self._build = jax.jit(jax.vmap(lambda t, e, s: build_batch(cfg, t, e, s), in_axes=(0, None, 0)))
        self._build_plain = jax.jit(jax.vmap(lambda t, e: build_batch(cfg, t, e, None), in_axes=(0, None)))
        n_eval = len(self.eval_texts) * self.eval_cfg.episodes

        def greedy(params, carry, obs, done_prev, key):
            # greedy by default; cfg.eval_epsilon > 0 adds epsilon-greedy noise (a deterministic
            # recurrent policy can loop forever on one action)
            carry, q = self.net.apply(params, carry, obs["obs"][None], obs["instruction"][None], done_prev[None])
            return carry, pqn.eps_greedy(key, q[0], cfg.eval_epsilon)

        self._evaluator = make_jax_evaluator(greedy, self.net.initial_carry, n_eval, self.eval_cfg.horizon,
                                             cfg.obs_mode)
        self._evaluate_seeds = jax.jit(jax.vmap(self._evaluator, in_axes=(0, 0, None, None)))
        self.update_idx = 0
        self.env_steps = 0
        self.history: list = []  # recent rollouts, newest first (LLM answers arrive late)
        self.history_len = cfg.llm_lag if self.async_llm else 1
        self.stale_llm = 0
        # the last iteration's rollout (host arrays), update batch and relabeled texts per seed
        self.last_rollout: dict | None = None
        self.last_batch: dict | None = None
        self.last_relabel_texts: list[list[str]] = []
        self._t_start = time.time()
        # generated instructions (oir: inserted into the buffer; ellm: proposed goals) -> count
        self.generated: Counter = Counter()
        self.pinned_counts: Counter = Counter()  # ellm: goals envs were pinned to
        self.proposer = proposer
        if cfg.method == "ellm" and self.proposer is None:
            self.proposer = make_proposer(cfg)
        self._goal_rng = np.random.default_rng(cfg.seed + 7919)

    # -------------------------------------------------------------- setup / state
    def _env_params(self) -> F.EnvParams:
        """Env params: the shared table, with each seed's buffer as its row of the sample mask."""
        masks = np.zeros((self.S, self.registry.capacity), bool)
        for s in range(self.S):
            masks[s, self._buffer_rows(s)] = True
        table = self.registry.device_table()
        return self.base_params.replace(table=table.replace(sample_mask=jnp.asarray(masks)))

    def _buffer_rows(self, s: int) -> np.ndarray:
        if self.cfg.method in ("gt", "cosine", "ellm"):  # ellm: unpinned envs (first episodes) draw these
            return self.orig_rows
        return self.registry.rows(self.buffers[s].contents(), protected=self._protected())

    @staticmethod
    def _num_also_pays(cfg: pqn.PQNConfig) -> int:
        """Slots per env for rows that also pay (ELLM with ellm_reward="any": its K proposed goals)."""
        return cfg.k if cfg.method == "ellm" and cfg.ellm_reward == "any" else 0

    def _protected(self) -> list[int]:
        rows = set(self.eval_rows.tolist()) | set(self.orig_rows.tolist())
        if getattr(self, "runner", None) is not None:
            rows |= set(np.asarray(self.runner[0].env.instr).reshape(-1).tolist())
            rows |= {r for r in np.asarray(self.runner[0].env.pinned).reshape(-1).tolist() if r >= 0}
            rows |= {r for r in np.asarray(self.runner[0].env.also_pays).reshape(-1).tolist() if r >= 0}
        for b in self.buffers:
            rows |= {self.registry._rows[t] for t in b.contents() if t in self.registry._rows}
        return sorted(rows)

    def init_state(self) -> None:
        cfg = self.cfg
        key = jax.random.PRNGKey(cfg.seed)
        key, *ks = jax.random.split(key, 1 + 3 * self.S)
        k_net, k_env, k_run = np.array(ks[: self.S]), np.array(ks[self.S: 2 * self.S]), np.array(ks[2 * self.S:])
        d_obs = obs_dim(cfg.obs_mode)
        self.train_state = jax.vmap(lambda k: pqn.create_train_state(k, cfg, self.net, d_obs, self.encoder.dim))(
            jnp.asarray(k_net))
        self.runner = None
        params = self._env_params()
        n = self.S * cfg.num_envs
        groups = jnp.repeat(jnp.arange(self.S), cfg.num_envs)
        reset = jax.jit(F.batch_reset, static_argnums=(2, 3, 5, 7))
        obs, bstate = reset(jnp.asarray(k_env[0]), params, n, max(2 * n, 32), None, cfg.obs_mode, groups,
                            self._num_also_pays(cfg))
        carry = jax.vmap(lambda _: self.net.initial_carry(cfg.num_envs))(jnp.arange(self.S))
        done = jnp.ones((n,), bool)
        self.runner = (bstate, obs, carry, done, jnp.asarray(k_run[0]))
        self.key = key

    # -------------------------------------------------------------- checkpoints
    def save(self) -> Path:
        path = self.run_dir / CHECKPOINT
        state = {
            "cfg": self.cfg.to_dict(), "update": self.update_idx, "env_steps": self.env_steps,
            "train_state": jax.device_get((self.train_state.params, self.train_state.opt_state, self.train_state.step)),
            "runner": jax.device_get(self.runner), "key": jax.device_get(self.key),
            "buffers": [b.state_dict() for b in self.buffers],
            "registry": {"texts": self.registry.texts, "emb": self.registry.emb, "event_sim": self.registry.event_sim,
                         "achievement": self.registry.achievement, "rows": dict(self.registry._rows)},
            "generated": {"counts": dict(self.generated), "pinned": dict(self.pinned_counts),
                          "goal_rng": self._goal_rng.bit_generator.state},
        }
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(state, f)
        os.replace(tmp, path)  # atomic: a crash mid-write never leaves a broken checkpoint
        self._write_generated()
        return path

    def _write_generated(self) -> None:
        """``instructions.json`` (oir: every relabeled instruction offered to a buffer; the buffer's
        priority order decides which of them it writes) or ``goals.json``
        (ellm: every goal proposed; ``pinned``: how often an env was pinned to it), with counts."""
        name = GENERATED_FILES.get(self.cfg.method)
        if name is None:
            return
        ellm = self.cfg.method == "ellm"
        items = [{"text": t, "count": int(c), **({"pinned": int(self.pinned_counts.get(t, 0))} if ellm else {})}
                 for t, c in sorted(self.generated.items(), key=lambda kv: (-kv[1], kv[0]))]
        payload = {
            "method": self.cfg.method,
            "source": (f"proposer {self.cfg.ellm_proposer}" if ellm else f"relabeler {self.cfg.relabeler}"),
            "what": ("goals proposed (one count per env and update)" if ellm
                     else ("instructions offered to the instruction buffers (one count per seed and update; "
                           + ("grounded or not)" if self.cfg.keep_ungrounded else "only those that paid a reward)"))),
            "update": self.update_idx, "env_steps": self.env_steps, "distinct": len(items),
            "total": int(sum(self.generated.values())), "items": items,
        }
        path = self.run_dir / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=1))
        os.replace(tmp, path)

    def load(self, path: str | os.PathLike | None = None) -> None:
        path = Path(path or self.run_dir / CHECKPOINT)
        with open(path, "rb") as f:
            state = pickle.load(f)
        saved = pqn.PQNConfig.from_dict(state["cfg"])
        for k in ("method", "num_envs", "num_steps", "num_seeds", "hidden_size", "num_layers", "obs_mode", "k"):
            if getattr(saved, k) != getattr(self.cfg, k):
                raise ValueError(f"checkpoint {path} has {k}={getattr(saved, k)!r}, this run {getattr(self.cfg, k)!r}")
        self.init_state()
        params, opt_state, step = state["train_state"]
        self.train_state = self.train_state.replace(params=params, opt_state=opt_state, step=step)
        runner = state["runner"]
        env = runner[0].env
        if "also_pays" not in vars(env):  # checkpoints written before EnvState.also_pays existed
            env = F.EnvState(**vars(env), also_pays=np.full((env.instr.shape[0], self._num_also_pays(self.cfg)), -1,
                                                             np.int32))
            runner = (runner[0].replace(env=env),) + tuple(runner[1:])
        self.runner = jax.tree_util.tree_map(jnp.asarray, runner)
        self.key = jnp.asarray(state["key"])
        for b, sd in zip(self.buffers, state["buffers"]):
            b.load_state_dict(sd)
        reg = state["registry"]
        self.registry.texts = list(reg["texts"])
        self.registry.emb, self.registry.event_sim = reg["emb"], reg["event_sim"]
        self.registry.achievement = reg["achievement"]
        self.registry._rows.clear()
        self.registry._rows.update(reg["rows"])
        self.registry._device = None
        # Rollouts awaiting LLM answers are not checkpointed: those answers are lost on resume.
        self.history = []
        gen = state.get("generated") or {}  # absent in checkpoints written before it existed
        self.generated = Counter(gen.get("counts", {}))
        self.pinned_counts = Counter(gen.get("pinned", {}))
        if "goal_rng" in gen:
            self._goal_rng.bit_generator.state = gen["goal_rng"]
        self.update_idx, self.env_steps = state["update"], state["env_steps"]

    # -------------------------------------------------------------- relabeling
    def _trajectories(self, host: dict, update: int) -> list[Trajectory]:
        out = []
        for s in range(self.S):
            for e in range(self.cfg.num_envs):
                out.append(Trajectory(
                    instruction=self.registry.text(host["instr"][s, 0, e]), events=host["events"][s, :, e],
                    actions=host["action"][s, :, e], dones=host["done"][s, :, e], env_id=e,
                    meta={"seed": s, "update": update},
                ))
        return out

    def _slots(self, results):
        """Relabel rows per seed from results of this or recent rollouts (``meta["update"]``)."""
        R = self.cfg.num_envs * self.cfg.k
        rows: list[list[tuple[int, int, str, bool]]] = [[] for _ in range(self.S)]
        if self.cfg.relabel_balance:  # every grounded event came back (make_relabeler); keep K per trajectory
            by_seed: list[list] = [[] for _ in range(self.S)]
            for r in results:
                by_seed[r.trajectory.meta["seed"]].append(r)
            for s, rs in enumerate(by_seed):
                picks = balanced_choice([list(dict.fromkeys(c.text for c in r.candidates if c.grounded)) for r in rs],
                                        self.cfg.k)
                for r, texts_r in zip(rs, picks):
                    age = self.update_idx - r.trajectory.meta["update"]
                    rows[s] += [(age, r.trajectory.env_id, t, True) for t in texts_r]
        else:
            for r in results:
                m = r.trajectory.meta
                age = self.update_idx - m["update"]
                for c in r.candidates:
                    rows[m["seed"]].append((age, r.trajectory.env_id, c.text, c.grounded))
        src = np.zeros((self.S, R), np.int32)
        env = np.zeros((self.S, R), np.int32)
        valid = np.zeros((self.S, R), bool)
        texts = [["" for _ in range(R)] for _ in range(self.S)]
        for s in range(self.S):
            # grounded candidates first (they carry reward), then older rollouts (LLM answers)
            chosen = sorted(rows[s], key=lambda x: (not x[3], -x[0]))[:R]
            for j, (sr, e, t, _) in enumerate(chosen):
                src[s, j], env[s, j], valid[s, j], texts[s][j] = sr, e, True, t
        uniq = sorted({t for ts in texts for t in ts if t})
        emb = np.zeros((self.S, R, self.encoder.dim), np.float32)
        sim = np.full((self.S, R, NUM_EVENTS), -1.0, np.float32)
        if uniq:
            u_emb = self.encoder.encode(uniq)
            u_sim = self.registry.similarity_to_events(u_emb)
            pos = {t: i for i, t in enumerate(uniq)}
            for s in range(self.S):
                for j, t in enumerate(texts[s]):
                    if t:
                        emb[s, j], sim[s, j] = u_emb[pos[t]], u_sim[pos[t]]
        slots = dict(src=jnp.asarray(src), env=jnp.asarray(env), emb=jnp.asarray(emb), sim=jnp.asarray(sim),
                     valid=jnp.asarray(valid))
        return slots, texts, valid

    def _llm_subset(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """The ``llm_per_update`` trajectories per seed with the most distinct achievement events.

        A small LLM on a CPU answers in seconds per trajectory while an update takes about a
        second: asking about every trajectory would only queue answers that arrive too late to
        use. Eventful trajectories are the ones worth an LLM's reading.
        """
        n = self.cfg.llm_per_update
        if n >= self.cfg.num_envs:
            return trajs
        chosen = []
        for s in range(self.S):
            mine = [t for t in trajs if t.meta["seed"] == s]
            score = [int(t.events[:, :22].any(axis=0).sum()) for t in mine]
            order = np.argsort(score, kind="stable")[::-1][:n]
            chosen += [mine[i] for i in order]
        return chosen

    def _relabel(self, host: dict) -> tuple[Any, dict]:
        trajs = self._trajectories(host, self.update_idx)
        stats: dict[str, float] = {}
        if self.async_llm:
            results = self.rules.relabel(trajs) if self.cfg.relabeler == "both" else []
            self.relabeler.submit(self._llm_subset(trajs))
            late = self.relabeler.collect(block=False)
            fresh = [r for r in late if self.update_idx - r.trajectory.meta["update"] < self.history_len]
            self.stale_llm += len(late) - len(fresh)
            results += fresh
            stats["relabel/llm_results"] = float(len(fresh))
            stats["relabel/llm_stale"] = float(self.stale_llm)
            stats["relabel/llm_pending"] = float(self.relabeler.pending)
            llm_stats = self.relabeler.stats()
            for k in ("calls", "cache_hit_rate", "errors", "fallbacks", "grounded_fraction", "latency_mean_s",
                      "prompt_tokens_mean", "candidates_llm"):
                if isinstance(llm_stats.get(k), (int, float)):
                    stats[f"relabel/llm_{k}"] = float(llm_stats[k])
        else:
            results = self.relabeler.relabel(trajs)
        slots, texts, valid = self._slots(results)
        self.last_relabel_texts = texts
        stats["relabel/rows"] = float(valid.sum() / self.S)
        stats["relabel/grounded_frac"] = float(np.mean([c.grounded for r in results for c in r.candidates] or [0.0]))
        # buffer: insert this iteration's candidates that paid a reward on their trajectory (all of
        # them with cfg.keep_ungrounded, as the paper's Alg. 1). An ungrounded one, such as the
        # rules' "A then B" compounds that never exceed delta against any caption, can never succeed
        # as an episode instruction, and its R = 0 would rank it ahead of every failing-but-learnable
        # instruction (R in (0, tau_low]) in the buffer's priority order. The relabelers this trainer
        # builds already drop ungrounded candidates unless cfg.keep_ungrounded; this check holds the
        # buffer to the config for a relabeler passed in (Trainer(relabeler=...)) as well.
        grounded = [set() for _ in range(self.S)]
        for r in results:
            grounded[r.trajectory.meta["seed"]].update(c.text for c in r.candidates if c.grounded)
        for s in range(self.S):
            cands = [t for t in dict.fromkeys(texts[s]) if t and (self.cfg.keep_ungrounded or t in grounded[s])]
            if cands:
                self.buffers[s].insert(cands)
                self.generated.update(cands)
        return slots, stats

    # -------------------------------------------------------------- iteration
    def iteration(self) -> IterationLog:
        cfg = self.cfg
        t0 = time.time()
        env_params = self._env_params()
        self.runner, traj = self._rollout(self.train_state.params, self.runner, env_params, self.env_steps)
        host = jax.device_get({k: traj[k] for k in ("instr", "events", "action", "done", "reward", "ep_return",
                                                      "success")})
        # returns of finished episodes -> instruction statistics (buffer ordering)
        for s in range(self.S):
            t_idx, e_idx = np.nonzero(host["done"][s])
            for t, e in zip(t_idx, e_idx):
                self.buffers[s].record(self.registry.text(host["instr"][s, t, e]), float(host["ep_return"][s, t, e]))
        metrics: dict[str, float] = {"curriculum/unpayable_step_frac": self._unpayable_frac(host["instr"])}
        table_emb = self.registry.device_table().emb
        if cfg.method == "oir":
            slots, stats = self._relabel(host)
            metrics.update(stats)
            self.history = [traj] + self.history[: self.history_len - 1]
            ring = self.history + [traj] * (self.history_len - len(self.history))
            stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs, axis=1), *ring)
            batch = self._build(stacked, table_emb, slots)
            # steps of relabeled copies without a target: after the copy's first success in an original
            # episode, or where the original instruction's success ended the episode
            metrics["relabel/cut_steps"] = float(jnp.sum(batch["cuts"]) / self.S)
        else:
            pair = jax.tree_util.tree_map(lambda a: a[:, None], traj)
            batch = self._build_plain(pair, table_emb)
            if cfg.method == "ellm":  # goals for the next episodes, from the states the envs continue from
                metrics.update(self._propose_goals(np.unique(host["instr"])))
        # kept until the next iteration for diagnostics (examples/batch_composition.py)
        self.last_rollout, self.last_batch = host, batch
        self.key, k = jax.random.split(self.key)
        self.train_state, upd = self._update(self.train_state, jax.random.split(k, self.S), batch)
        upd = jax.device_get(upd)
        if not np.all(np.isfinite(upd["loss"])):
            self.save()
            raise FloatingPointError(
                f"non-finite loss at update {self.update_idx} (env step {self.env_steps}); the last good state is "
                f"saved in {self.run_dir / CHECKPOINT}: lower lr or max_grad_norm and resume")
        self.update_idx += 1
        self.env_steps += cfg.batch_steps
        n_done = host["done"].sum()
        metrics.update({
            "loss": float(upd["loss"].mean()), "q_mean": float(upd["q_mean"].mean()),
            "epsilon": float(pqn.epsilon(cfg, self.env_steps)),
            "train/episodes": float(n_done / self.S),
            "train/success_rate": float(host["success"].sum() / max(n_done, 1)),
            "train/reward_per_step": float(host["reward"].mean()),
            "sps": cfg.batch_steps * self.S / max(time.time() - t0, 1e-9),
        })
        for s in range(self.S):
            metrics[f"seed{s}/loss"] = float(upd["loss"][s])
        return IterationLog(self.update_idx, self.env_steps, metrics)

    def _unpayable_frac(self, instr_rows: np.ndarray) -> float:
        """Share of this rollout's env steps run under an instruction whose reward can never fire.

        ``gt`` pays on the instruction's achievement; the cosine methods pay only where some caption
        of the vocabulary exceeds delta. An instruction below delta against every caption (such as
        "collect wood then place table") wastes the episodes that run it; a non-zero value here is
        worth a look.
        """
        if self.cfg.method == "gt":
            payable = self.registry.achievement >= 0
        else:
            payable = self.registry.event_sim.max(axis=1) > self.cfg.delta
        return float(np.mean(~payable[np.asarray(instr_rows)]))

    # -------------------------------------------------------------- ELLM
    def _propose_goals(self, rollout_rows: np.ndarray) -> dict[str, float]:
        """ELLM step: goals from every env's current text observation; pin each env to one of them.

        The rows of this rollout's instructions (``rollout_rows``) stay protected from reuse, so
        the batch built from it still reads the right embeddings.
        """
        t0 = time.time()
        bstate = self.runner[0]
        texts, _ = batch_text(bstate.env.craftax)
        goals = self.proposer.propose(texts)
        chosen = [g[int(self._goal_rng.integers(len(g)))] if g else "" for g in goals]
        for g in goals:
            self.generated.update(dict.fromkeys(g, 1))
        self.pinned_counts.update(t for t in chosen if t)
        protected = set(self._protected()) | {int(r) for r in rollout_rows}
        n_also = self._num_also_pays(self.cfg)
        # "any": every proposed goal needs a row (it pays); "pinned": only the chosen ones
        uniq = sorted({t for g in goals for t in g[:n_also]} | {t for t in chosen if t})
        try:
            row_of = dict(zip(uniq, self.registry.rows(uniq, protected=protected).tolist()))
        except (ValueError, RuntimeError, KeyError) as e:  # table full or a bad text: keep what is there
            self.log(f"ellm: could not register the proposed goals ({type(e).__name__}: {e}); "
                     "pinning only goals already in the table")
            row_of = {t: self.registry._rows[t] for t in uniq if t in self.registry._rows}
        pinned = np.array([row_of.get(t, -1) for t in chosen], np.int32)
        bstate = F.set_pinned(bstate, jnp.asarray(pinned))
        if n_also:  # from now on every goal proposed for an env pays its reward
            also = np.full((len(goals), n_also), -1, np.int32)
            for i, g in enumerate(goals):
                rows = [row_of[t] for t in g[:n_also] if t in row_of]
                also[i, : len(rows)] = rows
            bstate = F.set_also_pays(bstate, jnp.asarray(also))
        self.runner = (bstate,) + tuple(self.runner[1:])
        ok = pinned[pinned >= 0]
        groundable = 1.0 - self._unpayable_frac(ok) if len(ok) else 0.0
        stats = self.proposer.stats()
        metrics = {
            "ellm/distinct_goals": float(len(self.generated)),
            "ellm/distinct_goals_update": float(len({t for g in goals for t in g})),
            "ellm/distinct_pinned": float(len(set(ok.tolist()))),
            "ellm/goals_per_env": float(np.mean([len(g) for g in goals])),
            "ellm/pinned_frac": float(len(ok) / max(len(pinned), 1)),
            # goals some caption matches above delta (others can never pay a reward)
            "ellm/groundable_frac": float(groundable),
            "ellm/propose_s": time.time() - t0,
        }
        for k in ("requests", "cache_hit_rate", "fallbacks", "llm_calls", "llm_prompts", "llm_timeouts", "llm_errors",
                  "llm_busy", "llm_fraction", "latency_mean_s"):
            if isinstance(stats.get(k), (int, float)):
                metrics[f"ellm/{k}"] = float(stats[k])
        return metrics

    def evaluate(self) -> list[EvalResult]:
        """Evaluate every seed's policy on the instruction sets (greedy unless ``cfg.eval_epsilon``),
        all seeds in one program."""
        params = self.base_params.replace(table=self.registry.device_table())
        keys = eval_keys(self.cfg.seed, self.S, self.update_idx)  # worlds differ per run seed, seed index and update
        return evaluate_jax_seeds(self._evaluate_seeds, keys, self.train_state.params, params, self.eval_rows,
                                  self.eval_cfg, self.eval_texts, self.eval_achs, self.eval_sets)

    def close(self) -> None:
        for r in (self.relabeler, self.rules, self.proposer):
            if r is not None and hasattr(r, "close"):
                r.close()


def llm_backend_kwargs(cfg: pqn.PQNConfig) -> dict[str, Any]:
    """Constructor arguments of ``cfg.llm_backend`` from the config's ``llm_*`` fields."""
    from oir_gym.relabel.backends import backend_kwargs

    return backend_kwargs(cfg.llm_backend, cfg.llm_model, cfg.llm_base_url)


def make_proposer(cfg: pqn.PQNConfig):
    """The ELLM goal proposer of ``cfg.ellm_proposer``: rules, or ``cfg.llm_backend`` (falls back to rules)."""
    from oir_gym.proposer import GoalProposer

    if cfg.ellm_proposer == "rules":
        return GoalProposer("rules", k=cfg.k)
    kwargs = llm_backend_kwargs(cfg)
    return GoalProposer(cfg.llm_backend, k=cfg.k, timeout=cfg.ellm_timeout,
                        max_prompts=cfg.llm_per_update * cfg.num_seeds, backend_kwargs=kwargs)


def _rules_k(cfg: pqn.PQNConfig) -> int:
    """Candidates the rule relabeler returns per trajectory: K, or (``relabel_balance``) every
    grounded event, for the trainer to choose K from (``balanced_choice``)."""
    return 64 if cfg.relabel_balance else cfg.k


def make_relabeler(cfg: pqn.PQNConfig):
    """The relabeler of ``cfg.relabeler``: rules (sync), or an LLM backend (async worker)."""
    from oir_gym.relabel import HindsightRelabeler

    if cfg.relabeler == "rules":
        # cfg.keep_ungrounded (default False): the rules' ungrounded candidates are their "A then B"
        # compounds, which the single-caption cosine reward never pays; as rows of D they are
        # zero-reward copies of exactly the trajectories where B happened ("collect wood then place
        # table": cos 0.69 to "place table").
        return HindsightRelabeler("rules", k=_rules_k(cfg), delta=cfg.delta, encoder=get_encoder(), cache_size=0,
                                  keep_ungrounded=cfg.keep_ungrounded)
    kwargs = llm_backend_kwargs(cfg)
    # LLM answers come from a background worker; rules of the current rollout are merged by
    # the trainer, so the LLM relabeler itself does not add rules.
    # queue_size=1 + on_full="replace": while the LLM is busy, newer rollouts replace older ones
    # instead of piling up answers that would arrive too late to train on.
    return HindsightRelabeler(cfg.llm_backend, k=cfg.k, template=cfg.llm_template, use_rules=False,
                              delta=cfg.delta, encoder=get_encoder(), on_full="replace", queue_size=1,
                              backend_kwargs=kwargs, keep_ungrounded=cfg.keep_ungrounded)
