"""Record a trained policy (PQN or SB3 run) following your instruction, as a GIF or MP4 of the env's frames.

    python examples/record_video.py runs/paper_oir "collect wood then place a table" --out table.gif
    python examples/record_video.py runs/sb3_qrdqn "drink water" --seed 0 --steps 300 --out drink.mp4

The video ends after ``--episodes`` episodes or ``--steps`` steps; MP4 needs ``pip install
'oir-gym[video]'``. Every argument, the output folder and the MP4 writer are checked first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: Highest ``--fps``: a GIF stores a frame's duration in hundredths of a second.
MAX_FPS = 100


def check_output(out: str | Path) -> Path:
    """The video path, checked before any work: a .gif or .mp4 in an existing folder, with a writer for it."""
    out = Path(out)
    if out.suffix.lower() not in (".gif", ".mp4"):
        raise ValueError(f"--out {out}: the video must end in .gif or .mp4")
    if not out.parent.is_dir():
        raise ValueError(f"--out {out}: the folder {out.parent} does not exist (create it first, or write the "
                         "video to an existing folder)")
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give a file name ending in .gif or .mp4")
    if out.suffix.lower() == ".mp4":
        try:
            import imageio.v2  # noqa: F401
            import imageio_ffmpeg

            imageio_ffmpeg.get_ffmpeg_exe()  # the packaged ffmpeg binary (or one on PATH)
        except (ImportError, RuntimeError, OSError) as e:
            raise RuntimeError(f"--out {out}: writing an MP4 needs imageio and its ffmpeg plugin: pip install "
                               f"'oir-gym[video]' (or write a .gif; {type(e).__name__}: {e})") from None
    return out


def record(run_dir: str | Path, instruction: str, out: str | Path, *, seed: int = 0, env_seed: int = 0,
           steps: int = 300, episodes: int = 1, fps: int | None = None, scale: int = 2) -> dict:
    """Roll out the run's policy on ``instruction`` into video ``out``; returns ``{"frames", "path", ...}``."""
    import gymnasium as gym
    import numpy as np

    import oir_gym  # noqa: F401  (registers the env id)
    from agents.tools.policy import load_policy
    from oir_gym.validation import check_int

    out = check_output(out)
    for name, value in (("steps", steps), ("episodes", episodes), ("scale", scale)):
        check_int(f"--{name}", value, minimum=1)
    fps = check_int("--fps", fps, minimum=1, maximum=MAX_FPS, none_ok=True)
    policy = load_policy(run_dir, seed=seed)
    env = gym.make("OIR-CraftaxClassic-v0", render_mode="rgb_array", **policy.env_kwargs)
    fps = fps or env.metadata.get("render_fps", 10)
    frames, done_episodes, successes, total = [], 0, 0, 0.0
    obs, _ = env.reset(seed=env_seed, options={"instruction": instruction})
    policy.reset()
    frames.append(env.render())
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(policy.act(obs))
        frames.append(env.render())
        total += float(reward)
        if terminated or truncated:
            done_episodes += 1
            successes += int(bool(info.get("success", reward > 0)))
            if done_episodes >= episodes:
                break
            obs, _ = env.reset(options={"instruction": instruction})
            policy.reset()
            frames.append(env.render())
    env.close()
    frames = [np.repeat(np.repeat(f, scale, axis=0), scale, axis=1) if scale > 1 else f for f in frames]
    from oir_gym.analysis import caption_frame

    frames = [caption_frame(f, instruction) for f in frames]  # the instruction written across the top
    if out.suffix.lower() == ".gif":
        from PIL import Image

        images = [Image.fromarray(f) for f in frames]
        images[0].save(out, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    else:
        try:
            import imageio.v2 as imageio

            imageio.mimwrite(out, frames, fps=fps)
        except (ImportError, ValueError, RuntimeError) as e:
            raise RuntimeError(f"writing {out} needs imageio with an ffmpeg plugin (pip install imageio-ffmpeg); "
                               f"or write a .gif ({e})") from None
    return {"frames": len(frames), "episodes": done_episodes, "successes": successes, "return": total, "path": str(out)}


def main(argv: list[str] | None = None) -> int:
    from oir_gym.validation import int_arg

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="a run directory of train_pqn.py or train_sb3.py")
    p.add_argument("instruction", help="what the agent is asked to do, in your own words")
    p.add_argument("--out", default="policy.gif", help="output .gif or .mp4 (default policy.gif)")
    p.add_argument("--seed", type=int, default=0, help="which seed of the run (PQN runs train several)")
    p.add_argument("--env-seed", type=int, default=0, help="world seed")
    p.add_argument("--steps", type=int_arg(1), default=300, help="at most this many env steps")
    p.add_argument("--episodes", type=int_arg(1), default=1, help="stop after this many episodes")
    p.add_argument("--fps", type=int, default=None, help="frames per second (default: the env's render_fps)")
    p.add_argument("--scale", type=int_arg(1), default=2, help="enlarge each frame by this factor")
    args = p.parse_args(argv)
    if not args.instruction.strip():
        p.error("the instruction is empty")
    if args.fps is not None and not 1 <= args.fps <= MAX_FPS:
        p.error(f"--fps {args.fps} must be in [1, {MAX_FPS}]")
    try:  # the output before the policy is loaded and the rollout runs
        check_output(args.out)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from oir_gym import enable_compilation_cache

    enable_compilation_cache()
    try:
        res = record(args.run_dir, args.instruction, args.out, seed=args.seed, env_seed=args.env_seed,
                     steps=args.steps, episodes=args.episodes, fps=args.fps, scale=args.scale)
    except (FileNotFoundError, ValueError, RuntimeError, NotImplementedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {res['path']}: {res['frames']} frames, {res['episodes']} episode(s) ended, "
          f"{res['successes']} succeeded, return {res['return']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
