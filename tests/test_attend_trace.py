"""`hisparse attend --trace FILE` and `--no-kernel`: a decode trace replayed, and the synthetic
workload's books, give the copies, hits and device writes of the independent transcription of
SGLang's kernel and coordinator (tests/oracles/sglang_hisparse.py), per step and in total; a
malformed trace is refused naming the line and the field."""
import json
import os

import pytest
import torch

from tests.helpers import ROOT, run_cli
from tests.oracles.sglang_hisparse import Coordinator

EXAMPLE = os.path.join(ROOT, "examples", "decode-trace.jsonl")


def oracle_series(lines, top_k, buffer_size, release="0.5.23", admission="normal"):
    """Drive the oracle through trace lines (dicts): per step (copies, misses, writes, lookups)."""
    reqs = [r for line in lines for r in line["requests"]]
    R, S = max(r["id"] for r in reqs) + 1, max(r["seq_len"] for r in reqs)
    co = Coordinator(R, S, buffer_size, 64, release=release)
    live, series = set(), []
    for line in lines:
        ids = [r["id"] for r in line["requests"]]
        lens = [r["seq_len"] for r in line["requests"]]
        rows = [r["top_k"] for r in line["requests"]]
        before = (co.copies, co.misses, co.writes)  # a disaggregated admission's preload counts in its step
        for r, L in zip(ids, lens):
            if r not in live:
                co.admit(r, L - 1, direct=admission == "disaggregated")
                live.add(r)
        co.step(ids, lens, rows)
        lookups = sum(1 for L, row in zip(lens, rows) for j, p in enumerate(row)
                      if p >= 0 and (L > buffer_size or j < L))
        series.append((co.copies - before[0], co.misses - before[1], co.writes - before[2], lookups))
        for r in line.get("finished", []):
            co.finish(r)
            live.discard(r)
    return series


def read_lines(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(text) for text in fh if text.strip()]


@pytest.mark.parametrize("release", ["0.5.23", "0.5.12"])
@pytest.mark.parametrize("admission", ["normal", "disaggregated"])
def test_the_example_trace_replays_as_sglangs_code(capsys, release, admission):
    code, out, err = run_cli(capsys, "attend", "--trace", EXAMPLE, "--no-kernel", "--format", "json",
                             "--admission", admission, "--kernel-release", release)
    assert code == 0, err
    r = json.loads(out)
    lines = read_lines(EXAMPLE)
    t, h = r["trace"], r["hot_buffer"]
    assert (t["steps"], t["top_k"], t["buffer_size"]) == (len(lines), 64, 128)
    want = oracle_series(lines, 64, 128, release, admission)
    got = [(s["rows_copied"], s["misses"], s["rows_written"], s["lookups"]) for s in h["per_step"]]
    assert got == want
    assert [s["line"] for s in h["per_step"]] == list(range(1, len(lines) + 1))
    assert h["rows_copied"] == sum(w[0] for w in want) and h["misses"] == sum(w[1] for w in want)
    assert h["hits"] == h["lookups"] - h["misses"] and (h["release"], h["admission"]) == (release, admission)
    assert h["misses"] > 0 and h["rows_written"] > 0


def test_the_trace_text_gives_the_totals(capsys):
    code, out, err = run_cli(capsys, "attend", "--trace", EXAMPLE, "--no-kernel")
    assert code == 0, err
    h = json.loads(run_cli(capsys, "attend", "--trace", EXAMPLE, "--format", "json")[1])["hot_buffer"]
    assert f"hit rate {100 * h['hit_rate']:.2f}%, {h['rows_copied']} rows copied host -> device in 12 steps" in out
    assert "trace: " in out and "top-k 64" in out and "hot buffer 128 slots" in out


def test_a_trace_needs_no_kernel_and_no_kv(capsys, monkeypatch):
    from kernels_bridge import workload

    monkeypatch.setattr(workload, "_kv", lambda *a, **k: pytest.fail("KV built for a trace"))
    monkeypatch.setattr(workload, "attend", lambda *a, **k: pytest.fail("a kernel ran for a trace"))
    assert run_cli(capsys, "attend", "--trace", EXAMPLE)[0] == 0
    assert run_cli(capsys, "attend", "--no-kernel", "--requests", "1", "--steps", "2")[0] == 0


def test_attends_defaults_report_sglangs_copies(capsys):
    """At attend's defaults (2 requests x 4096 tokens, top-k 2048, buffer 4096, 8 steps) the books
    are the oracle's on the same picks: a warm buffer copies only the positions that left the
    reserved slot and were picked again."""
    from kernels_bridge.workload import _next_picks

    code, out, err = run_cli(capsys, "attend", "--no-kernel", "--format", "json")
    assert code == 0, err
    h = json.loads(out)["hot_buffer"]
    gen, picks, lines = torch.Generator().manual_seed(0), None, []
    for step in range(8):
        seq_lens = torch.full((2,), 4096 + step + 1, dtype=torch.int64)
        picks = _next_picks(picks, seq_lens, 2048, 0.7, gen)
        lines.append({"requests": [{"id": r, "seq_len": int(seq_lens[r]), "top_k": picks[r].tolist()}
                                   for r in range(2)]})
    want = oracle_series(lines, 2048, 4096)
    assert [(s["rows_copied"], s["misses"], s["rows_written"]) for s in h["per_step"]] == [w[:3] for w in want]
    assert h["lookups"] == 2 * 8 * 2048 and h["rows_copied"] == sum(w[0] for w in want) < 20
    assert h["hit_rate"] > 0.999


def _bad(tmp_path, *lines):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


GOOD = '{"requests": [{"id": 0, "seq_len": 90, "top_k": [1, 2, 3, -1]}]}'


@pytest.mark.parametrize("line, where, words", [
    ("not json", "line", "not JSON"),
    ("[1, 2]", "line", "expected an object"),
    ('{"requests": [], "extra": 1}', "extra", "unknown field"),
    ('{"requests": {}}', "requests", "expected a list of requests"),
    ('{"requests": [3]}', "requests[0]", "expected an object with id, seq_len, top_k"),
    ('{"requests": [{"id": 0, "seq_len": 91}]}', "requests[0].top_k", "missing"),
    ('{"requests": [{"id": 0, "seq_len": 91, "top_k": [1, 2, 3, 4], "x": 0}]}', "requests[0].x", "unknown field"),
    ('{"requests": [{"id": true, "seq_len": 91, "top_k": [1, 2, 3, 4]}]}', "requests[0].id", "expected an integer"),
    ('{"requests": [{"id": -1, "seq_len": 91, "top_k": [1, 2, 3, 4]}]}', "requests[0].id", "expected 0 <= id"),
    ('{"requests": [{"id": 0, "seq_len": 0, "top_k": [1, 2, 3, 4]}]}', "requests[0].seq_len", "expected 1 <= seq_len"),
    ('{"requests": [{"id": 0, "seq_len": 80, "top_k": [1, 2, 3, 4]}]}', "requests[0].seq_len", "below request 0's"),
    ('{"requests": [{"id": 0, "seq_len": 91, "top_k": [1, 2, 91, 4]}]}', "requests[0].top_k[2]", "< seq_len 91"),
    ('{"requests": [{"id": 0, "seq_len": 91, "top_k": [1, -2, 3, 4]}]}', "requests[0].top_k[1]", "-1 (padding)"),
    ('{"requests": [{"id": 0, "seq_len": 91, "top_k": [1, "2", 3, 4]}]}', "requests[0].top_k[1]", "an integer position"),
    ('{"requests": [{"id": 0, "seq_len": 91, "top_k": [1, 2, 3, 99999999999999999999999]}]}',
     "requests[0].top_k[3]", "< seq_len 91"),
    ('{"requests": [{"id": 0, "seq_len": 91, "top_k": [1, 2, 3]}]}', "requests[0].top_k", "every row of the trace"),
    ('{"requests": [{"id": 1, "seq_len": 9, "top_k": [1, 2]}, {"id": 1, "seq_len": 9, "top_k": [1, 2]}]}',
     "requests[0].top_k", "every row of the trace"),
    ('{"requests": [{"id": 1, "seq_len": 9, "top_k": [1, 2, 3, 4]}, {"id": 1, "seq_len": 9, "top_k": [1, 2, 3, 4]}]}',
     "requests[1].id", "already in this line"),
    ('{"requests": [], "finished": [5]}', "finished[0]", "request 5 is not running"),
    ('{"requests": [], "finished": 0}', "finished", "expected a list"),
])
def test_a_malformed_line_is_named_with_its_field(capsys, tmp_path, line, where, words):
    path = _bad(tmp_path, GOOD, "", line)
    code, out, err = run_cli(capsys, "attend", "--trace", path, "--no-kernel")
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith(f"hisparse attend: {path}:3: {where}: "), err
    assert words in err


@pytest.mark.parametrize("args, words", [
    (["--hisparse-top-k", "8"], "every row of the trace has the top-k's 8"),
    (["--hisparse-device-buffer-size", "100"], "a multiple of 64 and at least the trace's top-k (4)"),
    (["--compare"], "leave out --compare"),
])
def test_trace_options_the_trace_cannot_take(capsys, tmp_path, args, words):
    code, _, err = run_cli(capsys, "attend", "--trace", _bad(tmp_path, GOOD), *args)
    assert code == 2 and words in err, err


def test_unreadable_empty_and_huge_traces_are_refused(capsys, tmp_path, monkeypatch):
    code, _, err = run_cli(capsys, "attend", "--trace", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "missing.jsonl: cannot be read" in err
    code, _, err = run_cli(capsys, "attend", "--trace", _bad(tmp_path, "", ""))
    assert code == 2 and "no steps" in err
    huge = json.dumps({"requests": [{"id": 2000000, "seq_len": 1000000000, "top_k": list(range(64))}]})
    monkeypatch.setenv("HISPARSE_MEMORY_LIMIT", "64M")
    code, _, err = run_cli(capsys, "attend", "--trace", _bad(tmp_path, huge))
    assert code == 2 and "too many positions" in err and "Traceback" not in err


def test_repeats_that_corner_sglangs_kernel_are_named_at_their_line(capsys, tmp_path):
    lines = [json.dumps({"requests": [{"id": 0, "seq_len": 200, "top_k": [150, 150] + [-1] * 62}]})] * 63
    lines.append(json.dumps({"requests": [{"id": 0, "seq_len": 201, "top_k": [150] + list(range(63))}]}))
    code, _, err = run_cli(capsys, "attend", "--trace", _bad(tmp_path, *lines), "--hisparse-device-buffer-size", "64")
    assert code == 2 and f"bad.jsonl:64: positions:" in err and "repeated positions" in err, err
