"""`hisparse attend --draft-tokens N`: speculative decoding's figures (SGLang 0.5.23's CLOCK kernel)
from a trace and from the synthetic workload are those of the independent transcription
(tests/oracles/sglang_hisparse_spec.py), step by step; a malformed speculative trace is refused
naming the line and the field."""
import json
import os

import pytest

from kernels_bridge.hot_buffer import HotBuffer
from tests.helpers import ROOT, run_cli
from tests.oracles.sglang_hisparse_spec import SpecCoordinator

EXAMPLE = os.path.join(ROOT, "examples", "decode-trace-mtp.jsonl")


def oracle_series(steps, N, K, B, admission="normal"):
    """steps: [(ids, committed lens, [n][N][K] rows, finished)] -> per step (copies, misses, lookups)."""
    R = max(r for ids, *_ in steps for r in ids) + 1
    S = max(L for _, lens, *_ in steps for L in lens) + N
    co = SpecCoordinator(R, S, B, 64, N, K)
    live, series = {}, []
    for ids, lens, rows, finished in steps:
        before = co.copies
        for r, L in zip(ids, lens):
            if r not in live:
                co.admit(r, L, direct=admission == "disaggregated")
            else:
                co.accept(r, L - live[r])
            live[r] = L
        co.verify(ids, rows)
        res = co.results
        series.append((co.copies - before, sum(x.misses for x in res), sum(x.lookups for x in res)))
        for r in finished:
            co.finish(r)
            live.pop(r)
    return series


def trace_steps(path):
    with open(path, encoding="utf-8") as fh:
        lines = [json.loads(t) for t in fh if t.strip()]
    return [([q["id"] for q in line["requests"]], [q["seq_len"] for q in line["requests"]],
             [q["top_k"] for q in line["requests"]], line.get("finished", [])) for line in lines]


@pytest.mark.parametrize("admission", ["normal", "disaggregated"])
def test_the_example_speculative_trace_replays_as_sglangs_code(capsys, admission):
    code, out, err = run_cli(capsys, "attend", "--trace", EXAMPLE, "--draft-tokens", "2", "--format", "json",
                             "--admission", admission, "--kv-cache-dtype", "fp8_e4m3")
    assert code == 0, err
    r = json.loads(out)
    t, h = r["trace"], r["hot_buffer"]
    assert (t["top_k"], t["buffer_size"], t["draft_tokens"], h["draft_tokens"]) == (1024, 2048, 2, 2)
    want = oracle_series(trace_steps(EXAMPLE), 2, 1024, 2048, admission)
    assert [(s["rows_copied"], s["misses"], s["lookups"]) for s in h["per_step"]] == want
    assert sum(w[0] for w in want) == h["rows_copied"] > 0
    assert h["rows_written"] == 2 * 2 * 3  # every step's drafts, on the device


def test_the_speculative_text_names_the_kernel(capsys):
    code, out, err = run_cli(capsys, "attend", "--trace", EXAMPLE, "--draft-tokens", "2", "--no-kernel")
    assert code == 0, err
    assert "SGLang 0.5.23 speculative CLOCK kernel, 2 draft tokens, normal admission" in out
    assert "12 draft tokens written on the device" in out


def test_the_synthetic_workload_with_drafts_is_sglangs(capsys, monkeypatch):
    """--no-kernel --draft-tokens 4: the steps the workload makes, given to the oracle, give the
    copies and misses attend reports."""
    seen = []
    real = HotBuffer.translate

    def recording(self, req_ids, seq_lens, positions):
        seen.append((req_ids.tolist(), seq_lens.tolist(), positions.tolist(), []))
        return real(self, req_ids, seq_lens, positions)

    monkeypatch.setattr(HotBuffer, "translate", recording)
    code, out, err = run_cli(capsys, "attend", "--no-kernel", "--draft-tokens", "4", "--hisparse-top-k", "1024",
                             "--hisparse-device-buffer-size", "1024", "--context", "3000", "--steps", "4",
                             "--locality", "0.5", "--format", "json")
    assert code == 0, err
    h = json.loads(out)["hot_buffer"]
    assert len(seen) == 4 and all(len(rows[0]) == 4 for _, _, rows, _ in seen)
    want = oracle_series(seen, 4, 1024, 1024)
    assert [(s["rows_copied"], s["misses"], s["lookups"]) for s in h["per_step"]] == want
    assert h["rows_copied"] > 0


@pytest.mark.parametrize("args, words", [
    (["--draft-tokens", "2"], "add --no-kernel"),
    (["--draft-tokens", "5", "--no-kernel"], "--draft-tokens 5: 2, 3 or 4"),
    (["--draft-tokens", "4", "--no-kernel", "--hisparse-top-k", "4096"],
     "--hisparse-top-k 4096: with --draft-tokens 4, at least 1024 and --draft-tokens x --hisparse-top-k at most 8192"),
    (["--draft-tokens", "2", "--no-kernel", "--hisparse-top-k", "512"], "--hisparse-top-k 512: with --draft-tokens 2"),
    (["--draft-tokens", "2", "--no-kernel", "--kernel-release", "0.5.12"], "models 0.5.23's CLOCK kernel"),
])
def test_workloads_sglangs_speculative_buffer_refuses(capsys, args, words):
    code, out, err = run_cli(capsys, "attend", "--kv-cache-dtype", "fp8_e4m3", *args)
    assert code == 2 and words in err, err


def _line(reqs, finished=None):
    line = {"requests": reqs}
    if finished is not None:
        line["finished"] = finished
    return json.dumps(line)


ROWS = [[5] * 1 + [-1] * 1023, [2000] + [-1] * 1023]


@pytest.mark.parametrize("lines, where, words", [
    ([_line([{"id": 0, "seq_len": 2000, "top_k": ROWS[0]}])], ":1: requests[0].top_k",
     "expected 2 lists of positions (one per draft token, --draft-tokens 2)"),
    ([_line([{"id": 0, "seq_len": 1998, "top_k": ROWS}])], ":1: requests[0].top_k[1][0]",
     "got 2000; expected -1 (padding) or a position 0 <= p < seq_len 2000"),
    ([_line([{"id": 0, "seq_len": 2000, "top_k": [ROWS[0], ROWS[1][:10]]}])], ":1: requests[0].top_k",
     "rows of 1024, 10 positions"),
    ([_line([{"id": 0, "seq_len": 2000, "top_k": ROWS}]), _line([{"id": 0, "seq_len": 2003, "top_k": ROWS}])],
     ":2: requests[0].seq_len", "2003 after request 0's 2000; a speculative step commits 1 to 2 drafts"),
])
def test_a_malformed_speculative_line_is_named(capsys, tmp_path, lines, where, words):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    code, out, err = run_cli(capsys, "attend", "--trace", str(path), "--draft-tokens", "2", "--no-kernel")
    assert code == 2, (out, err)
    assert f"{path}{where}: " in err and words in err, err


def test_a_trace_too_narrow_for_drafts_is_named(capsys, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(_line([{"id": 0, "seq_len": 300, "top_k": [[1, 2], [3, -1]]}]) + "\n")
    code, out, err = run_cli(capsys, "attend", "--trace", str(path), "--draft-tokens", "2", "--no-kernel",
                             "--hisparse-device-buffer-size", "1024")
    assert code == 2 and f"{path}: top_k: got 2; expected an int >= 1024" in err, err


def test_a_trace_with_an_unsupported_draft_count_is_refused_first(capsys):
    code, out, err = run_cli(capsys, "attend", "--trace", EXAMPLE, "--draft-tokens", "5")
    assert code == 2 and "--draft-tokens 5: 2, 3 or 4" in err, err
