"""A loaded policy standing in for SGLang's DSA routing functions, each as a drop-in: the
replaced function's parameters, return shape, exceptions and log lines, for any object SGLang or
its tests pass (engine/sglang/hook_targets.py says which functions, per release;
engine/serving/sglang_plugin.py registers them with SGLang's HookRegistry).

Each replaced function is one part of the policy (interpreter.Part):
- the KV-dtype pass: the resolve stage;
- the backend pass: the defaults stage with its checks placed `at: defaults`;
- the HiSparse backend check `(server_args, attr, label)`: the per-phase checks of that phase;
- an inline HiSparse check `(server_args)`: the checks stage.

In a launch the policy decides once: the KV-dtype pass, called by SGLang's own resolution on its
own ServerArgs, evaluates the whole policy on that record (the launch decision, the one a
decision record keeps), and every later call on the same record answers from it: the lines of
its own stage, the violations raised where SGLang raises them, and, at the first HiSparse check,
any violation of a check SGLang has no function for (an operator's own rule). Called by itself
(SGLang's unit tests, another caller), a function computes exactly its own part from its own
arguments: the values the object carries (a missing one takes the policy's default), the
model, platform and GPU read as the release's own code reads them (engine/sglang/facts.py), and
no I/O. Outside what the policy models (a platform it does not declare), SGLang's own function
runs.

The lines are logged on the replaced function's logger as records of that function (its name,
file and line), so they read exactly as SGLang's own; in a launch one more line, after them (or
before a raise), names the policy that decided."""
from __future__ import annotations

import logging
import sys

from engine.errors import EngineError
from engine.language.interpreter import Part
from engine.sglang import facts
# what a launch's first decision reads, imported with the hooks so that no call pays an import
from engine.sglang.given import ENVIRONMENT, combine
from engine.sglang.layers import SOURCE_KEYS, read_layer
from engine.sglang.models import DSA_ARCHITECTURES
from engine.sglang.server_args import attr_names, raise_refusal


def deciding_line(policy, shown_as: str | None = None, what: str = "DSA routing decided by") -> str:
    """The line that names the deciding policy: family@version and the file's sha256 prefix, and
    the file when the policy was named by its path. `what`: the routing and how the policy took
    part (a model class's routing, decided by it or checked against it)."""
    ident = f"{policy.family}@{policy.version} sha256={policy.sha256[:12]}"
    where = f" from {shown_as}" if shown_as else ""
    return f"hisparse-router: {what} policy {ident}{where}"


def log_as(logger: logging.Logger, original, line: str, level: int = logging.WARNING) -> None:
    """Log `line` at `level` (WARNING: the policy's lines) as a record of `original` (SGLang's
    function): its logger, name, file and first line, so handlers and filters see what SGLang's
    own call would make."""
    if logger.isEnabledFor(level):
        code = original.__code__
        logger.handle(logger.makeRecord(logger.name, level, code.co_filename, code.co_firstlineno,
                                        line, (), None, code.co_name))


def is_server_args(obj) -> bool:
    """SGLang's own ServerArgs (what its resolution routes), not a stand-in object."""
    cls = type(obj)
    return cls.__name__ == "ServerArgs" and cls.__module__ == "sglang.srt.server_args"


def record_of(view):
    """The object a resolution view reads (SGLang's `record_of`; the view's own reference in
    0.5.15-0.5.18, which lack it); anything else is its own record."""
    mod = sys.modules.get("sglang.srt.arg_groups.overrides")
    kinds = tuple(k for k in (getattr(mod, "ResolvedView", None), getattr(mod, "ResolvingConfig", None)) if k)
    if not kinds or not isinstance(view, kinds):
        return view
    if hasattr(mod, "record_of"):
        return mod.record_of(view)
    return object.__getattribute__(view, "_server_args")


class NotEnforceable(EngineError, RuntimeError):
    """The policy decides a launch of a model class (DeepSeek-V4, MiniMax-M3) otherwise than
    SGLang's own code will, where the plugin does not replace that code: the launch stops."""


class Unmodelled(EngineError):
    """A value of the call lies outside the policy's domain (a platform or backend it does not
    declare): the policy cannot answer, SGLang's own function does."""


class Launch:
    """The decision of the launch whose record is being resolved, and what of it is done."""

    def __init__(self, record, decision):
        self.record, self.decision = record, decision
        self.named = False  # the deciding line was logged


class PolicyRouting:
    """The policy in place of SGLang's DSA functions, in one process. `reads`: role -> how the
    release's function reads its facts (hook_targets.Reads). `on_decision(decision, given)` is
    called once per launch decision (decision records). `env`: inputs SGLang's own gate settles
    where the functions run (before 0.5.15, the methods run only for DSA models)."""

    def __init__(self, policy, shown_as: str | None = None, on_decision=None, env: dict | None = None,
                 reads: dict | None = None):
        self.policy = policy
        self.env = env or {}
        self.reads = reads or {}
        self.line = deciding_line(policy, shown_as)
        self.on_decision = on_decision
        self.phase_fields = {a for spec in policy.phases.values() for a in attr_names(policy, spec.input)}
        self.launch: Launch | None = None
        # the checks each HiSparse check function answers for alone: the per-phase ones
        self.phase_checks = {id(r) for r in policy.stages["checks"].rules if r.for_each_phase and r.at != "defaults"}

    # -- reading a call --------------------------------------------------------------------------
    def _values(self, obj) -> dict:
        """The policy's inputs `obj` carries, by any of their attribute names (not those that
        describe the machine and the model: SGLang's code finds them, see facts.py)."""
        out = {}
        for name in self.policy.inputs:
            if name in ENVIRONMENT:
                continue
            got = facts.read_fields(obj, attr_names(self.policy, name))
            value = next((v for v in got.values() if v is not None), None)
            if value is not None or (got and self.policy.inputs[name].nullable):
                out[name] = value
        return out

    def _config(self, values: dict, found: dict, strict: bool = False) -> dict:
        """The config of one call: what the object carries, then what SGLang's code found (the
        model, platform, GPU); only the inputs the policy declares. A value the policy does not
        accept is left out, or, `strict`, raises Unmodelled (SGLang's own function answers)."""
        config = {}
        for name, value in {**values, **self.env, **found}.items():
            spec = self.policy.inputs.get(name)
            if spec is None:
                continue
            if spec.accepts(value):
                config[name] = value
            elif strict:
                raise Unmodelled(name)
        return config

    def _alone(self, values: dict, found: dict, part: Part):
        """A function called by itself: its part of the policy on its own values. Raises
        Unmodelled for a value outside the policy's domain."""
        return self.policy.evaluate(self._config(values, found, strict=True), part)

    def _model_found(self, arch: str) -> dict:
        """dsa_model, and the model family where the policy names it (else its default applies:
        a DSA family it does not single out routes as its default one)."""
        found = {"dsa_model": True}
        spec = self.policy.inputs.get("model_family")
        if DSA_ARCHITECTURES.get(arch) and spec is not None and spec.accepts(DSA_ARCHITECTURES[arch]):
            found["model_family"] = DSA_ARCHITECTURES[arch]
        return found

    def _gpu(self, found: dict, major=None) -> None:
        """sm_major (the argument SGLang passes, else torch as SGLang reads it) and sm_minor."""
        if "sm_major" in self.policy.inputs:
            found["sm_major"] = int(major) if major is not None else facts.sm_major()
        if "sm_minor" in self.policy.inputs and major is None:
            import torch

            found["sm_minor"] = int(torch.cuda.get_device_capability()[1])

    # -- the launch decision ---------------------------------------------------------------------
    def _decide_launch(self, record, view, found: dict) -> Launch:
        """The whole policy on the record being resolved (read through `view`), once."""
        values = self._values(view)
        for key in SOURCE_KEYS[2:]:  # SGLang's JSON options (--hisparse-config); the model comes from `found`
            got = facts.read_fields(view, [key.replace("-", "_")])
            if got and got[key.replace("-", "_")] not in (None, ""):
                values[key] = got[key.replace("-", "_")]
        layer = read_layer(self.policy, values, "server_args")
        layer.inputs = {name: (name, value) for name, (_, value) in layer.inputs.items()}
        sglang = read_layer(self.policy, self._config({}, {**self.env, **found}), "sglang")
        combined = combine(self.policy, [sglang, layer])
        decision = self.policy.evaluate(combined.config)
        given = dict(combined.given)
        model_path = facts.read_fields(view, ["model_path"]).get("model_path")
        if isinstance(model_path, str) and model_path:
            given["model-path"] = model_path
        self.launch = Launch(record, decision)
        if self.on_decision is not None:
            self.on_decision(decision, given)
        return self.launch

    def _launch_of(self, record) -> Launch | None:
        launch = self.launch
        return launch if launch is not None and launch.record is record else None

    def _name_the_policy(self, logger, launch: Launch) -> None:
        if not launch.named:
            launch.named = True
            logger.warning(self.line)

    def _refuse(self, logger, launch: Launch | None, decision, violation=None):
        if launch is not None:
            self._name_the_policy(logger, launch)
        raise_refusal(decision, violation)

    # -- SGLang 0.5.15 and later: resolution passes, fn(view) -> {field: value} --------------------
    def _pass_call(self, original, view, role: str):
        """(record, found) of a pass call on `view`: its record and what SGLang's code finds. Raises
        facts.Outside where SGLang's own gate returns {}, Unmodelled where a fact lies outside the
        policy's domain (SGLang's own function runs)."""
        reads, g = self.reads[role], original.__globals__
        arch = facts.dsa_gate(facts.hf_config_of(view, g, reads.model), g)
        hisparse = reads.hisparse_hip and facts.read_fields(view, ["enable_hisparse"]).get("enable_hisparse")
        platform = facts.platform_of(g, reads.platform, reads.hisparse_hip if hisparse else None)
        if platform == "npu":
            raise facts.Outside("no DSA step on NPU")
        found = {**self._model_found(arch), "platform": platform}
        self._gpu(found)
        self._config({}, found, strict=True)  # facts outside the policy's domain: SGLang's own function
        return record_of(view), found

    def dtype_pass(self, original, logger):
        """The KV-dtype pass (`_dsa_kv_cache_dtype_default`): the resolve stage."""
        def dsa_kv_cache_dtype_default(view) -> dict:
            try:
                record, found = self._pass_call(original, view, "dtype_pass")
            except facts.Outside:
                return {}
            except Unmodelled:
                return original(view)
            launch = self._decide_launch(record, view, found) if is_server_args(record) else None
            try:
                decision = launch.decision if launch else self._alone(self._values(view), found, Part(("resolve",)))
            except Unmodelled:
                return original(view)
            for line in decision.lines_of("resolve"):
                log_as(logger, original, line)
            first = decision.violations[0] if not decision.ok else None
            if first is not None and first.stage == "resolve":
                self._refuse(logger, launch, decision)
            kv = decision.config.get("kv_cache_dtype")
            current = facts.read_fields(view, ["kv_cache_dtype"]).get("kv_cache_dtype")
            return {"kv_cache_dtype": kv} if kv is not None and kv != current else {}
        return dsa_kv_cache_dtype_default

    def backend_pass(self, original, logger):
        """The backend pass (`_dsa_split_backend_resolution`): the defaults stage."""
        def dsa_split_backend_resolution(view) -> dict:
            try:
                record, found = self._pass_call(original, view, "backend_pass")
            except facts.Outside:
                return {}
            except Unmodelled:
                return original(view)
            launch = self._launch_of(record)
            try:
                decision = launch.decision if launch else self._alone(self._values(view), found, Part(("defaults",)))
            except Unmodelled:
                return original(view)
            first = decision.violations[0] if not decision.ok else None
            if first is not None and first.stage in ("resolve", "defaults"):
                self._refuse(logger, launch, decision)
            for line in decision.lines_of("defaults"):
                log_as(logger, original, line)
            if launch is not None:
                self._name_the_policy(logger, launch)
            return self._filled(decision, view)
        return dsa_split_backend_resolution

    def _filled(self, decision, obj) -> dict:
        """{phase field: backend} for the phases the decision filled that `obj` leaves unset."""
        out = {}
        sources = decision.sources
        for phase, backend in decision.backends.items():
            if backend is None or sources[phase] == "user":
                continue
            for attr in attr_names(self.policy, self.policy.phases[phase].input):
                got = facts.read_fields(obj, [attr])
                if got and got[attr] is None:
                    out[attr] = backend
                    break
        return out

    # -- the HiSparse backend check: fn(server_args, attr, label) ----------------------------------
    def backend_check(self, original, logger):
        """SGLang's HiSparse backend check (`validate_hisparse_dsa_backend(server_args, attr,
        label)`): the backend of one phase against the policy's allow-list for it."""
        reads = self.reads["backend_check"]

        def validate_hisparse_dsa_backend(server_args, attr, label) -> None:
            g = original.__globals__
            view = facts.checked_view(server_args, g, reads.view)
            launch = self._launch_of(record_of(server_args))
            if launch is not None:
                self._raise_from_launch(logger, launch, label)
                return
            platform = facts.platform_of(g, reads.platform)
            values = self._values(view)
            backend = facts.read_fields(view, [attr]).get(attr)
            phase = label if label in self.policy.phases else None
            if phase is not None:
                values[self.policy.phases[phase].input] = backend
            part = Part(("checks",), lambda rule, ph: id(rule) in self.phase_checks and ph == phase)
            try:
                decision = self._alone(values, {"platform": platform, "enable_hisparse": True}, part)
            except Unmodelled:
                return original(server_args, attr, label)
            if not decision.ok:
                raise_refusal(decision)
        return validate_hisparse_dsa_backend

    def _raise_from_launch(self, logger, launch: Launch, label, every: bool = False) -> None:
        """In a launch SGLang stops at the decision's first violation of the checks stage: this
        phase's call raises it when it is this phase's, any call when it is of a check SGLang has
        no function for (the first call that comes); `every`: the call checks every phase."""
        first = next((v for v in launch.decision.violations if v.stage == "checks"), None)
        if first is not None and (every or first.phase in (None, label)):
            self._refuse(logger, launch, launch.decision, first)

    # -- SGLang 0.5.11 to 0.5.14: ServerArgs methods that write the fields -------------------------
    def dtype_method(self, original, logger):
        """`ServerArgs._set_default_{nsa,dsa}_kv_cache_dtype(self, major, quantization)`: the
        resolve stage; the KV dtype written, as SGLang writes it before its assert."""
        reads = self.reads["dtype_method"]

        def set_default_kv_cache_dtype(server_args, major, quantization=None) -> None:
            found = {"platform": facts.platform_of(original.__globals__, reads.platform)}
            self._gpu(found, major)
            try:
                self._config({}, found, strict=True)
            except Unmodelled:
                return original(server_args, major, quantization)
            if is_server_args(server_args):
                decision = self._decide_launch(server_args, server_args, found).decision
            else:
                try:
                    decision = self._alone(self._values(server_args), found, Part(("resolve",)))
                except Unmodelled:
                    return original(server_args, major, quantization)
            for line in decision.lines_of("resolve"):
                log_as(logger, original, line)
            kv = decision.config.get("kv_cache_dtype")
            if kv is not None:
                server_args.kv_cache_dtype = kv
            first = decision.violations[0] if not decision.ok else None
            if first is not None and first.stage == "resolve":
                self._refuse(logger, self._launch_of(server_args), decision)
        return set_default_kv_cache_dtype

    def backend_method(self, original, logger, hisparse_line=None):
        """`ServerArgs._set_default_{nsa,dsa}_backends(self, kv_cache_dtype, major)`: the defaults
        stage; the backends written and the chosen default's line logged, under HiSparse as a
        record of `hisparse_line` ((logger, function): SGLang's apply_hisparse_*_backend_defaults,
        from 0.5.12) as SGLang logs it there."""
        reads = self.reads["backend_method"]

        def set_default_backends(server_args, kv_cache_dtype, major) -> None:
            launch = self._launch_of(server_args)
            if launch is not None:
                decision = launch.decision
            else:
                found = {"platform": facts.platform_of(original.__globals__, reads.platform)}
                self._gpu(found, major)
                values = {**self._values(server_args), "kv_cache_dtype": kv_cache_dtype}
                try:
                    decision = self._alone(values, found, Part(("defaults",)))
                except Unmodelled:
                    return original(server_args, kv_cache_dtype, major)
            first = decision.violations[0] if not decision.ok else None
            if first is not None and first.stage in ("resolve", "defaults"):
                self._refuse(logger, launch, decision)
            for attr, backend in self._filled(decision, server_args).items():
                setattr(server_args, attr, backend)
            line_logger, line_of = (hisparse_line if hisparse_line and getattr(server_args, "enable_hisparse", False)
                                    else (logger, original))
            for line in decision.lines_of("defaults"):
                log_as(line_logger, line_of, line)
            if launch is not None:
                self._name_the_policy(logger, launch)
        return set_default_backends

    def inline_check(self, original, where, logger):
        """SGLang's function holding the HiSparse checks inline (engine/sglang/inline_check.py),
        compiled from its source with them replaced by the policy's checks stage. Raises
        NotInline."""
        from engine.sglang.inline_check import compile_with_check

        reads = self.reads["inline_check"]

        def check(server_args) -> None:
            launch = self._launch_of(server_args)
            if launch is not None:
                self._raise_from_launch(logger, launch, None, every=True)
                return
            found = {"dsa_model": True}  # the statements before it assert a DSA model
            if reads.platform != "none":
                found["platform"] = facts.platform_of(original.__globals__, reads.platform)
            try:
                decision = self._alone(self._values(server_args), found, Part(("checks",)))
            except Unmodelled:
                return unmodelled(server_args)
            if not decision.ok:
                raise_refusal(decision)

        from engine.sglang.inline_check import inline_statements

        unmodelled = inline_statements(original, where)  # SGLang's own statements, for values outside the policy
        return compile_with_check(original, where, check)
