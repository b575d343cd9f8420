#!/usr/bin/env bash
# `make run`: the main job on the shipped default policy. Usage: examples/run.sh [VENV_BIN]
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-.venv/bin}"

step() { printf '\n$ hisparse %s\n' "$*"; "$BIN/hisparse" "$@" 2>&1; echo "(exit $?)"; }

step evaluate --config examples/deepseek-v32-hisparse-fp8.yaml
# the seed's backward-compatibility risk: FP8 with an explicit flashmla_sparse decode is refused
step evaluate --config examples/deepseek-v32-hisparse-fp8.yaml --nsa-decode-backend flashmla_sparse
exit 0
