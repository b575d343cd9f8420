"""`hisparse attend`: the end-to-end decode workload through the policy's backend."""
import json

import pytest
import torch

from tests.helpers import run_cli
from kernels_bridge.workload import _next_picks

SMALL = ["--requests", "2", "--context", "640", "--hisparse-top-k", "128", "--hisparse-device-buffer-size",
         "256", "--steps", "3", "--heads", "64", "--format", "json"]


@pytest.mark.parametrize("dtype, backend, row_bytes", [("fp8_e4m3", "flashmla_kv", 656),
                                                       ("bfloat16", "flashmla_sparse", 1152)])
def test_routes_and_runs(capsys, dtype, backend, row_bytes):
    code, out, _ = run_cli(capsys, "attend", "--policy", "dsa-backends@2", "--kv-cache-dtype", dtype, *SMALL)
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
        code, out, _ = run_cli(capsys, "attend", "--policy", "dsa-backends@8", "--seed", "7", *SMALL)
        r = json.loads(out)
        runs.append((r["hot_buffer"], r["accuracy"]))
    assert runs[0] == runs[1]
    code, out, _ = run_cli(capsys, "attend", "--policy", "dsa-backends@8", "--seed", "8", *SMALL)
    assert json.loads(out)["accuracy"] != runs[0][1]


def test_a_pairing_the_policy_rejects_exits_1(capsys):
    code, out, _ = run_cli(capsys, "attend", "--policy", "dsa-backends@2", "--kv-cache-dtype", "bfloat16",
                           "--nsa-decode-backend", "flashmla_kv", *SMALL)
    assert code == 1
    assert out.startswith("REJECTED by dsa-backends@2: HiSparse with --kv-cache-dtype=bfloat16 requires "
                          "--nsa-decode-backend in ['flashmla_sparse'], but got flashmla_kv.")
    code, out, _ = run_cli(capsys, "attend", "--policy", "dsa-backends@1", "--kv-cache-dtype", "fp8_e4m3", *SMALL)
    assert code == 1 and "HiSparse requires bfloat16 KV cache" in out


@pytest.mark.parametrize("args, text", [
    (["--hisparse-top-k", "100"], "--hisparse-top-k 100"),
    (["--hisparse-device-buffer-size", "200"], "--hisparse-device-buffer-size 200: a multiple of 64"),
    (["--heads", "96"], "--heads 96"),
    (["--locality", "1.5"], "--locality 1.5"),
    (["--no-enable-hisparse", "--sm-major", "10", "--kv-cache-dtype", "fp8_e4m3"], "the policy chose 'trtllm'"),
])
def test_bad_workloads_exit_2(capsys, args, text):
    code, _, err = run_cli(capsys, "attend", "--policy", "dsa-backends@2", *SMALL, *args)
    assert code == 2 and text in err and "Traceback" not in err


def test_text_report(capsys):
    code, out, _ = run_cli(capsys, "attend", "--policy", "dsa-backends@2", *SMALL[:-2])
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


def test_one_set_of_knobs_with_sglangs_defaults(capsys):
    """top-k and buffer are the policy's --hisparse-config inputs (v3 declares them) or attend's
    own flags of the same names (v2 does not): defaults top-k 2048, buffer 2 x top-k."""
    tiny = ["--requests", "1", "--context", "2048", "--steps", "1", "--heads", "64", "--format", "json"]
    for ref in ("dsa-backends@8", "dsa-backends@2"):
        code, out, _ = run_cli(capsys, "attend", "--policy", ref, *tiny)
        assert code == 0
        w = json.loads(out)["workload"]
        assert (w["top_k"], w["buffer_size"]) == (2048, 4096)
        code, out, _ = run_cli(capsys, "attend", "--policy", ref, *tiny, "--hisparse-top-k", "1024")
        assert code == 0  # an explicit top-k is used, and the default buffer follows it
        w = json.loads(out)["workload"]
        assert (w["top_k"], w["buffer_size"]) == (1024, 2048)


def test_the_policy_checks_the_workload_it_runs(capsys):
    code, out, _ = run_cli(capsys, "attend", "--policy", "dsa-backends@8", *SMALL[:2],
                           "--hisparse-top-k", "512", "--hisparse-device-buffer-size", "256")
    assert code == 1
    assert out.startswith("REJECTED by dsa-backends@8: device_buffer_size (256) must be no smaller than top_k (512)")


def test_help_states_attends_own_defaults(capsys):
    with pytest.raises(SystemExit):
        run_cli(capsys, "attend", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "HiSparse is on" in text
    assert "--enable-hisparse, --no-enable-hisparse" in text
    after = text.split("--enable-hisparse, --no-enable-hisparse", 1)[1]
    assert "(default true)" in after.split("--", 1)[0]
    assert "--top-k " not in text and "--buffer-size " not in text


@pytest.mark.parametrize("args, flag", [
    (["--hisparse-device-buffer-size", "4194304"], "--requests x --hisparse-device-buffer-size"),
    (["--context", "4000000000"], "--requests x --context"),
    (["--requests", "100000000"], "--requests x --hisparse-top-k"),
])
def test_a_workload_past_the_memory_limit_is_refused_before_allocating(capsys, args, flag):
    code, _, err = run_cli(capsys, "attend", "--policy", "dsa-backends@2", *SMALL, "--max-memory", "1G", *args)
    assert code == 2
    assert err.startswith(f"hisparse attend: {flag}: this workload needs ")
    assert "the limit is 1.0 GiB (max_bytes)" in err


def test_max_memory_is_checked_and_a_missing_device_named(capsys):
    code, _, err = run_cli(capsys, "attend", "--policy", "dsa-backends@2", *SMALL, "--max-memory", "1MB")
    assert code == 2 and "the limit is 1.0 MiB" in err
    code, _, err = run_cli(capsys, "attend", "--policy", "dsa-backends@2", *SMALL, "--max-memory", "lots")
    assert code == 2 and "--max-memory 'lots'" in err
    if not torch.cuda.is_available():
        code, _, err = run_cli(capsys, "attend", "--policy", "dsa-backends@2", *SMALL, "--device", "cuda:1")
        assert code == 2 and "--device: cuda:1: CUDA is not available" in err
    code, _, err = run_cli(capsys, "attend", "--policy", "dsa-backends@2", *SMALL, "--device", "tpu")
    assert code == 2 and "--device: 'tpu' is not a device name" in err
