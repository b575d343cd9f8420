#!/usr/bin/env bash
# Every SGLang release a shipped policy version models, checked against that release's own code:
#   tools/conform-releases.sh [SAMPLE] [SEED]      (make conform-releases; CI runs it)
#   tools/conform-releases.sh --list                (the modelled releases, oldest first; nothing run)
# For each release listed in a shipped version's upstream.releases: its environment (make
# conform-env: tools/sglang-env.sh, shared base environments), then `hisparse conform --policy
# sglang==RELEASE` on a stratified sample (default 1,000 configs, seed 1: every value of every
# input appears), which must agree on every config. Then, per release, SGLang's own unit tests of
# the functions the plugin replaces and the contract tests of each (tests/test_sglang_own_tests.py,
# tests/test_sglang_contracts.py), and its server flags against engine/sglang/release_flags.txt
# (tests/test_release_flags.py). Then the SGLang plugin's tests
# (tests/test_sglang_plugin_releases.py) in the environment of one release of each hook family
# before 0.5.19 (PLUGIN_RELEASES; `make test` covers 0.5.23's), with DeepSeek-V4 launches on those
# from 0.5.12; and its V4 launches alone on V4_RELEASES, one of each V4 hook family whose DSA hooks
# are 0.5.23's (registry.py: 0.5.19-0.5.22). Prints one line per release and per plugin run, and
# exits 1 when any release differs, cannot run, or fails a plugin test.
set -uo pipefail
SAMPLE=${1:-1000} SEED=${2:-1}
PLUGIN_RELEASES=${PLUGIN_RELEASES-0.5.11 0.5.12 0.5.14 0.5.16}  # 0.5.13: 0.5.12's check, 0.5.14's names
V4_RELEASES=${V4_RELEASES-0.5.20}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
ENVS=${HISPARSE_ENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/hisparse/sglang-envs}
RELEASES=$("$PY" -c "
import engine
from engine.sglang.registry import release_key
seen = set()
for family, versions in engine.list_families().items():
    for v in versions:
        up = engine.load_policy(f'{family}@{v}').upstream
        seen.update(up.releases if up else ())
print(' '.join(sorted(seen, key=release_key)))") || { echo "conform-releases: cannot list the modelled releases" >&2; exit 2; }
[ "$SAMPLE" = --list ] && { echo "$RELEASES"; exit 0; }
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
  # one summary line per family that models the release (each report's first line)
  summary=$(printf '%s\n' "$out" | grep -E ' vs SGLang ' | paste -sd ';' - | sed 's/;/; /g')
  echo "SGLang $release ($(( $(date +%s) - start )) s): ${summary:-$(printf '%s\n' "$out" | head -1)}"
  if [ $rc -ne 0 ]; then
    { printf '%s\n' "$out"; grep -v '^conform: ' "$err"; } | sed 's/^/    /' | head -40; failed+=("$release")
  fi
  rm -f "$err"
done
# every release: SGLang's own unit tests of the functions the plugin replaces (0.5.15 on; the
# folder HISPARSE_SGLANG_TESTS names, else ../shared/sglang-tests), and each replaced function
# called alone against SGLang's own (tests/test_sglang_contracts.py)
for release in $RELEASES; do
  start=$(date +%s)
  out=$(cd "$ROOT" && HISPARSE_PLUGIN_RELEASE_ENV="$ENVS/sglang-$release" "$PY" -m pytest -q -p no:cacheprovider -rs \
        tests/test_sglang_own_tests.py tests/test_sglang_contracts.py tests/test_release_flags.py 2>&1)
  rc=$?
  echo "SGLang $release own tests and contracts ($(( $(date +%s) - start )) s): $(printf '%s\n' "$out" | tail -1)"
  if [ $rc -ne 0 ]; then
    printf '%s\n' "$out" | tail -60 | sed 's/^/    /'; failed+=("contracts@$release")
  fi
done
for run in $(for r in $PLUGIN_RELEASES; do echo "$r:all"; done; for r in $V4_RELEASES; do echo "$r:v4"; done); do
  release=${run%:*} which=${run#*:}
  if [ ! -x "$ENVS/sglang-$release/bin/python" ]; then
    bash "$ROOT/tools/sglang-env.sh" "$release" "$ENVS" >/dev/null 2>&1 \
      || { echo "SGLang $release: environment FAILED (plugin tests)"; failed+=("plugin@$release"); continue; }
  fi
  start=$(date +%s)
  select=(); [ "$which" = v4 ] && select=(-k v4)
  out=$(cd "$ROOT" && HISPARSE_PLUGIN_RELEASE_ENV="$ENVS/sglang-$release" "$PY" -m pytest -q -p no:cacheprovider \
        tests/test_sglang_plugin_releases.py "${select[@]}" 2>&1)
  rc=$?
  echo "SGLang $release plugin tests${select:+ (DeepSeek-V4)} ($(( $(date +%s) - start )) s): $(printf '%s\n' "$out" | tail -1)"
  if [ $rc -ne 0 ]; then
    printf '%s\n' "$out" | tail -60 | sed 's/^/    /'; failed+=("plugin@$release")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "conform-releases: ${#failed[@]} release(s) failed: ${failed[*]}"; exit 1
fi
echo "conform-releases: every modelled release agrees on its sample ($SAMPLE configs, seed $SEED)" \
     "and the plugin drives ${PLUGIN_RELEASES:-no older release} as SGLang's own code" \
     "(and DeepSeek-V4 launches on ${V4_RELEASES:-no other release})"
