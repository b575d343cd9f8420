"""The Python API contract: load_policy, evaluate, Decision, ConfigError."""
import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest

import engine
from engine.policy.loader import clear_cache
from tests.helpers import ROOT, minimal_text, write_policy

HISPARSE_FP8 = {"enable_hisparse": True, "kv_cache_dtype": "fp8_e4m3", "disable_radix_cache": True}


def test_refs():
    newest = engine.load_policy("dsa-backends")
    assert newest.family == "dsa-backends"
    assert newest.version == max(engine.list_families()["dsa-backends"])
    v2 = engine.load_policy("dsa-backends@2")
    assert (v2.version, v2.file) == (2, "policies/dsa-backends/v2.yaml")
    by_path = engine.load_policy(os.path.join(ROOT, "policies", "dsa-backends", "v1.yaml"))
    assert by_path.version == 1 and by_path.sha256 == engine.load_policy("dsa-backends@1").sha256


@pytest.mark.parametrize("ref, code, text", [
    ("nsa-backend", "R601", "did you mean 'dsa-backends'?"),
    ("dsa-backends@99", "R601", "available: dsa-backends@1"),
    ("NSA backends!", "R602", "expected FAMILY, FAMILY@N"),
    ("missing/file.yaml", "E101", "cannot read file"),
])
def test_bad_refs(ref, code, text):
    with pytest.raises(engine.PolicyError) as exc:
        engine.load_policy(ref)
    assert exc.value.problems[0].code == code
    assert text in str(exc.value)


@pytest.mark.parametrize("name", ["dsa-backends", "dsa-backends@2", "mini"])
def test_a_file_in_the_working_directory_never_replaces_a_ref(tmp_path, monkeypatch, capsys, name):
    """A ref is a file only when spelled as a path; what happens to lie in the working directory
    never decides, for load_policy, the CLI, apply() and $HISPARSE_POLICY alike."""
    from engine.sglang import apply
    from tests.helpers import run_cli

    (tmp_path / name).write_text(minimal_text())  # a valid policy, but not the one asked for
    monkeypatch.chdir(tmp_path)
    clear_cache()
    if name == "mini":
        with pytest.raises(engine.PolicyError, match="no policy family 'mini'"):
            engine.load_policy(name)
        return
    shipped = engine.load_policy(name, policy_dir=os.path.join(ROOT, "policies"))
    assert engine.load_policy(name).sha256 == shipped.sha256
    code, out, _ = run_cli(capsys, "evaluate", "--policy", name, "--format", "json")
    assert code in (0, 1) and json.loads(out)["policy"]["sha256"] == shipped.sha256
    monkeypatch.setenv("HISPARSE_POLICY", name)
    code, out, _ = run_cli(capsys, "evaluate", "--format", "json")
    assert json.loads(out)["policy"]["sha256"] == shipped.sha256

    class Args:
        model_path, kv_cache_dtype, enable_hisparse, disable_radix_cache = "x/DeepSeek-V3.2", "bfloat16", False, False

    assert apply(Args()).policy.sha256 == shipped.sha256
    # spelled as a path, the same file is what is loaded
    assert engine.load_policy("./" + name).family == "mini"


def test_path_spellings(tmp_path, monkeypatch):
    from engine.files.catalog import looks_like_path

    for ref in ("a/b", "./x", ".hidden", "~/p", "p.yaml", "p.yml", "p.json", os.path.join("d", "p")):
        assert looks_like_path(ref), ref
    for ref in ("dsa-backends", "dsa-backends@2", "mini"):
        assert not looks_like_path(ref), ref
    write_policy(tmp_path, minimal_text(), "mini/v1.yaml")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert engine.load_policy("~/mini/v1.yaml").ref == "mini@1"


@pytest.mark.parametrize("argv, env", [
    (["--policy", ""], {}), (["--policy", "  "], {}), ([], {"HISPARSE_POLICY": ""}),
    (["--policy-dir", ""], {}), ([], {"HISPARSE_POLICY_DIR": ""}),
])
def test_empty_policy_settings_are_refused(capsys, monkeypatch, argv, env):
    from tests.helpers import run_cli

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for command in (["evaluate"], ["table"], ["explain"], ["conform"], ["replay", "r.jsonl"]):
        code, out, err = run_cli(capsys, *command, *argv)
        assert code == 2 and out == "" and "R602" in err and "Traceback" not in err, err
    if not argv:
        with pytest.raises(engine.PolicyError, match="set but empty"):
            from engine.sglang import apply

            apply(type("A", (), {"kv_cache_dtype": "auto"})())


def test_policy_dir_from_env(tmp_path, monkeypatch):
    write_policy(tmp_path, minimal_text(), "mini/v1.yaml")
    monkeypatch.setenv("HISPARSE_POLICY_DIR", str(tmp_path))
    policy = engine.load_policy("mini")
    assert policy.ref == "mini@1"
    assert policy.file == os.path.join(str(tmp_path), "mini", "v1.yaml")
    with pytest.raises(engine.PolicyError):
        engine.load_policy("dsa-backends")  # the env folder replaces the shipped one
    assert engine.load_policy("dsa-backends", policy_dir=os.path.join(ROOT, "policies")).family == "dsa-backends"


def test_cache_by_content(tmp_path):
    clear_cache()
    path = write_policy(tmp_path, minimal_text(), "mini/v1.yaml")
    first = engine.load_policy(path)
    assert engine.load_policy(path) is first
    write_policy(tmp_path, minimal_text().replace("A small valid", "An edited"), "mini/v1.yaml")
    second = engine.load_policy(path)
    assert second is not first and second.sha256 != first.sha256
    assert second.description.startswith("An edited")


def test_decision_contract():
    d = engine.evaluate("dsa-backends@2", HISPARSE_FP8)
    out = d.to_dict()
    for key in ("ok", "kv_cache_dtype", "nsa_prefill_backend", "nsa_decode_backend", "violations", "log",
                "sources", "policy"):
        assert key in out
    assert out["ok"] is True
    assert (out["nsa_prefill_backend"], out["nsa_decode_backend"]) == ("flashmla_kv", "flashmla_kv")
    assert out["sources"] == {"prefill": "hisparse-fp8", "decode": "hisparse-fp8"}
    assert out["policy"]["family"] == "dsa-backends" and out["policy"]["version"] == 2
    with open(os.path.join(ROOT, "policies", "dsa-backends", "v2.yaml"), "rb") as fh:
        import hashlib

        assert out["policy"]["sha256"] == hashlib.sha256(fh.read()).hexdigest()
    json.dumps(out)  # JSON-serialisable


def test_violation_fields():
    d = engine.evaluate("dsa-backends@2", dict(HISPARSE_FP8, nsa_decode_backend="flashmla_sparse"))
    assert not d.ok
    (v,) = d.violations
    assert v.check == "hisparse-backend-dtype" and v.phase == "decode"
    assert v.message == ("HiSparse with --kv-cache-dtype=fp8_e4m3 requires --nsa-decode-backend in "
                         "['flashmla_kv'], but got flashmla_sparse.")
    path, line = v.location.rsplit(":", 1)
    assert path == "policies/dsa-backends/v2.yaml"
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        assert "name: hisparse-backend-dtype" in fh.read().splitlines()[int(line) - 1]


def test_defaults_fill_missing_inputs():
    d = engine.evaluate("dsa-backends@2", {})
    assert d.ok and d.config["kv_cache_dtype"] == "bfloat16"  # auto on SM9
    assert d.backends == {"prefill": "flashmla_sparse", "decode": "fa3"}


def test_dash_keys_and_flag_spellings():
    a = engine.evaluate("dsa-backends@2", {"kv-cache-dtype": "fp8_e4m3", "enable-hisparse": True,
                                           "disable-radix-cache": True})
    b = engine.evaluate("dsa-backends@2", HISPARSE_FP8)
    assert a.outcome() == b.outcome()


@pytest.mark.parametrize("config, code, text", [
    ({"kv_cache_dtyp": "bf16"}, "C501", "did you mean 'kv_cache_dtype'?"),
    ({"kv_cache_dtype": "fp8"}, "C502", "did you mean one of 'fp8_e4m3', 'fp8_e5m2'?"),
    ({"kv_cache_dtype": "fp8_e4m"}, "C502", "did you mean 'fp8_e4m3'?"),
    ({"enable_hisparse": "true"}, "C503", "strings are not booleans"),
    ({"sm_major": "10"}, "C503", "strings are not integers"),
    ({"sm_major": True}, "C503", "expected an integer"),
    ({"nsa_decode_backend": "flashmla"}, "C502", "did you mean"),
    ({"kv_cache_dtype": "bf16", "kv-cache-dtype": "fp8_e4m3"}, "C501", "both set 'kv_cache_dtype'"),
    ([("kv_cache_dtype", "bf16")], "C504", "a config is a mapping"),
])
def test_config_errors(config, code, text):
    with pytest.raises(engine.ConfigError) as exc:
        engine.evaluate("dsa-backends@2", config)
    assert exc.value.problems[0].code == code
    assert text in str(exc.value)
    assert isinstance(exc.value, ValueError)


def test_all_config_problems_at_once():
    with pytest.raises(engine.ConfigError) as exc:
        engine.evaluate("dsa-backends@2", {"kv_cache_dtype": "fp8", "platfrom": "cuda", "sm_major": "9"})
    assert sorted(p.code for p in exc.value.problems) == ["C501", "C502", "C503"]


def test_errors_pickle():
    err = engine.ConfigError([engine.Problem("C501", "unknown config key 'x'")])
    back = pickle.loads(pickle.dumps(err))
    assert back.problems == err.problems and str(back) == str(err)


def test_import_engine_never_loads_torch():
    code = ("import sys, engine, engine.cli.commands\n"
            "engine.evaluate('dsa-backends', {})\n"
            "engine.cli.commands.main(['evaluate', '--format', 'json'])\n"
            "engine.cli.commands.main(['check'])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_enum_members_are_the_values_they_stand_for():
    """A str or int subclass (StrEnum, IntEnum members) is its value, for both evaluators. The
    compiled one answered "C503: invalid config"; found by tests/test_fuzz.py."""
    import enum

    class Dtype(str, enum.Enum):
        FP8 = "fp8_e4m3"

    class Arch(enum.IntEnum):
        BLACKWELL = 10

    policy = engine.load_policy("dsa-backends@2")
    config = {"enable_hisparse": True, "kv_cache_dtype": Dtype.FP8, "disable_radix_cache": True,
              "sm_major": Arch.BLACKWELL, "nsa-decode-backend": "flashmla_kv"}
    fast, slow = policy.evaluate(config), policy.trace(config)[0]
    assert fast.to_dict() == slow.to_dict() == policy.evaluate(
        dict(HISPARSE_FP8, sm_major=10, nsa_decode_backend="flashmla_kv")).to_dict()
    assert type(fast.config["kv_cache_dtype"]) is str and type(fast.config["sm_major"]) is int
    assert fast.input is config
    with pytest.raises(engine.ConfigError, match="C503: sm_major: expected an integer, got a boolean true"):
        policy.evaluate({"sm_major": True})
