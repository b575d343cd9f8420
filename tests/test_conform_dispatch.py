"""Which driver runs which SGLang release (engine/sglang/conform/drivers.py), without any SGLang:
the releases are stood in for by package metadata and fake modules."""
import importlib.metadata
import os
import sys
import types

import pytest

from engine.sglang.conform import drivers, pipeline
from tests.helpers import ROOT
from tests.sglang_release import require_modules

PIPELINE_RELEASES = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")


def installed(monkeypatch, release):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: release)


def fake_driver(monkeypatch, import_sglang):
    """The newest release's driver replaced by a fake one."""
    monkeypatch.setitem(sys.modules, "fake_newest_driver",
                        types.SimpleNamespace(VERSION="0.5.23", import_sglang=import_sglang))
    monkeypatch.setitem(drivers.DRIVERS, drivers.newest(), "fake_newest_driver")


def test_every_pipeline_release_runs_with_the_pipeline_driver():
    assert pipeline.RELEASES == PIPELINE_RELEASES
    for release in PIPELINE_RELEASES:
        assert drivers.driver_for(release) is pipeline
        assert drivers.note(release) is None
    # a .post release is its own row; one the registry does not list runs with the driver of the
    # release before it, and says so
    assert drivers.module_name("0.5.23") == drivers.PIPELINE
    assert drivers.module_name("0.5.18.post9") == drivers.DRIVERS["0.5.18"]
    assert "not a release a conform driver was checked on" in drivers.note("0.5.18.post9")
    with pytest.raises(drivers.UnknownVersion):
        drivers.module_name("0.5.10")


def test_a_newer_release_runs_with_the_newest_driver_and_says_so():
    for newer in ("0.5.24", "0.6.0", "0.5.23.post1"):
        assert drivers.is_newer(newer)
        assert drivers.driver_for(newer) is drivers.driver_for(drivers.newest())
        note = drivers.note(newer)
        assert note.startswith(f"SGLang {newer} is newer than every release a conform driver was checked on")
        assert f"newest: {drivers.newest()}" in note and drivers.DRIVERS[drivers.newest()] in note
    assert not drivers.is_newer("0.4.9") and drivers.note("0.4.9") is None


def test_a_newer_release_the_newest_driver_cannot_run_names_what_moved(monkeypatch):
    def moved():
        raise pipeline.Moved("SGLang no longer has sglang.srt.arg_groups.overrides.resolution_result")
    fake_driver(monkeypatch, moved)
    installed(monkeypatch, "0.5.24")
    version, reason = drivers.installed_sglang()
    assert version is None
    assert reason == ("SGLang 0.5.24 is newer than every release a conform driver was checked on "
                      f"(newest: {drivers.newest()}), and the newest driver, fake_newest_driver, cannot run "
                      "it: SGLang no longer has sglang.srt.arg_groups.overrides.resolution_result")


def test_a_newer_release_that_runs_says_so(monkeypatch):
    fake_driver(monkeypatch, lambda: None)
    installed(monkeypatch, "0.5.24")
    version, reason = drivers.installed_sglang()
    assert version == "0.5.24" and reason == drivers.note("0.5.24")


def test_install_hints_name_the_installed_release():
    hint = drivers.install_hint("0.5.18")
    assert "`make conform-env SGLANG=0.5.18`" in hint and "`pip install --no-deps sglang==0.5.18`" in hint
    assert "`pip install torch==2.13.0`" in hint and "0.5.23" not in hint
    own = drivers.install_hint(None)
    assert "`pip install --no-deps sglang==0.5.23`" in own and "'hisparse-router[conform]'" in own


def test_the_stand_in_comes_before_the_first_import_of_sglang(tmp_path):
    """0.5.12.post1-0.5.20 import torchvision in sglang/__init__: probing a release no driver knows
    imports it with the stand-in in place, so the answer is about the release, not torchvision."""
    import json
    import subprocess

    require_modules("torch", "transformers")
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("import torchvision  # as sglang 0.5.12.post1-0.5.20 do\n")
    probe = ("import importlib.metadata as m, json, sys; v = m.version; "
             "m.version = lambda name: '0.5.10' if name == 'sglang' else v(name); "
             "from engine.sglang.conform import drivers; "
             "print(json.dumps([drivers.installed_sglang(), sys.modules['sglang'].__file__]))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (version, reason), where = json.loads(proc.stdout)
    assert "torchvision" not in reason
    assert version == "0.5.10" and reason.startswith("SGLang 0.5.10 imports, but no conform driver runs it")
    assert os.path.dirname(where) == str(package)


def test_a_missing_dependency_is_the_environment_not_a_move(monkeypatch):
    """A dependency SGLang imports that is missing is an install hint for that release, not
    'moved'."""
    def missing():
        raise ModuleNotFoundError("No module named 'openai'", name="openai")
    monkeypatch.setitem(sys.modules, "fake_release_driver",
                        types.SimpleNamespace(VERSION="0.5.20", import_sglang=missing))
    monkeypatch.setitem(drivers.DRIVERS, "0.5.20", "fake_release_driver")
    installed(monkeypatch, "0.5.20")
    version, reason = drivers.installed_sglang()
    assert version is None and "No module named 'openai'" in reason
    assert "sglang==0.5.20" in reason and "newer" not in reason


def test_platform_facts_are_those_the_release_knows():
    from engine.sglang.conform.machine import platform_facts

    every = platform_facts("cuda", (10, 0))
    older = set(every) - {"is_mps", "is_sm110"}  # 0.5.19-0.5.21's platform context
    assert set(platform_facts("cuda", (10, 0), older)) == older
    with pytest.raises(ValueError, match="knows facts no stand-in gives: is_sm130"):
        platform_facts("cuda", (10, 0), older | {"is_sm130"})


def test_the_model_folder_of_a_config_class_nobody_has_is_plain_json(tmp_path, monkeypatch):
    """GLM-5.3-Flash under transformers 5.12.1 with SGLang 0.5.19: neither has its config class; the
    folder is the checkpoint's config.json, so SGLang gives its own start-up error."""
    import json

    from engine.sglang.conform import model_folders

    monkeypatch.setattr(model_folders, "config_class", lambda name: None)
    path = model_folders.ModelFolders(str(tmp_path)).path("Glm5NextForConditionalGeneration")
    with open(os.path.join(path, "config.json")) as fh:
        config = json.load(fh)
    assert config["model_type"] == "glm5_next" and config["architectures"] == ["Glm5NextForConditionalGeneration"]
    assert config["text_config"]["index_topk"] == 2048
    with pytest.raises(ValueError, match="no config class LlamaConfig"):
        model_folders.ModelFolders(str(tmp_path)).path("LlamaForCausalLM")
