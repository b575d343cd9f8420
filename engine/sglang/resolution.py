"""The policy on SGLang's own ServerArgs of 0.5.2x (a msgspec Struct), through SGLang's doors.

That ServerArgs is never written by resolution: a step returns `{field: value}` and SGLang
appends it to the record with `declare_resolution`; readers use `resolution_result(record,
field)` (the last declaration, else the operator's input). The record refuses assignment while
resolution runs and after it. So the policy comes in three ways, none of which assigns a field:

- `resolution_step(policy)`: a resolution step with the signature of SGLang's post-process
  passes (`fn(view) -> {field: value}`), for SGLang to run in place of its two DSA passes
  (`_dsa_kv_cache_dtype_default`, `_dsa_split_backend_resolution`);
- `apply(record)` before resolution: the decision is declared on the record (a launcher-stage
  declaration, which the pipeline keeps), so SGLang's DSA steps find the phases set;
- `apply(record)` after resolution: the policy judges the resolved values; nothing is written.

The model is read from SGLang's ModelConfig (`is_deepseek_dsa`, the DeepSeek-family gate, the
architecture), the platform from `get_platform()`, the GPU from
`torch.cuda.get_device_capability()`, as SGLang's DSA steps read them. SGLang is never imported
here: these paths run only on objects of an SGLang already imported."""
from __future__ import annotations

import logging
import sys

from engine.sglang.hook_targets import deepseek_family_archs, resolution_finished

_OVERRIDES = "sglang.srt.arg_groups.overrides"


def overrides_module():
    """SGLang's `arg_groups/overrides` when an SGLang with declared resolution is imported."""
    return sys.modules.get(_OVERRIDES)


def is_view(obj) -> bool:
    mod = overrides_module()
    kinds = tuple(k for k in (getattr(mod, "ResolvedView", None), getattr(mod, "ResolvingConfig", None)) if k)
    return bool(kinds) and isinstance(obj, kinds)


def _fields(record) -> set:
    """The field names of a ServerArgs: a msgspec Struct's (0.5.20 on), a dataclass's (before)."""
    names = getattr(type(record), "__struct_fields__", None)
    if names is None:
        import dataclasses

        names = [f.name for f in dataclasses.fields(record)]
    return set(names)


def is_record(obj) -> bool:
    """A ServerArgs of an SGLang that declares its resolution (msgspec Struct, resolve_once)."""
    if overrides_module() is None:
        return False
    msgspec = sys.modules.get("msgspec")
    return (msgspec is not None and isinstance(obj, msgspec.Struct)
            and callable(getattr(obj, "resolve_once", None)))


def record_of(obj):
    """The ServerArgs a resolution view reads (SGLang's `record_of`; the view's own reference in
    0.5.15-0.5.18, which lack it); a ServerArgs is its own record."""
    mod = overrides_module()
    if not is_view(obj):
        return obj
    if hasattr(mod, "record_of"):
        return mod.record_of(obj)
    return object.__getattribute__(obj, "_server_args")


def _reader(obj):
    """name -> value as SGLang reads it (view attribute or resolution_result), or KeyError."""
    mod = overrides_module()
    if is_view(obj):
        record = record_of(obj)
        fields = _fields(record)

        def read(name):
            if name not in fields:
                raise KeyError(name)
            return getattr(obj, name)
        return read
    fields = _fields(obj)
    # before 0.5.19 the fields carry the resolved values once resolution has run
    result = getattr(mod, "resolution_result", None) or (lambda record, name: getattr(record, name))

    def read(name):
        if name not in fields:
            raise KeyError(name)
        return result(obj, name)
    return read


def _detect(obj, policy) -> dict:
    """The environment inputs (dsa_model, model_family, platform, sm_major) as SGLang's DSA steps
    find them; one that cannot be read is left out (then the model path decides dsa_model and
    model_family, as for any source, and the policy's default the rest)."""
    from engine.sglang.models import DSA_ARCHITECTURES

    mod = overrides_module()
    out: dict = {}
    try:
        # model_config_of from 0.5.19; the view's get_model_config() before
        config = mod.model_config_of(obj) if hasattr(mod, "model_config_of") else obj.get_model_config()
        hf_config = config.hf_config
        from sglang.srt.configs.model_config import is_deepseek_dsa

        arch = hf_config.architectures[0]
        out["dsa_model"] = bool(arch in deepseek_family_archs(vars(mod)) and is_deepseek_dsa(hf_config))
        if out["dsa_model"] and DSA_ARCHITECTURES.get(arch):
            out["model_family"] = DSA_ARCHITECTURES[arch]
    except Exception:  # no readable model config
        out.clear()
    try:
        from sglang.srt.runtime_context import get_platform

        out["platform"] = "hip" if get_platform().is_hip else "cuda"
    except ImportError:  # before the runtime context (0.5.19)
        try:
            from sglang.srt.utils import is_hip

            out["platform"] = "hip" if is_hip() else "cuda"
        except Exception:
            pass
    except Exception:
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            out["sm_major"] = int(torch.cuda.get_device_capability()[0])
        except Exception:  # no GPU here: the policy's default applies
            pass
    spec = policy.inputs.get("model_family")
    if spec is not None and "model_family" in out and not spec.accepts(out["model_family"]):
        del out["model_family"]  # a family this policy does not name: its default applies
    return {k: v for k, v in out.items() if k in policy.inputs}


def decide(obj, policy, env: dict):
    """(Decision, {field: value} the decision changes) for a record or view; raises like SGLang
    when the policy refuses the config."""
    from engine.sglang.server_args import raise_refusal

    decision, changes, _ = judge(obj, policy, env)
    if not decision.ok:
        raise_refusal(decision)
    return decision, changes


def judge(obj, policy, env: dict):
    """(Decision, {field: value} the decision changes, what was given) for a record or view,
    refused or not. What SGLang finds on the machine and in the model, the record's fields and
    the keyword arguments are three sources, each read through engine/sglang/layers.py as every
    other source is, and stacked in that order (the keyword arguments last). What was given
    (engine.sglang.given.Given.given) is what a decision record keeps."""
    from engine.sglang.given import combine
    from engine.sglang.layers import SOURCE_KEYS, read_layer
    from engine.sglang.server_args import attr_names

    read = _reader(obj)
    found = _detect(obj, policy)
    attrs: dict = {}
    fields_of: dict = {}  # input -> the record fields that carry it
    for name, spec in policy.inputs.items():
        values, present = {}, False
        for attr in attr_names(policy, name):
            try:
                value = read(attr)
            except KeyError:
                continue
            present = True
            fields_of.setdefault(name, []).append(attr)
            if value is not None:
                values[attr] = value
        if values:
            attrs.update(values)
        elif present and spec.nullable:
            attrs[name] = None
    for key in SOURCE_KEYS:
        try:
            value = read(key.replace("-", "_"))
        except KeyError:
            continue
        if value is not None and value != "":
            attrs[key] = value
    given = {k: v for k, v in env.items() if v is not None and k in policy.inputs}
    record, sglang, kwargs = [read_layer(policy, data, source) for data, source in
                              ((attrs, "server_args"), (found, "sglang"), (given, "apply()"))]
    record.inputs = {name: (name, value) for name, (_, value) in record.inputs.items()}
    combined = combine(policy, [sglang, record, kwargs])
    decision = policy.evaluate(combined.config)
    changes = {}
    for name, value in decision.config.items():
        for attr in fields_of.get(name, ()):
            if read(attr) != value:
                changes[attr] = value
    return decision, changes, combined.given


def apply_to_record(server_args, policy, env: dict, logger):
    """`engine.sglang.apply` on an SGLang 0.5.2x ServerArgs: before (or during) resolution the
    changes are declared and the policy's lines logged; a resolved record is only judged."""
    decision, changes = decide(server_args, policy, env)
    if not resolution_finished(server_args):
        if changes:
            overrides_module().declare_resolution(server_args, _source(policy), **changes)
        for line in decision.log:
            logger.warning(line)
    return decision


def _source(policy) -> str:
    return f"hisparse-router {policy.family}@{policy.version}"


def resolution_step(policy=None, *, dsa_model=None, platform=None, sm_major=None, logger=None):
    """A resolution step for SGLang 0.5.2x, in place of its DSA passes: `step(view)` evaluates
    the policy on what resolution has declared so far, logs the policy's lines, raises like SGLang
    when it refuses (ValueError, or AssertionError for SGLang's asserts), and returns the fields
    it decides, for `run_post_process_pass` to declare. Keyword arguments fix inputs that are
    otherwise read from the machine and the model."""
    from engine.policy.loader import load_policy
    from engine.files.shipped import policy_ref

    loaded = load_policy(policy_ref(policy))
    env = {"dsa_model": dsa_model, "platform": platform, "sm_major": sm_major}
    log = logger or logging.getLogger("sglang.srt.arg_groups.overrides")

    def dsa_policy_resolution(view) -> dict:
        decision, changes = decide(view, loaded, env)
        for line in decision.log:
            log.warning(line)
        return changes

    # SGLang names a step's declarations by its __qualname__ (the `source` of declare_resolution)
    dsa_policy_resolution.__qualname__ = _source(loaded)
    dsa_policy_resolution.policy = loaded
    return dsa_policy_resolution
