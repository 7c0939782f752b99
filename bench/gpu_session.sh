#!/usr/bin/env bash
# Runs on the lent GPU machine (see docs/results.md): installs the carried wheels, points the
# encoder at the carried float16 MiniLM folder, then runs the command given as arguments.
# Usage (from the device tool): bash bench/gpu_session.sh python examples/train_pqn.py ...
set -eo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export OIR_GYM_ENCODER=$PWD/.device/minilm HF_HUB_OFFLINE=1 OIR_GYM_JAX_CACHE_DIR=$PWD/.device/jaxcache
"$@"
