"""bench/gpu_repro.sh builds the right commands (checked with DRY_RUN, which starts nothing)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_repro_launch_builds_one_job_per_spec_with_its_card_run_dir_and_flags(tmp_path):
    out = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_repro.sh"), "launch", str(tmp_path), "900", "gt:0",
         "oir:1:oir_b:--run.num-seeds+1+--run.seed+1000"],
        capture_output=True, text=True, env={**os.environ, "DRY_RUN": "1"}, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    jobs = out.stdout.split("export CUDA_VISIBLE_DEVICES=")[1:]
    assert len(jobs) == 2
    gt, oir = jobs
    assert gt.startswith("0") and f"paper --run.method gt --run.num-seeds 3 --run-dir {tmp_path}/gt " in gt
    assert "--time-limit 900" in gt and f"touch {tmp_path}/gt/DONE" in gt
    assert oir.startswith("1") and f"--run-dir {tmp_path}/oir_b " in oir
    assert "--run.num-seeds 1 --run.seed 1000" in oir  # given after --run.num-seeds 3: the last one counts
    assert "--eval-only end_greedy --eval.epsilon 0 &" in oir  # both evaluations at once
    assert "--eval-only end_eps0.05 --eval.epsilon 0.05" in oir and "wait" in oir
    assert not list(tmp_path.glob("*.log"))  # nothing was started
