"""Bad configs: through --config files, the API and --batch lines. Values keep their YAML/JSON
types (a string "true" is not a boolean, "10" is not an integer, and the error says so); unknown
keys and values get did-you-mean; every problem has a code and, from a file, its line:col; a bad
--batch line gets an error object on its own output line and every other line is evaluated."""
import json
import os
import subprocess
import sys
import tracemalloc

import pytest

import engine
from tests.helpers import ROOT, run_cli, run_process

V2 = "dsa-backends@2"
GOOD = {"enable_hisparse": True, "kv_cache_dtype": "fp8_e4m3", "disable_radix_cache": True}


def write(tmp_path, name, data):
    path = tmp_path / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return str(path)


# -- config files ---------------------------------------------------------------------------------
@pytest.mark.parametrize("line, code, text", [
    ('enable-hisparse: "true"', "C503", "got a string 'true' (strings are not booleans: write true or false "
                                        "without quotes)"),
    ("enable-hisparse: yes", None, None),  # YAML 1.1: a boolean, as SGLang's YAML reader reads it
    ("enable-hisparse: 1", "C503", "expected true or false, got an integer 1"),
    ('sm-major: "10"', "C503", "got a string '10' (strings are not integers: write the number without quotes)"),
    ("sm-major: 10.0", "C503", "expected an integer, got a number 10.0"),
    ("sm-major: true", "C503", "expected an integer, got a boolean true"),
    ("sm-major: 123456789012345678901234567890", "E112", "does not fit in 64 bits"),
    ("kv-cache-dtype: 8", "C503", "expected one of auto, bf16, bfloat16, fp8_e4m3, fp8_e5m2, fp4_e2m1, got an "
                                  "integer 8"),
    ("kv-cache-dtype: [fp8_e4m3]", "C503", "got a list ['fp8_e4m3']"),
    ("kv-cache-dtype: {fp8: e4m3}", "C503", "got a mapping {'fp8': 'e4m3'}"),
    ("kv-cache-dtype: null", "C503", "got null"),
    ("kv-cache-dtype: fp8_e4m4", "C502", "'fp8_e4m4' is not a valid value; one of auto, bf16, bfloat16, fp8_e4m3, "
                                         "fp8_e5m2, fp4_e2m1 (did you mean 'fp8_e4m3'?)"),
    ("kv-cache-dtype: FP8_E4M3", "C502", "(did you mean 'fp8_e4m3'?)"),
    ("nsa-decode-backend: flashmla", "C502", "did you mean one of 'flashmla_sparse', 'flashmla_kv', "
                                             "'flashmla_auto'?"),
    ("kv-cache-dtyp: fp8_e4m3", "C501", "unknown config key 'kv-cache-dtyp' (did you mean 'kv-cache-dtype'?)"),
    ("disable_radix_cach: true", "C501", "unknown config key 'disable_radix_cach' (did you mean "
                                         "'disable_radix_cache'?)"),
])
def test_config_file_values_keep_their_types(capsys, tmp_path, line, code, text):
    path = write(tmp_path, "server.yaml", "model-path: deepseek-ai/DeepSeek-V3.2\n" + line + "\n")
    rc, out, err = run_cli(capsys, "evaluate", "--policy", V2, "--config", path, "--format", "json")
    if code is None:
        assert rc in (0, 1) and json.loads(out)["enable_hisparse"] is True
        return
    assert rc == 2 and out == ""
    (message,) = [x for x in err.splitlines() if not x.startswith("note:")]
    col = 1 if code != "E112" else 11
    assert message.startswith(f"{path}:2:{col}: {code}: "), message
    assert text in message, message


def test_every_config_file_problem_at_once(capsys, tmp_path):
    path = write(tmp_path, "server.yaml", 'enable-hisparse: "true"\ntp: 8\nsm-major: "9"\nkv-cache-dtyp: x\n'
                                          "kv-cache-dtype: fp9\n")
    rc, _, err = run_cli(capsys, "evaluate", "--policy", V2, "--config", path)
    assert rc == 2
    assert [line.split(": ")[0].rsplit(":", 2)[1:] + [line.split(": ")[1]] for line in err.splitlines()] == [
        ["1", "1", "C503"], ["3", "1", "C503"], ["4", "1", "C501"], ["5", "1", "C502"]]


def test_unrelated_keys_are_ignored_with_a_note(capsys, tmp_path):
    path = write(tmp_path, "server.yaml", "tp: 8\nmodel-path: x\ntrust-remote-code: true\nenable-hisparse: true\n")
    rc, out, err = run_cli(capsys, "evaluate", "--policy", V2, "--config", path, "--format", "json")
    assert rc == 1 and json.loads(out)["enable_hisparse"] is True
    assert f"note: {path}: ignored 2 key(s) the policy does not read: tp, trust-remote-code" in err
    assert "note: cannot tell whether x uses DeepSeek Sparse Attention" in err  # model-path is read


@pytest.mark.parametrize("name, data, code, where, text", [
    ("tag.yaml", "enable-hisparse: !!python/object/apply:os.system [id]\n", "E106", (1, 18), "!!python/object"),
    ("alias.yaml", "a: &x true\nenable-hisparse: *x\n", "E107", (1, 4), "anchor '&x'"),
    ("merge.yaml", "<<: {enable-hisparse: true}\n", "E106", (1, 1), "merge keys"),
    ("deep.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n", "E108", (1, 67), "nesting deeper than 64"),
    ("tabs.yaml", "a:\n\tb: 1\n", "E104", (2, 1), "a tab"),
    ("dup.yaml", "tp: 1\ntp: 2\n", "E105", (2, 1), "duplicate key 'tp'"),
    ("latin1.yaml", b"model-path: caf\xe9\n", "E103", (1, 16), "not UTF-8"),
    ("nan.yaml", "sm-major: .nan\n", "E112", (1, 11), "not a finite number"),
    ("list.yaml", "- enable-hisparse\n", "C504", (1, 1), "holds a list"),
    ("scalar.yaml", "enable-hisparse\n", "C504", (1, 1), "holds a string"),
    ("deep.json", "[" * 100_000 + "]" * 100_000, "E108", (1, 65), "nesting deeper than 64"),
    ("deep-objects.json", '{"a":' * 70 + "1" + "}" * 70, "E108", (1, 321), "nesting deeper than 64"),
    ("bigint.json", '{"sm_major": ' + "9" * 5000 + "}", "E112", (1, 14), "limited to 64 characters"),
    ("int65.json", '{"sm_major": 18446744073709551616}', "E112", (1, 14), "does not fit in 64 bits"),
    ("nan.json", '{"tp": 1,\n "sm_major": NaN}', "E112", (2, 14), "NaN is not JSON"),
    ("inf.json", '{"sm_major": -Infinity}', "E112", (1, 14), "-Infinity is not JSON"),
    ("overflow.json", '{"sm_major": 1e999}', "E112", (1, 14), "not a finite number"),
    ("dup.json", '{"tp": 1,\n "tp": 2}', "E105", (2, 2), "duplicate key 'tp'"),
    ("surrogate.json", '{"model-path": "\\ud800"}', "E103", (1, 17), "lone surrogate"),
    ("syntax.json", '{"tp": 1,}', "E104", (1, 10), "JSON syntax"),
    ("list.json", "[1, 2]", "C504", (1, 1), "holds a list"),
    ("nul.json", b'{"tp": 1}\x00', "E103", (1, 10), "NUL"),
])
def test_hostile_config_files(capsys, tmp_path, name, data, code, where, text):
    path = write(tmp_path, name, data)
    rc, out, err = run_cli(capsys, "evaluate", "--policy", V2, "--config", path)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert err.splitlines() == [err.splitlines()[0]]
    assert err.startswith(f"{path}:{where[0]}:{where[1]}: {code}: ") and text in err, err


def test_oversized_config_file(capsys, tmp_path, monkeypatch):
    path = write(tmp_path, "big.yaml", "# x\n" * 5000)  # 20,000 bytes; the policy is about 11,000
    monkeypatch.setenv("HISPARSE_MAX_FILE_BYTES", "16000")
    rc, _, err = run_cli(capsys, "evaluate", "--policy", V2, "--config", path)
    assert rc == 2 and err.strip() == (f"{path}: E102: file is larger than the limit of 16000 bytes (raise the "
                                       "limit with HISPARSE_MAX_FILE_BYTES if this file is genuine)")


@pytest.mark.parametrize("limit", ["", "0", "-5", "1e6", "²", "lots"])
def test_a_bad_size_limit_setting_falls_back_to_the_default(monkeypatch, limit):
    from engine.files.reading import DEFAULT_MAX_BYTES, max_file_bytes

    monkeypatch.setenv("HISPARSE_MAX_FILE_BYTES", limit)
    assert max_file_bytes() == DEFAULT_MAX_BYTES


def test_bom_and_crlf_config_files_read_like_plain_ones(capsys, tmp_path):
    plain = {}
    for name, data in [("plain.json", b'{"enable_hisparse": true,\n "disable_radix_cache": true}\n'),
                       ("bom-crlf.json", b'\xef\xbb\xbf{"enable_hisparse": true,\r\n "disable_radix_cache": true}\r\n'),
                       ("bom-crlf.yaml", b"\xef\xbb\xbfenable-hisparse: true\r\ndisable-radix-cache: true\r\n")]:
        path = write(tmp_path, name, data)
        rc, out, _ = run_cli(capsys, "evaluate", "--policy", V2, "--config", path, "--format", "json")
        assert rc == 0
        plain.setdefault("want", json.loads(out))
        assert json.loads(out) == plain["want"]
    # positions stay right after a BOM and CRLF
    path = write(tmp_path, "bad.json", b'\xef\xbb\xbf{"enable_hisparse": true,\r\n "sm_major": "9"}\r\n')
    rc, _, err = run_cli(capsys, "evaluate", "--policy", V2, "--config", path)
    assert rc == 2 and err.startswith(f"{path}:2:2: C503: sm_major: expected an integer")


def test_config_from_a_pipe():
    """`--config /dev/stdin` (or `<(...)`): a pipe the operator names is read; policy files must be
    regular files, config files need not."""
    proc = run_process("evaluate", "--policy", V2, "--config", "/dev/stdin", "--format", "json",
                       stdin='{"enable_hisparse": true, "kv_cache_dtype": "fp8_e4m3", "disable_radix_cache": true}')
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["nsa_decode_backend"] == "flashmla_kv"


def test_a_bad_config_from_a_pipe_is_read_once(tmp_path):
    """A command looks at its config twice (for the model, then for the config). A pipe's bad
    content is refused with its error: the second look neither reopens the pipe (a FIFO whose writer
    left would wait forever, /dev/stdin would read as empty) nor loses the first error."""
    proc = run_process("evaluate", "--policy", V2, "--config", "/dev/stdin", stdin='{"kv_cache_dtype": 1}\n\x00\n')
    assert proc.returncode == 2 and "/dev/stdin:2:1: E103: binary data, not text" in proc.stderr, proc.stderr
    fifo = tmp_path / "config"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'wb').write(b'a: 1\\n\\x00\\n')"])
    try:
        proc = run_process("evaluate", "--policy", V2, "--config", str(fifo))
    finally:
        writer.wait(timeout=60)
    assert proc.returncode == 2 and "E103: binary data, not text" in proc.stderr, proc.stderr


@pytest.mark.parametrize("argv, code, text", [
    (["--config", "{missing}"], "C504", "cannot read file: No such file or directory"),
    (["--config", "{folder}"], "C504", "cannot read file: is a directory"),
    (["--batch", "{missing}"], "C504", "cannot read batch file: No such file or directory"),
    (["--batch", "{folder}"], "C504", "cannot read batch file: is a directory"),
    (["--policy", "{missing}"], "E101", "cannot read file: No such file or directory"),
    (["--policy", "dsa-backends@99"], "R601", "no version 99 of 'dsa-backends'"),
    (["--policy", "nsa-backend"], "R601", "no policy family 'nsa-backend' in policies (did you mean "
                                          "'dsa-backends'?)"),
])
def test_missing_files(capsys, tmp_path, argv, code, text):
    argv = [a.format(missing=tmp_path / "missing.yaml", folder=tmp_path) for a in argv]
    rc, out, err = run_cli(capsys, "evaluate", *argv)
    assert rc == 2 and out == "" and f"{code}: {text}" in err, err


# -- the API --------------------------------------------------------------------------------------
@pytest.mark.parametrize("config, code, text", [
    ({1: True}, "C501", "unknown config key 1"),
    ({None: True}, "C501", "unknown config key null"),
    ({("kv_cache_dtype",): "bf16"}, "C501", "unknown config key ('kv_cache_dtype',)"),
    ({"k" * 100_000: 1}, "C501", "(100002 characters)"),
    ({"kv_cache_dtype": "f" * 100_000}, "C502", "(100002 characters) is not a valid value"),
    ({"sm_major": 2 ** 70}, "C502", "1180591620717411303424 is outside the domain: integers are 64-bit"),
    ({"sm_major": 10 ** 5000}, "C502", "<an integer of 16610 bits> is outside the domain"),
    ({"sm_major": float("nan")}, "C503", "got a number nan"),
    ({"enable_hisparse": 1}, "C503", "got an integer 1"),
    ({"enable_hisparse": b"true"}, "C503", "got a bytes b'true'"),
    ({"kv_cache_dtype": ["fp8_e4m3"] * 10_000}, "C503", "characters)"),
    (None, "C504", "got null"),
    ("enable_hisparse=true", "C504", "got a string"),
])
def test_api_config_errors(config, code, text):
    with pytest.raises(engine.ConfigError) as info:
        engine.evaluate(V2, config)
    problem = info.value.problems[0]
    assert problem.code == code and text in problem.message, problem.message
    assert len(problem.message) < 300


# -- --batch ----------------------------------------------------------------------------------------
BATCH_LINES = [  # (raw line, expected error code or None for a decision)
    (json.dumps(GOOD).encode(), None),
    (b"not json", "C505"),
    (b"[1, 2]", "C505"),
    (b'"a string"', "C505"),
    (b"", "C505"),
    (b"   \t ", "C505"),
    (b'{"kv_cache_dtype": "fp9"}', "C502"),
    (b'{"enable_hisparse": "true"}', "C503"),
    (b'{"kv-cache-dtyp": "bf16"}', "C501"),
    (b'{"enable_hisparse": true, "kv_cache_dtype": "caf\xe9"}', "C505"),  # Latin-1, not UTF-8
    (b"\xff\xfe\x00{", "C505"),
    (b"[" * 5000 + b"]" * 5000, "C505"),
    (b'{"a": ' * 100 + b"1" + b"}" * 100, "C505"),
    (b'{"sm_major": NaN}', "C505"),
    (b'{"sm_major": 99999999999999999999}', "C505"),
    (b'{"sm_major": 10, "sm_major": 9}', "C505"),
    (b'{"kv_cache_dtype": "\\ud800"}', "C505"),
    (b'{"enable_hisparse": true}\r', None),  # CRLF line ending
    (b'{"sm_major": 10}', None),
]


def _batch_bytes(extra_long: bytes = b"") -> bytes:
    lines = [line for line, _ in BATCH_LINES]
    if extra_long:
        lines.insert(3, extra_long)
    return b"\n".join(lines) + b"\n"


def _check_rows(rows, with_long=False):
    expected = [code for _, code in BATCH_LINES]
    if with_long:
        expected.insert(3, "C505")
    assert [r["line"] for r in rows] == list(range(1, len(expected) + 1))
    assert [r["error"]["code"] if "error" in r else None for r in rows] == expected
    for row in rows:
        if "error" not in row:  # every good line is decided as it would be alone
            config = {k: row[k] for k in ("enable_hisparse", "kv_cache_dtype", "sm_major")}
            assert row["nsa_decode_backend"] == engine.evaluate(V2, config).backends["decode"]
        else:
            assert row["ok"] is False and row["error"]["message"]
    return rows


def test_batch_bad_lines_never_stop_the_others(capsys, tmp_path):
    path = write(tmp_path, "configs.jsonl", _batch_bytes())
    rc, out, err = run_cli(capsys, "evaluate", "--policy", V2, "--batch", path)
    assert rc == 2 and err == ""
    rows = _check_rows([json.loads(x) for x in out.splitlines()])
    messages = {r["line"]: r["error"]["message"] for r in rows if "error" in r}
    assert messages[2] == "not JSON: Expecting value at column 1"
    assert messages[3] == "a line holds one JSON object, got a list"
    assert messages[5] == messages[6] == "empty line (one JSON object per line)"
    assert messages[10] == "not UTF-8 text (byte 0xe9 at column 49)"
    assert messages[12] == "nesting deeper than 64 levels at column 65"
    assert messages[13] == "nesting deeper than 64 levels at column 385"
    assert messages[14] == "NaN is not JSON (NaN and infinities are not allowed) at column 14"
    assert messages[15] == "integer 99999999999999999999 does not fit in 64 bits at column 14"
    assert messages[16] == "duplicate key 'sm_major' at column 18"
    assert messages[17] == "not Unicode text: a lone surrogate escape \\ud800 at column 21"


def test_batch_text_format_is_aligned(capsys, tmp_path):
    path = write(tmp_path, "configs.jsonl", _batch_bytes())
    rc, out, _ = run_cli(capsys, "evaluate", "--policy", V2, "--batch", path, "--format", "text")
    lines = out.splitlines()
    assert rc == 2 and len(lines) == len(BATCH_LINES)
    for number, (line, (_, code)) in enumerate(zip(lines, BATCH_LINES), 1):
        assert line.startswith(f"line {number}: ")
        assert (f"ERROR {code}: " in line) if code else ("ERROR" not in line)


def test_batch_huge_line_is_skipped_in_bounded_memory(capsys, tmp_path, monkeypatch):
    huge = b'{"model": "' + b"x" * (8 << 20) + b'"}'  # 8 MiB on one line, limit 1 MiB
    path = write(tmp_path, "configs.jsonl", _batch_bytes(huge))
    tracemalloc.start()
    try:
        rc, out, _ = run_cli(capsys, "evaluate", "--policy", V2, "--batch", path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rows = _check_rows([json.loads(x) for x in out.splitlines()], with_long=True)
    assert rows[3]["error"]["message"] == "line longer than 1048576 bytes (HISPARSE_MAX_FILE_BYTES)"
    assert peak < 8 << 20, peak  # never the whole line: at most the limit plus a chunk
    # the limit is the one for files (the policy, about 11,000 bytes, must stay under it)
    monkeypatch.setenv("HISPARSE_MAX_FILE_BYTES", "16000")
    path = write(tmp_path, "configs.jsonl", _batch_bytes(b'{"model": "' + b"x" * 16000 + b'"}'))
    rc, out, _ = run_cli(capsys, "evaluate", "--policy", V2, "--batch", path)
    rows = _check_rows([json.loads(x) for x in out.splitlines()], with_long=True)
    assert rows[3]["error"]["message"] == "line longer than 16000 bytes (HISPARSE_MAX_FILE_BYTES)"


def test_batch_from_stdin_with_bad_bytes():
    """A pipe of bytes, as a script would send them: every line answered, in order."""
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "evaluate", "--policy", V2, "--batch", "-"],
                          input=_batch_bytes(b'{"x": "' + b"y" * (2 << 20) + b'"}'), capture_output=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stderr == b""
    _check_rows([json.loads(x) for x in proc.stdout.decode().splitlines()], with_long=True)


def test_batch_first_line_with_a_byte_order_mark(capsys, tmp_path):
    path = write(tmp_path, "configs.jsonl", b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\n{}\n")
    rc, out, _ = run_cli(capsys, "evaluate", "--policy", V2, "--batch", path)
    rows = [json.loads(x) for x in out.splitlines()]
    assert rc == 0 and [r["ok"] for r in rows] == [True, True]


def test_batch_output_with_characters_the_terminal_cannot_encode(tmp_path):
    """A message may quote text the output encoding cannot hold; it is escaped, never fatal."""
    path = write(tmp_path, "configs.jsonl", '{"kv_cache_dtype": "fp8_e4m3\u2603"}\n{}\n')
    env = dict(os.environ, PYTHONIOENCODING="ascii")
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "evaluate", "--policy", V2, "--batch", path],
                          capture_output=True, cwd=ROOT, env=env, timeout=120)
    rows = [json.loads(x) for x in proc.stdout.decode("ascii").splitlines()]
    assert proc.returncode == 2 and "internal error" not in proc.stderr.decode()
    assert rows[0]["error"]["code"] == "C502" and "\u2603" in rows[0]["error"]["message"]
    assert rows[1]["ok"] is True
