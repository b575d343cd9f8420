#!/usr/bin/env bash
# `make run`: the main job on the shipped default policy. Usage: examples/run.sh [VENV_BIN]
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-.venv/bin}"

step() { printf '\n$ hisparse %s\n' "$*"; "$BIN/hisparse" "$@" 2>&1; echo "(exit $?)"; }

# an SGLang config file: DeepSeek-V3.2 with HiSparse and an FP8 KV cache
step evaluate --config examples/deepseek-v32-hisparse-fp8.yaml
# the seed's backward-compatibility risk: FP8 with an explicit flashmla_sparse decode is refused
step evaluate --config examples/deepseek-v32-hisparse-fp8.yaml --dsa-decode-backend flashmla_sparse
# the chosen kernel, run: top-k -> hot buffer -> bridge -> kernel, checked against dense BF16
step attend --kv-cache-dtype fp8_e4m3 --requests 4 --context 4096 --top-k 512 --buffer-size 1024 --steps 8
exit 0
