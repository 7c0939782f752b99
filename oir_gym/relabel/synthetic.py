"""Synthetic trajectories for tests, docs and the throughput benchmark, no environment needed: scripted
events at chosen steps, moves or idle steps between, textual observations in the paper's format."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from oir_gym.captions import EVENT_NAMES
from oir_gym.relabel.segments import ACTION_NAMES
from oir_gym.trajectory import Trajectory

# event -> (action id that causes it, object faced while doing it, inventory change)
_EVENT_ACTION: dict[str, tuple[int, str, dict[str, int]]] = {
    "collect_wood": (5, "tree", {"wood": 1}),
    "place_table": (8, "grass", {"wood": -1}),
    "eat_cow": (5, "cow", {}),
    "attack_cow": (5, "cow", {}),
    "collect_sapling": (5, "grass", {"sapling": 1}),
    "search_grass": (5, "grass", {}),
    "collect_drink": (5, "water", {}),
    "make_wood_pickaxe": (11, "table", {"wood": -1, "wood_pickaxe": 1}),
    "make_wood_sword": (14, "table", {"wood": -1, "wood_sword": 1}),
    "place_plant": (10, "grass", {"sapling": -1}),
    "defeat_zombie": (5, "zombie", {}),
    "attack_zombie": (5, "zombie", {}),
    "collect_stone": (5, "stone", {"stone": 1}),
    "place_stone": (7, "water", {"stone": -1}),
    "eat_plant": (5, "plant", {}),
    "defeat_skeleton": (5, "skeleton", {}),
    "attack_skeleton": (5, "skeleton", {}),
    "make_stone_pickaxe": (12, "table", {"wood": -1, "stone": -1, "stone_pickaxe": 1}),
    "make_stone_sword": (15, "table", {"wood": -1, "stone": -1, "stone_sword": 1}),
    "fall_asleep": (6, "grass", {}),
    "wake_up": (0, "grass", {}),
    "place_furnace": (9, "grass", {"stone": -1}),
    "collect_coal": (5, "coal", {"coal": 1}),
    "collect_iron": (5, "iron", {"iron": 1}),
    "collect_diamond": (5, "diamond", {"diamond": 1}),
    "make_iron_pickaxe": (13, "table", {"wood": -1, "coal": -1, "iron": -1, "iron_pickaxe": 1}),
    "make_iron_sword": (16, "table", {"wood": -1, "coal": -1, "iron": -1, "iron_sword": 1}),
    "hit_hard_block": (5, "stone", {}),
    "take_damage": (0, "zombie", {}),
    "die": (0, "zombie", {}),
}
_SCENERY = ("grass", "grass", "grass", "sand", "tree", "stone", "water", "path")
_MOBS = ("cow", "zombie", "skeleton")

#: A scripted early-game trajectory: wood, table, wood pickaxe (the tests' canonical example).
WOOD_TABLE_PICKAXE: tuple[tuple[int, str], ...] = (
    (5, "collect_wood"), (6, "collect_wood"), (9, "collect_wood"),
    (12, "place_table"), (14, "make_wood_pickaxe"),
)


def _status(t: int, sleeping: bool) -> str:
    return (f"health 9, food {max(0, 9 - t // 30)}, drink {max(0, 9 - t // 25)}, energy {max(0, 9 - t // 40)}, "
            f"sleeping {'yes' if sleeping else 'no'}")


def _nearby(rng: np.random.Generator, facing: str) -> str:
    groups = []
    for d in (1, 2, 3):
        items = set(rng.choice(_SCENERY, size=int(rng.integers(1, 4))))
        if rng.random() < 0.25:
            items.add(str(rng.choice(_MOBS)))
        if d == 1:
            items.add(facing)
        groups.append(f"d{d}: " + ", ".join(sorted(items)))
    return " | ".join(groups)


def make_trajectory(script: Sequence[tuple[int, str | Sequence[str]]], length: int = 128, *, texts: bool = True,
                    seed: int = 0, instruction: str = "collect wood", dones: Optional[Sequence[int]] = None,
                    env_id: int = 0) -> Trajectory:
    """A trajectory of ``length`` steps with the ``script``'s ``(step, event name(s))`` at their steps, other
    steps moves (70%) or waits; ``texts``: with observation and action texts; ``dones``: episode ends."""
    rng = np.random.default_rng(seed)  # filler steps: independent of whether texts are built
    trng = np.random.default_rng([seed, 1])  # scenery of the textual observations
    ev = np.zeros((length, len(EVENT_NAMES)), dtype=bool)
    actions = np.zeros(length, dtype=np.int32)
    scripted: dict[int, list[str]] = {}
    for t, names in script:
        scripted.setdefault(int(t), []).extend([names] if isinstance(names, str) else list(names))
    inv: dict[str, int] = {}
    sleeping = False
    obs_texts: list[str] = []
    act_texts: list[str] = []
    for t in range(length):
        names = scripted.get(t, [])
        facing = str(_SCENERY[int(trng.integers(len(_SCENERY)))]) if texts else "grass"
        if names:
            act, facing, _ = _EVENT_ACTION.get(names[0], (5, facing, {}))
            actions[t] = act
            for n in names:
                ev[t, EVENT_NAMES.index(n)] = True
        elif sleeping:
            actions[t] = 0
            ev[t, EVENT_NAMES.index("noop")] = True
        elif rng.random() < 0.7:
            actions[t] = int(rng.integers(1, 5))
            ev[t, EVENT_NAMES.index("move")] = True
        else:
            actions[t] = int(rng.choice([0, 5]))
            ev[t, EVENT_NAMES.index("noop")] = True
        if texts:
            inv_text = ", ".join(f"{k} {v}" for k, v in sorted(inv.items()) if v > 0) or "empty"
            obs_texts.append(
                f"Facing: {facing}; Nearby: {_nearby(trng, facing)}; Inventory: {inv_text}; "
                f"Status: {_status(t, sleeping)}"
            )
            act = ACTION_NAMES[int(actions[t])]
            act_texts.append(facing if act == "do" else act)
        for n in names:  # inventory after the step, seen from the next observation on
            for k, dv in _EVENT_ACTION.get(n, (0, "", {}))[2].items():
                inv[k] = inv.get(k, 0) + dv
            sleeping = (sleeping or n == "fall_asleep") and n != "wake_up"
    done_arr = np.zeros(length, dtype=bool)
    done_arr[[int(d) for d in dones or ()]] = True
    return Trajectory(
        instruction=instruction, events=ev, actions=actions, dones=done_arr,
        texts=obs_texts if texts else None, action_texts=act_texts if texts else None, env_id=env_id,
    )


# Scripts the benchmark and tests draw from: early-game behaviour of increasing competence.
SCRIPTS: tuple[tuple[tuple[int, str], ...], ...] = (
    WOOD_TABLE_PICKAXE,
    ((3, "collect_sapling"), (8, "place_plant"), (20, "collect_drink"), (21, "collect_drink")),
    ((10, "attack_cow"), (11, "attack_cow"), (12, "eat_cow"), (40, "collect_wood"), (44, "collect_wood")),
    ((4, "collect_wood"), (9, "collect_wood"), (15, "place_table"), (16, "make_wood_sword"),
     (30, "attack_zombie"), (31, "defeat_zombie")),
    ((2, "collect_wood"), (6, "collect_wood"), (8, "place_table"), (9, "make_wood_pickaxe"),
     (20, "collect_stone"), (25, "collect_stone"), (30, "make_stone_pickaxe"), (60, "fall_asleep"),
     (90, "wake_up")),
    ((15, "search_grass"), (16, "collect_sapling"), (50, "take_damage"), (51, "take_damage")),
    (),  # an idle trajectory: the agent only walked around
)


def random_trajectories(n: int, length: int = 128, seed: int = 0, texts: bool = True) -> list[Trajectory]:
    """``n`` trajectories cycling through :data:`SCRIPTS` with random timing jitter and filler."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        script = SCRIPTS[i % len(SCRIPTS)]
        shift = int(rng.integers(0, 20))
        jittered = [(min(length - 1, t + shift + int(rng.integers(0, 3)) * j), e) for j, (t, e) in enumerate(script)]
        fixed, last = [], -1
        for t, e in jittered:
            t = max(t, last + 1)  # keeps the script's order after the jitter
            if t < length:
                fixed.append((t, e))
                last = t
        out.append(make_trajectory(fixed, length, texts=texts, seed=seed * 1000 + i, env_id=i))
    return out


def sample_script(rng: np.random.Generator, competence: float, length: int = 128) -> list[tuple[int, str]]:
    """A random early-game script; ``competence`` in ``[0, 1]`` raises the odds of longer tech chains."""
    ev: list[str] = []
    if rng.random() < 0.3 + 0.6 * competence:
        ev += ["collect_wood"] * int(rng.integers(1, 4))
        if rng.random() < competence:
            ev.append("place_table")
            if rng.random() < competence:
                ev.append(str(rng.choice(["make_wood_pickaxe", "make_wood_sword"])))
                if rng.random() < competence * 0.5:
                    ev += ["collect_stone"] * int(rng.integers(1, 3))
    side = []
    if rng.random() < 0.3:
        side += ["collect_sapling"] + (["place_plant"] if rng.random() < 0.5 else [])
    if rng.random() < 0.3:
        side += ["collect_drink"] * int(rng.integers(1, 3))
    if rng.random() < 0.15:
        side += ["attack_cow", "eat_cow"]
    if rng.random() < 0.1:
        side += ["fall_asleep", "wake_up"]
    # interleave the side quests with the main chain at random positions, keeping each's order
    seq = list(ev)
    for s in side:
        if s in ("place_plant", "eat_cow", "wake_up"):
            seq.append(s)  # the second half of a pair comes after its first half
        else:
            seq.insert(int(rng.integers(0, len(seq) + 1)), s)
    if not seq:
        return []
    steps = np.sort(rng.choice(np.arange(1, length), size=len(seq), replace=False))
    return [(int(t), e) for t, e in zip(steps, seq)]


def training_run(iterations: int, envs: int, length: int = 128, seed: int = 0, texts: bool = True) -> list[list[Trajectory]]:
    """Batches of trajectories of a simulated training run (competence rising from 0 to 1)."""
    rng = np.random.default_rng(seed)
    return [[make_trajectory(sample_script(rng, it / max(1, iterations - 1), length), length, texts=texts,
                             seed=int(rng.integers(1 << 30)), env_id=e) for e in range(envs)]
            for it in range(iterations)]
