"""engine.sglang.apply and resolution_step on SGLang 0.5.23's own ServerArgs, built by its own
prepare_server_args and resolved by its own pipeline (on a CPU machine, through the conform
driver's stand-ins for the GPU and the model); and the examples of docs/conform.md, run.

Skipped only when SGLang 0.5.23 is not importable (`make install` installs it)."""
from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys

import pytest

from engine.sglang import apply, resolution_step
from tests.helpers import ROOT
from tests.sglang_release import require



@pytest.fixture(scope="module", autouse=True)
def sglang_0523():
    """Skip the module when SGLang 0.5.23 cannot be imported (asked when the tests run, not at
    collection: importing SGLang costs seconds)."""
    require("0.5.23", imported=True)

V3 = "dsa-backends@8"
TILELANG_V3 = ("The tilelang DSA prefill/decode kernels only support an fp8_e4m3 KV cache on "
               "ROCm/HIP; on CUDA they require a bfloat16 KV cache. Use --kv-cache-dtype bfloat16, "
               "or keep --kv-cache-dtype fp8_e4m3 and pick an fp8-capable DSA backend (flashmla_kv "
               "on Hopper, trtllm on Blackwell).")
TILELANG = ["--kv-cache-dtype", "fp8_e4m3", "--dsa-prefill-backend", "tilelang",
            "--dsa-decode-backend", "tilelang"]
H = ["--enable-hisparse", "--disable-radix-cache"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from engine.sglang.conform import pipeline
    from engine.sglang.conform.model_folders import ModelFolders

    pipeline.import_sglang()
    return ModelFolders(str(tmp_path_factory.mktemp("models")))


@pytest.fixture
def sglang(models):
    """prepare_server_args(argv, arch), on a faked H100 for the test (a test nests another
    faked_gpu for another GPU), with what SGLang changes in the process (os.environ, the root
    logger) put back afterwards."""
    from engine.sglang.conform.machine import faked_gpu
    from sglang.srt.server_args import prepare_server_args

    env, root = dict(os.environ), logging.getLogger()
    saved = root.level, list(root.handlers)

    def build(argv, arch="DeepseekV32ForCausalLM"):
        return prepare_server_args(["--model-path", models.path(arch), *argv])

    with faked_gpu("cuda", (9, 0)):
        yield build
    os.environ.clear()
    os.environ.update(env)
    root.handlers[:] = saved[1]
    root.setLevel(saved[0])


@contextlib.contextmanager
def lines_of(name):
    """The messages logged on logger `name` (caplog cannot: prepare_server_args replaces the root
    logger's handlers)."""
    got = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: got.append(record.getMessage())
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield got
    finally:
        logger.removeHandler(handler)


def resolved(args):
    from sglang.srt.arg_groups.overrides import resolution_result

    return tuple(resolution_result(args, f) for f in ("kv_cache_dtype", "dsa_prefill_backend",
                                                        "dsa_decode_backend"))


def test_apply_before_resolution_declares_and_writes_no_field(sglang):
    args = sglang(H + ["--kv-cache-dtype", "fp8_e4m3"])
    with lines_of("sglang.srt.server_args") as lines:
        decision = apply(args, V3)
    assert decision.ok and decision.backends == {"prefill": "flashmla_kv", "decode": "flashmla_kv"}
    assert args._resolved_overrides == [("hisparse-router dsa-backends@8", {
        "dsa_prefill_backend": "flashmla_kv", "dsa_decode_backend": "flashmla_kv"})]
    assert args.dsa_prefill_backend is None and args.dsa_decode_backend is None  # the input, intact
    assert lines == [
        "HiSparse enabled (fp8_e4m3): using DSA backends prefill=flashmla_kv, decode=flashmla_kv."]
    args.resolve_once()  # SGLang keeps the declaration; its own DSA steps find the phases set
    args.check_server_args()
    assert resolved(args) == ("fp8_e4m3", "flashmla_kv", "flashmla_kv")
    assert args._raw_input["dsa_decode_backend"] is None


def test_apply_resolves_auto_from_the_gpu(sglang):
    from engine.sglang.conform.machine import faked_gpu

    args = sglang([], arch="GlmMoeDsaForCausalLM")
    with faked_gpu("cuda", (12, 0)):
        decision = apply(args, V3)  # read from torch.cuda as SGLang's DSA steps read it
    assert decision.config["sm_major"] == 12 and decision.config["model_family"] == "glm5"
    assert args._resolved_overrides[-1][1] == {"kv_cache_dtype": "fp8_e4m3",
                                               "dsa_prefill_backend": "flashinfer_sparse_mla",
                                               "dsa_decode_backend": "flashinfer_sparse_mla"}


def test_apply_refuses_with_sglangs_exception_types_and_declares_nothing(sglang):
    args = sglang(TILELANG)
    with pytest.raises(ValueError) as exc:
        apply(args, V3)
    assert type(exc.value) is ValueError and str(exc.value) == TILELANG_V3
    assert not getattr(args, "_resolved_overrides", None)
    # SGLang asserts these: the model check, the radix-cache check, the DSA dtype check
    for argv, arch, text in [
        (H, "DeepseekV3ForCausalLM", "--enable-hisparse is only supported for DSA"),
        (["--enable-hisparse"], "DeepseekV32ForCausalLM", "requires --disable-radix-cache"),
        (["--kv-cache-dtype", "fp8_e5m2"], "DeepseekV32ForCausalLM", "DeepSeek DSA only supports"),
    ]:
        with pytest.raises(AssertionError, match=re.escape(text)):
            apply(sglang(argv, arch=arch), V3)


def test_apply_reads_the_model_from_sglangs_model_config(sglang):
    # DeepSeek-V3 is in the DeepSeek family but has no indexer: not a DSA model
    decision = apply(sglang(["--kv-cache-dtype", "fp8_e4m3"], arch="DeepseekV3ForCausalLM"), V3)
    assert decision.config["dsa_model"] is False and decision.backends["decode"] is None


def test_apply_on_a_resolved_record_only_judges(sglang):
    args = sglang(H + ["--kv-cache-dtype", "fp8_e4m3"])
    args.resolve_once()
    stash = list(args._resolved_overrides)
    decision = apply(args, V3)
    assert decision.ok and decision.sources == {"prefill": "user", "decode": "user"}
    assert args._resolved_overrides == stash  # nothing declared, nothing assigned
    # SGLang 0.5.23 accepts tilelang/tilelang with FP8 on Hopper; dsa-backends@8 refuses it
    args = sglang(TILELANG)
    args.resolve_once()
    assert resolved(args) == ("fp8_e4m3", "tilelang", "tilelang")
    with pytest.raises(ValueError, match=re.escape(TILELANG_V3)):
        apply(args, V3)
    with pytest.raises(AttributeError, match="assigned after resolution"):
        args.dsa_decode_backend = "flashmla_kv"  # what the stand-in path would have done


@pytest.fixture
def dsa_passes():
    """set(step): SGLang's two DSA passes replaced by one step, as the docs show (set(None): its
    own again); put back after the test."""
    import sglang.srt.arg_groups.model_hook as model_hook

    saved = model_hook._dsa_kv_cache_dtype_default, model_hook._dsa_split_backend_resolution

    def use(step):
        model_hook._dsa_kv_cache_dtype_default, model_hook._dsa_split_backend_resolution = (
            saved if step is None else (step, lambda view: {}))
    yield use
    use(None)


@pytest.fixture
def policy_in_sglang(dsa_passes):
    dsa_passes(resolution_step(V3))


def test_resolution_step_routes_inside_sglangs_pipeline(sglang, policy_in_sglang):
    from engine.sglang.conform.machine import faked_gpu

    args = sglang(["--kv-cache-dtype", "fp8_e4m3"], arch="GlmMoeDsaForCausalLM")
    with faked_gpu("cuda", (12, 0)), lines_of("sglang") as lines:
        args.resolve_once()
    assert resolved(args) == ("fp8_e4m3", "flashinfer_sparse_mla", "flashinfer_sparse_mla")
    assert ("hisparse-router dsa-backends@8", {"dsa_prefill_backend": "flashinfer_sparse_mla",
                                               "dsa_decode_backend": "flashinfer_sparse_mla"}) \
        in args._resolved_overrides
    # the policy's line (SGLang 0.5.20's literal text), once: SGLang's own DSA passes do not run
    assert [line for line in lines if "GLM" in line] == ["Set DSA backends for GLM FP8 KV Cache on SM120/SM121: "
                     "prefill=flashinfer_sparse_mla, decode=flashinfer_sparse_mla."]


def test_resolution_step_refusals_stop_resolution(sglang, policy_in_sglang):
    args = sglang(TILELANG)
    with pytest.raises(ValueError, match=re.escape(TILELANG_V3)):
        args.resolve_once()
    args = sglang(["--kv-cache-dtype", "fp8_e5m2"])
    with pytest.raises(AssertionError, match="DeepSeek DSA only supports"):
        args.resolve_once()


def test_apply_on_a_view_returns_the_decision(sglang):
    from sglang.srt.arg_groups.overrides import resolved_view

    args = sglang(["--kv-cache-dtype", "bfloat16"])
    decision = apply(resolved_view(args), V3)
    assert decision.backends == {"prefill": "flashmla_sparse", "decode": "fa3"}
    assert not getattr(args, "_resolved_overrides", None)


def _doc_examples():
    """(code, expected output) of each ```python block of docs/conform.md and the ```text block
    right after it."""
    with open(os.path.join(ROOT, "docs", "conform.md"), encoding="utf-8") as fh:
        text = fh.read()
    return re.findall(r"```python\n(.*?)```\n\n```text\n(.*?)```", text, re.S)


def test_the_docs_examples_run_as_shown():
    examples = _doc_examples()
    assert len(examples) == 2
    marker = "----- next example -----"
    script = f"\nprint({marker!r})\n".join(code for code, _ in examples)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split(marker + "\n") == [expected for _, expected in examples]


def test_the_policy_that_models_0523_as_the_step_gives_sglangs_outcomes(dsa_passes):
    """dsa-backends@10 (the policy of SGLang 0.5.23) in place of SGLang's own DSA passes: every
    config is accepted or refused as SGLang refuses it, with its message, and an accepted one gets
    SGLang's dtype and backends (a refusal declares less: the policy decides in one step)."""
    import itertools

    from engine.sglang.conform import pipeline
    from engine.sglang.conform.protocol import Case

    cases = []
    for arch, platform, cap, kv, hisparse, prefill in itertools.product(
            ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "Glm5NextForConditionalGeneration"),
            ("cuda", "hip"), ((9, 0), (12, 0)), ("auto", "fp8_e4m3", "bfloat16"), (False, True),
            (None, "flashmla_kv", "tilelang", "triton")):
        argv = ["--kv-cache-dtype", kv] + (H if hisparse else []) + (
            ["--dsa-prefill-backend", prefill] if prefill else [])
        cases.append(Case(tuple(argv), arch, platform, cap))
    native = [pipeline.run_case(c) for c in cases]
    dsa_passes(resolution_step("dsa-backends@10"))
    routed = [pipeline.run_case(c) for c in cases]
    assert sum(r.ok for r in native) and sum(not r.ok for r in native)
    for case, a, b in zip(cases, native, routed):
        assert (b.ok, b.error_type, b.message) == (a.ok, a.error_type, a.message), case
        if a.ok:
            assert (b.kv_cache_dtype, b.backends) == (a.kv_cache_dtype, a.backends), case
