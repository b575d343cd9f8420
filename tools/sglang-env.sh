#!/usr/bin/env bash
# A virtual environment that runs one SGLang release's routing code on a CPU machine, for
# `hisparse conform`:  tools/sglang-env.sh VERSION DIR   (VERSION: 0.5.11 or 0.5.12)
#
# SGLang pins a CUDA torch and ~60 GPU packages; routing needs none of them. So: the pinned CPU
# torch first, this project, SGLang itself without its dependencies, then only the packages that
# importing its server_args and model config needs (found by importing them), pinned. A
# constraint keeps torch at the pinned build whatever a dependency asks for.
set -euo pipefail

usage() { echo "usage: $0 VERSION DIR   (VERSION: 0.5.11 or 0.5.12)" >&2; exit 2; }
[ $# -eq 2 ] || usage
VERSION=$1 DIR=$2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3.11}  # the SGLang wheels are cp311 only
TORCH=${TORCH:-torch==2.13.0}

# what `import sglang.srt.server_args` and `sglang.srt.configs.model_config` import (both releases
# pin transformers 5.6.0 and openai 2.6.1); triton because srt/utils/common.py imports it at the
# top and torch.compile decorators at import time need a real one
DEPS="transformers==5.6.0 openai==2.6.1 triton==3.9.0 aiohttp==3.14.5 compressed-tensors==0.20.1
dill==0.4.1 gguf==0.19.0 ipython==9.18.1 orjson==3.13.0 partial-json-parser==0.2.1.1.post7
pillow==13.0.0 psutil==7.2.2 pybase64==1.5.1 pyzmq==27.3.0 requests==2.34.2 sentencepiece==0.2.3
starlette==1.10.0"
case $VERSION in
  0.5.11) MODULE=sglang_0511 ;;
  0.5.12) MODULE=sglang_0512; DEPS="$DEPS einops==0.8.2" ;;  # srt/layers/moe/moe_runner/deep_gemm.py
  0.5.23) echo "$0: SGLang 0.5.23 is the project's own: \`make conform-env\` (or \`make test\`) puts it in .venv" >&2; exit 2 ;;
  *) echo "$0: no recipe for SGLang $VERSION (known: 0.5.11, 0.5.12)" >&2; exit 2 ;;
esac
command -v "$PYTHON" >/dev/null || { echo "$0: $PYTHON not found (set PYTHON=...)" >&2; exit 2; }

PIN=$(mktemp) LOG=$(mktemp)
trap 'rm -f "$PIN" "$LOG"' EXIT
echo "$TORCH" > "$PIN"

test -x "$DIR/bin/python" || "$PYTHON" -m venv "$DIR"
PIP="$DIR/bin/python -m pip"
$PIP install -q --upgrade pip
$PIP install -q "$TORCH"
$PIP install -q -c "$PIN" -e "$ROOT"
$PIP install -q --no-deps "sglang==$VERSION"
# pip's check of the whole environment then lists SGLang's unmet GPU pins: expected, not shown
$PIP install -q -c "$PIN" $DEPS >"$LOG" 2>&1 || { cat "$LOG" >&2; exit 1; }
grep -v -e "^sglang $VERSION requires" -e "dependency resolver" -e "^WARNING: Location" "$LOG" >&2 || true
# the driver's own start: imports the release with its stand-ins and builds the parser
"$DIR/bin/python" -W ignore -c "from engine.sglang.conform import $MODULE as d; d.setup()"
echo "$DIR: SGLang $VERSION ready (python -c 'from engine.sglang.conform import $MODULE')"
