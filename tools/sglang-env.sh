#!/usr/bin/env bash
# An environment that runs one SGLang release's routing code on a CPU machine, for `hisparse conform`:
#   tools/sglang-env.sh VERSION [ENVS]     (make conform-env SGLANG=VERSION [ENVS=...])
# VERSION: any release from 0.5.11 on, .post releases included (engine/sglang/registry.py: a later
# release takes the newest release's transformers). ENVS: where environments
# are kept (default $HISPARSE_ENVS, else ~/.cache/hisparse/sglang-envs); never this checkout.
#
# SGLang pins a CUDA torch and ~60 GPU packages; routing needs none of them. Releases share three
# base environments, one per transformers version they import (tools/pins/transformers-X.txt, the
# only place the pins are kept): the pinned CPU torch first, then the pins, all with --no-deps,
# so pip never pulls a CUDA torch or another version. The release itself is its wheel, unpacked
# under ENVS/wheels/VERSION and put first on PYTHONPATH (its dist-info tells importlib.metadata
# the version), with this checkout after it. ENVS/sglang-VERSION/bin/python and .../hisparse run
# them. A base environment that already holds every pin is used as it is (nothing installed).
# The last step proves the release imports and its conform driver loads.
set -euo pipefail

usage() { echo "usage: $0 VERSION [ENVS]   (VERSION: an SGLang release, 0.5.11 to 0.5.23)" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
VERSION=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ENVS=${2:-${HISPARSE_ENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/hisparse/sglang-envs}}
PYTHON=${PYTHON:-python3.11}  # the SGLang wheels are cp311 only
TORCH=${TORCH:-torch==2.13.0}
INDEX=${TORCH_INDEX:-}  # e.g. https://download.pytorch.org/whl/cpu where the default index has CUDA builds

command -v "$PYTHON" >/dev/null || { echo "$0: $PYTHON not found (set PYTHON=...)" >&2; exit 2; }
# release -> the transformers version its base environment pins (engine/sglang/registry.py)
TF=$(cd "$ROOT" && "$PYTHON" -c 'import sys; from engine.sglang.registry import main; sys.exit(main(sys.argv[1:]))' \
     transformers "$VERSION") || exit 2
PINS=$ROOT/tools/pins/transformers-$TF.txt
[ -f "$PINS" ] || { echo "$0: no pins for transformers $TF (tools/pins/)" >&2; exit 2; }
ENVS=$(realpath -m "$ENVS")
case $ENVS/ in
  "$ROOT"/*) echo "$0: $ENVS is inside this checkout; keep environments outside it" >&2; exit 2 ;;
esac

BASE=$ENVS/base-tf$TF WHEEL=$ENVS/wheels/$VERSION RUN=$ENVS/sglang-$VERSION
mkdir -p "$ENVS"

# 1. the base environment, unless it already holds torch and every pin
pinned() {  # exit 0 when BASE's python has every pin of PINS (and torch) at its version
  "$BASE/bin/python" - "$PINS" "$TORCH" <<'EOF'
import importlib.metadata as m, re, sys
want = [l.split("#")[0].strip() for l in open(sys.argv[1])] + [sys.argv[2]]
bad = []
for line in filter(None, want):
    name, version = line.split("==")
    try:
        have = m.version(name)
    except m.PackageNotFoundError:
        have = None
    if have is None or re.sub(r"\+.*", "", have) != version:
        bad.append(f"{name} {have or 'missing'} (pin {version})")
if bad:
    print("  " + "\n  ".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
}
if [ -x "$BASE/bin/python" ] && pinned 2>/dev/null; then
  echo "$BASE: transformers $TF base environment present"
else
  echo "$BASE: building the transformers $TF base environment ($PINS)"
  test -x "$BASE/bin/python" || "$PYTHON" -m venv "$BASE"
  "$BASE/bin/python" -m pip install -q --upgrade pip
  "$BASE/bin/python" -m pip install -q ${INDEX:+--index-url "$INDEX"} "$TORCH"
  "$BASE/bin/python" -m pip install -q --no-deps -r "$PINS"
  pinned || { echo "$0: $BASE does not hold the pins above after installing them" >&2; exit 1; }
fi

# 2. the release's wheel, unpacked (into a temporary folder first: never half there)
if [ ! -f "$WHEEL/sglang/__init__.py" ]; then
  TMP=$(mktemp -d "$ENVS/.wheel-$VERSION.XXXXXX")
  trap 'rm -rf "$TMP"' EXIT
  "$BASE/bin/python" -m pip download -q --no-deps --only-binary :all: -d "$TMP/dl" "sglang==$VERSION"
  "$BASE/bin/python" -m zipfile -e "$TMP"/dl/sglang-*.whl "$TMP/unpacked"
  rm -rf "$WHEEL" && mkdir -p "$ENVS/wheels" && mv "$TMP/unpacked" "$WHEEL"
fi
echo "$WHEEL: SGLang $VERSION unpacked"

# 3. the launchers: the base python with the wheel, then this checkout, first on PYTHONPATH
mkdir -p "$RUN/bin"
cat > "$RUN/bin/python" <<EOF
#!/bin/sh
# SGLang $VERSION (its unpacked wheel) and $ROOT on the transformers $TF base environment
PYTHONPATH="$WHEEL:$ROOT\${PYTHONPATH:+:\$PYTHONPATH}" exec "$BASE/bin/python" "\$@"
EOF
printf '#!/bin/sh\nexec "%s" -m kernels_bridge.cli "$@"\n' "$RUN/bin/python" > "$RUN/bin/hisparse"
chmod +x "$RUN/bin/python" "$RUN/bin/hisparse"

# 4. the proof: the release imports with its stand-ins and its conform driver loads
"$RUN/bin/python" -W ignore - "$VERSION" <<'EOF'
import sys
from engine.sglang.conform import drivers

version, reason = drivers.installed_sglang()
print(reason)
if version != sys.argv[1]:
    sys.exit(f"expected SGLang {sys.argv[1]}, found {version}")
try:
    drivers.driver_for(version).load()
except Exception as exc:  # no driver in this checkout, or one that cannot run the release
    sys.exit(f"SGLang {version}: its conform driver does not load: {type(exc).__name__}: {exc}")
EOF
echo "$RUN: SGLang $VERSION ready: $RUN/bin/hisparse conform --policy installed --sample 1000"
