"""Decision records: atomic appends under concurrent writers, and replay against another policy."""
import json
import multiprocessing as mp
import threading

import pytest

import engine
from engine.analysis.capability import decision_json
from engine.analysis.diff import diff
from engine.serving.records import append_records, replay
from tests.helpers import NSA_ALIASES, run_cli
from engine.analysis import domain

WRITERS, PER_WRITER = 6, 150


def _writer(path, seed):
    policy = engine.load_policy("dsa-backends@2")
    configs = list(domain.configs(policy))
    for i in range(PER_WRITER):
        # one record per call, like one `hisparse evaluate --record` per server start
        append_records(path, [policy.evaluate(configs[(seed * 997 + i * 31) % len(configs)])])


def _check_file(path, expected):
    with open(path, "rb") as fh:
        raw = fh.read()
    assert raw.endswith(b"\n")
    lines = raw.split(b"\n")[:-1]
    assert len(lines) == expected
    for line in lines:
        rec = json.loads(line)  # a mangled or interleaved line would not parse
        assert set(rec) == {"time", "policy", "input", "decision"}
        assert rec["time"].endswith("Z") and rec["policy"]["version"] == 2
        again = decision_json(engine.evaluate("dsa-backends@2", rec["input"]))
        assert again == rec["decision"]


def test_concurrent_processes_lose_and_mangle_nothing(tmp_path):
    path = str(tmp_path / "records.jsonl")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, k)) for k in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    _check_file(path, WRITERS * PER_WRITER)


def test_concurrent_threads(tmp_path):
    path = str(tmp_path / "records.jsonl")
    threads = [threading.Thread(target=_writer, args=(path, k)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _check_file(path, 4 * PER_WRITER)


@pytest.mark.parametrize("where, total", [pytest.param([], 12288, marks=pytest.mark.whole),
                                          (["enable_hisparse=true", "platform=cuda"], 12288 // 4)])
def test_replay_of_the_whole_domain_equals_diff(tmp_path, where, total):
    """Record every config (of a slice in make test) under v1, replay against v2: the same counts
    as diff v1 -> v2."""
    from engine.analysis.domain import parse_where

    path = str(tmp_path / "v1.jsonl")
    v1, v2 = engine.load_policy("dsa-backends@1"), engine.load_policy("dsa-backends@2")
    fixed = parse_where(v1, where)
    configs = [c for c in domain.configs(v1) if all(c[k] == v for k, v in fixed.items())]
    append_records(path, [v1.evaluate(c) for c in configs])
    result = replay(path, v2)
    assert result["total"] == total and not result["problems"]
    assert result["counts"] == diff(v1, v2, where=where or None)["counts"]
    assert replay(path, v1)["equivalent"]


def test_cli_record_and_replay(capsys, tmp_path):
    path = str(tmp_path / "r.jsonl")
    code, _, _ = run_cli(capsys, "evaluate", "--policy", "dsa-backends@1", "--enable-hisparse",
                         "--kv-cache-dtype", "fp8_e4m3", "--disable-radix-cache", "--record", path)
    assert code == 1
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"sm_major": 10}\nnot json\n')
    code, _, _ = run_cli(capsys, "evaluate", "--policy", "dsa-backends@1", "--batch", str(batch), "--record", path)
    assert code == 2
    with open(path) as fh:
        assert len(fh.readlines()) == 2  # the bad batch line is not recorded
    code, out, _ = run_cli(capsys, "replay", path, "--policy", "dsa-backends@2")
    assert code == 1
    assert "1 of 2 recorded decisions would change (newly_accepted 1)" in out
    code, out, _ = run_cli(capsys, "replay", path, "--policy", "dsa-backends@2", "--format", "json")
    assert json.loads(out)["counts"]["newly_accepted"] == 1
    with open(path, "a") as fh:
        fh.write("{broken\n")
    code, out, _ = run_cli(capsys, "replay", path, "--policy", "dsa-backends@1")
    assert code == 2 and ":3:1: C505" in out
    code, _, err = run_cli(capsys, "evaluate", "--record", str(tmp_path / "no" / "dir" / "r.jsonl"))
    assert code == 2 and "C504" in err


def test_a_record_keeps_the_spellings_so_replay_against_another_version_is_meaningful(capsys, tmp_path):
    """A v3 decision from --nsa-decode-backend (deprecated in v3, the name in v1) and a model
    path: replayed against v1 it is read as v1 reads it, never as an unknown key
    'dsa_decode_backend' or 'model_family' the user never typed."""
    path = str(tmp_path / "r.jsonl")
    code, _, _ = run_cli(capsys, "evaluate", "--policy", NSA_ALIASES, "--record", path, "--",
                         "python", "-m", "sglang.launch_server", "--model-path", "zai-org/GLM-5",
                         "--kv-cache-dtype", "bfloat16", "--nsa-decode-backend", "fa3", "--tp", "8")
    assert code == 0
    with open(path) as fh:
        rec = json.loads(fh.readline())
    assert rec["input"] == {"kv-cache-dtype": "bfloat16", "nsa-decode-backend": "fa3", "model-path": "zai-org/GLM-5"}
    assert rec["decision"]["model_family"] == "glm5"
    result = replay(path, engine.load_policy("dsa-backends@1"))
    assert result["problems"] == [] and result["counts"]["newly_rejected"] == 0, result
    assert result["equivalent"] or all(g["class"] == "log_changed" for g in result["groups"]), result
    code, out, _ = run_cli(capsys, "replay", path, "--policy", "dsa-backends@1")
    assert "unknown config key" not in out and "invalid config" not in out, out


def test_replay_reads_options_and_model_paths_as_the_other_version_does(tmp_path):
    """--hisparse-config recorded under v2 (which does not read it) counts when replayed on v3."""
    path = str(tmp_path / "r.jsonl")
    v2, v3 = engine.load_policy("dsa-backends@2"), engine.load_policy("dsa-backends@8")
    from engine.sglang.given import combine
    from engine.sglang.layers import read_layer

    given = {"model-path": "deepseek-ai/DeepSeek-V3.2", "enable-hisparse": True, "disable-radix-cache": True,
             "hisparse-config": '{"device_buffer_size": 512}'}
    g = combine(v2, [read_layer(v2, given)])
    append_records(path, [v2.evaluate(g.config)], [g.given])
    result = replay(path, v3)
    assert result["counts"]["newly_rejected"] == 1 and not result["problems"]
    assert "device_buffer_size (512)" in result["groups"][0]["example"]["now"]


class _Full:
    """os.write that writes part of what it is given, then fails as a full disk does."""

    def __init__(self, real, part):
        self.real, self.part, self.calls = real, part, 0

    def __call__(self, fd, data):
        self.calls += 1
        if self.calls == 1:
            return self.real(fd, bytes(data[: self.part]))
        raise OSError(28, "No space left on device")


def test_a_failed_append_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    from engine.serving import records

    path = str(tmp_path / "r.jsonl")
    policy = engine.load_policy("dsa-backends@2")
    append_records(path, [policy.evaluate({})])
    before = open(path, "rb").read()
    monkeypatch.setattr(records, "_write", _Full(records.os.write, 37))
    with pytest.raises(engine.ConfigError, match="No space left on device \\(nothing was appended\\)"):
        append_records(path, [policy.evaluate({"sm_major": 10})])
    assert open(path, "rb").read() == before
    monkeypatch.setattr(records, "_write", records.os.write)
    append_records(path, [policy.evaluate({"sm_major": 10})])
    assert [json.loads(line)["input"] for line in open(path)] == [{}, {"sm_major": 10}]


def test_a_torn_last_line_is_never_glued_to_and_replay_reports_it(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    policy = engine.load_policy("dsa-backends@2")
    append_records(str(path), [policy.evaluate({})])
    whole = path.read_bytes()
    path.write_bytes(whole + whole[:50])  # an older writer died half-way through a record
    append_records(str(path), [policy.evaluate({"sm_major": 10})])
    lines = path.read_bytes().split(b"\n")
    assert lines[1] == whole[:50] and json.loads(lines[2])["input"] == {"sm_major": 10}
    result = replay(str(path), policy)
    assert result["total"] == 2 and result["equivalent"]
    (problem,) = result["problems"]
    assert (problem["line"], problem["code"]) == (2, "C505") and "not a JSON record" in problem["message"]
    path.write_bytes(whole + "{\"input\": {\"é\"".encode()[:-2])  # torn inside a UTF-8 character too
    code, out, _ = run_cli(capsys, "replay", str(path), "--policy", "dsa-backends@2")
    assert code == 2 and "all 1 recorded decisions stay the same" in out
    assert f"{path}:2:1: C505: torn record: the file ends inside this line, without its newline" in out


RLIMIT_CHILD = """
import resource, sys
import engine
from engine.serving.records import append_records
path, limit = sys.argv[1], int(sys.argv[2])
policy = engine.load_policy("dsa-backends@2")
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    append_records(path, [policy.evaluate({"sm_major": 10})])
except engine.ConfigError as exc:
    print(exc)
    sys.exit(3)
"""


def test_a_file_size_limit_mid_append_leaves_no_torn_line(tmp_path):
    """RLIMIT_FSIZE in a child process: the kernel writes up to the limit, then refuses."""
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT

    path = str(tmp_path / "r.jsonl")
    policy = engine.load_policy("dsa-backends@2")
    append_records(path, [policy.evaluate({})])
    before = open(path, "rb").read()
    run = subprocess.run([sys.executable, "-c", RLIMIT_CHILD, path, str(len(before) + 40)], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert run.returncode == 3 and "cannot write the record file" in run.stdout, run.stdout + run.stderr
    assert open(path, "rb").read() == before
