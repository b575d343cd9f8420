"""`hisparse launch` runs the command it judged: a command given as one quoted string is split
as a shell would split it, and the words judged are the words run (not the whole string as a
program name). A stand-in `launch_server.py` prints what it was run with."""
import json
import sys

from tests.helpers import run_process

STAND_IN = """import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "policy": os.environ.get("HISPARSE_POLICY")}))
"""
ARGS = "--model-path deepseek-ai/DeepSeek-V3.2 --enable-hisparse --disable-radix-cache --kv-cache-dtype fp8_e4m3"


def _stand_in(tmp_path):
    script = tmp_path / "launch_server.py"  # a launcher name the reader knows
    script.write_text(STAND_IN)
    return f"{sys.executable} {script}"


def test_a_command_in_one_string_runs_as_its_words(tmp_path):
    proc = run_process("launch", "--", f"{_stand_in(tmp_path)} {ARGS} --tp 8")
    assert proc.returncode == 0, proc.stderr
    assert "accepts this launch" in proc.stderr
    ran = json.loads(proc.stdout)
    assert ran["argv"] == ARGS.split() + ["--tp", "8"] and ran["policy"] == "dsa-backends@10"


def test_a_command_in_words_runs_as_given(tmp_path):
    proc = run_process("launch", "--", *_stand_in(tmp_path).split(), *ARGS.split(), "--tp", "8")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["argv"] == ARGS.split() + ["--tp", "8"]


def test_a_quoted_value_inside_the_string_stays_one_word(tmp_path):
    config = '{"top_k": 2048}'
    proc = run_process("launch", "--", f"{_stand_in(tmp_path)} {ARGS} --hisparse-config '{config}'")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["argv"][-2:] == ["--hisparse-config", config]


def test_a_string_that_does_not_split_is_refused_before_anything_runs(tmp_path):
    proc = run_process("launch", "--", f"{_stand_in(tmp_path)} {ARGS} --tp '8")
    assert proc.returncode == 2 and "cannot split the launch command" in proc.stderr and proc.stdout == ""
