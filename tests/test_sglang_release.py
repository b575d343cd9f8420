"""The one rule the SGLang tests follow (tests/sglang_release.py): the release installed runs,
another release skips naming the one needed, and under CI a missing SGLang fails."""
import pytest

import tests.sglang_release as release


@pytest.mark.parametrize("ci", ["", "1"])
def test_the_installed_release_runs(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(release, "INSTALLED", "0.5.17")
    assert release.require(("0.5.15", "0.5.17")) == "0.5.17"


@pytest.mark.parametrize("ci", ["", "1"])
def test_another_release_skips_naming_the_one_needed(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(release, "INSTALLED", "0.5.23")
    with pytest.raises(pytest.skip.Exception, match=r"needs SGLang 0.5.11; SGLang 0.5.23 is installed here: "
                                                     r".*make conform-env SGLANG=0.5.11"):
        release.require("0.5.11")


def test_no_sglang_skips_outside_ci_and_fails_under_it(monkeypatch):
    monkeypatch.setattr(release, "INSTALLED", None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="SGLang is not installed here"):
        release.require("0.5.11")
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="under CI SGLang 0.5.23 must be installed .*not installed here"):
        release.require("0.5.11")


def test_under_ci_the_own_release_must_be_the_installed_one(monkeypatch):
    monkeypatch.setattr(release, "INSTALLED", "0.5.22")
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="needs SGLang 0.5.23 .*0.5.22 is installed here"):
        release.require(release.OWN)
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception):
        release.require(release.OWN)


def test_a_release_that_does_not_import_is_missing(monkeypatch):
    monkeypatch.setattr(release, "INSTALLED", "0.5.23")
    monkeypatch.setattr(release, "_imported", lambda: (None, "SGLang 0.5.23 is installed but cannot be imported"))
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="cannot be imported"):
        release.require("0.5.23", imported=True)


def test_a_module_make_install_installs_is_required_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "1")
    release.require_modules("pytest")  # present: nothing happens
    with pytest.raises(pytest.fail.Exception, match="needs no_such_module_here: `make install`"):
        release.require_modules("no_such_module_here")
