"""Regenerate engine/sglang/release_flags.txt: the server flags of each SGLang release the
registry lists, read from the release's own parser in its environment (tools/sglang-env.sh):

    python -m tools.release_flags [ENVS]

ENVS: where the environments are (default $HISPARSE_ENVS, else ~/.cache/hisparse/sglang-envs).
A flag's line holds the first and the last release that has it (the last left out while the
newest release has it); every flag is present over one run of consecutive releases, which the
tool checks (a flag that left and came back would need two lines)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "engine", "sglang", "release_flags.txt")
HEADER = ("# SGLang's server flags (ServerArgs.add_cli_args), by release: FLAG FIRST [LAST], the first\n"
          "# and the last release that has it (no LAST: still in the newest). Made by tools/release_flags.py\n"
          "# from each release's own parser; engine/sglang/registry.py reads it.\n")


def read_release(envs: str, release: str) -> set:
    python = os.path.join(envs, f"sglang-{release}", "bin", "python")
    proc = subprocess.run([python, "-W", "ignore", "-m", "engine.sglang.conform.parser_flags"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("FLAGS ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"SGLang {release}: cannot read its parser: {proc.stderr.strip()[-2000:]}")
    report = json.loads(lines[-1][len("FLAGS "):])
    if report["release"] != release:
        raise SystemExit(f"{python} runs SGLang {report['release']}, not {release}")
    return set(report["flags"])


def table(flags_by_release: dict) -> str:
    releases = list(flags_by_release)
    out = [HEADER]
    for flag in sorted(set().union(*flags_by_release.values())):
        having = [i for i, r in enumerate(releases) if flag in flags_by_release[r]]
        if having != list(range(having[0], having[-1] + 1)):
            raise SystemExit(f"{flag} leaves and comes back ({', '.join(releases[i] for i in having)})")
        last = "" if having[-1] == len(releases) - 1 else f" {releases[having[-1]]}"
        out.append(f"{flag} {releases[having[0]]}{last}\n")
    return "".join(out)


def main(argv: list[str]) -> int:
    from engine.sglang.registry import RELEASES

    envs = argv[0] if argv else os.environ.get("HISPARSE_ENVS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hisparse", "sglang-envs")
    flags = {r.version: read_release(envs, r.version) for r in RELEASES}
    with open(TABLE, "w", encoding="utf-8") as f:
        f.write(table(flags))
    print(f"{TABLE}: {len(set().union(*flags.values()))} flags over {len(flags)} releases")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
