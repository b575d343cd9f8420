"""Decision records: atomic appends under concurrent writers, and replay against another policy."""
import json
import multiprocessing as mp
import threading

import engine
from engine.diff import diff
from engine.records import append_records, replay
from helpers import run_cli

WRITERS, PER_WRITER = 6, 150


def _writer(path, seed):
    policy = engine.load_policy("nsa-backends@2")
    configs = list(policy.domain())
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
        again = engine.evaluate("nsa-backends@2", rec["input"]).to_dict()
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


def test_replay_of_the_whole_domain_equals_diff(tmp_path):
    """Record every config under v1, replay against v2: the same counts as diff v1 -> v2."""
    path = str(tmp_path / "v1.jsonl")
    v1, v2 = engine.load_policy("nsa-backends@1"), engine.load_policy("nsa-backends@2")
    append_records(path, [v1.evaluate(c) for c in v1.domain()])
    result = replay(path, v2)
    assert result["total"] == 12288 and not result["problems"]
    assert result["counts"] == diff(v1, v2)["counts"]
    assert replay(path, v1)["equivalent"]


def test_cli_record_and_replay(capsys, tmp_path):
    path = str(tmp_path / "r.jsonl")
    code, _, _ = run_cli(capsys, "evaluate", "--policy", "nsa-backends@1", "--enable-hisparse",
                         "--kv-cache-dtype", "fp8_e4m3", "--disable-radix-cache", "--record", path)
    assert code == 1
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"sm_major": 10}\nnot json\n')
    code, _, _ = run_cli(capsys, "evaluate", "--policy", "nsa-backends@1", "--batch", str(batch), "--record", path)
    assert code == 2
    with open(path) as fh:
        assert len(fh.readlines()) == 2  # the bad batch line is not recorded
    code, out, _ = run_cli(capsys, "replay", path, "--policy", "nsa-backends@2")
    assert code == 1
    assert "1 of 2 recorded decisions would change (newly_accepted 1)" in out
    code, out, _ = run_cli(capsys, "replay", path, "--policy", "nsa-backends@2", "--format", "json")
    assert json.loads(out)["counts"]["newly_accepted"] == 1
    with open(path, "a") as fh:
        fh.write("{broken\n")
    code, out, _ = run_cli(capsys, "replay", path, "--policy", "nsa-backends@1")
    assert code == 2 and ":3:2: C505: not a JSON record" in out  # the column of the syntax error
    code, _, err = run_cli(capsys, "evaluate", "--record", str(tmp_path / "no" / "dir" / "r.jsonl"))
    assert code == 2 and "C504" in err
