"""`hisparse attend`: the end-to-end decode workload through the policy's backend."""
import json

import pytest
import torch

from engine.files.shipped import DEFAULT_POLICY
from tests.helpers import run_cli
from kernels_bridge.workload import _next_picks

SMALL = ["--requests", "2", "--context", "640", "--hisparse-top-k", "128", "--hisparse-device-buffer-size",
         "256", "--steps", "3", "--heads", "64", "--format", "json"]


def small_with(args: list) -> list:
    """SMALL with `args` (FLAG VALUE ...) in place of its own values: an option given twice with
    different values is refused, so a test's value replaces SMALL's instead of following it."""
    small, rest = list(SMALL), []
    i = 0
    while i < len(args):
        flag = args[i]
        has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        if flag in small and has_value:
            small[small.index(flag) + 1] = args[i + 1]
        else:
            rest += args[i:i + 1 + has_value]
        i += 1 + has_value
    return small + rest


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
    (["--no-enable-hisparse", "--sm-major", "10", "--kv-cache-dtype", "fp8_e4m3"], "routes decode to trtllm"),
])
def test_bad_workloads_exit_2(capsys, args, text):
    code, _, err = run_cli(capsys, "attend", "--policy", "dsa-backends@2", *small_with(args))
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
    code, out, _ = run_cli(capsys, "attend", "--help")  # main returns argparse's exit code
    assert code == 0
    text = " ".join(out.split())
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
    code, _, err = run_cli(capsys, "attend", "--policy", "dsa-backends@2", *small_with(args), "--max-memory", "1G")
    assert code == 2
    assert err.startswith(f"hisparse attend: {flag}: this workload needs ")
    assert "the limit is 1.0 GiB (--max-memory)" in err and "max_bytes" not in err


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


BF16_ONLY = f"{DEFAULT_POLICY}@1"  # the first version: HiSparse on a BF16 cache only

# every argument is checked before torch is imported: one process, each bad command line in turn
BEFORE_TORCH = """
import json, sys
from kernels_bridge.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    out.append((main(["attend", *argv]), "torch" in sys.modules))
print(json.dumps(out))
"""


def test_bad_arguments_are_answered_before_torch_is_imported(tmp_path):
    import subprocess
    import sys

    from tests.helpers import ROOT

    cases = [["--requests", "0"], ["--context", "0"], ["--steps", "0"], ["--heads", "96"],
             ["--hisparse-top-k", "100"], ["--hisparse-top-k", "256", "--hisparse-device-buffer-size", "300"],
             ["--locality", "2"], ["--seed", "-1"], ["--device", "tpu"], ["--threads", "0"],
             ["--max-memory", "lots"], ["--requests", "4", "--max-memory", "1K"],
             ["--compare", "--kv-cache-dtype", "fp8_e4m3"]]
    proc = subprocess.run([sys.executable, "-c", BEFORE_TORCH, json.dumps(cases)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    results = json.loads(proc.stdout)
    assert [code for code, _ in results] == [2] * len(cases), proc.stderr
    assert not any(imported for _, imported in results), "torch was imported before the arguments were checked"
    assert proc.stderr.count("hisparse attend: ") == len(cases) and "Traceback" not in proc.stderr


def test_errors_name_the_flags_typed_and_the_default_derived_from_them(capsys):
    code, _, err = run_cli(capsys, "attend", "--hisparse-top-k", "100")
    assert code == 2
    assert "--hisparse-device-buffer-size 200" not in err  # a flag the user never typed
    assert "--hisparse-device-buffer-size is not given, and its default, 2 x --hisparse-top-k = 200, is not a " \
           "multiple of 64" in err
    code, _, err = run_cli(capsys, "attend", "--hisparse-top-k", "256", "--hisparse-device-buffer-size", "300")
    assert code == 2 and "--hisparse-device-buffer-size 300: a multiple of 64" in err


def test_a_context_shorter_than_top_k_picks_every_token(capsys):
    """As SGLang's indexer: a request shorter than top-k gets all its positions, padded with -1;
    the hot buffer and the kernels skip the padding, the reference too."""
    g = torch.Generator().manual_seed(0)
    seq = torch.tensor([50, 200])
    picks = _next_picks(None, seq, 128, 0.5, g)
    assert sorted(picks[0, :50].tolist()) == list(range(50)) and bool((picks[0, 50:] == -1).all())
    assert len(set(picks[1].tolist())) == 128 and bool((picks[1] >= 0).all())
    again = _next_picks(picks, seq + 1, 128, 0.5, g)
    assert sorted(again[0, :51].tolist()) == list(range(51)) and bool((again[0, 51:] == -1).all())
    for dtype in ("fp8_e4m3", "bfloat16"):
        code, out, err = run_cli(capsys, "attend", "--kv-cache-dtype", dtype, "--requests", "2", "--context", "60",
                                 "--hisparse-top-k", "128", "--steps", "2", "--heads", "64", "--format", "json")
        assert code == 0, err
        r = json.loads(out)
        assert r["workload"]["context"] == 60 and r["accuracy"]["cosine_min"] > 0.999
        assert r["hot_buffer"]["hits"] + r["hot_buffer"]["misses"] == 2 * (61 + 62)  # every token, each step


def test_compare_runs_one_workload_on_both_caches(capsys):
    code, out, err = run_cli(capsys, "attend", "--compare", *SMALL)
    assert code == 0, err
    runs = json.loads(out)["compare"]
    assert list(runs) == ["fp8_e4m3", "bfloat16"]
    fp8, bf16 = runs["fp8_e4m3"], runs["bfloat16"]
    assert (fp8["decision"]["decode_backend"], bf16["decision"]["decode_backend"]) == ("flashmla_kv", "flashmla_sparse")
    assert fp8["workload"] == bf16["workload"] and fp8["hot_buffer"]["hit_rate"] == bf16["hot_buffer"]["hit_rate"]
    assert (fp8["memory"]["kv_bytes_per_token"], bf16["memory"]["kv_bytes_per_token"]) == (656, 1152)
    assert bf16["accuracy"]["cosine_min"] > fp8["accuracy"]["cosine_min"] > 0.999  # FP8 costs a little
    code, out, _ = run_cli(capsys, "attend", "--compare", *SMALL[:-2])
    assert code == 0
    header = next(line for line in out.splitlines() if "fp8_e4m3" in line and "bfloat16" in line)
    for label in ("decode backend", "latency per step", "KV bytes per token", "cosine min vs float64"):
        row = next(line for line in out.splitlines() if line.strip().startswith(label))
        assert len(row.split()) > len(label.split()) + 1  # a value in both columns
    assert header.index("bfloat16") == next(line for line in out.splitlines()
                                            if "flashmla_sparse" in line).index("flashmla_sparse")
    code, out, _ = run_cli(capsys, "attend", "--compare", "--policy", BF16_ONLY, *SMALL)
    assert code == 1 and out.startswith(f"REJECTED by {BF16_ONLY} with --kv-cache-dtype=fp8_e4m3: ")


def test_the_workload_is_built_with_progress():
    import engine
    from kernels_bridge.workload import Workload, run

    calls = []
    decision = engine.evaluate(f"{DEFAULT_POLICY}@2", {"enable_hisparse": True, "kv_cache_dtype": "fp8_e4m3",
                                                  "disable_radix_cache": True})
    run(decision, Workload(2, 300, 64, 128, 256, 2), build_progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1] == (2 * 302 * 2, 2 * 302 * 2)  # the BF16 rows, then their FP8 rows
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_the_spec_knows_the_backends_the_bridge_runs():
    from kernels_bridge.dispatch import BACKENDS
    from kernels_bridge.workload_spec import TOPK_MULTIPLE

    assert tuple(TOPK_MULTIPLE) == BACKENDS
