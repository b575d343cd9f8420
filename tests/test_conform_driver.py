"""engine.sglang.conform: the SGLang 0.5.23 driver on hand-picked cases whose outcome is read from
SGLang's source (the expected texts are SGLang's own), the runner (order, workers, progress,
crashes, Ctrl-C) on stand-in drivers, and how the installed SGLang is found.

The driver tests (those using the `driver` fixture) need SGLang 0.5.23 (`make install` installs
it): without it they skip, and fail under CI (tests/sglang_release.py)."""
from __future__ import annotations

import contextlib
import importlib.metadata
import io
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import types

import pytest

from engine.sglang.conform import drivers, runner
from engine.sglang.conform.machine import platform_facts
from engine.sglang.conform.model_folders import config_fields
from engine.sglang.conform.protocol import Case, Result
from tests.helpers import ROOT
from tests.sglang_release import require

H = ("--enable-hisparse", "--disable-radix-cache")
V32, GLM5, GLM5_NEXT, V3 = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM",
                            "Glm5NextForConditionalGeneration", "DeepseekV3ForCausalLM")
TRITON_ON_CUDA = ("The triton DSA backend is only supported on ROCm/HIP. Pick an alternative DSA "
                  "backend for CUDA (flashmla_kv on Hopper, trtllm on Blackwell).")


def case(argv, arch=V32, platform="cuda", cap=(9, 0), extra=()):
    return Case(argv=tuple(argv), architecture=arch, platform=platform, capability=cap,
                model_extra=tuple(extra))


@pytest.fixture(scope="module")
def driver():
    """The 0.5.23 driver, loaded; the test is skipped when SGLang 0.5.23 cannot be imported
    (asked here, not at collection: importing SGLang costs seconds)."""
    require("0.5.23", imported=True)
    from engine.sglang.conform import pipeline

    pipeline.load()
    return pipeline


def source_line(where: str) -> str:
    """The source text at a Result.where ("srt/x.py:LINE function")."""
    import sglang

    path, line = where.split(" ")[0].rsplit(":", 1)
    with open(os.path.join(os.path.dirname(sglang.__file__), path), encoding="utf-8") as fh:
        return fh.read().splitlines()[int(line) - 1]


# -- the driver on hand-picked cases ------------------------------------------------------------
def test_fp8_hisparse_on_hopper_gets_flashmla_kv(driver):
    r = driver.run_case(case(H + ("--kv-cache-dtype", "fp8_e4m3")))
    assert (r.ok, r.stage, r.message, r.error_type) == (True, "done", None, None)
    assert r.kv_cache_dtype == "fp8_e4m3" and r.backends == ("flashmla_kv", "flashmla_kv")
    assert r.log == ("HiSparse enabled (fp8_e4m3): using DSA backends prefill=flashmla_kv, "
                     "decode=flashmla_kv.",)


def test_triton_on_cuda_is_refused_before_the_backends_line(driver):
    r = driver.run_case(case(["--kv-cache-dtype", "bfloat16", "--dsa-prefill-backend", "triton"]))
    assert (r.ok, r.stage, r.error_type, r.message) == (False, "resolve", "ValueError", TRITON_ON_CUDA)
    assert r.where.startswith("srt/arg_groups/overrides.py:")
    assert r.where.endswith(" _check_dsa_backend_constraints")
    assert "raise ValueError" in source_line(r.where)
    assert not any(line.startswith("Set DSA backends") for line in r.log)
    # what was declared before the raise: the dtype; the prefill backend as given, decode unset
    assert r.kv_cache_dtype == "bfloat16" and r.backends == ("triton", None)


def test_lines_logged_before_a_raise_are_kept(driver):
    r = driver.run_case(case(["--dsa-prefill-backend", "triton"]))  # kv auto, SM90
    assert not r.ok and r.message == TRITON_ON_CUDA
    assert r.log[0].startswith("When specifying --dsa-prefill-backend or --dsa-decode-backend, "
                               "you should also explicitly set --kv-cache-dtype")
    assert r.log[1:] == ("Setting KV cache dtype to bfloat16 for DeepSeek DSA on SM9 device.",)
    assert r.kv_cache_dtype == "bfloat16"  # declared by the dtype step before the raise


def argparse_error(argv) -> str:
    """What SGLang's own prepare_server_args prints after "error: " for argv (exit status 2)."""
    from sglang.srt.server_args import prepare_server_args

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        prepare_server_args(list(argv))
    assert exc.value.code == 2
    last = err.getvalue().strip().splitlines()[-1]
    assert last.startswith("sglang serve: error: ")
    return last[len("sglang serve: error: "):]


@pytest.mark.parametrize("argv", [
    ["--nsa-prefill-backend", "flashmla_kv"],  # removed in 0.5.23: no alias, no notice
    ["--kv-cache-dtype", "fp4_e2m1"],
    ["--dsa-decode-backend", "triton_sparse_mla"],  # a prefill-only choice
])
def test_parser_errors_are_argparse_text(driver, argv):
    r = driver.run_case(case(argv))
    assert (r.ok, r.stage, r.error_type) == (False, "parser", "SystemExit")
    assert r.kv_cache_dtype is None and r.backends == (None, None) and r.log == ()
    assert r.message == argparse_error(["--model-path", "unused", *argv])
    if argv[0] == "--nsa-prefill-backend":
        assert r.message == "unrecognized arguments: --nsa-prefill-backend flashmla_kv"


def test_glm5_sm120_fp8_gets_flashinfer_and_the_literal_glm_line(driver):
    r = driver.run_case(case(["--kv-cache-dtype", "fp8_e4m3"], arch=GLM5, cap=(12, 0)))
    assert r.ok and r.backends == ("flashinfer_sparse_mla", "flashinfer_sparse_mla")
    assert r.log == ("Set DSA backends for GLM FP8 KV Cache on SM120/SM121: "
                     "prefill=flashinfer_sparse_mla, decode=flashinfer_sparse_mla.",)
    # the same arm names the default for both phases even when one is user-set
    r = driver.run_case(case(["--kv-cache-dtype", "fp8_e4m3", "--dsa-decode-backend", "trtllm"],
                             arch=GLM5, cap=(12, 0)))
    assert r.ok and r.backends == ("flashinfer_sparse_mla", "trtllm")
    assert "decode=flashinfer_sparse_mla." in r.log[0]


def test_glm5_next_on_sm120_is_not_glms_arm(driver):
    r = driver.run_case(case(["--kv-cache-dtype", "fp8_e4m3"], arch=GLM5_NEXT, cap=(12, 0)))
    assert r.ok and r.backends == ("trtllm", "trtllm")  # FP8 on SM >= 10
    assert r.log == ("Set DSA backends for fp8_e4m3 KV Cache: prefill=trtllm, decode=trtllm.",)


def test_glm5_next_with_the_radix_cache_on_resolves(driver):
    # index_kpool 4 in its config: page size 256, a divisor of the mamba track interval
    r = driver.run_case(case([], arch=GLM5_NEXT))
    assert r.ok and r.backends == ("flashmla_sparse", "fa3")


def test_hisparse_on_a_non_dsa_model_is_the_assertion(driver):
    r = driver.run_case(case(H, arch=V3))
    assert (r.ok, r.stage, r.error_type) == (False, "check", "AssertionError")
    assert r.message == ("--enable-hisparse is only supported for DSA (DeepSeek Sparse Attention) "
                         "models (e.g., DeepSeek V3.2, GLM-5), DeepSeek V4, and MiniMax M3 now. ")
    assert r.where.endswith(" validate_hisparse") and "assert" in source_line(r.where)
    assert r.log == () and r.backends == (None, None)  # no DSA routing for DeepSeek-V3


@pytest.mark.parametrize("config, message", [
    ('{"top_k": 2048, "device_buffer_size": 1024}',
     "device_buffer_size (1024) must be no smaller than top_k (2048)"),
    ('{"swap_in_block_size": 0}', "swap_in_block_size (0) must be in the range [1, 1024]"),
    ("{bad", "Failed to parse hisparse_config: Expecting property name enclosed in double quotes: "
             "line 1 column 2 (char 1)"),
])
def test_bad_hisparse_config_fails_at_model_start(driver, config, message):
    r = driver.run_case(case(H + ("--kv-cache-dtype", "fp8_e4m3", "--hisparse-config", config)))
    assert (r.ok, r.stage, r.error_type, r.message) == (False, "hisparse_config", "ValueError", message)
    assert r.where.endswith(" _parse_sparse_config")
    # everything before it ran: the backends and their line
    assert r.backends == ("flashmla_kv", "flashmla_kv") and r.log[-1].startswith("HiSparse enabled")


def test_hisparse_config_is_read_only_with_hisparse(driver):
    r = driver.run_case(case(["--kv-cache-dtype", "fp8_e4m3", "--hisparse-config", "{bad"]))
    assert r.ok and r.stage == "done"


def test_tilelang_fp8_needs_sm89(driver):
    argv = ["--kv-cache-dtype", "fp8_e4m3", "--dsa-prefill-backend", "tilelang",
            "--dsa-decode-backend", "tilelang"]
    r = driver.run_case(case(argv, cap=(8, 0)))
    assert (r.ok, r.stage, r.message) == (False, "resolve", "CUDA TileLang FP8 KV requires SM89 or newer.")
    r = driver.run_case(case(argv, cap=(9, 0)))
    assert r.ok and r.backends == ("tilelang", "tilelang")
    r = driver.run_case(case(argv[:4], cap=(9, 0)))  # decode would be flashmla_kv: mixed layouts
    assert r.message.startswith("CUDA TileLang FP8 KV requires both DSA backends to be tilelang")


def test_rocm_and_nvfp4(driver):
    r = driver.run_case(case([], platform="hip", cap=(9, 4)))
    assert r.ok and r.backends == ("triton", "triton") and r.kv_cache_dtype == "bfloat16"
    r = driver.run_case(case(H, platform="hip", cap=(9, 4)))
    assert r.ok and r.backends == ("tilelang", "tilelang")
    r = driver.run_case(case(["--kv-cache-dtype", "nvfp4"], arch=GLM5, cap=(12, 0)))
    assert (r.ok, r.error_type) == (False, "AssertionError")
    assert r.message == "DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype"
    assert r.kv_cache_dtype == "nvfp4"


def test_model_extra_reaches_the_config(driver):
    # the indexer fields on DeepSeek-V3's config make it a DSA model for SGLang
    argv = ["--kv-cache-dtype", "fp8_e4m3"]
    r = driver.run_case(case(argv, arch=V3, extra=(("index_topk", 2048),)))
    assert r.message == "'DeepseekV3Config' object has no attribute 'index_head_dim'"  # half a DSA config
    indexer = (("index_head_dim", 128), ("index_n_heads", 64), ("index_topk", 2048))
    r = driver.run_case(case(argv, arch=V3, extra=indexer))
    assert r.ok and r.backends == ("flashmla_kv", "flashmla_kv")
    # a nested field: GLM-5.3-Flash's text config, with transformers' index_kpool 16 back
    r = driver.run_case(case([], arch=GLM5_NEXT, extra=(("text_config", {"index_kpool": 16}),)))
    assert (r.ok, r.error_type, r.where.split(":")[0]) == (False, "AssertionError",
                                                          "srt/arg_groups/mamba_hook.py")
    with pytest.raises(ValueError, match="no model config for architecture 'Nope'; known: "):
        driver.run_case(case([], arch="Nope"))
    with pytest.raises(ValueError, match="unknown platform 'xpu'"):
        driver.run_case(case([], platform="xpu"))


HAND_PICKED = [
    case(H + ("--kv-cache-dtype", "fp8_e4m3")),
    case(["--dsa-prefill-backend", "triton"]),
    case(["--nsa-prefill-backend", "flashmla_kv"]),
    case(["--kv-cache-dtype", "fp8_e4m3"], arch=GLM5, cap=(12, 0)),
    case(["--kv-cache-dtype", "fp8_e4m3"], arch=GLM5_NEXT, cap=(12, 0)),
    case(H, arch=V3),
    case(H + ("--hisparse-config", '{"device_buffer_size": 8}')),
    case(["--kv-cache-dtype", "fp8_e4m3", "--dsa-prefill", "tilelang", "--dsa-decode", "tilelang"],
         cap=(8, 0)),
    case([], platform="hip", cap=(9, 4)),
    case(["--kv-cache-dtype", "auto"], cap=(10, 0)),
]


def test_cases_do_not_leak_into_each_other(driver):
    import torch

    env, available = dict(os.environ), torch.cuda.is_available()
    forward = [driver.run_case(c) for c in HAND_PICKED]
    backward = [driver.run_case(c) for c in reversed(HAND_PICKED)][::-1]
    assert forward == backward
    assert dict(os.environ) == env  # the DSA step's SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD too
    assert torch.cuda.is_available() == available


def test_the_fields_memo_changes_no_result(driver):
    memo = driver._STATE.fields
    with_memo = [driver.run_case(c) for c in HAND_PICKED]
    memo.enable(False)
    try:
        without = [driver.run_case(c) for c in HAND_PICKED]
    finally:
        memo.enable(True)
    assert with_memo == without


def test_the_parse_is_prepare_server_args(driver):
    import msgspec
    from sglang.srt.server_args import prepare_server_args

    root = logging.getLogger()
    saved = root.level, list(root.handlers)
    try:
        for argv in (["--model-path", "m", "--enable-hisparse", "--dsa-prefill", "flashmla_kv"],
                     ["--model-path", "m", "--radix-eviction-policy=lru", "--tp", "8"]):
            ours, theirs = driver._parse(list(argv)), prepare_server_args(list(argv))
            assert msgspec.structs.asdict(ours) == msgspec.structs.asdict(theirs)
            assert ours._launch_command == theirs._launch_command
    finally:  # prepare_server_args reconfigures the root logger (basicConfig(force=True))
        root.handlers[:] = saved[1]
        root.setLevel(saved[0])


def test_sglang_logs_nothing_to_the_host_during_a_case(driver, caplog):
    with caplog.at_level(logging.INFO):
        r = driver.run_case(case(H + ("--kv-cache-dtype", "fp8_e4m3")))
    assert r.log and not [rec for rec in caplog.records if rec.name.startswith("sglang")]


def test_forked_workers_give_the_in_process_results(driver):
    cases = HAND_PICKED * 3
    assert runner.run_cases(driver, cases, workers=2) == runner.run_cases("0.5.23", cases, workers=0)


def test_installed_sglang_finds_the_driver(driver):
    version, reason = drivers.installed_sglang()
    assert version == "0.5.23" and "engine.sglang.conform.pipeline" in reason
    assert drivers.resolve(None) is driver


# -- the runner on stand-in drivers (no SGLang needed) --------------------------------------------
def stand_in(run_case, loaded=None):
    return types.SimpleNamespace(VERSION="test", load=lambda: loaded.append(1) if loaded is not None
                                 else None, run_case=run_case)


def echo(c):
    time.sleep((hash(c.argv) % 5) / 2000)  # uneven work, so workers finish out of order
    return Result(ok=True, message=" ".join(c.argv), kv_cache_dtype=None, backends=(None, None),
                  log=(), stage="done")


CASES = [case([f"--n={i}"]) for i in range(97)]


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_results_come_back_in_input_order(workers):
    loaded = []
    results = runner.run_cases(stand_in(echo, loaded), CASES, workers=workers)
    assert [r.message for r in results] == [f"--n={i}" for i in range(97)]
    assert loaded == [1]  # loaded once, in the parent


def test_more_workers_than_cases_and_no_cases():
    assert [r.message for r in runner.run_cases(stand_in(echo), CASES[:2], workers=8)] == ["--n=0", "--n=1"]
    assert runner.run_cases(stand_in(echo), [], workers=2) == []


def test_workers_share_the_work(tmp_path):
    """Both workers run cases: a worker's first case waits (boundedly) until two have shown up, so a
    worker that starts late on a loaded machine still gets work, and one that never gets any fails
    the test rather than leaving it to timing."""
    def pid(c):
        mine = tmp_path / str(os.getpid())
        first = not mine.exists()
        mine.touch()
        for _ in range(200 if first else 0):  # a worker's first case waits, at most ~10 s
            if len(os.listdir(tmp_path)) >= 2:
                break
            time.sleep(0.05)
        return Result(ok=True, message=str(os.getpid()), kv_cache_dtype=None, backends=(None, None),
                      log=(), stage="done")
    pids = {r.message for r in runner.run_cases(stand_in(pid), CASES, workers=2)}
    assert len(pids) == 2 and str(os.getpid()) not in pids


def test_progress_on_a_pipe_is_whole_lines():
    out = io.StringIO()
    runner.run_cases(stand_in(echo), CASES, workers=2, progress=out)
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert 2 <= len(lines) <= 11  # one per 10% at most, and the last
    assert all(re.fullmatch(r"conform: \d+/97 launches \(\d+%\), \d+s.*", line) for line in lines)
    assert lines[-1].startswith("conform: 97/97 launches (100%)")


def test_progress_on_a_terminal_is_redrawn():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    clock = iter(range(1000)).__next__  # one second per reading: every update redraws
    out = Tty()
    bar = runner.launches_line(out, 3, clock=clock)
    for done in (1, 2, 3):
        bar(done)
    bar.close()
    text = out.getvalue()
    assert text.count("\r") == 4 and text.endswith("\n") and text.count("\n") == 1
    assert "eta" in text.split("\r")[1] and "3/3 launches (100%)" in text.split("\r")[-1]


def test_a_worker_crash_names_the_case():
    def crash(c):
        if c.argv == ("--n=41",):
            os._exit(3)
        return echo(c)
    with pytest.raises(runner.WorkerCrashed) as exc:
        runner.run_cases(stand_in(crash), CASES, workers=2)
    assert exc.value.index == 41 and exc.value.exitcode == 3
    assert str(exc.value) == ("conform worker died (exit code 3) on case 41: "
                              "DeepseekV32ForCausalLM on cuda SM90: --n=41")


def test_a_worker_killed_by_a_signal():
    def crash(c):
        if c.argv == ("--n=7",):
            os.kill(os.getpid(), signal.SIGKILL)
        return echo(c)
    with pytest.raises(runner.WorkerCrashed, match=r"killed by SIGKILL\) on case 7: "):
        runner.run_cases(stand_in(crash), CASES, workers=3)


def test_a_worker_killed_on_its_first_case_is_named_every_time():
    # the death races the parent, which may still be queueing chunks (the pool then refuses the
    # next one) and whose pool thread reaps and stops workers while the crash is looked into
    def crash(c):
        if c.argv == ("--n=0",):
            os.kill(os.getpid(), signal.SIGKILL)
        return echo(c)
    for _ in range(30):
        with pytest.raises(runner.WorkerCrashed) as exc:
            runner.run_cases(stand_in(crash), CASES, workers=3)
        assert (exc.value.index, exc.value.exitcode) == (0, -signal.SIGKILL)


def test_a_driver_that_raises_names_the_case():
    def bad(c):
        if c.argv == ("--n=5",):
            raise KeyError("boom")
        return echo(c)
    for workers in (0, 2):
        with pytest.raises(runner.DriverError, match=r"failed on case 5 \(.*--n=5\): KeyError: 'boom'"):
            runner.run_cases(stand_in(bad), CASES, workers=workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_case_that_hangs_stops_the_run_naming_it(workers, tmp_path):
    """SGLang stuck on one launch (a deadlock, a wait on a device) stops the run with the case
    named, by the timeout (the stuck launch never gets to its end), and leaves no worker behind."""
    ended = tmp_path / "the stuck launch ended"

    def stuck(c):
        if c.argv == ("--n=30",):
            time.sleep(30)  # "forever" to a 0.5 s timeout; bounded so that a regression fails, not hangs
            ended.touch()  # reached only when the timeout did not stop it
        return echo(c)
    with pytest.raises(runner.CaseTimedOut, match=r"more than 0.5 s on case 30 and was stopped .*--n=30") as exc:
        runner.run_cases(stand_in(stuck), CASES, workers=workers, case_timeout=0.5)
    assert exc.value.index == 30
    assert not ended.exists()
    if workers:
        import multiprocessing

        assert not multiprocessing.active_children()


def test_slow_cases_under_the_timeout_all_finish():
    """The clock is per case, not per run: many cases that each take a fraction of the timeout
    finish, on workers and in this process."""
    def slow(c):
        time.sleep(0.05)
        return echo(c)
    for workers in (0, 2):
        results = runner.run_cases(stand_in(slow), CASES[:24], workers=workers, case_timeout=0.3)
        assert [r.message for r in results] == [f"--n={i}" for i in range(24)]


def test_conform_reports_a_failed_launch_in_one_line(monkeypatch, capsys):
    """A crash, a driver error or a hang inside SGLang ends `hisparse conform` with its message and
    exit 2, never an internal error."""
    import engine.sglang.conform as conform_package
    from engine.cli.commands import main

    for exc in (runner.CaseTimedOut(3, CASES[3], 120.0), runner.WorkerCrashed(4, CASES[4], -9),
                runner.DriverError(5, CASES[5], "KeyError: 'boom'")):
        def fail(*args, exc=exc, **kwargs):
            raise exc
        monkeypatch.setattr(conform_package, "conform", fail)
        assert main(["conform", "--sample", "60", "--case-timeout", "120"]) == 2
        err = capsys.readouterr().err
        # before it, at most the line saying which policy version the installed SGLang has
        assert err.endswith(f"\nhisparse conform: {exc}\n") or err == f"hisparse conform: {exc}\n"
        assert len(err.splitlines()) <= 2 and "internal error" not in err
    assert main(["conform", "--case-timeout", "0"]) == 2
    assert "--case-timeout 0: from above 0 to 86400 seconds" in capsys.readouterr().err


def _slow_run(folder, cases: int, progress: str) -> str:
    """A script running `cases` slow launches on 2 workers, each worker leaving a file named by
    its pid in `folder`; `progress`: the run_cases keyword for the progress stream."""
    return textwrap.dedent(f"""
        import os, sys, time, types
        from engine.sglang.conform import runner
        from engine.sglang.conform.protocol import Case, Result
        def slow(c):
            with open(os.path.join({str(folder)!r}, str(os.getpid())), "w"):
                pass
            time.sleep(0.05)
            return Result(True, None, None, (None, None), (), "done")
        drv = types.SimpleNamespace(load=lambda: None, run_case=slow)
        cases = [Case(("--n=%d" % i,), "A", "cuda", (9, 0)) for i in range({cases})]
        runner.run_cases(drv, cases, workers=2{progress})
    """)


def test_ctrl_c_stops_the_workers(tmp_path):
    script = _slow_run(tmp_path, 2000, ", progress=sys.stdout")
    # Ctrl-C as at a terminal: SIGINT at its default in the child, even where this process was
    # started with it ignored (a background job), which Python would otherwise keep
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=ROOT),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert err.count("Traceback") == 1  # the parent's only: the workers ignore SIGINT
    for pid in map(int, os.listdir(tmp_path)):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_workers_end_when_the_parent_is_killed(tmp_path):
    """A parent killed outright (SIGKILL: no Ctrl-C handling, no cleanup) leaves no worker behind."""
    script = _slow_run(tmp_path, 4000, "")
    proc = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=ROOT))
    deadline = time.monotonic() + 60
    while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = [int(name) for name in os.listdir(tmp_path)]
    assert len(workers) == 2
    proc.kill()
    proc.wait(timeout=30)

    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                return fh.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
        except FileNotFoundError:
            return False
    deadline = time.monotonic() + 30  # a bound for a loaded machine, not a speed claim
    while any(map(alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if alive(pid)]
    for pid in left:  # a failing run leaves nothing behind either
        os.kill(pid, signal.SIGKILL)
    assert not left


# -- finding the driver ---------------------------------------------------------------------------
def test_unknown_version_names_the_known_ones():
    known = ", ".join(drivers.known_versions())
    assert known.startswith("0.5.11, 0.5.12, ") and known.endswith(", 0.5.23")
    with pytest.raises(drivers.UnknownVersion, match=re.escape(f"no conform driver for SGLang 0.4.9; "
                                                               f"drivers exist for {known}")):
        drivers.driver_for("0.4.9")
    with pytest.raises(drivers.UnknownVersion):
        runner.run_cases("0.4.9", CASES)


def test_sglang_not_installed(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "version", missing)
    version, reason = drivers.installed_sglang()
    assert version is None
    assert reason.startswith("SGLang is not installed in this Python: install it with `pip install "
                             "torch==2.13.0 'hisparse-router[conform]'`")
    assert "`pip install --no-deps sglang==0.5.23`" in reason and "make " not in reason  # a wheel user can run it
    with pytest.raises(RuntimeError, match="SGLang is not installed"):
        runner.run_cases(None, CASES)


def test_sglang_that_cannot_be_imported(monkeypatch):
    def import_sglang():
        raise ModuleNotFoundError("No module named 'msgspec'")
    monkeypatch.setitem(sys.modules, "fake_conform_driver",
                        types.SimpleNamespace(VERSION="9.9", import_sglang=import_sglang))
    monkeypatch.setitem(drivers.DRIVERS, "9.9", "fake_conform_driver")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.9")
    version, reason = drivers.installed_sglang()
    assert version is None
    assert reason.startswith("SGLang 9.9 is installed but cannot be imported (ModuleNotFoundError: "
                             "No module named 'msgspec'); install it in a Python 3.11 venv with pip: "
                             "`pip install torch==2.13.0`")
    # the hint is for the installed release, in pip commands, never another release's
    assert "`pip install --no-deps sglang==9.9`" in reason and "0.5.23" not in reason


def test_platform_facts_are_consistent():
    hopper, blackwell, sm120 = (platform_facts("cuda", cap) for cap in ((9, 0), (10, 0), (12, 1)))
    assert hopper["is_sm90"] and not hopper["is_blackwell"] and hopper["device_sm"] == 90
    assert blackwell["is_sm100"] and blackwell["is_sm100_or_sm110"] and blackwell["is_blackwell"]
    assert sm120["is_sm120"] and not sm120["is_sm100"] and sm120["device_capability"] == (12, 1)
    mi300 = platform_facts("hip", (9, 4))
    assert mi300["is_hip"] and not mi300["is_cuda"] and not any(
        v for k, v in mi300.items() if k.startswith("is_sm") or k == "is_blackwell")


def test_model_fields_merge_nested_defaults():
    indexer = {"index_kpool": 4, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32}
    assert config_fields(GLM5_NEXT) == {"text_config": indexer}
    assert config_fields(GLM5_NEXT, (("text_config", {"index_topk": 512}),)) == {
        "text_config": dict(indexer, index_topk=512)}
    assert config_fields(V3, (("index_topk", 2048),)) == {"index_topk": 2048}


def test_install_pins_agree():
    """The Makefile installs the SGLang release the driver runs, and the conform extra is pinned
    and free of anything that pulls a CUDA build."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        extra = tomllib.load(fh)["project"]["optional-dependencies"]["conform"]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][A-Za-z0-9.]*", req) for req in extra)
    names = {req.split("==")[0].lower() for req in extra}
    assert "transformers" in names and not names & {"torch", "sglang", "torchvision", "flashinfer-python"}
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as fh:
        makefile = fh.read()
    assert re.search(r"^SGLANG \?= sglang==0\.5\.23$", makefile, re.M)
    assert "--no-deps $$($(CONFORM_DEPS)) $(SGLANG)" in makefile
    assert drivers.DRIVERS["0.5.23"] == "engine.sglang.conform.pipeline"
