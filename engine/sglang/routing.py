"""`apply(server_args, policy=None)` evaluates the policy on SGLang's ServerArgs, raises what SGLang
raises with the policy's message when the config is rejected, and otherwise logs SGLang's lines
and hands the resolved dtype and backends to SGLang: declared on a 0.5.2x record (read-only once
resolved, see resolution.py), written back on a plain object (older generations).
`resolution_step(policy)` is the same policy as a step of 0.5.2x's resolution pipeline.
"""
from __future__ import annotations

import logging
import sys

from engine.sglang.given import combine
from engine.sglang.layers import SOURCE_KEYS, read_layer
from engine.sglang.server_args import ServerArgsError, attr_names, raise_refusal
from engine.values import clip, typed


def apply(server_args, policy=None, *, dsa_model=None, platform=None, sm_major=None, logger=None):
    """Route `server_args` by the policy.

    On SGLang 0.5.2x's own ServerArgs (a msgspec Struct, see engine/sglang/resolution.py): values
    are read as SGLang reads them (`resolution_result`), nothing is ever assigned; before
    resolution the decided kv_cache_dtype and backends are declared on the record
    (`declare_resolution`), after it the record is only judged.

    On any other object with SGLang's attribute names (older SGLang generations, whose ServerArgs
    is a plain dataclass): reads the policy's inputs from attributes of the same names (phase
    inputs also under their flag aliases, e.g. nsa_decode_backend / dsa_decode_backend) and, when
    accepted, writes the resolved kv_cache_dtype and backends back. A mapping of those names (a
    dict) is read and written the same way. None or a scalar raises ServerArgsError (a TypeError)
    before anything is read; the writes are all or nothing: a field that cannot be written (a
    read-only property, a frozen dataclass) raises ServerArgsError with the object as it was.

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
    fields = Fields(server_args)
    # the object's attributes (a mapping's keys) are one source, read as every other source is
    # (two attributes of one input with different values are an error, not a silent pick)
    attrs: dict = {}
    for name, spec in policy.inputs.items():
        present = [a for a in attr_names(policy, name) if fields.has(a)]
        values = {a: fields.get(a) for a in present if fields.get(a) is not None}
        if values:
            attrs.update(values)
        elif present and spec.nullable:
            attrs[name] = None
    for key in SOURCE_KEYS:
        value = fields.get(key.replace("-", "_"))
        if value is not None and value != "":
            attrs[key] = value
    layer = read_layer(policy, attrs, "server_args")
    layer.inputs = {name: (name, value) for name, (_, value) in layer.inputs.items()}  # no flags typed
    given = {k: v for k, v in env.items() if v is not None and k in policy.inputs}
    layers = [read_layer(policy, _detected(policy), "torch"), layer, read_layer(policy, given, "apply()")]
    decision = policy.evaluate(combine(policy, layers).config)
    if not decision.ok:
        raise_refusal(decision)
    fields.write_all([(attr, value) for name, value in decision.config.items()
                      for attr in attr_names(policy, name) if fields.has(attr)])
    for line in decision.log:
        logger.warning(line)
    return decision


class Fields:
    """The fields of a ServerArgs as apply() reads and writes them: an object's attributes, or a
    mapping's keys (a dict of SGLang's attribute names). Anything else (None, a number) is refused
    before anything is read; writes are all or nothing."""

    def __init__(self, target):
        from collections.abc import Mapping, MutableMapping

        if target is None or isinstance(target, (str, bytes, int, float, list, tuple)):
            raise ServerArgsError(f"apply() reads SGLang's ServerArgs or a mapping of its attribute names, "
                                  f"got {typed(target)}")
        self.target = target
        self.mapping = isinstance(target, Mapping)
        self.writable = isinstance(target, MutableMapping)

    def has(self, name: str) -> bool:
        return name in self.target if self.mapping else hasattr(self.target, name)

    def get(self, name: str):
        return self.target.get(name) if self.mapping else getattr(self.target, name, None)

    def write_all(self, items: list) -> None:
        """Write every (name, value), or nothing: each field is first written with the value it
        holds (a read-only one fails there, before any change), and should a write still fail,
        those already made are undone."""
        if self.mapping and not self.writable:
            if items:
                raise ServerArgsError(f"apply() cannot write the resolved values into a read-only mapping "
                                      f"({type(self.target).__name__}); nothing was written")
            return
        put = self.target.__setitem__ if self.mapping else (lambda n, v: setattr(self.target, n, v))
        old = [(name, self.get(name)) for name, _ in items]
        for name, value in old:  # a field that cannot be written fails here, before any change
            self._put(put, name, value)
        done = []
        try:
            for (name, value), before in zip(items, old):
                self._put(put, name, value)
                done.append(before)
        except ServerArgsError:
            for name, value in reversed(done):
                put(name, value)
            raise

    def _put(self, put, name: str, value) -> None:
        try:
            put(name, value)
        except Exception as exc:  # a read-only property, a frozen dataclass, __slots__, a failing setter
            raise ServerArgsError(f"apply() cannot write server_args.{name} ({type(exc).__name__}: "
                                  f"{clip(str(exc))}); nothing was written") from None


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
