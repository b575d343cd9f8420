"""A DeepSeek-V4 policy standing in for SGLang's V4 routing functions, each a drop-in as the DSA
ones are (engine/sglang/routing_hooks.py): the replaced function's parameters, return shape,
exceptions and log lines, for any view SGLang or its tests pass.

What the plugin replaces, where the release has it (engine/sglang/hook_targets.py):
- the KV-dtype pass `_deepseek_v4_kv_cache_dtype(view) -> {field: value}` (0.5.15 and later): the
  rules of the policy's part `deepseek_v4_kv_cache_dtype`;
- `_default_dsv4_attention_backend(server_args) -> str` (0.5.23), what `--dsv4-attn-backend auto`
  becomes: the rules of the part `default_dsv4_attention_backend`.

In a launch the KV-dtype pass, SGLang's first V4 step that reads the whole record, decides the
whole policy once (the decision a record keeps) and the other function answers from it. The rest
of a V4 launch (the model override, the backend gates, the V4.1 and context-parallel checks, the
generic checks) stays SGLang's own code, so the launch decision is held against what that code
will do: the release's own shipped version of the family evaluated on the same launch, with the
replaced functions' answers in place. Where the policy decides anything else otherwise (a gate
it drops, a message it words anew), the launch stops naming the difference: the policy never
seems to decide what SGLang's code decides. Called by itself, a function computes exactly its own
part from its own arguments; outside what the policy models, SGLang's own function runs."""
from __future__ import annotations

import os

from engine.language.interpreter import Part
from engine.sglang import facts
from engine.sglang.routing_hooks import (NotEnforceable, PolicyRouting, Unmodelled, deciding_line, is_server_args,
                                         log_as, record_of)
from engine.sglang.server_args import raise_refusal

KV_PART = "deepseek_v4_kv_cache_dtype"
AUTO_PART = "default_dsv4_attention_backend"
V4_ARCH = "DeepseekV4ForCausalLM"  # the V4 steps test architectures[0] for exactly this
# what each replaced function decides: its part and the field it answers
ENFORCED = {KV_PART: "kv_cache_dtype", AUTO_PART: "dsv4_attn_backend"}


class V4Routing(PolicyRouting):
    """The DeepSeek-V4 family's policy in place of SGLang's V4 functions. `shipped`: the release's
    own shipped version of the family (the launch guard's reference); `release`: its name, for
    messages; `parts`: the parts the replaced functions answer (by release)."""

    def __init__(self, policy, shipped, release: str, parts, shown_as=None, on_decision=None, reads=None):
        super().__init__(policy, shown_as, on_decision, {}, reads)
        self.shipped, self.release, self.parts = shipped, release, tuple(parts)
        self.line = deciding_line(policy, shown_as, "DeepSeek-V4 routing decided by" if self.parts
                                  else "DeepSeek-V4 routing checked against")

    # -- reading a call --------------------------------------------------------------------------
    def _values(self, obj) -> dict:
        values = super()._values(obj)
        for name, spec in self.policy.inputs.items():  # environment variables, as SGLang reads them
            if spec.env is not None and spec.env in os.environ:
                values[name] = os.environ[spec.env]
        return values

    def _found(self, view, g: dict, reads, gpu: bool = False) -> dict:
        """The model family and the platform as the V4 steps tell them: architectures[0] must be
        DeepseekV4ForCausalLM (else facts.Outside: SGLang's own step returns {}), V4.1 by the
        config's model_type, NPU by `--device`, ROCm and the GPU as the release reads them."""
        hf = facts.hf_config_of(view, g, reads.model)
        archs = getattr(hf, "architectures", None) or [None]
        if archs[0] != V4_ARCH:
            raise facts.Outside("not DeepseekV4ForCausalLM")
        found = {"model_family": "deepseek_v41" if getattr(hf, "model_type", None) == "deepseek_v41"
                 else "deepseek_v4"}
        if facts.read_fields(view, ["device"]).get("device") == "npu":
            found["platform"] = "npu"
        else:
            found["platform"] = facts.platform_of(g, reads.platform)
            if gpu and found["platform"] == "cuda" and "sm_major" in self.policy.inputs:
                found["sm_major"] = facts.sm_major()  # the launch's: the V4 steps ask for SM100
        return found

    # -- the launch decision and its guard ---------------------------------------------------------
    def _decide(self, record, view, found):
        launch = self._decide_launch(record, view, found)
        self._guard(launch.decision)
        return launch

    def _guard(self, decision) -> None:
        """Stop the launch where the decision differs from what SGLang's own code will do outside
        the replaced functions: the shipped version on the same config, with the replaced
        functions' answers given as the operator's."""
        if self.shipped is None or self.shipped.sha256 == self.policy.sha256 or not decision.in_scope:
            return
        config = {k: v for k, v in decision.input.items() if k in self.shipped.inputs}
        for part in self.parts:
            field = ENFORCED[part]
            value = decision.config.get(field)
            if field in self.shipped.inputs and self.shipped.inputs[field].accepts(value):
                config[field] = value
        expected = self.shipped.evaluate(self.shipped.complete(config))
        why = _difference(decision, expected, self.parts, self.shipped)
        if why is not None:
            raise NotEnforceable(
                f"hisparse-router: {self.policy.ref} decides this DeepSeek-V4 launch otherwise than SGLang "
                f"{self.release}'s own code where the plugin does not replace it ({why}). The plugin replaces "
                f"{', '.join(self.parts)} only; the launch stops so that the policy never seems to decide "
                "what SGLang's code decides. Route with a policy that matches SGLang there, or unset "
                "HISPARSE_POLICY.")

    # -- _deepseek_v4_kv_cache_dtype(view) -> {field: value} ---------------------------------------
    def kv_pass(self, original, logger):
        """The V4 KV-dtype pass: the rules of its part."""
        reads = self.reads["kv_pass"]

        def deepseek_v4_kv_cache_dtype(view) -> dict:
            g = original.__globals__
            record = record_of(view)
            try:
                found = self._found(view, g, reads, gpu=is_server_args(record))
                self._config({}, found, strict=True)
            except facts.Outside:
                return {}
            except Unmodelled:
                return original(view)
            if is_server_args(record):
                launch = self._decide(record, view, found)
                decision = launch.decision
            else:
                launch = None
                try:
                    decision = self._alone(self._values(view), found, Part(("resolve",), rules=(KV_PART,)))
                except Unmodelled:
                    return original(view)
            if not decision.in_scope:
                return original(view)
            for line in decision.lines_of(KV_PART):
                log_as(logger, original, line)
            first = decision.violations[0] if not decision.ok else None
            if first is not None and first.part == KV_PART:
                self._refuse(logger, launch, decision, first)
            if launch is not None:
                self._name_the_policy(logger, launch)
            kv = decision.config.get("kv_cache_dtype")
            current = facts.read_fields(view, ["kv_cache_dtype"]).get("kv_cache_dtype")
            return {"kv_cache_dtype": kv} if kv is not None and kv != current else {}
        return deepseek_v4_kv_cache_dtype

    # -- _default_dsv4_attention_backend(server_args) -> str ----------------------------------------
    def attention_default(self, original, logger):
        """What `--dsv4-attn-backend auto` becomes: the rules of its part."""
        reads = self.reads["attention_default"]

        def default_dsv4_attention_backend(server_args) -> str:
            launch = self._launch_of(record_of(server_args))
            if launch is not None and launch.decision.in_scope:
                return launch.decision.config["dsv4_attn_backend"]
            view = facts.checked_view(server_args, original.__globals__, "resolved_view")
            try:
                found = self._found(view, original.__globals__, reads, gpu=True)
                values = {**self._values(view), "dsv4_attn_backend": "auto"}
                decision = self._alone(values, found, Part(("resolve",), rules=(AUTO_PART,)))
            except (facts.Outside, Unmodelled):
                return original(server_args)
            if not decision.in_scope or decision.config.get("dsv4_attn_backend") in (None, "auto"):
                return original(server_args)
            return decision.config["dsv4_attn_backend"]
        return default_dsv4_attention_backend


    # -- before apply_deepseek_v4_defaults(server_args, model_arch): the launch checked only ---------
    def check_only(self, original, logger):
        """Where the plugin replaces no V4 function (the KV dtype is inline in
        apply_deepseek_v4_defaults), the launch is decided and held against the release's own code
        before that step runs: an edited policy that decides otherwise stops it."""
        def check_deepseek_v4_launch(server_args, model_arch=None, *args, **kwargs):
            if model_arch != V4_ARCH or not is_server_args(server_args):
                return None
            hf = server_args.get_hf_config() if hasattr(server_args, "get_hf_config") else None
            found = {"model_family": "deepseek_v41" if getattr(hf, "model_type", None) == "deepseek_v41"
                     else "deepseek_v4",
                     "platform": "npu" if getattr(server_args, "device", None) == "npu" else
                     facts.platform_of(_utils_globals(), "is_functions")}
            if found["platform"] == "cuda" and "sm_major" in self.policy.inputs:
                found["sm_major"] = facts.sm_major()
            try:
                self._config({}, found, strict=True)
            except Unmodelled:
                return None
            self._name_the_policy(logger, self._decide(server_args, server_args, found))
            return None
        return check_deepseek_v4_launch


def _utils_globals() -> dict:
    import sys

    mod = sys.modules.get("sglang.srt.utils")
    return vars(mod) if mod is not None else {}


def _difference(decision, expected, parts, shipped) -> str | None:
    """What differs between the policy's decision and the shipped version's on the launch, outside
    the replaced functions' parts; None when nothing does."""
    first = decision.violations[0] if not decision.ok else None
    if first is not None and first.part in parts:
        # the replaced function refuses the launch itself: nothing of SGLang's may refuse before it
        start = next(i for i, r in enumerate(shipped.rule_list) if r.part == first.part) \
            if any(r.part == first.part for r in shipped.rule_list) else len(shipped.rule_list)
        theirs = expected.violations[0] if not expected.ok else None
        if theirs is not None and shipped.rule_list.index(_rule(shipped, theirs.check)) < start:
            return f"SGLang refuses it first: {theirs.message!r}"
        return None
    if decision.ok != expected.ok:
        return (f"the policy {'accepts' if decision.ok else 'refuses'} it"
                + (f" ({first.message!r})" if first else "") + ", SGLang's code "
                + ("accepts it" if expected.ok else f"refuses it ({expected.error!r})"))
    if not decision.ok and (first.message, first.raises) != (expected.violations[0].message,
                                                              expected.violations[0].raises):
        theirs = expected.violations[0]
        return f"the policy refuses with {first.raises} {first.message!r}, SGLang's code with {theirs.raises} {theirs.message!r}"
    enforced = {ENFORCED[p] for p in parts}
    for name in sorted(set(decision.policy.written) & set(expected.policy.written) - enforced):
        if decision.config.get(name) != expected.config.get(name):
            return f"{name}: {decision.config.get(name)!r} by the policy, {expected.config.get(name)!r} by SGLang's code"
    ours = [line for line in decision.log if line not in set().union(*(decision.lines_of(p) for p in parts))]
    theirs = [line for line in expected.log if line not in set().union(*(expected.lines_of(p) for p in parts))]
    if ours != theirs:
        return f"the log lines: {ours!r} by the policy, {theirs!r} by SGLang's code"
    return None


def _rule(policy, name: str):
    return next(r for r in policy.rule_list if r.name == name)
