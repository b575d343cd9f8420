"""`hisparse evaluate` and `hisparse explain` as an operator uses them."""
import json

import pytest

from tests.helpers import run_cli, run_process

FP8 = ["--enable-hisparse", "--kv-cache-dtype", "fp8_e4m3", "--disable-radix-cache"]


def test_evaluate_text_accepted(capsys):
    code, out, _ = run_cli(capsys, "evaluate", *FP8)
    assert code == 0
    assert out.startswith("ACCEPTED by dsa-backends@")
    assert "prefill: flashmla_kv" in out and "decode:  flashmla_kv" in out
    assert "log: HiSparse enabled (fp8_e4m3)" in out


def test_evaluate_rejected_exit_1(capsys):
    code, out, _ = run_cli(capsys, "evaluate", "--policy", "dsa-backends@2", *FP8,
                           "--nsa-decode-backend", "flashmla_sparse")
    assert code == 1
    assert out.splitlines()[0] == ("REJECTED by dsa-backends@2: HiSparse with --kv-cache-dtype=fp8_e4m3 requires "
                                   "--nsa-decode-backend in ['flashmla_kv'], but got flashmla_sparse.")


def test_evaluate_json(capsys):
    code, out, _ = run_cli(capsys, "evaluate", "--policy", "dsa-backends@1", *FP8, "--format", "json")
    assert code == 1
    d = json.loads(out)
    assert d["ok"] is False
    # v1 defaults HiSparse to flashmla_sparse, then refuses the FP8 cache
    assert d["violations"][0]["message"].startswith("HiSparse requires bfloat16 KV cache, but got --kv-cache-dtype=fp8_e4m3")
    assert d["policy"]["version"] == 1


def test_boolean_negation_and_sm(capsys):
    code, out, _ = run_cli(capsys, "evaluate", "--policy", "dsa-backends@2", "--no-dsa-model", "--enable-hisparse",
                           "--format", "json")
    assert code == 1
    assert json.loads(out)["violations"][0]["check"] == "hisparse-dsa-model"
    code, out, _ = run_cli(capsys, "evaluate", "--policy", "dsa-backends@2", "--sm-major", "10", "--format", "json")
    d = json.loads(out)
    assert d["kv_cache_dtype"] == "fp8_e4m3" and d["nsa_decode_backend"] == "trtllm"


@pytest.mark.parametrize("argv, text", [
    (["--kv-cache-dtype", "fp8_e4m4"], "C502: kv-cache-dtype: 'fp8_e4m4' is not a valid value"),
    (["--sm-major", "ten"], "invalid int value"),
    (["--kv-cache-dtyp", "bf16"], "unrecognized arguments"),
    (["--policy", "dsa-backends@77"], "R601"),
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
    code, out, _ = run_cli(capsys, "evaluate", "--policy", "dsa-backends@2", "--batch", str(batch))
    assert code == 2
    rows = [json.loads(x) for x in out.splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0]["ok"] and rows[0]["nsa_decode_backend"] == "flashmla_kv"
    assert [r.get("error", {}).get("code") for r in rows] == [None, "C505", "C505", "C502", "C505", None]
    assert rows[5]["ok"] is False and rows[5]["violations"][0]["check"] == "hisparse-radix-cache"


def test_batch_flags_are_the_base(capsys, tmp_path):
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"kv_cache_dtype": "bfloat16"}\n{}\n')
    code, out, _ = run_cli(capsys, "evaluate", "--policy", "dsa-backends@2", "--enable-hisparse",
                           "--disable-radix-cache", "--kv-cache-dtype", "fp8_e4m3", "--batch", str(batch),
                           "--format", "text")
    assert code == 0
    assert out.splitlines() == ["line 1: ok prefill=flashmla_sparse decode=flashmla_sparse",
                                "line 2: ok prefill=flashmla_kv decode=flashmla_kv"]


def test_batch_from_stdin_process():
    proc = run_process("evaluate", "--policy", "dsa-backends@2", "--batch", "-",
                       stdin='{"enable_hisparse": true}\n{"sm_major": 10}\n')
    assert proc.returncode == 1
    rows = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [r["ok"] for r in rows] == [False, True]
    assert rows[1]["nsa_decode_backend"] == "trtllm"


def test_explain(capsys):
    code, out, _ = run_cli(capsys, "explain", "--policy", "dsa-backends@2", "--enable-hisparse",
                           "--nsa-decode-backend", "flashmla_sparse", "--disable-radix-cache")
    assert code == 0
    assert "1. resolve" in out and "2. defaults" in out and "3. checks" in out
    assert "backend-without-dtype (line" in out and "applied" in out
    assert "kv_cache_dtype = bfloat16" in out
    assert "hisparse-fp8 (line" in out and "skipped: enable_hisparse == true (yes); kv_cache_dtype == fp8_e4m3 (no)" in out
    assert "hisparse (line" in out and "CHOSEN" in out
    assert "decode stays flashmla_sparse (user)" in out
    assert "hisparse-backend-dtype [decode]" in out and "passed" in out
    assert out.rstrip().splitlines()[-1].startswith("  policy: dsa-backends@2")


def test_explain_stop_and_violation(capsys):
    code, out, _ = run_cli(capsys, "explain", "--policy", "dsa-backends@2", "--kv-cache-dtype", "fp8_e5m2")
    assert code == 1
    assert "dsa-dtype (line" in out and "STOP" in out
    assert "Evaluation stopped at dsa-dtype" in out
    code, out, _ = run_cli(capsys, "explain", "--policy", "dsa-backends@2", "--enable-hisparse")
    assert "hisparse-radix-cache (line" in out and "VIOLATED" in out


def test_console_help_process():
    proc = run_process("--help")
    assert proc.returncode == 0 and "evaluate" in proc.stdout
    proc = run_process("evaluate", "--help")
    assert proc.returncode == 0
    assert "--dsa-decode-backend BACKEND" in proc.stdout and "--no-dsa-model" in proc.stdout
    assert "--nsa-decode-backend" not in proc.stdout  # removed in the default policy's SGLang


def test_terminal_controls_are_escaped_in_text_and_json(capsys, tmp_path):
    from tests.helpers import minimal_text, write_policy

    text = minimal_text().replace("(SM{sm_major})", "(SM{sm_major}) \\e[2J\\rACCEPTED \\u202e\\x9b")
    path = write_policy(tmp_path, text)
    args = ["evaluate", "--policy", path, "--kv-cache-dtype", "fp8_e4m3", "--decode-backend", "flashmla_sparse"]
    code, out, _ = run_cli(capsys, *args)
    assert code == 1
    assert "\\x1b[2J\\x0dACCEPTED \\u202e\\x9b" in out
    assert not any(c in out for c in "\x1b\r\x9b\u202e")
    code, out, _ = run_cli(capsys, *args, "--format", "json")
    assert "\\u009b" in out and "\x9b" not in out and "\u202e" not in out
    assert json.loads(out)["violations"][0]["message"].endswith("\x1b[2J\rACCEPTED \u202e\x9b")


def test_progress_lines_suit_the_stream():
    import io

    from engine.progress import Progress

    log = io.StringIO()
    p = Progress("step", 3, delay=0.0, every=0.0, stream=log)
    for done in (1, 2, 3):
        p(done)
    assert log.getvalue() == "step 1/3\nstep 2/3\nstep 3/3\n"  # whole lines: never "step 1/3step 2/3"

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    p = Progress("step", 2, delay=0.0, stream=tty)
    p(1)
    p(2)
    assert tty.getvalue() == "\rstep 1/2\rstep 2/2\n"
    quiet = io.StringIO()
    p = Progress("step", 2, delay=60.0, stream=quiet)
    p(1)
    p(2)
    assert quiet.getvalue() == ""  # a job that ends before the delay shows nothing


def test_every_option_of_every_engine_command_is_reserved(capsys, monkeypatch):
    """No policy input may take an engine command's own option as its flag (`hisparse check`
    refuses it with E309), so that a policy can never collide with a command's parser. The
    bridge's commands (attend, doctor) guard their own options: tests/test_attend_flags.py."""
    from engine.cli import commands as cli, options
    from engine.language.parts import RESERVED_FLAGS

    engine_commands = {name: run for name, (run, _) in cli.COMMANDS.items()
                       if run.__module__.startswith("engine.")}
    seen = {}
    real = options.Parser.parse_args

    def capture(self, *a, **k):
        seen[self.prog] = self
        raise SystemExit(0)

    monkeypatch.setattr(options.Parser, "parse_args", capture)
    for command, run in engine_commands.items():
        with pytest.raises(SystemExit):
            run(["a", "b"] if command == "diff" else [])
    monkeypatch.setattr(options.Parser, "parse_args", real)
    from engine.files.catalog import list_families

    refs = [f"dsa-backends@{v}" for v in list_families()["dsa-backends"]]
    policy_flags = {f for ref in refs for spec in __import__("engine").load_policy(ref).inputs.values()
                    for f in tuple(spec.flags) + tuple(spec.deprecated)}
    own = {o for parser in seen.values() for o in parser._option_string_actions
           if o.startswith("--") and not o.startswith("--no-")}
    assert len(seen) == len(engine_commands) >= 10
    missing = own - RESERVED_FLAGS - policy_flags
    assert not missing


def test_misspelt_flag_gets_did_you_mean(capsys):
    code, _, err = run_cli(capsys, "evaluate", "--kv-cache-dtpye", "fp8_e4m3")
    assert code == 2
    assert "unrecognized arguments: --kv-cache-dtpye (did you mean '--kv-cache-dtype'?)" in err
    code, _, err = run_cli(capsys, "table", "--were", "x=1")
    assert code == 2 and "did you mean '--where'?" in err


def test_a_reader_that_leaves_is_not_a_read_error(tmp_path):
    """--batch output into a pipe whose reader quits (| head): the command ends quietly with its
    verdict (tests/test_pipes.py), and never says the batch input could not be read."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    lines = tmp_path / "many.jsonl"
    lines.write_text('{"enable_hisparse": true}\n' * 20000)
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "evaluate", "--batch", str(lines)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1  # the lines are rejected (no --disable-radix-cache): still said
    assert json.loads(first)["line"] == 1
    assert "cannot read" not in err and "Traceback" not in err and "Exception ignored" not in err


def test_huge_integers_in_text_are_refused_by_name(capsys):
    big = "9" * 5000
    for argv, text in ((["evaluate", "--policy", "dsa-backends@" + big], "R601: no version 999"),
                       (["table", "--where", "sm_major=" + big], "--where sm_major='999"),
                       (["evaluate", "--sm-major", big], "invalid int value: '999")):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and text in err and "internal error" not in err
        assert len(err) < 600  # the number is clipped, not echoed whole


def test_whole_domain_operations_report_progress():
    import engine
    from engine.analysis.diff import PROGRESS_EVERY, diff
    from engine.analysis.table import routing_rows

    seen = []
    a, b = engine.load_policy("dsa-backends@1"), engine.load_policy("dsa-backends@2")
    result = diff(a, b, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (result["total"], result["total"])
    assert len(seen) == result["total"] // PROGRESS_EVERY + 1
    seen.clear()
    routing_rows(b, progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1] and all(d <= t for d, t in seen)
