"""engine/sglang/registry.py: the one table of SGLang release facts, and the one parser of
release strings."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engine.sglang import registry
from tests.helpers import ROOT


def test_release_strings_sort_as_pep_440_does():
    order = ["0.5.9", "0.5.12", "0.5.12.post1", "0.5.13", "0.6.0.dev1", "0.6.0a1", "0.6.0b2", "0.6.0rc1",
             "0.6.0", "0.6.0.post1", "1.0", "1.0.1.dev3", "1.0.1rc1", "1.0.1", "1.0.1.post1"]
    shuffled = order[::-2] + order[-2::-2]
    assert sorted(shuffled, key=registry.release_key) == order
    assert registry.version_key("1.0") == registry.version_key("1.0.0") == registry.version_key("v1.0+cu128")
    for bad in ("", "latest", "0.5.x", None, 5):
        assert registry.version_key(bad) is None
        assert registry.release_key(bad) < registry.release_key("0.0.1")  # sorts first, never raises


def test_every_release_is_a_row_in_order_and_each_names_what_exists():
    from engine.sglang.hook_targets import BY_NAME

    versions = [r.version for r in registry.RELEASES]
    assert versions == sorted(versions, key=registry.release_key) and len(set(versions)) == len(versions)
    for row in registry.RELEASES:
        assert row.hooks in BY_NAME, row
        assert row.transformers in ("5.6.0", "5.12.1", "5.19.0")
        __import__(row.driver)
        assert row.version in registry.driven_by(row.driver)
    assert registry.OWN in registry.BY_VERSION


def test_a_release_the_table_does_not_list_is_placed_by_its_number():
    assert registry.release("0.5.16.post1").version == "0.5.16"  # between two: the one before
    assert registry.release("0.6.0").version == registry.RELEASES[-1].version  # later: the newest
    assert registry.release("1.0rc1").version == registry.RELEASES[-1].version
    assert registry.is_newer("0.5.24") and not registry.is_newer("0.5.23") and not registry.is_newer("junk")
    assert registry.release("0.5.10") is None and registry.release("nonsense") is None


@pytest.mark.parametrize("version,out,code", [("0.5.12.post1", "5.6.0", 0), ("0.5.20", "5.12.1", 0),
                                              ("0.7.0", "5.19.0", 0), ("0.5.10", "", 2), ("x", "", 2)])
def test_the_environment_script_asks_the_registry(version, out, code):
    """tools/sglang-env.sh asks with a bare Python, from the checkout (nothing but the standard
    library is imported)."""
    code_ = "import sys; from engine.sglang.registry import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-S", "-c", code_, "transformers", version], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout.strip()) == (code, out), proc.stderr
    assert code == 0 or "no SGLang release facts" in proc.stderr


def test_every_shipped_family_routes_classes_the_registry_names():
    """A policy's `models:` are model classes of the registry, and every architecture the registry
    reads is of one of those classes: a family for a class nobody can pick would route nothing."""
    import engine
    from engine.sglang.policy_sets import load_policy_set

    assert set(a.model_class for a in registry.ARCHITECTURES.values()) <= set(registry.MODEL_CLASSES)
    routed = set()
    for policy in load_policy_set(None).policies:
        assert set(policy.models) <= set(registry.MODEL_CLASSES), (policy.ref, policy.models)
        routed |= set(policy.models)
    # every class has a family that routes it (the DSA family also says what "other" models get)
    assert routed == set(registry.MODEL_CLASSES)
    assert "other" in engine.load_policy("dsa-backends").models


def test_conform_releases_walks_every_release_in_the_table():
    """The CI's release walk (tools/conform-releases.sh) lists the releases the shipped versions
    model with its own snippet; each registry release is modelled by one, oldest first."""
    out = subprocess.run(["bash", os.path.join(ROOT, "tools", "conform-releases.sh"), "--list"],
                         capture_output=True, text=True, env={**os.environ, "PY": sys.executable})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [r.version for r in registry.RELEASES]
