"""An independent, hand-written transcription of the LATEST upstream SGLang DSA (ex-NSA)
attention-backend routing and HiSparse validation, for one server config (version 3 oracle).

Written from sgl-project/sglang at 2026-09/10 era snapshots (identified by commit; see
sglang_latest_notes.md beside this file for how "latest" was chosen and for every quote):

* Step A (resolution, runs inside ``handle_model_specific_adjustments`` of the resolution
  pipeline ``arg_groups/pipeline.py::run_resolution_pipeline``):
  ``python/sglang/srt/arg_groups/overrides.py`` at commit
  23749862a036b0feb2442b457cb507d37b860d60, functions
  ``_dsa_kv_cache_dtype_default``, ``_check_dsa_backend_constraints`` and
  ``_dsa_split_backend_resolution`` (plus ``_DEEPSEEK_FAMILY_ARCHS``).
* Step B (validation, ``check_server_args`` in ``arg_groups/validation_hook.py`` runs the
  ``_hisparse_validation`` pass "at its legacy slot", after the whole pipeline):
  ``python/sglang/srt/arg_groups/hisparse_hook.py`` at commit
  007bddd4a95b44d3c8cd22c8a24d0ee1455955fd, functions
  ``_hisparse_default_backend``, ``_hisparse_allowed_backends``, ``validate_hisparse``,
  ``validate_hisparse_kv_cache_dtype``, ``validate_hisparse_dsa_backend``.
* Step C (start-up, NOT argument time): ``--hisparse-config`` is parsed only when the model
  runner builds the HiSparse DSA KV pool / coordinator
  (``mem_cache/sparsity/factory.py::_parse_sparse_config`` via ``parse_hisparse_config``).
* Choices: ``--kv-cache-dtype`` from ``arg_groups/fields/model.py`` at commit
  0116c6066d6ead4b97c0468f65e04cad47ca021e (``fp4_e2m1`` no longer a choice);
  ``--dsa-{prefill,decode}-backend`` = the backends the Step-A code above names or declares
  (see notes: ``aiter_sparse_mla`` / ``triton_sparse_mla`` only appear at another snapshot
  and are left out).
* Which models are DSA: ``configs/model_config.py::is_deepseek_dsa`` (arch list +
  ``index_topk``); both DSA passes also require the arch in ``_DEEPSEEK_FAMILY_ARCHS``.

Scope, as for versions 1 and 2: only these steps, for a DSA model (DeepSeek V3.2 = "deepseek_v32",
GLM-5 ``GlmMoeDsaForCausalLM`` = "glm5") or a non-DSA model ("other"); CUDA or HIP; the user did
not set ``--attention-backend``; no learnable attention sinks; not NPU/XPU; not DeepSeek V4
(its own hook is not transcribed). Generic KV-dtype gates of ``kv_cache_hook.py`` that can fire
for non-DSA models are out of scope (see notes). It shares no code with the engine and uses only
the standard library. ``route`` never raises: every upstream exception becomes data.
"""
from __future__ import annotations

import itertools

# --------------------------------------------------------------------------- choices
# arg_groups/fields/model.py @ 0116c606: Model.kv_cache_dtype choices (argparse).
KV_CACHE_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")
# Backends Step A names/declares at overrides.py @ 23749862 (ROCm default "triton", XPU default
# "intel_xpu") plus the pre-existing DSA_CHOICES; see notes for the two left out.
DSA_BACKENDS = (
    "flashmla_sparse", "flashmla_sparse_q8", "flashmla_kv", "flashmla_auto", "flashinfer_sparse_mla",
    "fa3", "tilelang", "triton", "aiter", "trtllm", "intel_xpu",
)
CHOICES = (None,) + DSA_BACKENDS
PLATFORMS = ("cuda", "hip")
SM_MAJORS = (9, 10, 12)

# model_family -> (hf architectures[0], is_deepseek_dsa)
MODEL_FAMILIES = {
    "deepseek_v32": ("DeepseekV32ForCausalLM", True),
    "glm5": ("GlmMoeDsaForCausalLM", True),
    "other": ("LlamaForCausalLM", False),  # any non-DSA, non-DeepSeek-V4 model
}
# overrides.py @ 23749862: both DSA passes return {} unless the arch is in this set.
_DEEPSEEK_FAMILY_ARCHS = frozenset({
    "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "KimiK25ForConditionalGeneration",
    "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM",
    "Glm5NextForConditionalGeneration", "HYV4ForCausalLM", "HYV4ForCausalLMNextN",
    "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN", "Dots3NoteForCausalLM",
})
GLM5_KV_LORA_RANK, GLM5_QK_ROPE_HEAD_DIM = 512, 64  # GLM-5 geometry read by the NVFP4 check
MODEL_INDEX_TOPK = 2048  # index_topk of DeepSeek V3.2 / GLM-5 (hf config)

# hisparse_hook.py @ 007bddd4
HISPARSE_CUDA_DSA_BACKENDS_BY_DTYPE = {
    "bfloat16": {"flashmla_sparse"},
    "fp8_e4m3": {"flashmla_kv", "flashinfer_sparse_mla"},
}
HISPARSE_ROCM_DSA_BACKENDS = {"tilelang", "triton", "aiter"}
HISPARSE_KV_CACHE_DTYPES = ("bfloat16", "fp8_e4m3")

# Representative --hisparse-config values (top_k, device_buffer_size, host_to_device_ratio);
# None = key absent from the JSON (no --hisparse-config at all for the first one).
HISPARSE_CONFIGS = ((None, None, None), (1024, 4096, 10), (2048, 1024, 2))

WARN_BACKEND_WITHOUT_DTYPE = (
    "When specifying --dsa-prefill-backend or --dsa-decode-backend, you should also explicitly set "
    "--kv-cache-dtype (e.g., 'fp8_e4m3' or 'bfloat16'). DeepSeek V3.2 defaults to FP8 KV cache "
    "which may not be compatible with all backends."
)


class UpstreamError(Exception):
    """An exception SGLang raises; ``kind`` is its Python type name, ``stage`` where it happens."""

    def __init__(self, kind: str, message: str, stage: str):
        super().__init__(message)
        self.kind, self.message, self.stage = kind, message, stage


def _value_error(message, stage):
    return UpstreamError("ValueError", message, stage)


def _assertion_error(message, stage):
    return UpstreamError("AssertionError", message, stage)


class ServerArgs:
    """The attributes of SGLang's ServerArgs (plus the device facts) that the routing reads and
    writes. Declarations of the resolution pipeline are applied directly to the fields here
    (upstream keeps them in a stash read through ``resolved_view``; the reads are equivalent)."""

    def __init__(self, dsa_model=True, model_family=None, enable_hisparse=False, kv_cache_dtype="auto",
                 platform="cuda", sm_major=9, disable_radix_cache=False, dsa_prefill_backend=None,
                 dsa_decode_backend=None, top_k=None, device_buffer_size=None, host_to_device_ratio=None,
                 nsa_prefill_backend=None, nsa_decode_backend=None):
        if model_family is None:
            model_family = "deepseek_v32" if dsa_model else "other"
        self.dsa_model = dsa_model
        self.model_family = model_family
        self.enable_hisparse = enable_hisparse
        self.kv_cache_dtype = kv_cache_dtype
        self.platform = platform
        self.sm_major = sm_major
        self.disable_radix_cache = disable_radix_cache
        self.dsa_prefill_backend = dsa_prefill_backend
        self.dsa_decode_backend = dsa_decode_backend
        self.top_k = top_k
        self.device_buffer_size = device_buffer_size
        self.host_to_device_ratio = host_to_device_ratio
        self.nsa_prefill_backend = nsa_prefill_backend
        self.nsa_decode_backend = nsa_decode_backend
        self.hisparse_config = None
        self.logs: list[str] = []

    # facts derived from the inputs ------------------------------------------------------
    @property
    def is_hip(self) -> bool:
        return self.platform == "hip"

    @property
    def arch(self) -> str:
        return MODEL_FAMILIES[self.model_family][0]

    def is_deepseek_dsa(self) -> bool:
        return MODEL_FAMILIES[self.model_family][1]


# --------------------------------------------------------------------------- step 0: argparse
def _parse_cli(args: ServerArgs) -> None:
    """What argparse does before resolution: choices, and the deprecated --nsa-* aliases
    (DeprecatedAliasStoreAction: store into dsa_*, log a deprecation warning). Alias semantics
    when both spellings are given: the dsa_* value wins (as if the alias came first)."""
    if args.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise UpstreamError("SystemExit", _invalid_choice("--kv-cache-dtype", args.kv_cache_dtype,
                                                          KV_CACHE_DTYPES), "parse")
    for phase in ("prefill", "decode"):
        alias = getattr(args, f"nsa_{phase}_backend")
        if alias is not None:
            if alias not in DSA_BACKENDS:
                raise UpstreamError("SystemExit", _invalid_choice(f"--nsa-{phase}-backend", alias,
                                                                  DSA_BACKENDS), "parse")
            # print_deprecated_warning wraps this in ANSI bold yellow (\033[1;33m ... \033[0m).
            args.logs.append(f"'--nsa-{phase}-backend' is deprecated and will be removed in a future "
                             f"release. Use '--dsa-{phase}-backend' instead.")
            if getattr(args, f"dsa_{phase}_backend") is None:
                setattr(args, f"dsa_{phase}_backend", alias)
        value = getattr(args, f"dsa_{phase}_backend")
        if value is not None and value not in DSA_BACKENDS:
            raise UpstreamError("SystemExit", _invalid_choice(f"--dsa-{phase}-backend", value,
                                                              DSA_BACKENDS), "parse")


def _invalid_choice(flag, value, choices):
    # argparse's text (Python <= 3.11 wording; 3.12+ prints the choices without quotes); the
    # process then exits with status 2 after printing usage.
    return f"argument {flag}: invalid choice: {value!r} (choose from {', '.join(map(repr, choices))})"


# --------------------------------------------------------------------------- step A: resolution
def _dsa_kv_cache_dtype_default(args: ServerArgs) -> None:
    """overrides.py::_dsa_kv_cache_dtype_default (CUDA/HIP arm; learnable sinks absent)."""
    if args.arch not in _DEEPSEEK_FAMILY_ARCHS or not args.is_deepseek_dsa():
        return
    major = args.sm_major  # torch.cuda.get_device_capability()[0]
    if (args.dsa_prefill_backend is not None or args.dsa_decode_backend is not None) and (
        args.kv_cache_dtype == "auto"
    ):
        args.logs.append(WARN_BACKEND_WITHOUT_DTYPE)
    kv_cache_dtype = args.kv_cache_dtype
    if kv_cache_dtype == "auto":
        kv_cache_dtype = "fp8_e4m3" if major >= 10 else "bfloat16"
        args.logs.append(f"Setting KV cache dtype to {kv_cache_dtype} for DeepSeek DSA on SM{major} device.")
    if kv_cache_dtype == "bf16":
        kv_cache_dtype = "bfloat16"
    if kv_cache_dtype == "nvfp4":
        if args.arch != "GlmMoeDsaForCausalLM" or major != 12 or args.is_hip:
            raise _value_error("DSA NVFP4 KV cache requires GLM DSA on NVIDIA SM120/SM121.", "resolve")
        if GLM5_KV_LORA_RANK != 512 or GLM5_QK_ROPE_HEAD_DIM != 64:  # always holds for GLM-5
            raise _value_error("DSA NVFP4 requires latent dimension 512 and RoPE 64.", "resolve")
        args.kv_cache_dtype = kv_cache_dtype
        return
    if kv_cache_dtype not in ("bfloat16", "fp8_e4m3"):
        raise _assertion_error("DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype", "resolve")
    args.kv_cache_dtype = kv_cache_dtype


def _check_dsa_backend_constraints(kv_cache_dtype, prefill_backend, decode_backend, *, hip) -> None:
    """overrides.py::_check_dsa_backend_constraints."""
    chosen = {prefill_backend, decode_backend}
    rocm_only = {"triton"} & chosen
    if not hip and rocm_only:
        raise _value_error(
            f"The {'/'.join(sorted(rocm_only))} DSA backend is only supported on "
            "ROCm/HIP. Pick an alternative DSA backend for CUDA "
            "(flashmla_kv on Hopper, trtllm on Blackwell).", "resolve")
    cuda_fp8_unsupported = {"tilelang"} & chosen
    if not hip and kv_cache_dtype == "fp8_e4m3" and cuda_fp8_unsupported:
        raise _value_error(
            f"The {'/'.join(sorted(cuda_fp8_unsupported))} DSA prefill/decode kernels "
            "only support an fp8_e4m3 KV cache on ROCm/HIP; on CUDA they require "
            "a bfloat16 KV cache. Use --kv-cache-dtype bfloat16, or keep "
            "--kv-cache-dtype fp8_e4m3 and pick an fp8-capable DSA backend "
            "(flashmla_kv on Hopper, trtllm on Blackwell).", "resolve")


def _hisparse_default_backend(args: ServerArgs, kv_cache_dtype: str) -> str:
    """hisparse_hook.py::_hisparse_default_backend."""
    if args.is_hip:
        return "tilelang"
    return "flashmla_kv" if kv_cache_dtype == "fp8_e4m3" else "flashmla_sparse"


def _dsa_split_backend_resolution(args: ServerArgs) -> None:
    """overrides.py::_dsa_split_backend_resolution (CUDA/HIP arm; learnable sinks absent)."""
    if args.arch not in _DEEPSEEK_FAMILY_ARCHS or not args.is_deepseek_dsa():
        return
    major = args.sm_major
    kv_cache_dtype = args.kv_cache_dtype
    user_set_prefill = args.dsa_prefill_backend is not None
    user_set_decode = args.dsa_decode_backend is not None
    is_glm_sm12_quantized = (
        args.arch == "GlmMoeDsaForCausalLM" and major == 12
        and kv_cache_dtype in ("fp8_e4m3", "nvfp4") and not args.is_hip
    )

    if is_glm_sm12_quantized:  # checked BEFORE the HiSparse arm; no constraint check here
        backend = "flashinfer_sparse_mla"
        if kv_cache_dtype == "nvfp4":
            for field in ("dsa_prefill_backend", "dsa_decode_backend"):
                value = getattr(args, field)
                if value not in (None, backend):
                    raise _value_error(
                        f"GLM DSA NVFP4 KV cache requires {field}={backend!r}; got {value!r}.", "resolve")
        if not user_set_prefill:
            args.dsa_prefill_backend = backend
        if not user_set_decode:
            args.dsa_decode_backend = backend
        # (sic) the line names flashinfer_sparse_mla for both phases even when one is user-set
        args.logs.append(f"Set DSA backends for GLM {kv_cache_dtype} KV Cache on SM120/SM121: "
                         f"prefill={backend}, decode={backend}.")
        return

    if args.enable_hisparse:
        backend = _hisparse_default_backend(args, kv_cache_dtype)
        if not user_set_prefill:
            args.dsa_prefill_backend = backend
        if not user_set_decode:
            args.dsa_decode_backend = backend
        _check_dsa_backend_constraints(kv_cache_dtype, args.dsa_prefill_backend, args.dsa_decode_backend,
                                       hip=args.is_hip)
        args.logs.append(f"HiSparse enabled ({kv_cache_dtype}): using DSA backends "
                         f"prefill={args.dsa_prefill_backend}, decode={args.dsa_decode_backend}.")
        return

    if args.is_hip:  # per phase; no longer needs both phases unset
        prefill, decode = "triton", "triton"
    elif kv_cache_dtype == "fp8_e4m3":
        prefill = decode = "trtllm" if major >= 10 else "flashmla_kv"
    else:
        prefill, decode = "flashmla_sparse", ("trtllm" if major >= 10 else "fa3")
    if not user_set_prefill:
        args.dsa_prefill_backend = prefill
    if not user_set_decode:
        args.dsa_decode_backend = decode
    _check_dsa_backend_constraints(kv_cache_dtype, args.dsa_prefill_backend, args.dsa_decode_backend,
                                   hip=args.is_hip)
    args.logs.append(f"Set DSA backends for {kv_cache_dtype} KV Cache: "
                     f"prefill={args.dsa_prefill_backend}, decode={args.dsa_decode_backend}.")


# --------------------------------------------------------------------------- step B: check_server_args
def _hisparse_allowed_backends(args: ServerArgs, kv_cache_dtype: str) -> set:
    """hisparse_hook.py::_hisparse_allowed_backends."""
    if args.is_hip:
        return HISPARSE_ROCM_DSA_BACKENDS
    return HISPARSE_CUDA_DSA_BACKENDS_BY_DTYPE.get(
        kv_cache_dtype, {"flashmla_sparse", "flashmla_kv", "flashinfer_sparse_mla"})


def validate_hisparse_kv_cache_dtype(args: ServerArgs) -> None:
    kv_cache_dtype = args.kv_cache_dtype
    if kv_cache_dtype in HISPARSE_KV_CACHE_DTYPES:
        return
    choices = " or ".join(f"--kv-cache-dtype={dtype}" for dtype in HISPARSE_KV_CACHE_DTYPES)
    raise _value_error(
        f"HiSparse requires one of {HISPARSE_KV_CACHE_DTYPES} KV cache dtypes, "
        f"but got --kv-cache-dtype={kv_cache_dtype}. Please use {choices}.", "check")


def validate_hisparse_dsa_backend(args: ServerArgs, attr: str, label: str) -> None:
    backend = getattr(args, attr)
    kv_cache_dtype = args.kv_cache_dtype
    allowed_backends = _hisparse_allowed_backends(args, kv_cache_dtype)
    if backend is not None and backend not in allowed_backends:
        raise _value_error(
            f"HiSparse supports DSA {label} backend(s) {sorted(allowed_backends)} "
            f"on this platform with --kv-cache-dtype={kv_cache_dtype}, "
            f"but got --dsa-{label}-backend={backend}. "
            f"Please use one of {sorted(allowed_backends)}, or omit the option "
            "to let SGLang pick a backend for this platform.", "check")


def validate_hisparse(args: ServerArgs) -> None:
    """hisparse_hook.py::validate_hisparse (DeepSeek V4 branches not reachable here)."""
    if not args.enable_hisparse:
        return
    if not args.is_deepseek_dsa():  # is_deepseek_dsa(hf) or is_deepseek_v4(hf)
        raise _assertion_error(
            "--enable-hisparse is only supported for DSA (DeepSeek Sparse Attention) "
            "models (e.g., DeepSeek V3.2, GLM-5) and DeepSeek V4 now. ", "check")
    if not args.disable_radix_cache:
        raise _assertion_error("Hierarchical sparse attention currently requires --disable-radix-cache.", "check")
    if args.kv_cache_dtype not in ("bfloat16", "auto", "fp8_e4m3"):
        validate_hisparse_kv_cache_dtype(args)
    for attr, label in (("dsa_prefill_backend", "prefill"), ("dsa_decode_backend", "decode")):
        validate_hisparse_dsa_backend(args, attr, label)


# --------------------------------------------------------------------------- step C: start-up
def _parse_sparse_config(args: ServerArgs) -> dict:
    """mem_cache/sparsity/factory.py::_parse_sparse_config, called (via parse_hisparse_config)
    when the model runner builds the HiSparse DSA pool and coordinator, i.e. after every
    argument check passed. Only the fields in our domain; swap_in_block_size keeps its default."""
    top_k = 2048 if args.top_k is None else args.top_k
    device_buffer_size = 2 * top_k if args.device_buffer_size is None else args.device_buffer_size
    host_to_device_ratio = 2 if args.host_to_device_ratio is None else args.host_to_device_ratio
    if device_buffer_size < top_k:
        raise _value_error(
            f"device_buffer_size ({device_buffer_size}) must be no smaller than top_k ({top_k})", "startup")
    return {
        "top_k": top_k,
        "device_buffer_size": device_buffer_size,
        "host_to_device_ratio": host_to_device_ratio,
        "swap_in_block_size": 960,
        # model_runner: hisparse_top_k = getattr(hf_text_config, "index_topk", cfg.top_k)
        "coordinator_top_k": MODEL_INDEX_TOPK,
    }


# --------------------------------------------------------------------------- entry points
_INPUT_KEYS = frozenset({
    "dsa_model", "model_family", "enable_hisparse", "kv_cache_dtype", "platform", "sm_major",
    "disable_radix_cache", "dsa_prefill_backend", "dsa_decode_backend", "top_k", "device_buffer_size",
    "host_to_device_ratio", "nsa_prefill_backend", "nsa_decode_backend",
})


def _input_problem(config: dict):
    unknown = sorted(set(config) - _INPUT_KEYS)
    if unknown:
        return f"unknown input(s): {unknown}"
    family = config.get("model_family")
    dsa = config.get("dsa_model", True)
    if family is not None:
        if family not in MODEL_FAMILIES:
            return f"unknown model_family {family!r}; one of {sorted(MODEL_FAMILIES)}"
        if MODEL_FAMILIES[family][1] != bool(dsa):
            return f"model_family {family!r} does not match dsa_model={dsa!r}"
    if config.get("platform", "cuda") not in PLATFORMS:
        return f"unknown platform {config.get('platform')!r}"
    return None


def route(**config) -> dict:
    """SGLang's steps for one server config: {"error", "error_type", "error_stage",
    "kv_cache_dtype", "prefill", "decode", "logs", "hisparse_config"}. ``error`` is the message of
    the first exception upstream raises (None if it starts), ``error_stage`` one of
    "input" (not a valid input of this oracle), "parse" (argparse), "resolve" (step A),
    "check" (step B) or "startup" (step C). ``logs`` are the routing warnings in order,
    also when an error follows them."""
    problem = _input_problem(config)
    if problem is not None:
        return {"error": problem, "error_type": "InputError", "error_stage": "input", "kv_cache_dtype": None,
                "prefill": None, "decode": None, "logs": [], "hisparse_config": None}
    args = ServerArgs(**config)
    error = error_type = stage = None
    try:
        if not isinstance(args.sm_major, int) or isinstance(args.sm_major, bool):
            raise UpstreamError("InputError", f"sm_major must be an int, got {args.sm_major!r}", "input")
        _parse_cli(args)
        _dsa_kv_cache_dtype_default(args)        # handle_model_specific_adjustments: DSA arm,
        _dsa_split_backend_resolution(args)      # kv dtype first, then the split backends
        validate_hisparse(args)                  # check_server_args -> _hisparse_validation
        if args.enable_hisparse:
            args.hisparse_config = _parse_sparse_config(args)  # model runner start-up
    except UpstreamError as exc:
        error, error_type, stage = exc.message, exc.kind, exc.stage
    return {"error": error, "error_type": error_type, "error_stage": stage,
            "kv_cache_dtype": args.kv_cache_dtype, "prefill": args.dsa_prefill_backend,
            "decode": args.dsa_decode_backend, "logs": args.logs, "hisparse_config": args.hisparse_config}


DOMAIN_KEYS = ("dsa_model", "model_family", "enable_hisparse", "kv_cache_dtype", "platform", "sm_major",
               "disable_radix_cache", "dsa_prefill_backend", "dsa_decode_backend", "top_k",
               "device_buffer_size", "host_to_device_ratio")


def domain():
    """The representative input domain: 3 model families x (hisparse off, or on with 3
    --hisparse-config variants) x 8 dtypes x 2 platforms x 3 SM majors x 2 radix settings x
    12 x 12 backend choices = 165,888 configs. The --hisparse-config fields vary only when HiSparse
    is on (they are not read otherwise). The --nsa-* aliases are not part of the domain."""
    families = (("deepseek_v32", True), ("glm5", True), ("other", False))
    for (family, dsa), enable_hisparse in itertools.product(families, (False, True)):
        configs = HISPARSE_CONFIGS if enable_hisparse else ((None, None, None),)
        for kv, platform, sm_major, radix, prefill, decode, hs_cfg in itertools.product(
            KV_CACHE_DTYPES, PLATFORMS, SM_MAJORS, (False, True), CHOICES, CHOICES, configs
        ):
            yield dict(zip(DOMAIN_KEYS, (dsa, family, enable_hisparse, kv, platform, sm_major, radix,
                                         prefill, decode) + tuple(hs_cfg)))
