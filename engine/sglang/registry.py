"""SGLang's releases, and what is known of each: the one place a release fact lives.

The plugin (which functions to replace, engine/sglang/hook_targets.py), `hisparse conform` (which
driver runs a release), `hisparse versions` (which releases there are), the model reader (from
which release SGLang counts an architecture as DSA) and the release environments
(tools/sglang-env.sh: which transformers a release imports) all read the table below. A new
release is a row here (and, where its routing changed, a policy version); a release this table
does not list is placed by its version number: after the newest known one, it takes the newest
known facts; between two, the facts of the one before it.

Every release string parses (`version_key`): three-part and two-part versions (`1.0`),
`.postN`, pre-releases (`0.6.0rc1`, `a1`, `b2`) and `.devN`, a local part (`+cu128`) ignored.

Nothing here imports anything but the standard library (tools/sglang-env.sh asks it with a bare
Python: `main(["transformers", "0.5.18"])`)."""
from __future__ import annotations

import re
import sys


class Release:
    """One SGLang release: its transformers base environment, the family of functions the plugin
    replaces in it (hook_targets), the conform driver module that runs it, and the folder of
    SGLang's own unit tests of those functions (None: the release has none)."""

    __slots__ = ("version", "transformers", "hooks", "driver", "own_tests")

    def __init__(self, version, transformers, hooks, driver, own_tests=None):
        self.version, self.transformers, self.hooks, self.driver = version, transformers, hooks, driver
        self.own_tests = own_tests

    def __repr__(self) -> str:
        return f"<SGLang {self.version}>"


_C = "engine.sglang.conform."
# oldest first; .post releases on their own rows (PyPI publishes them as releases)
RELEASES = (
    Release("0.5.11", "5.6.0", "nsa-methods-0511", _C + "sglang_0511"),
    Release("0.5.12", "5.6.0", "nsa-methods-0512", _C + "sglang_0512"),
    Release("0.5.12.post1", "5.6.0", "nsa-methods-0512", _C + "sglang_0512"),
    Release("0.5.13", "5.12.1", "dsa-methods-0513", _C + "sglang_0513"),
    Release("0.5.13.post1", "5.12.1", "dsa-methods-0513", _C + "sglang_0513"),
    Release("0.5.14", "5.12.1", "dsa-methods-0514", _C + "sglang_0513"),
    Release("0.5.15", "5.12.1", "passes-in-methods", _C + "transitional", "v0.5.17"),
    Release("0.5.15.post1", "5.12.1", "passes-in-methods", _C + "transitional", "v0.5.17"),
    Release("0.5.16", "5.12.1", "passes-in-methods", _C + "transitional", "v0.5.17"),
    Release("0.5.17", "5.12.1", "passes-in-methods", _C + "transitional", "v0.5.17"),
    Release("0.5.18", "5.12.1", "passes-in-methods", _C + "transitional", "v0.5.17"),
    Release("0.5.19", "5.12.1", "pipeline", _C + "pipeline", "v0.5.23"),
    Release("0.5.20", "5.12.1", "pipeline", _C + "pipeline", "v0.5.23"),
    Release("0.5.21", "5.19.0", "pipeline", _C + "pipeline", "v0.5.23"),
    Release("0.5.22", "5.19.0", "pipeline", _C + "pipeline", "v0.5.23"),
    Release("0.5.23", "5.19.0", "pipeline", _C + "pipeline", "v0.5.23"),
)
BY_VERSION = {r.version: r for r in RELEASES}
# the release this project installs and tests first (`make install`; the conform extra's pins)
OWN = "0.5.23"

# SGLang architectures that count as DSA (is_deepseek_dsa, with index_topk) only from a release on
DSA_SINCE = {"LongcatFlashForCausalLM": "0.5.16", "LongcatFlashForCausalLMNextN": "0.5.16",
             "Dots3NoteForCausalLM": "0.5.19", "Dots3NoteForCausalLMNextN": "0.5.19"}


# -- release strings ------------------------------------------------------------------------------
_VERSION = re.compile(r"""^\s*v?(?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre>a|alpha|b|beta|c|rc|pre|preview)[-_.]?(?P<pre_n>\d*))?
    (?:[-_.]?(?:post|rev|r)[-_.]?(?P<post>\d*))?
    (?:[-_.]?dev[-_.]?(?P<dev>\d*))?
    (?:\+[a-z0-9.]+)?\s*$""", re.I | re.X)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


def version_key(version: str) -> tuple | None:
    """A sort key for a release string (PEP 440 order: 1.0 == 1.0.0 < 1.0.1.dev1 < 1.0.1rc1 <
    1.0.1 < 1.0.1.post1), or None when it is not a version."""
    m = _VERSION.match(version or "") if isinstance(version, str) else None
    if m is None:
        return None
    parts = [int(p) for p in m["release"].split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    if m["pre"]:
        stage = (_PRE[m["pre"].lower()], int(m["pre_n"] or 0))
    elif m["dev"] is not None and m["post"] is None:
        stage = (-1, 0)  # a dev release comes before the pre-releases of its version
    else:
        stage = (3, 0)  # the final release
    post = int(m["post"] or 0) + 1 if m["post"] is not None else 0
    dev = int(m["dev"] or 0) if m["dev"] is not None else float("inf")
    return (tuple(parts), stage, post, dev)


def release_key(version: str) -> tuple:
    """version_key, for sorting: a string that is not a version sorts before every release."""
    key = version_key(version)
    return key if key is not None else ((), (-2, 0), 0, 0)


def release(version: str) -> Release | None:
    """The facts of a release: its own row; for a release the table does not list, the row of the
    newest listed release at or before it (a release after the newest known one takes the newest
    facts); None before the first known release or for what is not a version."""
    if version in BY_VERSION:
        return BY_VERSION[version]
    key = version_key(version)
    if key is None:
        return None
    known = [r for r in RELEASES if version_key(r.version) <= key]
    return known[-1] if known else None


def is_known(version: str) -> bool:
    return version in BY_VERSION


def is_newer(version: str) -> bool:
    """After every release the table lists."""
    key = version_key(version)
    return key is not None and key > version_key(RELEASES[-1].version)


def driven_by(module: str) -> tuple:
    """The releases whose conform driver is `module`, oldest first."""
    return tuple(r.version for r in RELEASES if r.driver == module)


def installed_release() -> str | None:
    """The installed SGLang's version, from its package metadata (SGLang is not imported), or
    None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def dsa_since(architecture: str) -> str | None:
    return DSA_SINCE.get(architecture)


def main(argv: list[str]) -> int:
    """`main(["transformers", VERSION])`: print the transformers version of the release's base
    environment (exit 2 for a release before the first known one)."""
    if len(argv) != 2 or argv[0] != "transformers":
        print("usage: transformers VERSION", file=sys.stderr)
        return 2
    row = release(argv[1])
    if row is None:
        known = ", ".join(r.version for r in RELEASES)
        print(f"no SGLang release facts for {argv[1]!r} (known: {known}; a later release takes the newest)",
              file=sys.stderr)
        return 2
    print(row.transformers)
    return 0
