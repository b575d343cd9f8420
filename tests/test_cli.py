"""`hisparse evaluate` and `hisparse explain` as an operator uses them."""
import json

import pytest

from helpers import run_cli, run_process

FP8 = ["--enable-hisparse", "--kv-cache-dtype", "fp8_e4m3", "--disable-radix-cache"]


def test_evaluate_text_accepted(capsys):
    code, out, _ = run_cli(capsys, "evaluate", *FP8)
    assert code == 0
    assert out.startswith("ACCEPTED by nsa-backends@")
    assert "prefill: flashmla_kv" in out and "decode:  flashmla_kv" in out
    assert "log: HiSparse enabled (fp8_e4m3)" in out


def test_evaluate_rejected_exit_1(capsys):
    code, out, _ = run_cli(capsys, "evaluate", "--policy", "nsa-backends@2", *FP8,
                           "--nsa-decode-backend", "flashmla_sparse")
    assert code == 1
    assert out.splitlines()[0] == ("REJECTED by nsa-backends@2: HiSparse with --kv-cache-dtype=fp8_e4m3 requires "
                                   "--nsa-decode-backend in ['flashmla_kv'], but got flashmla_sparse.")


def test_evaluate_json(capsys):
    code, out, _ = run_cli(capsys, "evaluate", "--policy", "nsa-backends@1", *FP8, "--format", "json")
    assert code == 1
    d = json.loads(out)
    assert d["ok"] is False
    # v1 defaults HiSparse to flashmla_sparse, then refuses the FP8 cache
    assert d["violations"][0]["message"].startswith("HiSparse requires bfloat16 KV cache, but got --kv-cache-dtype=fp8_e4m3")
    assert d["policy"]["version"] == 1


def test_boolean_negation_and_sm(capsys):
    code, out, _ = run_cli(capsys, "evaluate", "--policy", "nsa-backends@2", "--no-dsa-model", "--enable-hisparse",
                           "--format", "json")
    assert code == 1
    assert json.loads(out)["violations"][0]["check"] == "hisparse-dsa-model"
    code, out, _ = run_cli(capsys, "evaluate", "--policy", "nsa-backends@2", "--sm-major", "10", "--format", "json")
    d = json.loads(out)
    assert d["kv_cache_dtype"] == "fp8_e4m3" and d["nsa_decode_backend"] == "trtllm"


@pytest.mark.parametrize("argv, text", [
    (["--kv-cache-dtype", "fp8_e4m4"], "C502: kv-cache-dtype: 'fp8_e4m4' is not a valid value"),
    (["--sm-major", "ten"], "invalid int value"),
    (["--kv-cache-dtyp", "bf16"], "unrecognized arguments"),
    (["--policy", "nsa-backends@7"], "R601"),
])
def test_bad_usage_exit_2_without_traceback(capsys, argv, text):
    code, out, err = run_cli(capsys, "evaluate", *argv)
    assert code == 2
    assert text in err
    assert "Traceback" not in err + out


def test_unknown_command(capsys):
    code, _, err = run_cli(capsys, "evalute")
    assert code == 2 and "did you mean 'evaluate'?" in err


def test_config_file_yaml(capsys, tmp_path):
    cfg = tmp_path / "server.yaml"
    cfg.write_text("model-path: deepseek-ai/DeepSeek-V3.2\ntp: 8\nenable-hisparse: true\n"
                   "kv-cache-dtype: fp8_e4m3\ndisable_radix_cache: true\n")
    code, out, err = run_cli(capsys, "evaluate", "--config", str(cfg), "--format", "json")
    assert code == 0
    assert json.loads(out)["dsa_decode_backend"] == "flashmla_kv"
    assert "ignored 1 key(s) the policy does not read: tp" in err  # model-path is read: dsa_model
    # flags override the file
    code, out, _ = run_cli(capsys, "evaluate", "--config", str(cfg), "--kv-cache-dtype", "bfloat16", "--format", "json")
    assert json.loads(out)["dsa_decode_backend"] == "flashmla_sparse"


def test_config_file_near_miss_is_an_error(capsys, tmp_path):
    cfg = tmp_path / "server.yaml"
    cfg.write_text("enable-hisparse: true\nkv-cache-dtyp: fp8_e4m3\n")
    code, _, err = run_cli(capsys, "evaluate", "--config", str(cfg))
    assert code == 2
    assert f"{cfg}:2:1: C501: unknown config key 'kv-cache-dtyp' (did you mean 'kv-cache-dtype'?)" in err


def test_config_file_json_and_bad_files(capsys, tmp_path):
    cfg = tmp_path / "server.json"
    cfg.write_text(json.dumps({"enable_hisparse": True, "disable_radix_cache": True}))
    code, out, _ = run_cli(capsys, "evaluate", "--config", str(cfg), "--format", "json")
    assert code == 0 and json.loads(out)["dsa_decode_backend"] == "flashmla_sparse"
    cfg.write_text("[1, 2]")
    code, _, err = run_cli(capsys, "evaluate", "--config", str(cfg))
    assert code == 2 and "C504" in err
    code, _, err = run_cli(capsys, "evaluate", "--config", str(tmp_path / "missing.yaml"))
    assert code == 2 and "C504" in err and "cannot read file" in err


def test_batch_aligned_with_errors(capsys, tmp_path):
    lines = [
        json.dumps({"enable_hisparse": True, "kv_cache_dtype": "fp8_e4m3", "disable_radix_cache": True}),
        "not json",
        json.dumps([1]),
        json.dumps({"kv_cache_dtype": "fp9"}),
        "",
        json.dumps({"enable_hisparse": True}),
    ]
    batch = tmp_path / "configs.jsonl"
    batch.write_text("\n".join(lines) + "\n")
    code, out, _ = run_cli(capsys, "evaluate", "--policy", "nsa-backends@2", "--batch", str(batch))
    assert code == 2
    rows = [json.loads(x) for x in out.splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0]["ok"] and rows[0]["nsa_decode_backend"] == "flashmla_kv"
    assert [r.get("error", {}).get("code") for r in rows] == [None, "C505", "C505", "C502", "C505", None]
    assert rows[5]["ok"] is False and rows[5]["violations"][0]["check"] == "hisparse-radix-cache"


def test_batch_flags_are_the_base(capsys, tmp_path):
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"kv_cache_dtype": "bfloat16"}\n{}\n')
    code, out, _ = run_cli(capsys, "evaluate", "--policy", "nsa-backends@2", "--enable-hisparse",
                           "--disable-radix-cache", "--kv-cache-dtype", "fp8_e4m3", "--batch", str(batch),
                           "--format", "text")
    assert code == 0
    assert out.splitlines() == ["line 1: ok prefill=flashmla_sparse decode=flashmla_sparse",
                                "line 2: ok prefill=flashmla_kv decode=flashmla_kv"]


def test_batch_from_stdin_process():
    proc = run_process("evaluate", "--policy", "nsa-backends@2", "--batch", "-",
                       stdin='{"enable_hisparse": true}\n{"sm_major": 10}\n')
    assert proc.returncode == 1
    rows = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [r["ok"] for r in rows] == [False, True]
    assert rows[1]["nsa_decode_backend"] == "trtllm"


def test_explain(capsys):
    code, out, _ = run_cli(capsys, "explain", "--policy", "nsa-backends@2", "--enable-hisparse",
                           "--nsa-decode-backend", "flashmla_sparse", "--disable-radix-cache")
    assert code == 0
    assert "1. resolve" in out and "2. defaults" in out and "3. checks" in out
    assert "backend-without-dtype (line" in out and "applied" in out
    assert "kv_cache_dtype = bfloat16" in out
    assert "hisparse-fp8 (line" in out and "skipped: enable_hisparse == true (yes); kv_cache_dtype == fp8_e4m3 (no)" in out
    assert "hisparse (line" in out and "CHOSEN" in out
    assert "decode stays flashmla_sparse (user)" in out
    assert "hisparse-backend-dtype [decode]" in out and "passed" in out
    assert out.rstrip().splitlines()[-1].startswith("  policy: nsa-backends@2")


def test_explain_stop_and_violation(capsys):
    code, out, _ = run_cli(capsys, "explain", "--policy", "nsa-backends@2", "--kv-cache-dtype", "fp8_e5m2")
    assert code == 1
    assert "dsa-dtype (line" in out and "STOP" in out
    assert "Evaluation stopped at dsa-dtype" in out
    code, out, _ = run_cli(capsys, "explain", "--policy", "nsa-backends@2", "--enable-hisparse")
    assert "hisparse-radix-cache (line" in out and "VIOLATED" in out


def test_console_help_process():
    proc = run_process("--help")
    assert proc.returncode == 0 and "evaluate" in proc.stdout
    proc = run_process("evaluate", "--help")
    assert proc.returncode == 0
    assert "--dsa-decode-backend BACKEND" in proc.stdout and "--no-dsa-model" in proc.stdout
    assert "--nsa-decode-backend" not in proc.stdout  # removed in the default policy's SGLang
