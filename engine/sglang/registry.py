"""SGLang's releases, and what is known of each: the one place a release fact lives.

The plugin (which functions to replace, engine/sglang/hook_targets.py), `hisparse conform` (which
driver runs a release), `hisparse versions` (which releases there are), the model reader (from
which release SGLang counts an architecture as DSA) and the release environments
(tools/sglang-env.sh: which transformers a release imports) all read the table below. A new
release is a row here (and, where its routing changed, a policy version); a release this table
does not list is placed by its version number: after the newest known one, it takes the newest
known facts; between two, the facts of the one before it. Each release's server flags, read from
its own parser, are data beside this file (release_flags.txt, made by tools/release_flags.py):
`release_flags` answers them for a listed release only.

Every release string parses (`version_key`): three-part and two-part versions (`1.0`),
`.postN`, pre-releases (`0.6.0rc1`, `a1`, `b2`) and `.devN`, a local part (`+cu128`) ignored.

Nothing here imports anything but the standard library (tools/sglang-env.sh asks it with a bare
Python: `main(["transformers", "0.5.18"])`)."""
from __future__ import annotations

import re
import sys


class Release:
    """One SGLang release: its transformers base environment, the family of functions the plugin
    replaces in it (hook_targets), the conform driver module that runs it, the folder of SGLang's
    own unit tests of those functions (None: the release has none), and the families of the other
    model classes' functions it replaces."""

    __slots__ = ("version", "transformers", "hooks", "driver", "own_tests", "class_hooks")

    def __init__(self, version, transformers, hooks, driver, own_tests=None, class_hooks=None):
        self.version, self.transformers, self.hooks, self.driver = version, transformers, hooks, driver
        self.own_tests = own_tests
        # model class -> the family of that class's functions the plugin replaces (hook_targets)
        self.class_hooks = dict(class_hooks or {})

    def __repr__(self) -> str:
        return f"<SGLang {self.version}>"


_C = "engine.sglang.conform."
# the DeepSeek-V4 functions the plugin replaces (hook_targets.CLASS_FAMILIES): none where the KV
# dtype is inline (0.5.12-0.5.14: checked only), the KV-dtype pass, and from 0.5.23 what auto becomes
_V4_CHECKED, _V4_METHODS, _V4_PASS, _V4_AUTO = ({"dsv4": name} for name in (
    "v4-checked", "v4-pass-methods", "v4-pass", "v4-auto"))
# and from 0.5.21 (HiSparse serves MiniMax-M3) the MiniMax-M3 provider
_M3 = {"minimax_m3": "m3-provider"}
# oldest first; .post releases on their own rows (PyPI publishes them as releases)
RELEASES = (
    Release("0.5.11", "5.6.0", "nsa-methods-0511", _C + "sglang_0511"),
    Release("0.5.12", "5.6.0", "nsa-methods-0512", _C + "sglang_0512", class_hooks=_V4_CHECKED),
    Release("0.5.12.post1", "5.6.0", "nsa-methods-0512", _C + "sglang_0512", class_hooks=_V4_CHECKED),
    Release("0.5.13", "5.12.1", "dsa-methods-0513", _C + "sglang_0513", class_hooks=_V4_CHECKED),
    Release("0.5.13.post1", "5.12.1", "dsa-methods-0513", _C + "sglang_0513", class_hooks=_V4_CHECKED),
    Release("0.5.14", "5.12.1", "dsa-methods-0514", _C + "sglang_0513", class_hooks=_V4_CHECKED),
    Release("0.5.15", "5.12.1", "passes-in-methods", _C + "transitional", "v0.5.17", class_hooks=_V4_METHODS),
    Release("0.5.15.post1", "5.12.1", "passes-in-methods", _C + "transitional", "v0.5.17", class_hooks=_V4_METHODS),
    Release("0.5.16", "5.12.1", "passes-in-methods", _C + "transitional", "v0.5.17", class_hooks=_V4_METHODS),
    Release("0.5.17", "5.12.1", "passes-in-methods", _C + "transitional", "v0.5.17", class_hooks=_V4_METHODS),
    Release("0.5.18", "5.12.1", "passes-in-methods", _C + "transitional", "v0.5.17", class_hooks=_V4_METHODS),
    Release("0.5.19", "5.12.1", "pipeline", _C + "pipeline", "v0.5.23", class_hooks=_V4_PASS),
    Release("0.5.20", "5.12.1", "pipeline", _C + "pipeline", "v0.5.23", class_hooks=_V4_PASS),
    Release("0.5.21", "5.19.0", "pipeline", _C + "pipeline", "v0.5.23", class_hooks={**_V4_PASS, **_M3}),
    Release("0.5.22", "5.19.0", "pipeline", _C + "pipeline", "v0.5.23", class_hooks={**_V4_PASS, **_M3}),
    Release("0.5.23", "5.19.0", "pipeline", _C + "pipeline", "v0.5.23", class_hooks={**_V4_AUTO, **_M3}),
)
BY_VERSION = {r.version: r for r in RELEASES}
# the release this project installs and tests first (`make install`; the conform extra's pins)
OWN = "0.5.23"

# -- models --------------------------------------------------------------------------------------
# The model classes HiSparse serves, each routed by its own policy family (a policy file says
# which classes it routes: `models:`); "other" is every model SGLang routes through none of them.
MODEL_CLASSES = ("dsa", "dsv4", "minimax_m3", "other")


class Architecture:
    """A config.json `architectures[0]` SGLang routes by class: the class, the value of a policy's
    model_family input, and the first release that serves it as that class (None: every release
    from 0.5.11). DSA architectures are DSA only with `index_topk` set (`is_deepseek_dsa`);
    `topk_default`: the transformers config class has a default for it."""

    __slots__ = ("name", "model_class", "family", "since", "topk_default")

    def __init__(self, name, model_class, family, since=None, topk_default=False):
        self.name, self.model_class, self.family, self.since = name, model_class, family, since
        self.topk_default = topk_default


ARCHITECTURES = {a.name: a for a in (
    # srt/configs/model_config.py is_deepseek_dsa (is_deepseek_nsa before 0.5.13)
    Architecture("DeepseekV3ForCausalLM", "dsa", "deepseek_v32"),
    Architecture("DeepseekV3ForCausalLMNextN", "dsa", "deepseek_v32"),
    Architecture("DeepseekV32ForCausalLM", "dsa", "deepseek_v32", topk_default=True),
    Architecture("MistralLarge3ForCausalLM", "dsa", None),
    Architecture("PixtralForConditionalGeneration", "dsa", None),
    Architecture("GlmMoeDsaForCausalLM", "dsa", "glm5", topk_default=True),  # GLM-5: its own SM12x route
    Architecture("GlmMoeDsaForCausalLMNextN", "dsa", None, "0.5.16"),  # GLM-5's SM12x route names GlmMoeDsaForCausalLM
    Architecture("Glm5NextForConditionalGeneration", "dsa", "glm5_next", topk_default=True),  # GLM-5.3-Flash
    Architecture("Glm5NextForConditionalGenerationNextN", "dsa", None, "0.5.20"),
    Architecture("LongcatFlashForCausalLM", "dsa", "longcat_flash", "0.5.16"),
    Architecture("LongcatFlashForCausalLMNextN", "dsa", "longcat_flash", "0.5.16"),
    Architecture("Dots3NoteForCausalLM", "dsa", "dots3_note", "0.5.19"),
    Architecture("Dots3NoteForCausalLMNextN", "dsa", "dots3_note", "0.5.19"),
    Architecture("HYV4ForCausalLM", "dsa", None, "0.5.20"),
    Architecture("HYV4ForCausalLMNextN", "dsa", None, "0.5.20"),
    # is_deepseek_v4; V4.1 is told by model_type (MODEL_TYPES)
    Architecture("DeepseekV4ForCausalLM", "dsv4", "deepseek_v4", "0.5.12"),
    # a draft architecture loaded as the main model: a V4 model for HiSparse, but none of the V4
    # overrides (they test architectures[0] == "DeepseekV4ForCausalLM")
    Architecture("DeepseekV4ForCausalLMNextN", "dsv4", "deepseek_v4_nextn", "0.5.12"),
    Architecture("DeepseekV4ForCausalLMDSpark", "dsv4", "deepseek_v4_dspark", "0.5.16"),
    # is_minimax_sparse
    Architecture("MiniMaxM3SparseForCausalLM", "minimax_m3", "minimax_m3", "0.5.14"),
    Architecture("MiniMaxM3SparseForConditionalGeneration", "minimax_m3", "minimax_m3", "0.5.14"),
)}
# config.json model_type values that decide the class and family whatever the architecture
# (SGLang 0.5.21's configs/deepseek_v41.py renames DeepseekV41ForCausalLM to DeepseekV4ForCausalLM)
MODEL_TYPES = {"deepseek_v41": Architecture("DeepseekV41ForCausalLM", "dsv4", "deepseek_v41", "0.5.21")}

# hub names (no local folder), matched in order on the last path part: (pattern, class, family);
# a known name is never guessed wrong, anything else is "cannot tell"
NAMES = (
    (r"deepseek[-_ ]?v4[._]1(?![0-9])", "dsv4", "deepseek_v41"),
    (r"deepseek[-_ ]?v4(?![._]?[0-9])", "dsv4", "deepseek_v4"),
    (r"minimax[-_ ]?m3(?![0-9])", "minimax_m3", "minimax_m3"),
    (r"deepseek[-_ ]?v3[._]2", "dsa", "deepseek_v32"),
    (r"glm[-_ ]?5[._][0-9]+[-_ ]?flash", "dsa", "glm5_next"),  # GLM-5.3-Flash: Glm5Next
    (r"glm[-_ ]?5(?![0-9])", "dsa", "glm5"),
    (r"deepseek[-_ ]?(v2|v3(?![._]2)|r1|coder|llm|math|moe|vl)|llama|qwen|mistral|mixtral|gemma|phi|kimi|"
     r"glm[-_ ]?4|chatglm|gpt|minimax(?![-_ ]?m3)|yi[-_]|baichuan|internlm|olmo|falcon|command|granite",
     "other", None),
)

# What `hisparse conform` compares of a launch's log, per model class: the WARNING records of these
# SGLang functions (every release's spellings), and of the parser's deprecation notice for flags
# whose names hold one of the `deprecated` parts. The DSA drivers keep their own lists (per driver).
class Routing:
    __slots__ = ("functions", "deprecated")

    def __init__(self, functions, deprecated=()):
        self.functions, self.deprecated = frozenset(functions), tuple(deprecated)


ROUTING = {
    "dsv4": Routing((
        "handle_deprecated_args", "_handle_deprecated_args",  # --attention-backend compressed -> dsv4 (0.5.19+ / before)
        "_deepseek_v4_kv_cache_dtype", "apply_deepseek_v4_defaults", "validate_deepseek_v41_features",
        "validate_deepseek_v4_cp", "context_parallel_attn_dp_size", "_mla_backend_page_constraints",
        # the page constraints before 0.5.15 (inline; also the FA3 FP8 fallback and FA4 page lines there)
        "_handle_attention_backend_compatibility",
        "validate_hisparse", "validate_hisparse_dsa_backend", "validate_hisparse_kv_cache_dtype",
        "validate_hisparse_feature_combos", "_hisparse_validation", "_parse_sparse_config",
        "print_deprecated_warning"), deprecated=("--enable-dp-attention",)),
    "minimax_m3": Routing((
        "_minimax_m3_overrides", "_mla_backend_page_constraints", "_attention_backend_fa3_fp8_fallback",
        "_fa4_page_constraint", "_handle_attention_backend_compatibility", "handle_attention_backend_compatibility",
        "_handle_kv4_compatibility", "handle_kv4_compatibility", "validate_hisparse", "validate_hisparse_feature_combos",
        "_hisparse_validation", "_parse_sparse_config")),
}


def architecture_of(family: str) -> Architecture | None:
    """The architecture (and model_type) a model family's config.json has: its first listed one."""
    for arch in (*MODEL_TYPES.values(), *ARCHITECTURES.values()):
        if arch.family == family:
            return arch
    return None


# SGLang architectures that count as DSA only from a release on (the model reader's view of a
# policy whose every modelled release is older: not DSA)
DSA_SINCE = {a.name: a.since for a in ARCHITECTURES.values() if a.model_class == "dsa" and a.since}


# -- release strings ------------------------------------------------------------------------------
_VERSION = re.compile(r"""^\s*v?(?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre>a|alpha|b|beta|c|rc|pre|preview)[-_.]?(?P<pre_n>\d*))?
    (?:[-_.]?(?:post|rev|r)[-_.]?(?P<post>\d*))?
    (?:[-_.]?dev[-_.]?(?P<dev>\d*))?
    (?:\+[a-z0-9.]+)?\s*$""", re.I | re.X)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


def version_key(version: str) -> tuple | None:
    """A sort key for a release string (PEP 440 order: 1.0 == 1.0.0 < 1.0.1.dev1 < 1.0.1rc1 <
    1.0.1 < 1.0.1.post1), or None when it is not a version."""
    m = _VERSION.match(version or "") if isinstance(version, str) else None
    if m is None:
        return None
    parts = [int(p) for p in m["release"].split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    if m["pre"]:
        stage = (_PRE[m["pre"].lower()], int(m["pre_n"] or 0))
    elif m["dev"] is not None and m["post"] is None:
        stage = (-1, 0)  # a dev release comes before the pre-releases of its version
    else:
        stage = (3, 0)  # the final release
    post = int(m["post"] or 0) + 1 if m["post"] is not None else 0
    dev = int(m["dev"] or 0) if m["dev"] is not None else float("inf")
    return (tuple(parts), stage, post, dev)


def release_key(version: str) -> tuple:
    """version_key, for sorting: a string that is not a version sorts before every release."""
    key = version_key(version)
    return key if key is not None else ((), (-2, 0), 0, 0)


def release(version: str) -> Release | None:
    """The facts of a release: its own row; for a release the table does not list, the row of the
    newest listed release at or before it (a release after the newest known one takes the newest
    facts); None before the first known release or for what is not a version."""
    if version in BY_VERSION:
        return BY_VERSION[version]
    key = version_key(version)
    if key is None:
        return None
    known = [r for r in RELEASES if version_key(r.version) <= key]
    return known[-1] if known else None


def is_newer(version: str) -> bool:
    """After every release the table lists."""
    key = version_key(version)
    return key is not None and key > version_key(RELEASES[-1].version)


def driven_by(module: str) -> tuple:
    """The releases whose conform driver is `module`, oldest first."""
    return tuple(r.version for r in RELEASES if r.driver == module)


def release_flags(version: str) -> frozenset | None:
    """The flags SGLang `version`'s server parser has (release_flags.txt), or None for a release
    the table does not list (its parser is not known)."""
    if version not in BY_VERSION:
        return None
    return _flag_table()[version]


def flag_releases(flag: str) -> list:
    """The listed releases whose server parser has `flag`, oldest first."""
    return [v for v, flags in _flag_table().items() if flag in flags]


_FLAG_TABLE: dict = {}


def _flag_table() -> dict:
    """release -> frozenset of its flags, read once (each line: FLAG FIRST [LAST])."""
    if not _FLAG_TABLE:
        import os

        order = [r.version for r in RELEASES]
        having: dict = {v: [] for v in order}
        with open(os.path.join(os.path.dirname(__file__), "release_flags.txt"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                flag, first, *last = line.split()
                for v in order[order.index(first):order.index(last[0] if last else order[-1]) + 1]:
                    having[v].append(flag)
        _FLAG_TABLE.update({v: frozenset(flags) for v, flags in having.items()})
    return _FLAG_TABLE


def installed_release() -> str | None:
    """The installed SGLang's version, from its package metadata (SGLang is not imported), or
    None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    """`main(["transformers", VERSION])`: print the transformers version of the release's base
    environment (exit 2 for a release before the first known one)."""
    if len(argv) != 2 or argv[0] != "transformers":
        print("usage: transformers VERSION", file=sys.stderr)
        return 2
    row = release(argv[1])
    if row is None:
        known = ", ".join(r.version for r in RELEASES)
        print(f"no SGLang release facts for {argv[1]!r} (known: {known}; a later release takes the newest)",
              file=sys.stderr)
        return 2
    print(row.transformers)
    return 0
