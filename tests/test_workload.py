"""`hisparse attend`: the end-to-end decode workload through the policy's backend."""
import json

import pytest
import torch

from helpers import run_cli
from kernels_bridge.workload import _next_picks

SMALL = ["--requests", "2", "--context", "640", "--top-k", "128", "--buffer-size", "256", "--steps", "3",
         "--heads", "64", "--format", "json"]


@pytest.mark.parametrize("dtype, backend, row_bytes", [("fp8_e4m3", "flashmla_kv", 656),
                                                       ("bfloat16", "flashmla_sparse", 1152)])
def test_routes_and_runs(capsys, dtype, backend, row_bytes):
    code, out, _ = run_cli(capsys, "attend", "--policy", "nsa-backends@2", "--kv-cache-dtype", dtype, *SMALL)
    assert code == 0
    r = json.loads(out)
    assert r["decision"]["decode_backend"] == backend
    assert r["provider"] in ("reference", "flashmla")
    assert r["memory"]["kv_bytes_per_token"] == row_bytes
    assert r["hot_buffer"]["buffer_bytes_per_request"] == (256 + 64) * row_bytes
    assert 0.0 < r["hot_buffer"]["hit_rate"] < 1.0
    assert set(r["latency_ms"]) == {"translate", "kernel", "total"}
    # FP8 costs a little accuracy; BF16 rows only the bf16 rounding of the output
    assert r["accuracy"]["cosine_min"] > (0.999 if dtype == "fp8_e4m3" else 0.99999)
    assert r["accuracy"]["max_abs_error_relative"] < (0.05 if dtype == "fp8_e4m3" else 0.01)


def test_reproducible_with_a_seed(capsys):
    runs = []
    for _ in range(2):
        code, out, _ = run_cli(capsys, "attend", "--policy", "nsa-backends@3", "--seed", "7", *SMALL)
        r = json.loads(out)
        runs.append((r["hot_buffer"], r["accuracy"]))
    assert runs[0] == runs[1]
    code, out, _ = run_cli(capsys, "attend", "--policy", "nsa-backends@3", "--seed", "8", *SMALL)
    assert json.loads(out)["accuracy"] != runs[0][1]


def test_a_pairing_the_policy_rejects_exits_1(capsys):
    code, out, _ = run_cli(capsys, "attend", "--policy", "nsa-backends@2", "--kv-cache-dtype", "bfloat16",
                           "--nsa-decode-backend", "flashmla_kv", *SMALL)
    assert code == 1
    assert out.startswith("REJECTED by nsa-backends@2: HiSparse with --kv-cache-dtype=bfloat16 requires "
                          "--nsa-decode-backend in ['flashmla_sparse'], but got flashmla_kv.")
    code, out, _ = run_cli(capsys, "attend", "--policy", "nsa-backends@1", "--kv-cache-dtype", "fp8_e4m3", *SMALL)
    assert code == 1 and "HiSparse requires bfloat16 KV cache" in out


@pytest.mark.parametrize("args, text", [
    (["--top-k", "100"], "--top-k 100"),
    (["--buffer-size", "200"], "--buffer-size 200: a multiple of 64"),
    (["--heads", "96"], "--heads 96"),
    (["--locality", "1.5"], "--locality 1.5"),
    (["--no-enable-hisparse", "--sm-major", "10", "--kv-cache-dtype", "fp8_e4m3"], "the policy chose 'trtllm'"),
])
def test_bad_workloads_exit_2(capsys, args, text):
    code, _, err = run_cli(capsys, "attend", "--policy", "nsa-backends@2", *SMALL, *args)
    assert code == 2 and text in err and "Traceback" not in err


def test_text_report(capsys):
    code, out, _ = run_cli(capsys, "attend", "--policy", "nsa-backends@2", *SMALL[:-2])
    assert code == 0
    assert "decode backend flashmla_sparse" in out and "hit rate" in out and "cosine min" in out


def test_picks_keep_the_locality_share_and_stay_in_range():
    g = torch.Generator().manual_seed(0)
    seq = torch.tensor([1000, 300])
    first = _next_picks(None, seq, 128, 0.75, g)
    assert first.shape == (2, 128)
    assert all(len(set(row.tolist())) == 128 for row in first)
    assert bool((first < seq.unsqueeze(1)).all())
    second = _next_picks(first, seq + 1, 128, 0.75, g)
    for a, b in zip(first.tolist(), second.tolist()):
        assert len(set(a) & set(b)) >= 96  # the kept share (fresh picks may add more)
        assert len(set(b)) == 128
