"""The README's generated blocks are current, and its quickstart commands exist."""
import os

from engine.docs import stale_blocks
from helpers import ROOT


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
        return fh.read()


def test_generated_blocks_are_current():
    stale = stale_blocks(read("README.md"))
    assert not stale, f"README blocks out of date: {stale}; run `python -m engine.docs README.md`"


def test_quickstart_targets_exist():
    makefile = read("Makefile")
    readme = read("README.md")
    for target in ("run", "test"):
        assert f"make {target}" in readme
        assert f"\n{target}:" in makefile
    assert "make test" in read(".ci/run")
