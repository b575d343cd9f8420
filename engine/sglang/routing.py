"""`apply(server_args, policy=None)` evaluates the policy on SGLang's ServerArgs, raises what SGLang
raises with the policy's message when the config is rejected, and otherwise logs SGLang's lines
and hands the resolved dtype and backends to SGLang: declared on a 0.5.2x record (read-only once
resolved, see resolution.py), written back on a plain object (older generations).
`resolution_step(policy)` is the same policy as a step of 0.5.2x's resolution pipeline.
"""
from __future__ import annotations

import logging
import sys

from engine.sglang.given import MODEL_KEYS, OPTIONS, combine, read_layer
from engine.sglang.server_args import attr_names, raise_refusal


def apply(server_args, policy=None, *, dsa_model=None, platform=None, sm_major=None, logger=None):
    """Route `server_args` by the policy.

    On SGLang 0.5.2x's own ServerArgs (a msgspec Struct, see engine/sglang/resolution.py): values
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
    import engine.sglang.resolution as sglang_resolution
    from engine.policy.loader import load_policy
    from engine.files.shipped import policy_ref

    policy = load_policy(policy_ref(policy))
    logger = logger or logging.getLogger("sglang.srt.server_args")
    env = {"dsa_model": dsa_model, "platform": platform, "sm_major": sm_major}
    if sglang_resolution.is_view(server_args):
        decision, _ = sglang_resolution.decide(server_args, policy, env)
        return decision
    if sglang_resolution.is_record(server_args):
        return sglang_resolution.apply_to_record(server_args, policy, env, logger)
    # the object's attributes are one source, read as every other source is (two attributes of
    # one input with different values are an error, not a silent pick)
    attrs: dict = {}
    for name, spec in policy.inputs.items():
        present = [a for a in attr_names(policy, name) if hasattr(server_args, a)]
        values = {a: getattr(server_args, a) for a in present if getattr(server_args, a) is not None}
        if values:
            attrs.update(values)
        elif present and spec.nullable:
            attrs[name] = None
    for key in MODEL_KEYS + tuple(k for p, (aliases, _) in OPTIONS.items() for k in (p,) + aliases):
        value = getattr(server_args, key.replace("-", "_"), None)
        if value is not None and value != "":
            attrs[key] = value
    layer = read_layer(policy, attrs, "server_args")
    layer.inputs = {name: (name, value) for name, (_, value) in layer.inputs.items()}  # no flags typed
    given = {k: v for k, v in env.items() if v is not None and k in policy.inputs}
    layers = [read_layer(policy, _detected(policy), "torch"), layer, read_layer(policy, given, "apply()")]
    decision = policy.evaluate(combine(policy, layers).config)
    if not decision.ok:
        raise_refusal(decision)
    for name, value in decision.config.items():
        for attr in attr_names(policy, name):
            if hasattr(server_args, attr):
                setattr(server_args, attr, value)
    for line in decision.log:
        logger.warning(line)
    return decision


def resolution_step(policy=None, **env):
    """A resolution step for SGLang 0.5.2x to run in place of its DSA passes: see
    engine/sglang/resolution.py."""
    from engine.sglang.resolution import resolution_step as step

    return step(policy, **env)


def _detected(policy) -> dict:
    """platform and sm_major from torch, if the caller already imported it."""
    out = {}
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
    return {k: v for k, v in out.items() if k in policy.inputs}
