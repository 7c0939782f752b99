"""``InstructionCraftax``: the Gymnasium vector env over the jitted batched JAX core.

Every step is one call of a jitted function over the whole batch; this class only converts
arrays to writable numpy copies, keeps instruction strings and builds ``infos``.
"""

from __future__ import annotations

import time
from collections import abc
from typing import Any, Sequence

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from oir_gym import functional as F
from oir_gym.buffer import InstructionBuffer
from oir_gym.captions import ACHIEVEMENT_NAMES, EVENT_NAMES, NUM_ACHIEVEMENTS
from oir_gym.craftax_compat import NUM_ACTIONS
from oir_gym.encoder import DEFAULT_MODEL, InstructionEncoder, get_encoder
from oir_gym.instruction_registry import InstructionRegistry, validate_instruction
from oir_gym.instructions import ORIGINAL_INSTRUCTIONS
from oir_gym.observation import check_obs_mode, obs_dim
from oir_gym.text import action_text, batch_text
from oir_gym.validation import (
    MAX_NUM_ENVS, ArgumentTypeError, check_bool, check_choice, check_instance, check_int, check_real, check_seed,
    show,
)

REWARD_MODES = ("cosine", "gt")
AUTORESET_MODES = {"same_step": AutoresetMode.SAME_STEP, "next_step": AutoresetMode.NEXT_STEP}
#: Step counters, world and table rows live in int32 on the device.
_MAX_INT32 = 2**31 - 1


#: The keys ``reset(options=...)`` understands.
RESET_OPTIONS = ("instruction",)


def check_reset_options(options: Any) -> dict[str, Any]:
    """``options`` of ``reset`` as a dict: ``None`` or a mapping whose keys are :data:`RESET_OPTIONS`."""
    if options is None:
        return {}
    if not isinstance(options, abc.Mapping):
        raise ArgumentTypeError(f"options={show(options)} must be a dict such as {{'instruction': 'collect wood'}} "
                                f"or None, got {type(options).__name__}")
    unknown = [k for k in options if k not in RESET_OPTIONS]
    if unknown:
        raise ValueError(f"options: unknown key {show(unknown[0])}; reset understands {RESET_OPTIONS}")
    return dict(options)


@jax.jit
def _merge_next_step(reset_mask, fresh_env, fresh_obs, state, obs, reward, term, trunc):
    """Next-step autoreset: envs in ``reset_mask`` keep their fresh state and first obs, reward 0."""
    state = state.replace(env=F.tree_select(reset_mask, fresh_env, state.env))
    obs = F.tree_select(reset_mask, fresh_obs, obs)
    zero = jnp.zeros_like(term)
    reward = jnp.where(reset_mask, 0.0, reward)
    return state, obs, reward, jnp.where(reset_mask, zero, term), jnp.where(reset_mask, zero, trunc)


class InstructionCraftax(VectorEnv):
    """Instruction-conditioned Craftax-Classic, batched (Gymnasium ``VectorEnv``).

    Reward 1 at the first step whose caption matches the instruction (cosine ``> delta``), which
    terminates, as do death and lava. ``instructions``: the initial buffer (default: the 22 achievements);
    ``buffer`` (overrides it) is drawn from and records returns; ``reward``: ``"cosine"`` or ``"gt"``
    (the instruction's achievement); ``info_text``: add ``text``/``action_text`` to infos; ``pool_size`` /
    ``pool_refresh``: worlds pre-generated / regenerated per step with a reset. Spaces and infos: docs/api.md.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10, "autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int = 16, obs_mode: str = "paper", delta: float = 0.9,
                 max_episode_steps: int = 10_000, instructions: Sequence[str] | None = None,
                 buffer: InstructionBuffer | None = None, reward: str = "cosine", terminate_on_success: bool = True,
                 autoreset_mode: str | AutoresetMode = "same_step", info_text: bool = False,
                 encoder: InstructionEncoder | str = DEFAULT_MODEL, render_mode: str | None = None,
                 seed: int | None = None, pool_size: int | None = None, pool_refresh: int | None = None,
                 table_capacity: int = 256) -> None:
        num_envs = check_int("num_envs", num_envs, minimum=1, maximum=MAX_NUM_ENVS)
        check_obs_mode(obs_mode)
        delta = check_real("delta", delta, low=-1.0, high=1.0, low_open=True, hint=" (cosine similarity threshold)")
        max_episode_steps = check_int("max_episode_steps", max_episode_steps, minimum=1, maximum=_MAX_INT32)
        check_choice("reward", reward, REWARD_MODES)
        check_choice("render_mode", render_mode, (None, "rgb_array"))
        terminate_on_success = check_bool("terminate_on_success", terminate_on_success)
        info_text = check_bool("info_text", info_text)
        seed = check_seed("seed", seed)
        pool_size = check_int("pool_size", pool_size, minimum=1, maximum=_MAX_INT32, none_ok=True)
        pool_refresh = check_int("pool_refresh", pool_refresh, minimum=1, none_ok=True)
        if pool_refresh is not None and pool_refresh > (pool_size or max(2 * num_envs, 32)):
            raise ValueError(f"pool_refresh={pool_refresh} must be <= pool_size ({pool_size or max(2 * num_envs, 32)}): "
                             "a step regenerates at most the whole pool")
        table_capacity = check_int("table_capacity", table_capacity, minimum=1, maximum=_MAX_INT32)
        check_instance("buffer", buffer, InstructionBuffer, none_ok=True)
        check_instance("encoder", encoder, (InstructionEncoder, str), what="an InstructionEncoder or a model path")
        if isinstance(autoreset_mode, AutoresetMode):
            autoreset_mode = {v: k for k, v in AUTORESET_MODES.items()}.get(autoreset_mode, str(autoreset_mode))
        check_choice("autoreset_mode", autoreset_mode, tuple(AUTORESET_MODES))

        self.num_envs = int(num_envs)
        self.obs_mode = obs_mode
        self.render_mode = render_mode
        self.info_text = info_text
        self.autoreset = autoreset_mode
        self.metadata = dict(self.metadata, autoreset_mode=AUTORESET_MODES[autoreset_mode])
        self.pool_refresh = int(pool_refresh or max(1, min(self.num_envs, 4)))
        self.pool_size = int(pool_size or max(2 * self.num_envs, 32))

        if isinstance(instructions, (str, bytes)):
            raise ArgumentTypeError(f"instructions must be a list of strings, got the string {show(instructions)}; "
                                    f"for one instruction pass [{show(instructions)}]")
        if instructions is not None and not isinstance(instructions, (abc.Iterable)):
            raise ArgumentTypeError(f"instructions={show(instructions)} must be a list of strings or None, "
                                    f"got {type(instructions).__name__}")
        self.encoder = encoder if isinstance(encoder, InstructionEncoder) else get_encoder(encoder)
        self.registry = InstructionRegistry(self.encoder, capacity=table_capacity)
        if buffer is None:
            initial = list(ORIGINAL_INSTRUCTIONS if instructions is None else instructions)
            if not initial:
                raise ValueError("instructions must hold at least one instruction")
            initial = [validate_instruction(t, f"instructions[{i}]") for i, t in enumerate(initial)]
            buffer = InstructionBuffer(capacity=len(dict.fromkeys(initial)), initial=initial, seed=seed)
        self.buffer = buffer
        # the original wordings carry their achievement, for the ground-truth reward and evaluation
        self.registry.rows(list(ORIGINAL_INSTRUCTIONS), achievements=list(range(NUM_ACHIEVEMENTS)))
        self._buffer_contents: list[str] = []
        self._sync_buffer()

        self._params = F.EnvParams(table=self.registry.device_table(), delta=delta, max_steps=int(max_episode_steps),
                                   terminate_on_success=bool(terminate_on_success),
                                   reward_mode=REWARD_MODES.index(reward))
        self.single_observation_space = gym.spaces.Dict({
            "obs": gym.spaces.Box(0.0, 1.0, (obs_dim(obs_mode),), np.float32),
            "instruction": gym.spaces.Box(-1.0, 1.0, (self.encoder.dim,), np.float32),
        })
        self.single_action_space = gym.spaces.Discrete(NUM_ACTIONS)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)

        self._reset_fn = jax.jit(F.batch_reset, static_argnums=(2, 3, 5))
        self._step_fn = jax.jit(F.batch_step, static_argnames=("obs_mode", "pool_refresh", "autoreset"))
        self._reset_masked_fn = jax.jit(F.batch_reset_masked, static_argnames=("obs_mode", "pool_refresh"))
        self._renderer = None
        self._state: F.BatchState | None = None
        self._key = jax.random.PRNGKey(np.random.SeedSequence(seed).generate_state(1)[0] if seed is None else seed)
        self._pinned = np.full((self.num_envs,), -1, np.int32)
        self._needs_reset = np.zeros((self.num_envs,), bool)
        # lets a TrajectoryRecorder that only sees step outputs tell a reset happened between two steps
        self.reset_count = 0
        self._episode_start = np.zeros((self.num_envs,), np.float64)

    @property
    def params(self) -> F.EnvParams:
        """Current functional parameters (for users of the JAX core)."""
        return self._params

    @property
    def state(self) -> F.BatchState | None:
        """The batch's current functional state (for users of the JAX core; None before ``reset``)."""
        return self._state

    def _sync_buffer(self) -> None:
        contents = self.buffer.contents()
        if contents != self._buffer_contents:
            self.registry.set_buffer(contents)
            self._buffer_contents = list(contents)

    def _refresh_params(self) -> None:
        self._sync_buffer()
        table = self.registry.device_table()
        if table is not self._params.table:
            self._params = self._params.replace(table=table)

    def register_instructions(self, texts: Sequence[str], achievements: Sequence[int] | None = None,
                              bindings: Sequence[Any] | None = None) -> np.ndarray:
        """Add instructions to the device table (optionally with achievements or per-text bindings); their rows."""
        rows = self.registry.rows(texts, achievements, protected=self._pinned[self._pinned >= 0], bindings=bindings)
        self._refresh_params()
        return rows

    def set_instructions(self, instructions: str | Sequence[str | None] | None) -> None:
        """Pin instructions (one string for all envs, one per env, or ``None`` to unpin) from each env's next reset."""
        if instructions is None:
            per_env: list[str | None] = [None] * self.num_envs
        elif isinstance(instructions, str):
            per_env = [instructions] * self.num_envs
        else:
            if not isinstance(instructions, (abc.Sequence, np.ndarray)):
                raise TypeError("instructions must be a string, a sequence of strings/None (one per env) or None, "
                                f"got {type(instructions).__name__}: {instructions!r}")
            per_env = list(instructions)
            if len(per_env) != self.num_envs:
                raise ValueError(f"got {len(per_env)} instructions for {self.num_envs} envs")
        texts = [t for t in per_env if t is not None]
        rows = iter(self.register_instructions(texts)) if texts else iter(())
        self._pinned = np.array([-1 if t is None else next(rows) for t in per_env], np.int32)
        if self._state is not None:
            self._state = F.set_pinned(self._state, self._pinned)

    def current_instructions(self) -> list[str]:
        """The instruction each env currently follows."""
        if self._state is None:
            raise RuntimeError("call reset() first")
        return [self.registry.text(r) for r in np.asarray(self._state.env.instr)]

    def _batch_seed(self, seed: Any) -> int | None:
        if seed is None or isinstance(seed, (int, np.integer, bool, np.bool_)):
            return check_seed("seed", seed)
        if not isinstance(seed, (abc.Sequence, np.ndarray)) or isinstance(seed, (str, bytes)):
            raise ArgumentTypeError(f"seed must be an int, a list of {self.num_envs} ints or None, got {show(seed)}")
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"seed: got {len(seeds)} seeds for {self.num_envs} envs")
        if all(x is None for x in seeds):
            return None
        for i, x in enumerate(seeds):
            check_int(f"seed[{i}]", x)
        check_seed("seed[0]", seeds[0])
        if any(int(x) != int(seeds[0]) + i for i, x in enumerate(seeds)):
            raise ValueError(
                f"seed={seeds!r}: InstructionCraftax is one JAX batch seeded by one key, so per-env seeds "
                f"must be consecutive ([s, s + 1, ..., s + {self.num_envs - 1}], what Gymnasium's vector envs "
                "derive from seed=s); pass an int instead")
        return int(seeds[0])

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        """Reset all envs; ``options={"instruction": str | list}`` pins instructions first; ``seed``: an int or
        ``[s, s + 1, ...]``."""
        seed = self._batch_seed(seed)
        options = check_reset_options(options)
        if seed is not None:
            self._key = jax.random.PRNGKey(int(seed))
            self.buffer.rng.bit_generator.state = np.random.default_rng(int(seed)).bit_generator.state
        if "instruction" in options:
            self.set_instructions(options["instruction"])
        self._refresh_params()
        self._key, k = jax.random.split(self._key)
        obs, self._state = self._reset_fn(k, self._params, self.num_envs, self.pool_size, self._pinned, self.obs_mode)
        self._needs_reset[:] = False
        self._episode_start[:] = time.perf_counter()
        self.reset_count += 1
        obs_np = self._to_numpy(obs)
        infos = {"instruction": np.array(self.current_instructions(), dtype=object)}
        if self.info_text:
            infos["text"] = np.array(batch_text(self._state.env.craftax)[0], dtype=object)
        return obs_np, infos

    def _check_actions(self, actions) -> jax.Array:
        try:
            a = np.asarray(actions)
        except (ValueError, TypeError) as e:  # ragged lists and the like
            raise ValueError(f"actions: expected {self.num_envs} integers in [0, {NUM_ACTIONS - 1}], got "
                             f"{show(actions)} ({e})") from None
        if a.shape == () and self.num_envs == 1:
            a = a.reshape(1)
        if a.shape != (self.num_envs,):
            raise ValueError(f"actions: expected {self.num_envs} actions, got an array of shape {a.shape}")
        if not np.issubdtype(a.dtype, np.integer):
            if np.issubdtype(a.dtype, np.floating) and np.all(np.mod(a, 1) == 0):
                a = a.astype(np.int64)
            else:
                raise ArgumentTypeError(f"actions must be integers in [0, {NUM_ACTIONS - 1}], got dtype {a.dtype}")
        bad = (a < 0) | (a >= NUM_ACTIONS)
        if bad.any():
            raise ValueError(f"actions: action {a[bad][0]} outside the action space [0, {NUM_ACTIONS - 1}]")
        return jnp.asarray(a, jnp.int32)

    def step(self, actions):
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        acts = self._check_actions(actions)
        self._refresh_params()
        self._key, k, k_reset = jax.random.split(self._key, 3)
        pre_craftax = self._state.env.craftax if self.info_text else None

        if self.autoreset == "next_step" and self._needs_reset.any():
            reset_mask = jnp.asarray(self._needs_reset)
            reset_obs, self._state = self._reset_masked_fn(k_reset, self._state, reset_mask, self._params,
                                                           obs_mode=self.obs_mode, pool_refresh=self.pool_refresh)
        else:
            reset_mask = None
        obs, state, reward, term, trunc, info, final_obs = self._step_fn(
            k, self._state, acts, self._params, obs_mode=self.obs_mode, pool_refresh=self.pool_refresh,
            autoreset=self.autoreset == "same_step")
        if reset_mask is not None:
            self._episode_start[self._needs_reset] = time.perf_counter()
            # envs reset this step ignore their action and report their episode's first observation
            state, obs, reward, term, trunc = _merge_next_step(reset_mask, self._state.env, reset_obs, state, obs,
                                                               reward, term, trunc)
        self._state = state

        host = jax.device_get({"reward": reward, "term": term, "trunc": trunc, "info": info._asdict()})
        rewards = np.array(host["reward"], dtype=np.float32)
        terms = np.array(host["term"], dtype=bool)
        truncs = np.array(host["trunc"], dtype=bool)
        inf = host["info"]
        if reset_mask is not None:
            skipped = np.asarray(reset_mask)
            for k2 in ("events", "achievements", "success"):
                inf[k2] = np.where(skipped.reshape((-1,) + (1,) * (inf[k2].ndim - 1)), False, inf[k2])
            inf["similarity"] = np.where(skipped, -1.0, inf["similarity"])  # no caption: no event
        done = terms | truncs
        instr_text = np.array([self.registry.text(r) for r in inf["instr"]], dtype=object)

        infos: dict[str, Any] = {"instruction": instr_text, "success": np.array(inf["success"], bool),
                                 "events": np.array(inf["events"], bool),
                                 "achievements": np.array(inf["achievements"], bool),
                                 "similarity": np.array(inf["similarity"], np.float32)}
        if self.info_text:
            texts, facing = batch_text(pre_craftax)
            infos["text"] = np.array(texts, dtype=object)
            infos["action_text"] = np.array([action_text(a, f) for a, f in zip(np.asarray(acts), facing)], dtype=object)
        if done.any():
            ep_r = np.array(inf["ep_return"], np.float32)
            ep_l = np.array(inf["ep_length"], np.int32)
            now = time.perf_counter()
            ep_t = np.where(done, np.round(now - self._episode_start, 6), 0.0)
            if self.autoreset == "same_step":
                self._episode_start[done] = now  # next_step: at the reset step (below)
            infos["episode"] = {"r": np.where(done, ep_r, 0.0), "l": np.where(done, ep_l, 0), "t": ep_t}
            infos["_episode"] = done.copy()
            for i in np.flatnonzero(done):
                self.buffer.record(instr_text[i], float(ep_r[i]))
            if self.autoreset == "same_step":
                infos["final_obs"] = np.empty(self.num_envs, dtype=object)
                fo = self._to_numpy(final_obs)
                for i in np.flatnonzero(done):
                    infos["final_obs"][i] = {k2: v[i].copy() for k2, v in fo.items()}
                infos["_final_obs"] = done.copy()
                infos["final_info"] = _copy_info({k2: v for k2, v in infos.items() if not k2.startswith("final")})
                infos["_final_info"] = done.copy()
        self._needs_reset = done if self.autoreset == "next_step" else np.zeros_like(done)
        return self._to_numpy(obs), rewards, terms, truncs, infos

    def _to_numpy(self, obs) -> dict[str, np.ndarray]:
        host = jax.device_get(obs)
        return {k: np.array(v, dtype=np.float32) for k, v in host.items()}

    def render(self) -> list[np.ndarray]:
        """A list of one RGB frame ``[H, W, 3]`` uint8 per env (Craftax-Classic's pixel renderer)."""
        if self.render_mode != "rgb_array":
            raise RuntimeError("render() needs render_mode='rgb_array'")
        if self._state is None:
            raise RuntimeError("call reset() before render()")
        if self._renderer is None:
            from oir_gym.craftax_compat import make_pixel_renderer

            self._renderer = jax.jit(jax.vmap(make_pixel_renderer(16)))
        frames = np.clip(np.asarray(self._renderer(self._state.env.craftax)), 0, 255).astype(np.uint8)
        return list(frames)

    def close_extras(self, **kwargs) -> None:
        self._state = None

    @property
    def event_names(self) -> tuple[str, ...]:
        return EVENT_NAMES

    @property
    def achievement_names(self) -> tuple[str, ...]:
        return ACHIEVEMENT_NAMES


def _copy_info(infos: dict[str, Any]) -> dict[str, Any]:
    return {k: (_copy_info(v) if isinstance(v, dict) else np.array(v, copy=True)) for k, v in infos.items()}
