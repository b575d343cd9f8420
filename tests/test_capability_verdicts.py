"""Capability verdicts on every decision (engine/analysis/capability.py): a decision that routes a phase to
a backend whose declared capabilities exclude the config says so, in its text, its JSON and (for
the SGLang plugin's log) as warning lines; `hisparse launch` refuses such a launch unless
--allow-incapable. The README's worked edit once made such a route the default."""
import json
import sys

import pytest

import engine
from engine.analysis.capability import decision_json, incapable, warning_lines
from tests.helpers import run_cli, run_process

POLICY = engine.load_policy("dsa-backends@10")
FP8 = {"enable_hisparse": True, "disable_radix_cache": True, "kv_cache_dtype": "fp8_e4m3"}


def test_a_capable_route_has_no_verdict():
    d = POLICY.evaluate(FP8)
    assert d.ok and incapable(d) == [] and decision_json(d)["incapable"] == [] and warning_lines(d) == []


def test_a_users_incapable_backend_is_named_with_where_it_runs():
    d = POLICY.evaluate(dict(FP8, dsa_decode_backend="flashinfer_sparse_mla"))
    assert d.ok  # SGLang's start-up accepts it: its backend init refuses it later
    [route] = incapable(d)
    assert (route.phase, route.backend, route.source) == ("decode", "flashinfer_sparse_mla", "user")
    assert "runs decode only where (platform == cuda and sm_major == 12" in route.runs
    line = POLICY.doc.pos(("capabilities", "flashinfer_sparse_mla"), key=True)[0]
    assert route.capability == f"{POLICY.file}:{line}"
    assert route.gap and "admits flashinfer_sparse_mla" in route.gap  # the version's stated known gap
    assert decision_json(d)["incapable"] == [route.to_dict()]
    [warning] = warning_lines(d)
    assert warning.startswith("hisparse-router: policy dsa-backends@10 routes the decode phase to "
                              "flashinfer_sparse_mla, which cannot run this config")


def test_an_edited_default_that_cannot_run_is_named_with_its_rule(tmp_path):
    text = open(POLICY.file, encoding="utf-8").read().replace(
        "set: {prefill: flashmla_kv, decode: flashmla_kv}\n      log: \"HiSparse",
        "set: {prefill: flashmla_kv, decode: flashinfer_sparse_mla}\n      log: \"HiSparse", 1)
    folder = tmp_path / "dsa-backends"
    folder.mkdir()
    (folder / "v10.yaml").write_text(text, encoding="utf-8")
    d = engine.load_policy(str(folder / "v10.yaml")).evaluate(FP8)
    assert [(r.phase, r.backend, r.source, r.gap) for r in incapable(d)] == [
        ("decode", "flashinfer_sparse_mla", "hisparse-fp8", None)]


def test_a_refused_decision_routes_nothing():
    d = POLICY.evaluate({"enable_hisparse": True, "kv_cache_dtype": "bfloat16", "dsa_decode_backend": "flashmla_kv"})
    assert not d.ok and incapable(d) == [] and decision_json(d)["incapable"] == []


@pytest.mark.parametrize("command", ["evaluate", "explain"])
def test_text_and_json_say_so(command, capsys):
    flags = ["--kv-cache-dtype", "bfloat16", "--sm-major", "10", "--dsa-decode-backend", "fa3"]
    code, out, _ = run_cli(capsys, command, *flags)
    assert code == 0
    [line] = [x for x in out.splitlines() if x.startswith("  incapable: ")]
    assert line.startswith("  incapable: the decode phase goes to fa3, which cannot run this config: fa3 runs "
                           "decode only where (platform == cuda and sm_major in [8, 9])")
    code, out, _ = run_cli(capsys, command, *flags, "--format", "json")
    data = json.loads(out)
    decision = data["decision"] if command == "explain" else data
    assert [(r["phase"], r["backend"], r["source"]) for r in decision["incapable"]] == [("decode", "fa3", "user")]


def _stand_in(tmp_path):
    script = tmp_path / "launch_server.py"
    script.write_text("import sys\nprint('started', *sys.argv[1:])\n")
    return [sys.executable, str(script), "--model-path", "deepseek-ai/DeepSeek-V3.2", "--enable-hisparse",
            "--disable-radix-cache", "--kv-cache-dtype", "fp8_e4m3", "--dsa-decode-backend", "flashinfer_sparse_mla"]


def test_launch_refuses_an_incapable_route_unless_allowed(tmp_path):
    command = _stand_in(tmp_path)
    proc = run_process("launch", "--", *command)
    assert proc.returncode == 1 and "started" not in proc.stdout
    assert "  incapable: the decode phase goes to flashinfer_sparse_mla" in proc.stdout
    assert "SGLang was not started" in proc.stderr and "--allow-incapable" in proc.stderr
    proc = run_process("launch", "--allow-incapable", "--", *command)
    assert proc.returncode == 0 and proc.stdout.startswith("started --model-path"), proc.stderr


def test_a_record_of_an_incapable_route_replays(tmp_path, capsys):
    record = str(tmp_path / "r.jsonl")
    flags = ["--kv-cache-dtype", "bfloat16", "--sm-major", "10", "--dsa-decode-backend", "fa3"]
    assert run_cli(capsys, "evaluate", "--record", record, *flags)[0] == 0
    assert json.loads(open(record, encoding="utf-8").read())["decision"]["incapable"][0]["backend"] == "fa3"
    code, out, err = run_cli(capsys, "replay", record)
    assert code == 0 and "1 recorded decisions stay the same" in out, out + err
    (tmp_path / "bad.jsonl").write_text(open(record, encoding="utf-8").read().replace('"incapable":[{', '"incapable":[1,{'))
    code, out, err = run_cli(capsys, "replay", str(tmp_path / "bad.jsonl"))
    assert code == 2 and "decision.incapable: expected a list of objects" in out + err
