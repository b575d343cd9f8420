#!/usr/bin/env bash
# `make run`: the main job on the shipped default policy. Usage: examples/run.sh [VENV_BIN]
# Each step states the exit code it must end with (the second is a rejection on purpose); the
# script exits 1 when any step ends otherwise, so `make run` fails when a step does.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-.venv/bin}"
failed=0

step() {
    local want="$1"; shift
    printf '\n$ hisparse %s\n' "$*"
    "$BIN/hisparse" "$@" 2>&1
    local got=$?
    echo "(exit $got)"
    if [ "$got" -ne "$want" ]; then
        echo "make run: this step should exit $want" >&2
        failed=1
    fi
}

# an SGLang config file: DeepSeek-V3.2 with HiSparse and an FP8 KV cache
step 0 evaluate --config examples/deepseek-v32-hisparse-fp8.yaml
# the seed's backward-compatibility risk: FP8 with an explicit flashmla_sparse decode is refused
step 1 evaluate --config examples/deepseek-v32-hisparse-fp8.yaml --dsa-decode-backend flashmla_sparse
# the chosen kernel, run at attend's defaults: top-k -> SGLang's hot buffer -> bridge -> kernel,
# checked against dense BF16 at the model's softmax scale
step 0 attend --kv-cache-dtype fp8_e4m3
exit "$failed"
