"""SGLang adapters: read a real launch command, and stand in for SGLang's hard-coded routing.

`config_from_launch(policy, tokens)` parses `python -m sglang.launch_server ...` the way SGLang's
argument parser would for the routing flags: `--flag value` and `--flag=value`, store-true
booleans, `--config FILE` (SGLang's YAML config file; command-line flags win), the policy's flag
aliases (e.g. deprecated `--nsa-*` spellings). Unrelated flags (`--tp 8`, `--trust-remote-code`)
are skipped. A flag that looks like a misspelt or abbreviated routing flag is an error with
did-you-mean, never a guess. Whether the model uses DeepSeek Sparse Attention is read from the
model path (DeepSeek-V3.2*, GLM-5*); `--dsa-model` / `--no-dsa-model` given to hisparse override.

`apply(server_args, policy=None)` evaluates the policy on SGLang's ServerArgs, raises what SGLang
raises with the policy's message when the config is rejected, and otherwise logs SGLang's lines
and hands the resolved dtype and backends to SGLang: declared on a 0.5.2x record (read-only once
resolved, see sglang_resolution.py), written back on a plain object (older generations).
`resolution_step(policy)` is the same policy as a step of 0.5.2x's resolution pipeline.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shlex
import sys

from .errors import ConfigError, Problem
from .suggest import near_miss

# model names whose config makes SGLang's is_deepseek_nsa() true (DeepSeek Sparse Attention),
# by family (the names a policy's model_family input uses)
DSA_FAMILIES = {
    "deepseek_v32": re.compile(r"deepseek[-_ ]?v3[._]2", re.I),
    "glm5": re.compile(r"glm[-_ ]?5(?![0-9])", re.I),
}
DSA_MODELS = re.compile("|".join(p.pattern for p in DSA_FAMILIES.values()), re.I)
# model families known not to use DSA (anything else is "unknown": the policy default applies)
NON_DSA_MODELS = re.compile(
    r"deepseek[-_ ]?(v2|v3(?![._]2)|r1|coder|llm|math|moe|vl)|llama|qwen|mistral|mixtral|gemma|phi|kimi|"
    r"glm[-_ ]?4|chatglm|gpt|minimax|yi[-_]|baichuan|internlm|olmo|falcon|command|granite", re.I)

_LAUNCHERS = ("sglang.launch_server", "launch_server.py", "sglang.srt.server")

# SGLang options whose value is a JSON object: option -> {JSON key: the policy input it sets}
JSON_OPTIONS = {
    "hisparse-config": {"top_k": "hisparse_top_k", "device_buffer_size": "hisparse_device_buffer_size"},
    "hierarchical-sparse-attention-extra-config": {"top_k": "hisparse_top_k",
                                                   "device_buffer_size": "hisparse_device_buffer_size"},
}


def _model_name(model_path: str) -> str:
    return os.path.basename(model_path.rstrip("/\\")) or model_path


def model_is_dsa(model_path: str) -> bool | None:
    """True / False when the model path names a known family, None when it cannot tell."""
    name = _model_name(model_path)
    if DSA_MODELS.search(name):
        return True
    if NON_DSA_MODELS.search(name):
        return False
    return None


def model_family(model_path: str) -> str | None:
    """The DSA family a model path names (deepseek_v32, glm5), or None."""
    name = _model_name(model_path)
    return next((fam for fam, pattern in DSA_FAMILIES.items() if pattern.search(name)), None)


def model_inputs(policy, model_path: str) -> tuple[dict, str | None]:
    """(inputs the model path decides, a note when it cannot tell) for the policy's dsa_model and
    model_family inputs, where it declares them."""
    out: dict = {}
    dsa = model_is_dsa(model_path)
    if "dsa_model" in policy.inputs:
        if dsa is None:
            default = str(policy.inputs["dsa_model"].default).lower()
            return out, (f"cannot tell whether {model_path} uses DeepSeek Sparse Attention: the policy "
                         f"default ({default}) applies; pass --dsa-model or --no-dsa-model to hisparse to say")
        out["dsa_model"] = dsa
    family = model_family(model_path)
    spec = policy.inputs.get("model_family")
    if spec is not None and family is not None and spec.accepts(family):
        out["model_family"] = family
    return out, None


def expand_json_options(policy, data: dict, file: str = "") -> tuple[dict, list[Problem]]:
    """Replace SGLang's JSON-valued options (e.g. --hisparse-config '{"top_k": 2048}') in a
    config by the policy inputs they carry; options whose inputs the policy does not declare
    are left alone (and ignored as unrelated keys)."""
    out, problems = {}, []
    for key, value in data.items():
        mapping = JSON_OPTIONS.get(key.replace("_", "-")) if isinstance(key, str) else None
        targets = {k: v for k, v in (mapping or {}).items() if v in policy.inputs}
        if not targets:
            out[key] = value
            continue
        obj = value
        if isinstance(value, str):
            try:
                obj = json.loads(value)
            except (json.JSONDecodeError, RecursionError):
                problems.append(Problem("C503", f"{key}: not a JSON object: {value!r}", file))
                continue
        if not isinstance(obj, dict):
            problems.append(Problem("C503", f"{key}: expected a JSON object, got {type(obj).__name__}", file))
            continue
        for json_key, name in targets.items():
            if json_key in obj:
                out[name] = obj[json_key]
    return out, problems


def launch_args(tokens: list[str]) -> list[str]:
    """The server arguments of a launch command (everything after the launcher)."""
    if len(tokens) == 1 and " " in tokens[0].strip():
        tokens = shlex.split(tokens[0])
    for i, tok in enumerate(tokens):
        if tok.endswith(_LAUNCHERS) or (tok == "serve" and i and os.path.basename(tokens[i - 1]) == "sglang"):
            return tokens[i + 1:]
    if tokens and tokens[0].startswith("--"):
        return tokens  # the arguments alone
    shown = " ".join(tokens[:4]) + (" ..." if len(tokens) > 4 else "")
    raise ConfigError([Problem("C501", f"not an SGLang launch command: {shown!r}",
                               hint="expected python -m sglang.launch_server ARGS, or the ARGS alone")])


def _flag_table(policy) -> dict:
    """--flag (as typed) -> input name, for every spelling the policy declares."""
    table = {}
    for name, spec in policy.inputs.items():
        for flag in tuple(spec.flags) + tuple(spec.deprecated):
            table[flag] = name
            table["--" + flag[2:].replace("-", "_")] = name
    return table


def config_from_launch(policy, tokens: list[str]) -> tuple[dict, list[str]]:
    """(canonical config, notes) from a launch command. Raises ConfigError listing every problem."""
    args = launch_args(tokens)
    flags = _flag_table(policy)
    problems: list[Problem] = []
    notes: list[str] = []
    given: dict = {}
    config_file = None
    model = None
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("--") or tok == "--":
            notes.append(f"ignored the stray argument {tok!r}")
            continue
        flag, eq, inline = tok.partition("=")

        def value():
            nonlocal i
            if eq:
                return inline
            if i < len(args) and not (args[i].startswith("--")):
                i += 1
                return args[i - 1]
            problems.append(Problem("C503", f"{flag} expects a value"))
            return None

        if flag == "--config":
            config_file = value()
            continue
        if flag[2:] in JSON_OPTIONS:
            raw = value()
            if raw is not None:
                expanded, more = expand_json_options(policy, {flag[2:]: raw})
                problems += more
                given.update({k: v for k, v in expanded.items() if k in policy.inputs})
            continue
        name = flags.get(flag)
        if name is None:
            near = _near_routing_flag(flag, flags)
            if near:
                problems.append(Problem("C501", f"unknown flag {flag}", hint=near))
                if not eq and i < len(args) and not args[i].startswith("--"):
                    i += 1
                continue
            # an unrelated SGLang flag: take a following non-flag token as its value
            v = value() if (eq or (i < len(args) and not args[i].startswith("--"))) else None
            if flag in ("--model-path", "--model"):
                model = v
            continue
        spec = policy.inputs[name]
        if spec.type == "bool":
            if eq:
                problems.append(Problem("C503", f"{flag} is a switch and takes no value (got {inline!r})"))
                continue
            given[flag[2:]] = True
            continue
        raw = value()
        if raw is None:
            continue
        if spec.type == "int":
            try:
                raw = int(raw)
            except ValueError:
                problems.append(Problem("C503", f"{flag}: expected an integer, got {raw!r}"))
                continue
        given[flag[2:]] = raw  # the spelling typed: a deprecated one is logged when evaluated
    from .config import load_config_file, merge_config

    config: dict = {}
    if config_file is not None:
        try:
            config, _ = load_config_file(policy, config_file)
        except ConfigError as exc:
            problems += exc.problems
    try:
        policy.normalize(given)
    except ConfigError as exc:
        problems += exc.problems
    if problems:
        raise ConfigError(problems)
    config = merge_config(policy, config, given)
    if model is None:
        if "dsa_model" in policy.inputs:
            notes.append("no --model-path: whether the model uses DSA is left to the policy default "
                         f"({str(policy.inputs['dsa_model'].default).lower()})")
    else:
        decided, note = model_inputs(policy, model)
        if note:
            notes.append(note)
        for name, value in decided.items():
            if policy.canonical_key(name) not in {policy.canonical_key(k) for k in config}:
                config[name] = value
    return config, notes


def _near_routing_flag(flag: str, flags: dict) -> str:
    """A did-you-mean when `flag` is a misspelling or an abbreviation of a routing flag."""
    primary = sorted({f for f in flags if "_" not in f})
    prefixed = [f for f in primary if f.startswith(flag) and f != flag]
    if prefixed and len(flag) > 4:
        return ("an abbreviation is not accepted here (SGLang's parser may resolve it differently): "
                "did you mean " + " or ".join(prefixed) + "?")
    hit = near_miss(flag, primary)
    return f"did you mean {hit}?" if hit else ""


# -- in place of SGLang's if/else --------------------------------------------------------------
# rules SGLang checks with a bare `assert` (AssertionError); it refuses everything else with a
# ValueError
ASSERTED_RULES = frozenset({"dsa-dtype", "hisparse-dsa-model", "hisparse-radix-cache"})


def raise_refusal(decision):
    """Raise what SGLang raises for the decision's first violation."""
    first = decision.violations[0]
    raise (AssertionError if first.check in ASSERTED_RULES else ValueError)(decision.error)


def apply(server_args, policy=None, *, dsa_model=None, platform=None, sm_major=None, logger=None):
    """Route `server_args` by the policy.

    On SGLang 0.5.2x's own ServerArgs (a msgspec Struct, see engine/sglang_resolution.py): values
    are read as SGLang reads them (`resolution_result`), nothing is ever assigned; before
    resolution the decided kv_cache_dtype and backends are declared on the record
    (`declare_resolution`), after it the record is only judged.

    On any other object with SGLang's attribute names (older SGLang generations, whose ServerArgs
    is a plain dataclass): reads the policy's inputs from attributes of the same names (phase
    inputs also under their flag aliases, e.g. nsa_decode_backend / dsa_decode_backend) and, when
    accepted, writes the resolved kv_cache_dtype and backends back.

    Inputs SGLang takes from the environment come from the keyword arguments, else as SGLang finds
    them (its ModelConfig, platform and torch.cuda for a 0.5.2x record; the model path and torch if
    already imported otherwise), else from the policy's defaults. A refused config raises what
    SGLang raises for that rule (AssertionError for its asserts, ValueError otherwise) before
    anything is written or declared; an accepted one logs SGLang's lines (except on a resolved
    record, which SGLang has already routed and logged). Returns the Decision."""
    from . import sglang_resolution
    from .loader import load_policy
    from .paths import default_policy_ref

    policy = load_policy(policy or default_policy_ref())
    logger = logger or logging.getLogger("sglang.srt.server_args")
    env = {"dsa_model": dsa_model, "platform": platform, "sm_major": sm_major}
    if sglang_resolution.is_view(server_args):
        decision, _ = sglang_resolution.decide(server_args, policy, env)
        return decision
    if sglang_resolution.is_record(server_args):
        return sglang_resolution.apply_to_record(server_args, policy, env, logger)
    config: dict = {}
    for name, spec in policy.inputs.items():
        present = [a for a in _attr_names(policy, name) if hasattr(server_args, a)]
        values = [getattr(server_args, a) for a in present]
        value = next((v for v in values if v is not None), None)
        if value is not None or (present and spec.nullable):
            config[name] = value
    detected = _detect(server_args, policy)
    env["model_family"] = detected.get("model_family")
    for option in JSON_OPTIONS:
        raw = getattr(server_args, option.replace("-", "_"), None)
        if raw:
            expanded, problems = expand_json_options(policy, {option: raw})
            if problems:
                raise ValueError(str(problems[0].message))
            config.update({k: v for k, v in expanded.items() if k in policy.inputs})
    for name, value in env.items():
        if name in policy.inputs and name not in config:
            value = value if value is not None else detected.get(name)
            if value is not None:
                config[name] = value
    decision = policy.evaluate(config)
    if not decision.ok:
        raise_refusal(decision)
    for name, value in decision.config.items():
        for attr in _attr_names(policy, name):
            if hasattr(server_args, attr):
                setattr(server_args, attr, value)
    for line in decision.log:
        logger.warning(line)
    return decision


def resolution_step(policy=None, **env):
    """A resolution step for SGLang 0.5.2x to run in place of its DSA passes: see
    engine/sglang_resolution.py."""
    from .sglang_resolution import resolution_step as step

    return step(policy, **env)


def _attr_names(policy, name: str) -> list[str]:
    """The attribute names an input may have on a ServerArgs: its name, then its flags', then its
    deprecated flags' (older SGLang objects)."""
    spec = policy.inputs[name]
    names = [name] + [f[2:].replace("-", "_") for f in tuple(spec.flags) + tuple(spec.deprecated)]
    return list(dict.fromkeys(names))


def _detect(server_args, policy) -> dict:
    out = {}
    model = getattr(server_args, "model_path", None)
    if isinstance(model, str):
        out.update(model_inputs(policy, model)[0])
    torch = sys.modules.get("torch")  # only if the caller already imported it
    if torch is not None:
        if getattr(getattr(torch, "version", None), "hip", None):
            out["platform"] = "hip"
        try:
            if torch.cuda.is_available():
                out["sm_major"] = int(torch.cuda.get_device_capability()[0])
                out.setdefault("platform", "cuda")
        except Exception:  # no usable device: leave it to the policy's default
            pass
    return out
