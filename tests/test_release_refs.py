"""Policy references by SGLang release (`sglang==X`, `installed`) and retired references: each
resolves to exactly one file or fails with exit 2 saying why."""
from __future__ import annotations

import importlib.metadata
import os
import shutil

import pytest

import engine
from engine.errors import PolicyError
from tests.helpers import ROOT, run_cli

SHIPPED = os.path.join(ROOT, "policies")


def _releases_of_shipped() -> dict[str, dict[str, str]]:
    """release -> {family: FAMILY@N}, read from each shipped file's own upstream (not from the
    resolver): at most one version of a family models a release."""
    out: dict = {}
    for family, versions in engine.list_families().items():
        for v in versions:
            up = engine.load_policy(f"{family}@{v}").upstream
            for release in (up.releases if up else ()):
                seen = out.setdefault(release, {})
                assert family not in seen, f"{release} is modelled twice: {seen[family]} and {family}@{v}"
                seen[family] = f"{family}@{v}"
    return out


def test_every_modelled_release_resolves_to_its_version_of_each_family():
    from engine.sglang.policy_sets import load_policy_set

    table = _releases_of_shipped()
    assert "0.5.23" in table and "0.5.11" in table and len(table["0.5.23"]) >= 2
    for release, refs in table.items():
        # one policy: the version of the family that routes DSA models, which every release has
        policy = engine.load_policy(f"sglang=={release}")
        assert f"{policy.family}@{policy.version}" == refs["dsa-backends"] and "dsa" in policy.models
        assert policy.upstream.models(release)
        # the set: one version of every family that models the release, each routing its classes
        got = {p.family: f"{p.family}@{p.version}" for p in load_policy_set(f"sglang=={release}").policies}
        assert got == refs


def test_a_release_no_version_models_exits_2_listing_the_modelled_ones(capsys):
    modelled = sorted(_releases_of_shipped())
    for ref in ("sglang==0.5.99", "sglang==0.5.23.post1", "sglang==0.5", "sglang=="):
        with pytest.raises(PolicyError) as exc:
            engine.load_policy(ref)
        (p,) = exc.value.problems
        assert p.code == "R601" and "no policy version models SGLang" in p.message
        assert all(r in p.hint for r in modelled)
    code, _, err = run_cli(capsys, "evaluate", "--policy", "sglang==0.5.99")
    assert code == 2 and "R601: no policy version models SGLang '0.5.99'" in err


def test_installed_names_the_installed_release(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.22")
    assert engine.load_policy("installed").upstream.models("0.5.22")

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(PolicyError) as exc:
        engine.load_policy("installed")
    assert exc.value.problems[0].code == "R604"
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.4.0")
    with pytest.raises(PolicyError) as exc:
        engine.load_policy("installed")
    assert "no policy version models SGLang '0.4.0' (installed)" in str(exc.value)


def test_two_versions_modelling_one_release_is_ambiguous(tmp_path, capsys):
    folder = tmp_path / "dsa-backends"
    folder.mkdir()
    v10 = open(os.path.join(SHIPPED, "dsa-backends", "v10.yaml"), encoding="utf-8").read()
    (folder / "v10.yaml").write_text(v10)
    (folder / "v11.yaml").write_text(v10.replace("version: 10\n", "version: 11\n", 1))
    shutil.copytree(os.path.join(SHIPPED, "schema"), tmp_path / "schema")
    with pytest.raises(PolicyError) as exc:
        engine.load_policy("sglang==0.5.23", policy_dir=str(tmp_path))
    (p,) = exc.value.problems
    assert p.code == "R603" and "dsa-backends@10" in p.message and "dsa-backends@11" in p.message
    # the release env var takes the same refs
    code, out, _ = run_cli(capsys, "evaluate", "--policy", "sglang==0.5.22")
    assert code == 0 and out.startswith("ACCEPTED by dsa-backends@10")


def test_hisparse_policy_takes_a_release_ref(monkeypatch, capsys):
    monkeypatch.setenv("HISPARSE_POLICY", "sglang==0.5.11")
    code, out, _ = run_cli(capsys, "evaluate", "--enable-hisparse", "--disable-radix-cache")
    assert code == 0 and "by dsa-backends@1" in out.splitlines()[0]


@pytest.mark.parametrize("ref, now", [("nsa-backends@1", "dsa-backends@1"), ("nsa-backends@2", "dsa-backends@2"),
                                      ("nsa-backends@4", "dsa-backends@10")])
def test_a_retired_ref_names_what_replaced_it(ref, now, capsys):
    with pytest.raises(PolicyError) as exc:
        engine.load_policy(ref)
    (p,) = exc.value.problems
    assert p.code == "R605" and p.message.startswith(f"{ref} is retired: it is now {now};")
    code, out, err = run_cli(capsys, "evaluate", "--policy", ref)
    assert code == 2 and out == "" and f"it is now {now}" in err


def test_a_retired_ref_without_successor_says_so(capsys):
    with pytest.raises(PolicyError) as exc:
        engine.load_policy("nsa-backends@3")
    (p,) = exc.value.problems
    assert p.code == "R605" and "matched no SGLang release" in p.message and "now" not in p.message.split(":")[1]
    for ref in ("nsa-backends", "nsa-backends@9"):
        with pytest.raises(PolicyError) as exc:
            engine.load_policy(ref)
        assert exc.value.problems[0].code == "R605" and "renamed dsa-backends" in exc.value.problems[0].message


def test_a_folder_holding_the_retired_family_loads_its_own_files(tmp_path):
    folder = tmp_path / "nsa-backends"
    folder.mkdir()
    v1 = open(os.path.join(SHIPPED, "dsa-backends", "v1.yaml"), encoding="utf-8").read()
    (folder / "v1.yaml").write_text(v1.replace("policy: dsa-backends\n", "policy: nsa-backends\n", 1))
    shutil.copytree(os.path.join(SHIPPED, "schema"), tmp_path / "schema")
    policy = engine.load_policy("nsa-backends@1", policy_dir=str(tmp_path))
    assert (policy.family, policy.version) == ("nsa-backends", 1)
