"""SGLang's OWN unit tests of the functions the plugin replaces, run with the plugin on: every
result must equal the result without it (the same passes, the same failures), and an edited
policy must make SGLang's own default test fail, naming the edited backend (proof the tests see
the plugin).

The tests are SGLang's (Apache-2.0), kept outside this checkout, one folder per API form
(`v0.5.23/`: releases 0.5.19 to 0.5.23; `v0.5.17/`: 0.5.15 to 0.5.18; hook_targets says which a
release takes): the folder HISPARSE_SGLANG_TESTS names, else `../shared/sglang-tests` beside the
checkout. Without it these tests skip, naming what is missing.

Which SGLang runs them: the release environment HISPARSE_PLUGIN_RELEASE_ENV names
(tools/conform-releases.sh runs this module once for each release 0.5.15 to 0.5.23), else the
installed SGLang (0.5.23 with `make install`). Each run is a fresh process of that release's
Python (tests/sglang_own_runner.py), so SGLang's own loader registers the plugin as in a launch.
Releases 0.5.11 to 0.5.14 have no such tests: tests/test_sglang_contracts.py holds each replaced
function to SGLang's own, called alone."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.helpers import ROOT
from tests.sglang_release import release_environment

RUNNER = os.path.join(ROOT, "tests", "sglang_own_runner.py")
# SGLang's own tests of the HiSparse FP8 default (the second: the v0.5.17 folder's model-override
# module, whose backend-pass test includes that case)
DEFAULT_TESTS = ("TestHiSparseDsaBackendPolicy.test_hisparse_defaults_to_flashmla_kv_on_cuda_fp8",
                 "TestGoldenModelOverrides.test_dsa_split_backend_resolution_pass")


def own_tests_root() -> str | None:
    root = os.environ.get("HISPARSE_SGLANG_TESTS") or os.path.join(os.path.dirname(ROOT), "shared", "sglang-tests")
    return root if os.path.isfile(os.path.join(root, "conftest_plugin_loader.py")) else None


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """(python, environment, release, folder of SGLang's tests for it)."""
    python, env, version = release_environment(tmp_path_factory)
    from engine.sglang import registry

    row = registry.release(version)
    if row is None or row.own_tests is None:
        pytest.skip(f"SGLang {version} has no unit tests of the functions the plugin replaces "
                    "(tests/test_sglang_contracts.py holds them to SGLang's own instead)")
    root = own_tests_root()
    if root is None:
        pytest.skip("SGLang's own tests are not here: set HISPARSE_SGLANG_TESTS to the folder holding "
                    "conftest_plugin_loader.py and v0.5.17/, v0.5.23/ (../shared/sglang-tests beside the checkout)")
    return python, env, version, os.path.join(root, row.own_tests)


def run_own(release, tmp_path, policy: str | None, name: str) -> dict:
    python, env, _, folder = release
    out, evidence = tmp_path / f"{name}.json", tmp_path / f"{name}-hooks.json"
    # SGLang's test modules and its plugin-loader conftest import by their folder's names
    path = os.pathsep.join([folder, os.path.dirname(folder)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env = dict(env, PEER_EVIDENCE=str(evidence), PYTHONPATH=path)
    if policy is not None:
        env["HISPARSE_POLICY"] = policy
    proc = subprocess.run([python, "-W", "ignore", RUNNER, folder, str(out)], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text(encoding="utf-8"))
    result["hooked"] = json.loads(evidence.read_text(encoding="utf-8"))["patched"]
    return result


@pytest.fixture(scope="module")
def without(release, tmp_path_factory):
    return run_own(release, tmp_path_factory.mktemp("own"), None, "without")


def _shipped(release):
    import engine

    return engine.load_policy(f"sglang=={release[2]}")


@pytest.mark.parametrize("how", ["release", "file"])
def test_sglangs_own_tests_give_the_same_results_with_the_plugin(release, without, tmp_path, how):
    """The shipped version that models the release, named by release or by its file: every test
    passes or fails exactly as without the plugin (a test that fails without it is listed)."""
    policy = f"sglang=={release[2]}" if how == "release" else _shipped(release).path
    with_plugin = run_own(release, tmp_path, policy, "with")
    base = without["outcomes"]
    # a module that does not import on this release (0.5.15 and 0.5.16 lack one of its imports)
    # counts as one failing test, with and without the plugin
    assert sum(o == "passed" for o in base.values()) >= 2, base
    assert without["hooked"] == [] and with_plugin["hooked"], (without["hooked"], with_plugin["hooked"])
    changed = {t: (base[t], with_plugin["outcomes"].get(t)) for t in base if base[t] != with_plugin["outcomes"].get(t)}
    failing = sorted(t for t, o in base.items() if o != "passed")
    assert not changed and set(with_plugin["outcomes"]) == set(base), \
        f"results that change with the plugin: {changed}; failing without it too: {failing}"


def edited_copy(policy, folder) -> tuple[str, str]:
    """(path, backend): a copy of the shipped version in which HiSparse with an FP8 KV cache
    decodes on another backend, which its CUDA allow-list admits."""
    import yaml

    data = yaml.safe_load(open(policy.path, encoding="utf-8"))
    backend = next(b for b in ("flashinfer_sparse_mla", "flashmla_sparse") if b in data["backends"])
    (rule,) = [r for r in data["defaults"]["rules"] if r["name"] == "hisparse-fp8"]
    assert rule["set"]["decode"] == "flashmla_kv", rule
    rule["set"]["decode"] = backend
    fp8 = data["tables"]["hisparse_backends"]["rows"]["cuda"]["rows"]["fp8_e4m3"]
    if backend not in fp8:
        fp8.append(backend)
    folder = folder / policy.family
    folder.mkdir()
    path = folder / os.path.basename(policy.path)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return str(path), backend


def test_an_edited_policy_fails_sglangs_own_default_test_naming_its_backend(release, without, tmp_path):
    """HiSparse FP8 decoding on another backend (allowed by the edited copy): SGLang's own tests
    of the FP8 default fail, naming that backend; nothing else changes."""
    edited, backend = edited_copy(_shipped(release), tmp_path)
    with_edit = run_own(release, tmp_path, edited, "edited")
    changed = {t: o for t, o in with_edit["outcomes"].items() if o != without["outcomes"].get(t)}
    ran = [t for t, o in without["outcomes"].items() if t.endswith(DEFAULT_TESTS) and o == "passed"]
    assert ran and sorted(changed) == sorted(ran), (changed, ran)
    for outcome in changed.values():
        # a failed assertion naming the backend (under SGLang's CustomTestCase, wrapped by its retry)
        assert outcome.startswith(("failed: AssertionError", "error: Exception: retry()")), outcome
        assert "AssertionError: " in outcome and backend in outcome, outcome
