"""A MiniMax-M3 policy standing in for SGLang's MiniMax-M3 launch override, as a drop-in (the DSA
functions: engine/sglang/routing_hooks.py; DeepSeek-V4's: engine/sglang/dsv4_hooks.py).

What the plugin replaces (SGLang 0.5.21 to 0.5.23, engine/sglang/hook_targets.py): the provider
`_minimax_m3_overrides(server_args, hf_config) -> {field: value}` that
`arg_groups/model_overrides/minimax_m3.py` registers for both MiniMax-M3 architectures in SGLang's
model-override registry (`model_override_base._MODEL_OVERRIDE_FNS`, filled by
`register_model_override`). SGLang has no call to take a provider back, so the plugin puts its own
entry in the original's place in that registry, for each architecture, and replaces the module's
function through the HookRegistry; the entry calls the module's function, so both paths run the
replacement. The policy's part `minimax_m3_overrides` answers it: the attention backend, the page
size and the MoE runner it declares, and its WARNING lines.

In a launch the provider, SGLang's first MiniMax-M3 step, decides the whole policy once on the
ServerArgs (the decision a record keeps), and returns what the part declares on the values
resolution holds when SGLang calls it (its resolving view). The rest of the launch (the NPU
defaults before it, the generic attention, KV-cache and page-size steps after it, the HiSparse
checks) stays SGLang's own code, so the decision is held against what that code will do: the
release's shipped version of the family evaluated on the same launch without its own part, the
part's declarations given as the operator's. Where the policy decides anything else otherwise,
the launch stops naming the difference.

What the policy does not model of the provider stays SGLang's: the fields it declares that are
no input of the policy (on ROCm `disable_custom_all_reduce`) and the environment it sets
(`USE_ROCM_AITER_ROPE_BACKEND`) come from SGLang's own provider, run with its lines held back;
its INFO lines, which report what it declared ("MiniMax-M3 on Hopper: attention_backend=fa3,
page_size=128 ..."), are SGLang's texts filled in with what the replacement declares. Outside
the policy's domain (a quantized checkpoint, a value or platform it does not declare, a config
its leaves_out names), SGLang's own provider answers."""
from __future__ import annotations

import logging
import os
import sys

from engine.language.interpreter import Part
from engine.sglang import facts
from engine.sglang.routing_hooks import (NotEnforceable, PolicyRouting, Unmodelled, deciding_line, is_server_args,
                                         log_as, record_of)
from engine.sglang.server_args import attr_names

PART = "minimax_m3_overrides"
# SGLang 0.5.21 to 0.5.23's INFO lines of the provider (model_overrides/minimax_m3.py), which
# report what it declared
SM100_LINE = ("MiniMax-M3 on SM100: attention_backend={attention_backend}, page_size={page_size}, "
              "moe_runner_backend={moe_runner_backend}.")
HOPPER_LINE = ("MiniMax-M3 on Hopper: attention_backend={attention_backend}, page_size={page_size} "
               "(MSA is SM100-only; sparse attention runs on the Triton path).")
FP8_DISABLED_LINE = ("MiniMax-M3 fp8 attention GEMMs DISABLED by SGLANG_DISABLE_M3_FP8_ATTN_GEMM: bf16 indexer "
                     "+ widening Triton sparse path, bf16 q; dense layers keep trtllm_mha's fp8 KV cache.")
FP8_ACTIVE_LINE = ("MiniMax-M3 fp8 attention GEMMs active (kv_cache_dtype fp8_e4m3 + trtllm_mha on SM100): fp8 "
                   "main/index KV, fp8-cast q, fp8 sparse/MSA kernels. Set SGLANG_DISABLE_M3_FP8_ATTN_GEMM=1 "
                   "to force the pre-fp8 numerics.")


class M3Routing(PolicyRouting):
    """The MiniMax-M3 family's policy in place of SGLang's MiniMax-M3 provider. `shipped`: the
    release's own shipped version of the family (the launch guard's reference); `release`: its
    name, for messages."""

    def __init__(self, policy, shipped, release: str, shown_as=None, on_decision=None, reads=None):
        super().__init__(policy, shown_as, on_decision, {}, reads)
        self.shipped, self.release = shipped, release
        self.line = deciding_line(policy, shown_as, "MiniMax-M3 routing decided by")
        # the policy inputs the part writes, and the attribute names of every input (what SGLang's
        # provider declares of them is the policy's to say)
        self.part_fields = tuple(dict.fromkeys(n for r in policy.rule_list if r.part == PART for n in r.set))
        self.policy_attrs = {a for n in policy.inputs for a in attr_names(policy, n)}

    # -- reading a call --------------------------------------------------------------------------
    def _values(self, obj) -> dict:
        """The inputs `obj` carries, and the environment variables the policy reads, as SGLang
        reads them (`envs.NAME.get()` for a boolean one: "1", "yes", "true" ...)."""
        values = super()._values(obj)
        envs = getattr(sys.modules.get("sglang.srt.environ"), "envs", None)
        for name, spec in self.policy.inputs.items():
            if spec.env is None or spec.env not in os.environ:
                continue
            if spec.type == "bool" and envs is not None and hasattr(envs, spec.env):
                values[name] = bool(getattr(envs, spec.env).get())
            else:
                values[name] = os.environ[spec.env]
        return values

    def _found(self, g: dict) -> dict:
        """The model and the platform as the provider tells them: `get_platform()` (is_hip, is_npu,
        and the GPU generation by is_sm100 / is_sm90 / is_sm120). A GPU whose generation facts
        disagree with its capability is outside the policy (Unmodelled)."""
        found = {"model_family": "minimax_m3", "platform": facts.platform_of(g, "get_platform")}
        if found["platform"] == "cuda" and "sm_major" in self.policy.inputs:
            p = g["get_platform"]()
            named = 10 if p.is_sm100 else 9 if p.is_sm90 else 12 if p.is_sm120 else None
            if named is None:
                named = facts.sm_major()
                if named in (9, 10, 12):  # the capability says a generation its facts deny
                    raise Unmodelled("sm_major")
            found["sm_major"] = named
        return found

    # -- _minimax_m3_overrides(server_args, hf_config) -> {field: value} ---------------------------
    def provider(self, original, logger):
        """The MiniMax-M3 provider: the rules of the part `minimax_m3_overrides`."""
        g = original.__globals__
        quantization_of = g.get("get_quantization_config")

        def _minimax_m3_overrides(server_args, hf_config) -> dict:
            if quantization_of is None or quantization_of(hf_config) is not None:
                return original(server_args, hf_config)  # a quantized checkpoint: not modelled
            record = record_of(server_args)
            cfg = g["resolving_view"](server_args)
            try:
                found = self._found(g)
                self._config({}, found, strict=True)
                before = self._config(self._values(cfg), found, strict=True)
                if is_server_args(record):
                    self._config(self._values(record), found, strict=True)
            except Unmodelled:
                return original(server_args, hf_config)
            part = self.policy.evaluate(before, Part(("resolve",), rules=(PART,)))
            if not part.in_scope:
                return original(server_args, hf_config)
            declared = {f: part.config[f] for f in self.part_fields
                        if part.config[f] != self.policy.complete(before)[f]}
            launch = None
            if is_server_args(record):  # decided once per record, however often SGLang collects it
                launch = self._launch_of(record) or self._decide_launch(record, record, found)
                if not launch.decision.in_scope:
                    return original(server_args, hf_config)
                self._guard(launch.decision, declared)
            first = part.violations[0] if not part.ok else None
            if first is not None:
                self._refuse(logger, launch, part, first)
            theirs = _held_back(original, g.get("logger"), server_args, hf_config)
            for level, line in self._info_lines(found, before, declared):
                log_as(logger, original, line, level)
            for line in part.lines_of(PART):
                log_as(logger, original, line)
            if launch is not None:
                self._name_the_policy(logger, launch)
            return self._merged(theirs, declared)

        _minimax_m3_overrides.__qualname__ = original.__qualname__
        return _minimax_m3_overrides

    def _merged(self, theirs: dict, declared: dict) -> dict:
        """SGLang's declarations, in its order, with those of the policy's inputs replaced by the
        part's (a field the part does not declare is not declared)."""
        out = {}
        for name, value in theirs.items():
            if name not in self.policy_attrs:
                out[name] = value
            elif name in declared:
                out[name] = declared[name]
        for name, value in declared.items():
            out.setdefault(name, value)
        return out

    def _info_lines(self, found: dict, before: dict, declared: dict) -> list:
        """The provider's INFO lines (SGLang's texts), for what the part declared."""
        if found["platform"] != "cuda" or found.get("sm_major") not in (9, 10):
            return []
        full = self.policy.complete(before)
        values = {"attention_backend": declared.get("attention_backend", full.get("attention_backend")),
                  "page_size": declared.get("page_size", full.get("page_size")),
                  "moe_runner_backend": full.get("moe_runner_backend")}  # as logged: before the bf16 guard
        if found["sm_major"] == 9:
            return [(logging.INFO, HOPPER_LINE.format(**values))]
        lines = [(logging.INFO, SM100_LINE.format(**values))]
        if full.get("kv_cache_dtype") == "fp8_e4m3" and values["attention_backend"] == "trtllm_mha":
            lines.append((logging.INFO, FP8_DISABLED_LINE if full.get("sglang_disable_m3_fp8_attn_gemm")
                          else FP8_ACTIVE_LINE))
        return lines

    # -- the launch guard --------------------------------------------------------------------------
    def _guard(self, decision, declared: dict) -> None:
        """Stop the launch where the decision differs from what SGLang's own code will do after
        the provider: the shipped version on the same config without its own part, the part's
        declarations given as the operator's."""
        shipped = self.shipped
        if shipped is None or shipped.sha256 == self.policy.sha256 or not decision.in_scope:
            return
        config = {k: v for k, v in decision.input.items() if k in shipped.inputs}
        for name, value in declared.items():
            if name in shipped.inputs and shipped.inputs[name].accepts(value):
                config[name] = value
        expected = shipped.evaluate(shipped.complete(config), Part(("resolve", "defaults", "checks"), rules=(None,)))
        why = _difference(decision, expected)
        if why is not None:
            raise NotEnforceable(
                f"hisparse-router: {self.policy.ref} decides this MiniMax-M3 launch otherwise than SGLang "
                f"{self.release}'s own code where the plugin does not replace it ({why}). The plugin replaces "
                f"{PART} only; the launch stops so that the policy never seems to decide what SGLang's "
                "code decides. Route with a policy that matches SGLang there, or unset HISPARSE_POLICY.")


def _held_back(original, logger, *args) -> dict:
    """SGLang's own provider on the call, its log records held back (the replacement logs its own)."""
    if logger is None:
        return original(*args)

    def hold(record) -> bool:
        return False

    logger.addFilter(hold)
    try:
        return original(*args)
    finally:
        logger.removeFilter(hold)


def _difference(decision, expected) -> str | None:
    """What differs between the policy's decision and SGLang's code (`expected`) on the launch,
    outside the part: the outcome, the first refusal, any resolved value, the other lines."""
    first = decision.violations[0] if not decision.ok else None
    theirs = expected.violations[0] if not expected.ok else None
    if first is not None and first.part == PART:
        return None  # the replaced provider refuses it itself, before any of SGLang's steps after it
    if decision.ok != expected.ok:
        return (f"the policy {'accepts' if decision.ok else 'refuses'} it"
                + (f" ({first.message!r})" if first else "") + ", SGLang's code "
                + ("accepts it" if expected.ok else f"refuses it ({theirs.message!r})"))
    if first is not None and (first.message, first.raises) != (theirs.message, theirs.raises):
        return (f"the policy refuses with {first.raises} {first.message!r}, SGLang's code with "
                f"{theirs.raises} {theirs.message!r}")
    ours_config, their_config = decision.config, expected.config
    for name in ours_config:
        if name in their_config and ours_config[name] != their_config[name]:
            return f"{name}: {ours_config[name]!r} by the policy, {their_config[name]!r} by SGLang's code"
    ours = decision.lines_outside(PART)
    if ours != list(expected.log):
        return f"the log lines: {ours!r} by the policy, {list(expected.log)!r} by SGLang's code"
    return None
