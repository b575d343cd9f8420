#!/usr/bin/env bash
# Every SGLang release a shipped policy version models, checked against that release's own code:
#   tools/conform-releases.sh [SAMPLE] [SEED]      (make conform-releases; CI runs it)
# For each release listed in a shipped version's upstream.releases: its environment (make
# conform-env: tools/sglang-env.sh, shared base environments), then `hisparse conform --policy
# sglang==RELEASE` on a stratified sample (default 1,000 configs, seed 1: every value of every
# input appears), which must agree on every config. Prints one line per release and exits 1 when
# any release differs or cannot run.
set -uo pipefail
SAMPLE=${1:-1000} SEED=${2:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
ENVS=${HISPARSE_ENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/hisparse/sglang-envs}
RELEASES=$("$PY" -c "
import engine
from engine.policy.releases import release_key
seen = set()
for family, versions in engine.list_families().items():
    for v in versions:
        up = engine.load_policy(f'{family}@{v}').upstream
        seen.update(up.releases if up else ())
print(' '.join(sorted(seen, key=release_key)))") || { echo "conform-releases: cannot list the modelled releases" >&2; exit 2; }
failed=()
for release in $RELEASES; do
  log=$(mktemp)
  if ! bash "$ROOT/tools/sglang-env.sh" "$release" "$ENVS" >"$log" 2>&1; then
    echo "SGLang $release: environment FAILED"; sed 's/^/    /' "$log" | tail -20; failed+=("$release"); rm -f "$log"; continue
  fi
  rm -f "$log"
  start=$(date +%s)
  err=$(mktemp)
  out=$("$ENVS/sglang-$release/bin/hisparse" conform --policy "sglang==$release" --sample "$SAMPLE" --seed "$SEED" 2>"$err")
  rc=$?
  echo "SGLang $release ($(( $(date +%s) - start )) s): $(printf '%s\n' "$out" | head -1)"
  if [ $rc -ne 0 ]; then
    { printf '%s\n' "$out"; grep -v '^conform: ' "$err"; } | sed 's/^/    /' | head -40; failed+=("$release")
  fi
  rm -f "$err"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "conform-releases: ${#failed[@]} release(s) failed: ${failed[*]}"; exit 1
fi
echo "conform-releases: every modelled release agrees on its sample ($SAMPLE configs, seed $SEED)"
