"""Where SGLang keeps its DSA routing, per release: the functions the plugin replaces
(engine/serving/sglang_plugin.py) and the resolution entry point its guard runs before; and, at
the end, the adapters through which the engine reads SGLang's private names, one each.

Each target was read in the release's wheel. A release this table does not know is driven by
the newest family when every target of that family exists in it, and refused otherwise: the
policy must never seem to decide while SGLang's own code routes."""
from __future__ import annotations

# the role of each replaced function (a PolicyRouting factory, engine/sglang/routing_hooks.py)
DTYPE, BACKENDS, BACKEND_CHECK = "dtype_pass", "backend_pass", "backend_check"
# before 0.5.15: ServerArgs methods that write the fields themselves
DTYPE_METHOD, BACKEND_METHOD = "dtype_method", "backend_method"
# an SGLang function whose HiSparse backend/dtype statements are inline: compiled from its own
# source with those statements replaced by the policy's check (engine/sglang/inline_check.py)
INLINE_CHECK = "inline_check"


class Inline:
    """Where an inline HiSparse check sits in `target`: the statements of the `if self.enable_hisparse:`
    block preceded by `# Check hisparse` (`block`), else of the function body, from the first one
    that raises a ValueError starting "HiSparse" to the end, which raises one too: `count` of them."""

    def __init__(self, block: str | None, count: int):
        self.block, self.count = block, count


_HOOK = "sglang.srt.arg_groups.hisparse_hook"


class Reads:
    """How one replaced function reads its facts (engine/sglang/facts.py): `model`
    ("model_config_of" or "get_model_config"), `platform` ("get_platform", "is_functions",
    "_is_hip", or "none": it reads none), `view` ("resolved_view" or "direct": what a check reads
    its values from)."""

    def __init__(self, model: str = "", platform: str = "none", view: str = "direct", hisparse_hip: str | None = None):
        self.model, self.platform, self.view = model, platform, view
        # under HiSparse the function asks this "module.function" whether it runs on ROCm
        self.hisparse_hip = hisparse_hip


class HookFamily:
    """The releases that keep their routing in the same functions."""

    def __init__(self, name: str, label: str, replace: dict, guard: str,
                 inline: dict | None = None, hisparse_line: str | None = None, reads: dict | None = None):
        self.name = name  # what engine/sglang/registry.py calls it, per release
        self.label = label
        self.reads = reads or {}  # role -> Reads
        self.replace = replace  # dotted target -> role
        self.guard = guard  # the resolution entry point: the guard checks the hooks before it runs
        self.inline = inline or {}  # INLINE_CHECK target -> Inline
        # the function that logs the HiSparse backend line (before 0.5.15, from 0.5.12): the
        # backend method logs that line as a record of it, as SGLang does
        self.hisparse_line = hisparse_line

    def targets(self) -> list[str]:
        return [*self.replace, self.guard] + ([self.hisparse_line] if self.hisparse_line else [])


# SGLang 0.5.19 to 0.5.23: resolution passes `fn(view) -> {field: value}` in
# arg_groups/overrides.py, run by arg_groups/model_hook.py inside ServerArgs.resolve_once(); the
# HiSparse check in arg_groups/hisparse_hook.py, run from check_server_args.
PIPELINE = HookFamily(
    "pipeline", "resolution pipeline (0.5.19 and later)",
    {
        "sglang.srt.arg_groups.overrides._dsa_kv_cache_dtype_default": DTYPE,
        "sglang.srt.arg_groups.overrides._dsa_split_backend_resolution": BACKENDS,
        "sglang.srt.arg_groups.hisparse_hook.validate_hisparse_dsa_backend": BACKEND_CHECK,
    },
    "sglang.srt.arg_groups.pipeline.run_resolution_pipeline",
    reads={DTYPE: Reads("model_config_of", "get_platform"), BACKENDS: Reads("model_config_of", "get_platform"),
           BACKEND_CHECK: Reads(platform="get_platform", view="resolved_view")},
)

# SGLang 0.5.15 to 0.5.18: the same passes in arg_groups/overrides.py, called from
# ServerArgs._set_default_dsa_kv_cache_dtype / _set_default_dsa_backends (function-local imports,
# so the patched module attribute is what runs) inside _handle_model_specific_adjustments, from
# __post_init__; the HiSparse check from check_server_args through
# ServerArgs._validate_hisparse_dsa_backend.
PASSES_IN_METHODS = HookFamily(
    "passes-in-methods", "passes called from ServerArgs methods (0.5.15 to 0.5.18)",
    dict(PIPELINE.replace),
    "sglang.srt.server_args.ServerArgs._handle_model_specific_adjustments",
    reads={DTYPE: Reads("get_model_config", "is_functions"),
           BACKENDS: Reads("get_model_config", "is_functions", hisparse_hip=f"{_HOOK}._is_hip"),
           BACKEND_CHECK: Reads(platform="_is_hip", view="resolved_view")},
)

# Before 0.5.15 the routing is the body of two ServerArgs methods, run inside
# _handle_model_specific_adjustments (from __post_init__), which write the fields themselves; the
# HiSparse check runs in check_server_args (Engine._launch_subprocesses, after the HTTP server's
# modules are imported).
_SA = "sglang.srt.server_args.ServerArgs"
GUARD_PRE = f"{_SA}._handle_model_specific_adjustments"

# 0.5.14: `--dsa-*` methods; the backend check is hisparse_hook.validate_hisparse_dsa_backend, as later
DSA_METHODS_0514 = HookFamily(
    "dsa-methods-0514", "ServerArgs._set_default_dsa_* methods (0.5.14)",
    {f"{_SA}._set_default_dsa_kv_cache_dtype": DTYPE_METHOD,
     f"{_SA}._set_default_dsa_backends": BACKEND_METHOD,
     f"{_HOOK}.validate_hisparse_dsa_backend": BACKEND_CHECK},
    GUARD_PRE, hisparse_line=f"{_HOOK}.apply_hisparse_dsa_backend_defaults",
    reads={DTYPE_METHOD: Reads(platform="is_functions"), BACKEND_METHOD: Reads(platform="is_functions"),
           BACKEND_CHECK: Reads(platform="_is_hip")},
)

# 0.5.13, 0.5.13.post1: the same methods; the dtype and backend checks inline in validate_hisparse
# (after `if is_v4_hisparse: return`: the dtype check, the allow-list, the backend loop)
DSA_METHODS_0513 = HookFamily(
    "dsa-methods-0513", "ServerArgs._set_default_dsa_* methods (0.5.13)",
    {f"{_SA}._set_default_dsa_kv_cache_dtype": DTYPE_METHOD,
     f"{_SA}._set_default_dsa_backends": BACKEND_METHOD,
     f"{_HOOK}.validate_hisparse": INLINE_CHECK},
    GUARD_PRE, inline={f"{_HOOK}.validate_hisparse": Inline(None, 3)},
    hisparse_line=f"{_HOOK}.apply_hisparse_dsa_backend_defaults",
    reads={DTYPE_METHOD: Reads(platform="is_functions"), BACKEND_METHOD: Reads(platform="is_functions"),
           INLINE_CHECK: Reads()},
)

# 0.5.12, 0.5.12.post1: `--nsa-*` methods; the checks inline in validate_hisparse, as 0.5.13
NSA_METHODS_0512 = HookFamily(
    "nsa-methods-0512", "ServerArgs._set_default_nsa_* methods (0.5.12)",
    {f"{_SA}._set_default_nsa_kv_cache_dtype": DTYPE_METHOD,
     f"{_SA}._set_default_nsa_backends": BACKEND_METHOD,
     f"{_HOOK}.validate_hisparse": INLINE_CHECK},
    GUARD_PRE, inline={f"{_HOOK}.validate_hisparse": Inline(None, 3)},
    hisparse_line=f"{_HOOK}.apply_hisparse_nsa_backend_defaults",
    reads={DTYPE_METHOD: Reads(platform="is_functions"), BACKEND_METHOD: Reads(platform="is_functions"),
           INLINE_CHECK: Reads()},
)

# 0.5.11: the methods log every line themselves; the HiSparse check is the "# Check hisparse"
# statement inside check_server_args (its backend loop and dtype check after the model and
# radix-cache asserts)
NSA_METHODS_0511 = HookFamily(
    "nsa-methods-0511", "ServerArgs._set_default_nsa_* methods (0.5.11)",
    {f"{_SA}._set_default_nsa_kv_cache_dtype": DTYPE_METHOD,
     f"{_SA}._set_default_nsa_backends": BACKEND_METHOD,
     f"{_SA}.check_server_args": INLINE_CHECK},
    GUARD_PRE, inline={f"{_SA}.check_server_args": Inline("self.enable_hisparse", 2)},
    reads={DTYPE_METHOD: Reads(platform="is_functions"), BACKEND_METHOD: Reads(platform="is_functions"),
           INLINE_CHECK: Reads(platform="is_functions")},
)

FAMILIES = (NSA_METHODS_0511, NSA_METHODS_0512, DSA_METHODS_0513, DSA_METHODS_0514, PASSES_IN_METHODS, PIPELINE)
BY_NAME = {f.name: f for f in FAMILIES}

# -- DeepSeek-V4 (engine/sglang/dsv4_hooks.py) ------------------------------------------------------
KV_PASS, ATTENTION_DEFAULT = "kv_pass", "attention_default"
_V4_PASS = "sglang.srt.arg_groups.overrides._deepseek_v4_kv_cache_dtype"
_V4_HOOK = "sglang.srt.arg_groups.deepseek_v4_hook"
_PIPELINE_READS = Reads("model_config_of", "get_platform")
# -- MiniMax-M3 (engine/sglang/m3_hooks.py) ---------------------------------------------------------
PROVIDER = "provider"
_M3_PROVIDER = "sglang.srt.arg_groups.model_overrides.minimax_m3._minimax_m3_overrides"


class Registered:
    """Where SGLang also holds a replaced function in a registry of its own: the dict at `registry`
    (a dotted path) lists it under each of `keys` (SGLang's model-override providers, by
    architecture). The plugin puts its entry in the original's place there."""

    def __init__(self, registry: str, keys):
        self.registry, self.keys = registry, tuple(keys)


class ClassFamily(HookFamily):
    """The functions of one model class's routing the plugin replaces in a family of releases, and
    the policy parts they answer (dsv4_hooks.ENFORCED, m3_hooks.PART). `registered`: replaced
    target -> Registered, where SGLang's own registry holds that function too."""

    def __init__(self, name, label, replace, guard, parts, reads, registered=None):
        super().__init__(name, label, replace, guard, reads=reads)
        self.parts = tuple(parts)
        self.registered = dict(registered or {})


CLASS_FAMILIES = {"dsv4": {f.name: f for f in (
    # 0.5.23: the pass (overrides', and deepseek_v4_hook's own import of it) and what auto becomes
    ClassFamily("v4-auto", "the V4 KV-dtype pass and auto attention backend (0.5.23)",
                {_V4_PASS: KV_PASS, f"{_V4_HOOK}._deepseek_v4_kv_cache_dtype": KV_PASS,
                 f"{_V4_HOOK}._default_dsv4_attention_backend": ATTENTION_DEFAULT},
                PIPELINE.guard, ("deepseek_v4_kv_cache_dtype", "default_dsv4_attention_backend"),
                {KV_PASS: _PIPELINE_READS, ATTENTION_DEFAULT: _PIPELINE_READS}),
    ClassFamily("v4-pass", "the V4 KV-dtype pass (0.5.19 to 0.5.22)",
                {_V4_PASS: KV_PASS, f"{_V4_HOOK}._deepseek_v4_kv_cache_dtype": KV_PASS},
                PIPELINE.guard, ("deepseek_v4_kv_cache_dtype",), {KV_PASS: _PIPELINE_READS}),
    # 0.5.15-0.5.18: apply_deepseek_v4_defaults imports the pass inside its body
    ClassFamily("v4-pass-methods", "the V4 KV-dtype pass (0.5.15 to 0.5.18)", {_V4_PASS: KV_PASS},
                PASSES_IN_METHODS.guard, ("deepseek_v4_kv_cache_dtype",),
                {KV_PASS: Reads("get_model_config", "is_functions")}),
    # 0.5.12-0.5.14: the KV dtype is inline in apply_deepseek_v4_defaults; nothing is replaced, the
    # launch is checked against the release's own code before it runs
    ClassFamily("v4-checked", "none (0.5.12 to 0.5.14: the launch is checked only)",
                {}, f"{_V4_HOOK}.apply_deepseek_v4_defaults", (), {}),
)}, "minimax_m3": {f.name: f for f in (
    # 0.5.21-0.5.23: the provider model_overrides/minimax_m3.py registers for both MiniMax-M3
    # architectures in model_override_base._MODEL_OVERRIDE_FNS (register_model_override, through
    # _register_for); collect_model_override_declarations calls it from the registry, inside
    # handle_model_specific_adjustments of ServerArgs.resolve_once()
    ClassFamily("m3-provider", "the MiniMax-M3 model-override provider (0.5.21 to 0.5.23)",
                {_M3_PROVIDER: PROVIDER}, PIPELINE.guard, ("minimax_m3_overrides",),
                {PROVIDER: Reads(platform="get_platform")},
                {_M3_PROVIDER: Registered("sglang.srt.arg_groups.model_override_base._MODEL_OVERRIDE_FNS",
                                          ("MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration"))}),
)}}


def class_family_of(model_class: str, release: str) -> ClassFamily | None:
    """The family of a model class's functions the plugin replaces in a release (None: it routes
    none of that class there)."""
    from engine.sglang import registry

    row = registry.release(release)
    name = row.class_hooks.get(model_class) if row is not None else None
    return CLASS_FAMILIES.get(model_class, {}).get(name) if name else None


def family_of(release: str) -> HookFamily | None:
    """The family of functions the plugin replaces in a release (engine/sglang/registry.py: a
    release it does not list takes the facts of the newest listed one at or before it); None
    before 0.5.11 or for what is not a version."""
    from engine.sglang import registry

    row = registry.release(release)
    return BY_NAME[row.hooks] if row is not None else None


# -- SGLang's privates ------------------------------------------------------------------------------
# Every read (or write) of a private name of SGLang in engine/ is one of the adapters below
# (tests/test_private_access.py allows these and no other; docs/design.md lists them), each where
# the releases it names keep the fact nowhere public: read in every release's wheel, 0.5.11 to
# 0.5.23. When SGLang renames one, this is the one place that changes.

def last_replace_hook(target: str):
    """The REPLACE hook that takes effect on `target` (the last registered), or None.
    `HookRegistry._hooks` (target -> [(HookType, hook, source)]), the same in every release 0.5.11
    to 0.5.23: the registry's methods are register, apply_hooks and reset, none of which says what
    is registered, so only here can the plugin's guard see another plugin's REPLACE, registered
    later, override its own. (Whether a hook was applied has a public answer: the plugin looks
    at the target itself.)"""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    replaces = [hook for kind, hook, _ in HookRegistry._hooks.get(target, ()) if kind == HookType.REPLACE]
    return replaces[-1] if replaces else None


def deepseek_family_archs(overrides_namespace: dict) -> frozenset:
    """The DSA passes' own gate list, `_DEEPSEEK_FAMILY_ARCHS` of arg_groups/overrides.py
    (0.5.15 to 0.5.23), from the module's namespace (a module's vars, or a pass's globals): the
    policy's model inputs follow the installed release's list, which SGLang keeps only there."""
    return overrides_namespace["_DEEPSEEK_FAMILY_ARCHS"]


def hisparse_hook_is_hip(hisparse_hook_namespace: dict) -> bool:
    """hisparse_hook's `_is_hip()` (0.5.14 to 0.5.18), from the module's namespace: the HiSparse
    backend check of those releases asks it, and nothing public, whether it runs on ROCm; its
    replacement asks the same."""
    return hisparse_hook_namespace["_is_hip"]()


def resolution_finished(server_args) -> bool:
    """Whether a 0.5.19-0.5.23 ServerArgs record has been resolved: `_resolution_finished`, which
    SGLang's own code reads the same way (resolve_once, declare_resolution); no public method
    says it, and a resolved record refuses declarations."""
    return getattr(server_args, "_resolution_finished", False)


def platform_fact_names(runtime_context) -> frozenset:
    """The facts `override_platform` accepts (0.5.19 to 0.5.23): the keys of runtime_context's
    `_PLATFORM_PROBES` and `_PLATFORM_VALUES`, which differ by release and are listed only there;
    the conform driver offers each release exactly the facts it knows."""
    return frozenset(runtime_context._PLATFORM_PROBES) | frozenset(runtime_context._PLATFORM_VALUES)


def handle_model_specific_adjustments(server_args) -> None:
    """SGLang 0.5.11 to 0.5.18's own routing code, the ServerArgs method
    `_handle_model_specific_adjustments` (0.5.15-0.5.18: it runs their DSA passes), which the
    conform driver runs as __post_init__ would."""
    server_args._handle_model_specific_adjustments()


def post_init_effects(server_args) -> None:
    """What SGLang 0.5.11 to 0.5.18's __post_init__ does that their routing reads, for a ServerArgs
    built without it: `--quantization unquant` becomes None and sets
    `_quantization_explicitly_unset`, and, where the release has it (0.5.14-0.5.18),
    `_parse_cuda_graph_config()` turns the CUDA graph flags into a CudaGraphConfig (it reads no
    device), run as the release's own code."""
    server_args._quantization_explicitly_unset = server_args.quantization == "unquant"
    if server_args.quantization == "unquant":
        server_args.quantization = None
    if callable(getattr(server_args, "_parse_cuda_graph_config", None)):
        server_args._parse_cuda_graph_config()


def hisparse_validation(overrides_module):
    """SGLang 0.5.15 to 0.5.18's HiSparse check, the pass `_hisparse_validation` of
    arg_groups/overrides.py that check_server_args runs at its slot: the conform driver runs it
    there too."""
    return overrides_module._hisparse_validation


def begin_declarations(server_args) -> None:
    """The first statement of SGLang 0.5.15 to 0.5.18's __post_init__, for a ServerArgs built
    without it: an empty `_resolved_overrides`, the stash where their passes declare."""
    server_args._resolved_overrides = []


def declarations_pending(server_args) -> bool:
    """Whether a ServerArgs (0.5.15 on) holds declarations of its passes not yet written to its
    fields (a raise midway through __post_init__): `_resolved_overrides` and
    `_declarations_materialized`, which SGLang reads the same way; its public `resolved_view`
    then gives the values."""
    return bool(getattr(server_args, "_resolved_overrides", None)) and \
        not getattr(server_args, "_declarations_materialized", False)
