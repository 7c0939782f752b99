"""The functional JAX core of InstructionCraftax (gymnax style, vmappable, jittable).

:func:`reset` / :func:`step` act on one env and never auto-reset; :func:`batch_reset` /
:func:`batch_step` act on a batch and auto-reset finished envs from a pool of pre-generated worlds
(a step regenerates ``pool_refresh`` worlds, only when some env finished). An env state holds a row
of the device-side :class:`InstructionTable`; resets draw a ``sample_mask`` row unless pinned.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from oir_gym.captions import NUM_ACHIEVEMENTS
from oir_gym.craftax_compat import CraftaxParams, CraftaxState, CraftaxStaticParams, craftax_step, generate_world
from oir_gym.events import detect_events
from oir_gym.grounding import ordered_step
from oir_gym.observation import observe
from oir_gym.reward import step_match, step_similarity


@struct.dataclass
class InstructionTable:
    """Device-side instruction rows."""

    emb: jax.Array  # [N, D] unit-norm instruction embeddings (the policy input)
    event_sim: jax.Array  # [N, E] what a step's events are compared with (``final`` of oir_gym.grounding)
    achievement: jax.Array  # [N] ground-truth achievement index of the row, or -1
    sample_mask: jax.Array  # [G, N] bool: rows that resets of group g envs may draw (the buffer)
    pre_sim: jax.Array  # [N, E] an event that must happen earlier first (``pre``); all -1: none


def default_craftax_params() -> CraftaxParams:
    """Craftax-Classic's parameters, episodes ended by ``EnvParams.max_steps`` only."""
    return CraftaxParams(max_timesteps=2**30)


@struct.dataclass
class EnvParams:
    """Parameters of InstructionCraftax (all traced: changing them does not recompile)."""

    table: InstructionTable
    delta: float = 0.9  # cosine threshold of the reward (strict >)
    max_steps: int = 10_000  # reaching it truncates
    terminate_on_success: bool = True
    reward_mode: int = 0  # 0 = cosine reward (paper), 1 = ground-truth reward of the row's achievement
    craftax: CraftaxParams = struct.field(default_factory=default_craftax_params)


@struct.dataclass
class EnvState:
    """State of one environment; ``steps`` to ``pre_seen`` are the episode's."""

    craftax: CraftaxState
    instr: jax.Array  # row of the current instruction in the table
    pinned: jax.Array  # row every reset of this env uses, or -1 to draw from the buffer
    also_pays: jax.Array  # [G] further rows that also pay its cosine reward (-1 = unused; ELLM), kept across resets
    group: jax.Array  # which row of table.sample_mask this env draws from
    steps: jax.Array
    success: jax.Array
    ep_return: jax.Array
    achieved: jax.Array
    pre_seen: jax.Array


class StepInfo(NamedTuple):
    """Per-step information of :func:`step` (``success``: the first one; ``ep_*``: so far)."""

    events: jax.Array
    achievements: jax.Array
    similarity: jax.Array
    success: jax.Array
    instr: jax.Array
    ep_return: jax.Array
    ep_length: jax.Array
    died: jax.Array


STATIC = CraftaxStaticParams()


def make_table(emb, event_sim, achievement=None, sample_mask=None, pre_sim=None) -> InstructionTable:
    """Build an :class:`InstructionTable` from numpy/JAX arrays (``pre_sim`` default: no preconditions)."""
    n = emb.shape[0]
    pre_sim = jnp.full(jnp.shape(event_sim), -1.0) if pre_sim is None else pre_sim
    achievement = jnp.full((n,), -1) if achievement is None else achievement
    sample_mask = jnp.atleast_2d(jnp.asarray(jnp.ones((n,)) if sample_mask is None else sample_mask, bool))
    return InstructionTable(jnp.asarray(emb, jnp.float32), jnp.asarray(event_sim, jnp.float32),
                            jnp.asarray(achievement, jnp.int32), sample_mask, jnp.asarray(pre_sim, jnp.float32))


def sample_instruction(key, params: EnvParams, pinned, group=0):
    """A row drawn uniformly from the group's buffer rows, or the pinned row when ``pinned >= 0``."""
    drawn = jax.random.categorical(key, jnp.where(params.table.sample_mask[group], 0.0, -jnp.inf))
    return jnp.where(pinned >= 0, pinned, drawn).astype(jnp.int32)


def observation(state: EnvState, params: EnvParams, obs_mode: str = "paper") -> dict:
    """``{"obs": [D_obs], "instruction": [D_emb]}`` of one env."""
    return {"obs": observe(state.craftax, obs_mode), "instruction": params.table.emb[state.instr]}


def _fresh_state(craftax_state, instr, pinned, group=0, also_pays=None) -> EnvState:
    also_pays = jnp.zeros((0,), jnp.int32) if also_pays is None else jnp.asarray(also_pays, jnp.int32)
    return EnvState(craftax=craftax_state, instr=instr, pinned=jnp.asarray(pinned, jnp.int32), also_pays=also_pays,
                    group=jnp.asarray(group, jnp.int32), steps=jnp.zeros((), jnp.int32), success=jnp.zeros((), bool),
                    ep_return=jnp.zeros((), jnp.float32), achieved=jnp.zeros((NUM_ACHIEVEMENTS,), bool),
                    pre_seen=jnp.zeros((), bool))


def reset(key, params: EnvParams, pinned=-1, obs_mode: str = "paper"):
    """Reset one env: generate a world and draw an instruction. Returns ``(obs, state)``."""
    k_world, k_instr = jax.random.split(key)
    world = _new_world(k_world, params.craftax)
    pinned = jnp.asarray(pinned, jnp.int32)
    state = _fresh_state(world, sample_instruction(k_instr, params, pinned), pinned)
    return observation(state, params, obs_mode), state


def step(key, state: EnvState, action, params: EnvParams, obs_mode: str = "paper"):
    """Step one env (no auto-reset): ``(obs, state, reward, terminated, truncated, info: StepInfo)``;
    terminated at the first success (with ``terminate_on_success``) or game over, truncated at ``max_steps``."""
    prev = state.craftax
    # Clear the achievement flags so that the flags after the step are this step's achievements.
    stepped, _ = craftax_step(key, prev.replace(achievements=jnp.zeros_like(prev.achievements)),
                              action, params.craftax, STATIC)
    step_ach = stepped.achievements
    nxt = stepped.replace(achievements=prev.achievements | step_ach)

    events = detect_events(prev, action, nxt, step_ach)
    sims = params.table.event_sim[state.instr]
    cos_match, pre_seen = ordered_step(events, sims, params.table.pre_sim[state.instr], state.pre_seen, params.delta)
    # further rows that also pay (ELLM: any goal proposed for this env); none by default
    also = step_match(events, params.table.event_sim[jnp.maximum(state.also_pays, 0)], params.delta)
    cos_match = jnp.logical_or(cos_match, jnp.any(jnp.logical_and(also, state.also_pays >= 0)))
    ach_idx = params.table.achievement[state.instr]
    gt_match = jnp.where(ach_idx >= 0, step_ach[jnp.maximum(ach_idx, 0)], False)
    match = jnp.where(params.reward_mode == 1, gt_match, cos_match)
    first = jnp.logical_and(match, jnp.logical_not(state.success))
    reward = first.astype(jnp.float32)

    died = jnp.logical_or(nxt.player_health <= 0,
                          nxt.map[nxt.player_position[0], nxt.player_position[1]] == 14)  # BlockType.LAVA
    steps = state.steps + 1
    terminated = jnp.logical_or(died, jnp.logical_and(first, params.terminate_on_success))
    truncated = jnp.logical_and(steps >= params.max_steps, jnp.logical_not(terminated))

    new_state = state.replace(craftax=nxt, steps=steps, success=state.success | match,
                              ep_return=state.ep_return + reward, achieved=state.achieved | step_ach, pre_seen=pre_seen)
    info = StepInfo(events=events, achievements=step_ach, similarity=step_similarity(events, sims), success=first,
                    instr=state.instr, ep_return=new_state.ep_return, ep_length=steps, died=died)
    return observation(new_state, params, obs_mode), new_state, reward, terminated, truncated, info


@struct.dataclass
class BatchState:
    """A batch of envs plus the pool of pre-generated worlds used to reset them."""

    env: EnvState  # leaves [B, ...]
    pool: CraftaxState  # leaves [P, ...]
    cursor: jax.Array  # next pool slot to hand out / regenerate


def _new_world(key, craftax: CraftaxParams):
    world = generate_world(key, craftax, STATIC)
    # strong types for the generator's weakly typed leaves, or the first step after a reset recompiles
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=jnp.asarray(x).dtype), world)


def batch_worlds(key, craftax: CraftaxParams, num_envs: int, pool_size: int):
    """The worlds :func:`batch_reset` with ``key`` starts from: ``(worlds [num_envs], pool [pool_size])``."""
    k_env, k_pool, _ = jax.random.split(key, 3)
    keys = jnp.concatenate([jax.random.split(k_env, num_envs), jax.random.split(k_pool, pool_size)])
    both = jax.vmap(lambda k: _new_world(k, craftax))(keys)
    return (jax.tree_util.tree_map(lambda x: x[:num_envs], both),
            jax.tree_util.tree_map(lambda x: x[num_envs:], both))


def batch_reset(key, params: EnvParams, num_envs: int, pool_size: int | None = None,
                pinned=None, obs_mode: str = "paper", groups=None, num_also_pays: int = 0, worlds=None):
    """Reset a batch and fill its world pool: ``(obs, BatchState)``; ``worlds``: :func:`batch_worlds` of this key."""
    pool_size = pool_size or max(num_envs, 16)
    _, _, k_instr = jax.random.split(key, 3)
    worlds, pool = batch_worlds(key, params.craftax, num_envs, pool_size) if worlds is None else worlds
    pinned = jnp.full((num_envs,), -1, jnp.int32) if pinned is None else jnp.asarray(pinned, jnp.int32)
    groups = jnp.zeros((num_envs,), jnp.int32) if groups is None else jnp.asarray(groups, jnp.int32)
    instr = jax.vmap(sample_instruction, in_axes=(0, None, 0, 0))(
        jax.random.split(k_instr, num_envs), params, pinned, groups)
    also = jnp.full((num_envs, num_also_pays), -1, jnp.int32)
    env = jax.vmap(_fresh_state)(worlds, instr, pinned, groups, also)
    obs = _observe_batch(env, params, obs_mode)
    return obs, BatchState(env=env, pool=pool, cursor=jnp.zeros((), jnp.int32))


def tree_select(mask, a, b):
    """Leaf-wise ``where(mask, a, b)`` over two pytrees of batched arrays (``mask [B]`` or a scalar)."""
    def sel(x, y):
        m = mask.reshape(mask.shape + (1,) * (x.ndim - 1))
        return jnp.where(m, x, y)

    return jax.tree_util.tree_map(sel, a, b)


def reset_done(key, bstate: BatchState, done, params: EnvParams, pool_refresh: int):
    """Reset the envs where ``done`` from the pool at the cursor; regenerate ``pool_refresh`` slots there."""
    env = bstate.env
    num_envs = done.shape[0]
    pool_size = jax.tree_util.tree_leaves(bstate.pool)[0].shape[0]
    k_instr, k_pool = jax.random.split(key)
    rank = jnp.cumsum(done) - 1
    slot = (bstate.cursor + rank) % pool_size
    fresh_worlds = jax.tree_util.tree_map(lambda p: p[slot], bstate.pool)
    instr = jax.vmap(sample_instruction, in_axes=(0, None, 0, 0))(
        jax.random.split(k_instr, num_envs), params, env.pinned, env.group)
    fresh = jax.vmap(_fresh_state)(fresh_worlds, instr, env.pinned, env.group, env.also_pays)
    env = tree_select(done, fresh, env)

    new = jax.vmap(lambda k: _new_world(k, params.craftax))(jax.random.split(k_pool, pool_refresh))
    idx = (bstate.cursor + jnp.arange(pool_refresh)) % pool_size
    pool = jax.tree_util.tree_map(lambda p, n: p.at[idx].set(n), bstate.pool, new)
    return BatchState(env=env, pool=pool, cursor=(bstate.cursor + pool_refresh) % pool_size)


def batch_step(key, bstate: BatchState, actions, params: EnvParams, obs_mode: str = "paper",
               pool_refresh: int = 4, autoreset: bool = True):
    """Step a batch, resetting finished envs in the same step (``autoreset``): ``(obs, bstate, reward,
    terminated, truncated, info, final_obs)``; ``final_obs`` is a reset env's last observation."""
    one = bstate.replace(cursor=bstate.cursor[None])
    obs, one, *rest = block_step(key[None], one, actions, params, obs_mode, pool_refresh, autoreset)
    return (obs, one.replace(cursor=one.cursor[0]), *rest)


def _blocks(x, B: int):
    return x.reshape((B, x.shape[0] // B) + x.shape[1:])


def _flat(x):
    return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def block_worlds(keys, craftax: CraftaxParams, envs_per_block: int, pool_per_block: int):
    """:func:`batch_worlds` of every block of :func:`block_reset`, block-major."""
    worlds, pool = jax.vmap(lambda k: batch_worlds(k, craftax, envs_per_block, pool_per_block))(keys)
    return jax.tree_util.tree_map(_flat, worlds), jax.tree_util.tree_map(_flat, pool)


def block_reset(keys, params: EnvParams, envs_per_block: int, pool_per_block: int, pinned=None,
                obs_mode: str = "paper", groups=None, num_also_pays: int = 0, worlds=None):
    """Reset ``len(keys)`` independent blocks of ``envs_per_block`` envs: ``(obs, BatchState)``, env leaves
    block-major, ``cursor [B]``; ``worlds``: :func:`block_worlds`."""
    B, n = keys.shape[0], envs_per_block
    pinned = jnp.full((B * n,), -1, jnp.int32) if pinned is None else jnp.asarray(pinned, jnp.int32)
    groups = jnp.zeros((B * n,), jnp.int32) if groups is None else jnp.asarray(groups, jnp.int32)
    if worlds is None:
        worlds = block_worlds(keys, params.craftax, n, pool_per_block)
    per_block = jax.tree_util.tree_map(lambda x: _blocks(x, B), worlds)
    obs, bstate = jax.vmap(lambda k, p, g, w: batch_reset(k, params, n, pool_per_block, p, obs_mode, g,
                                                          num_also_pays, w))(
        keys, _blocks(pinned, B), _blocks(groups, B), per_block)
    return (jax.tree_util.tree_map(_flat, obs),
            BatchState(env=jax.tree_util.tree_map(_flat, bstate.env), pool=jax.tree_util.tree_map(_flat, bstate.pool),
                       cursor=bstate.cursor))


def block_step(keys, bstate: BatchState, actions, params: EnvParams, obs_mode: str = "paper",
               pool_refresh: int = 4, autoreset: bool = True):
    """:func:`batch_step` for ``len(keys)`` independent blocks (:func:`block_reset`)."""
    B = keys.shape[0]
    num_envs = actions.shape[0]
    n = num_envs // B
    split = jax.vmap(jax.random.split)(keys)  # [B, 2, 2]
    k_step, k_reset = split[:, 0], split[:, 1]
    step_keys = jax.vmap(lambda k: jax.random.split(k, n))(k_step).reshape((num_envs,) + k_step.shape[1:])
    _, env, reward, term, trunc, info = jax.vmap(step, in_axes=(0, 0, 0, None, None))(
        step_keys, bstate.env, actions, params, obs_mode
    )
    bstate = bstate.replace(env=env)
    final_obs = _observe_batch(env, params, obs_mode)
    if not autoreset:
        return final_obs, bstate, reward, term, trunc, info, final_obs
    done = jnp.logical_or(term, trunc)
    blocks = lambda x: _blocks(x, B)  # noqa: E731

    def _reset(b):
        def one(k, env_b, pool_b, cursor_b, done_b):
            new = reset_done(k, BatchState(env=env_b, pool=pool_b, cursor=cursor_b), done_b, params, pool_refresh)
            any_b = jnp.any(done_b)  # a block with no finished env keeps its pool and cursor
            return new.replace(pool=tree_select(any_b, new.pool, pool_b), cursor=jnp.where(any_b, new.cursor, cursor_b))

        out = jax.vmap(one)(k_reset, jax.tree_util.tree_map(blocks, b.env), jax.tree_util.tree_map(blocks, b.pool),
                            b.cursor, blocks(done))
        b = BatchState(env=jax.tree_util.tree_map(_flat, out.env), pool=jax.tree_util.tree_map(_flat, out.pool),
                       cursor=out.cursor)
        return b, tree_select(done, _observe_batch(b.env, params, obs_mode), final_obs)

    bstate, obs = jax.lax.cond(jnp.any(done), _reset, lambda b: (b, final_obs), bstate)
    return obs, bstate, reward, term, trunc, info, final_obs


def _observe_batch(env: EnvState, params: EnvParams, obs_mode: str):
    return jax.vmap(observation, in_axes=(0, None, None))(env, params, obs_mode)


def batch_reset_masked(key, bstate: BatchState, mask, params: EnvParams, obs_mode: str = "paper",
                       pool_refresh: int = 4):
    """Reset the envs where ``mask`` (e.g. for next-step autoreset). Returns ``(obs, bstate)``."""
    bstate = jax.lax.cond(jnp.any(mask), lambda b: reset_done(key, b, mask, params, pool_refresh), lambda b: b, bstate)
    return _observe_batch(bstate.env, params, obs_mode), bstate


def set_pinned(bstate: BatchState, pinned) -> BatchState:
    """Pin (row >= 0) or unpin (-1) the instruction of every env; takes effect at its next reset."""
    return bstate.replace(env=bstate.env.replace(pinned=jnp.asarray(pinned, jnp.int32)))


def set_also_pays(bstate: BatchState, rows) -> BatchState:
    """Set the ``[B, G]`` rows that also pay each env's reward (-1 = unused)."""
    rows = jnp.asarray(rows, jnp.int32)
    if rows.shape != bstate.env.also_pays.shape:
        raise ValueError(f"also_pays rows of shape {rows.shape}; this batch holds {bstate.env.also_pays.shape} "
                         "(reset it with num_also_pays=G)")
    return bstate.replace(env=bstate.env.replace(also_pays=rows))
