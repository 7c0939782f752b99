#!/usr/bin/env bash
# The oracle-ladder runs of docs/experiments/oracle-ladder.md: bench/experiments.sh with the arm list
# `ladder` (its header has the usage: start ROOT, wait ROOT SECONDS, collect ROOT DEST).
#   bash bench/gpu_session.sh bash bench/oracle_ladder.sh start /tmp/ladder
set -u
if [ "$1" = start ]; then exec bash bench/experiments.sh start "$2" ladder; fi
exec bash bench/experiments.sh "$@"
