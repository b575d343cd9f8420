"""A loaded policy standing in for SGLang's DSA routing passes and its HiSparse backend check, as
functions with the signatures of the SGLang functions they replace (engine/sglang/hook_targets.py
says which, per release; engine/serving/sglang_plugin.py registers them with SGLang's plugin
hooks).

One decision per launch: the KV-dtype pass evaluates the policy on what resolution has declared
so far (engine/sglang/resolution.py, the same reading as `apply()`), keeps the decision for the
record being resolved, logs the lines of the policy's resolve stage and declares the dtype; the
backend pass logs the chosen default's line and declares the backends; the HiSparse backend
check raises the decision's first violation. A refusal raises where SGLang raises: a resolve
requirement in the dtype pass, a check placed `at: defaults` in the backend pass (after the
dtype pass's lines, before any backend line), any other check in the HiSparse check. Exceptions
are SGLang's types (AssertionError for its asserts, ValueError otherwise) with the policy's
message.

The lines are logged on the replaced function's logger as records of that function (its name,
file and line), so they read exactly as SGLang's own; one more line, after them (or before a
raise), names the policy that decided."""
from __future__ import annotations

import logging

from engine.sglang.server_args import attr_names, raise_refusal


def deciding_line(policy, shown_as: str | None = None) -> str:
    """The line that names the deciding policy: family@version and the file's sha256 prefix, and
    the file when the policy was named by its path."""
    ident = f"{policy.family}@{policy.version} sha256={policy.sha256[:12]}"
    where = f" from {shown_as}" if shown_as else ""
    return f"hisparse-router: DSA routing decided by policy {ident}{where}"


def log_as(logger: logging.Logger, original, line: str) -> None:
    """Log `line` at WARNING as a record of `original` (SGLang's function): its logger, name,
    file and first line, so handlers and filters see what SGLang's own call would make."""
    if logger.isEnabledFor(logging.WARNING):
        code = original.__code__
        logger.handle(logger.makeRecord(logger.name, logging.WARNING, code.co_filename, code.co_firstlineno,
                                        line, (), None, code.co_name))


def refused_in(policy, decision) -> str | None:
    """Where the decision's first violation stops SGLang: "resolve" (the dtype pass),
    "defaults" (a check placed `at: defaults`: the backend pass), "checks" (the HiSparse
    check), or None when it is accepted."""
    if decision.ok:
        return None
    first = decision.violations[0]
    if first.stage == "resolve":
        return "resolve"
    return "defaults" if getattr(policy.rule(first.check), "at", None) == "defaults" else "checks"


def split_log(policy, decision) -> tuple[list, list]:
    """(the lines of the resolve stage, the chosen default's line): the defaults stage logs at
    most one line, the last before the checks (which log none), and none when a check placed
    `at: defaults` failed (engine/language/interpreter.py)."""
    lines = decision.log
    _, trace = policy.trace(decision.input)
    chosen = [s for s in trace.steps if s.stage == "defaults" and s.chosen]
    emitted = bool(chosen) and chosen[0].rule.log is not None and refused_in(policy, decision) != "defaults"
    if emitted and lines:
        return lines[:-1], lines[-1:]
    return lines, []


class PolicyRouting:
    """The policy in place of SGLang's DSA passes, in one process. `on_decision(decision, given)`
    is called once for each decision the dtype pass makes (decision records)."""

    def __init__(self, policy, shown_as: str | None = None, on_decision=None, env: dict | None = None):
        self.policy = policy
        self.env = env or {}  # inputs SGLang's own gate has settled where the hooks run (before 0.5.15: dsa_model)
        self.line = deciding_line(policy, shown_as)
        self.on_decision = on_decision
        self.phase_fields = {a for spec in policy.phases.values() for a in attr_names(policy, spec.input)}
        self._current = None  # [record, decision, changes, backend lines, named] of the launch resolving

    # -- what the passes share ---------------------------------------------------------------------
    def _record(self, view):
        from engine.sglang.resolution import record_of

        return record_of(view)

    def _decide(self, view, logger, original) -> list:
        """Evaluate for this launch, log the resolve stage's lines, keep the rest for the
        backend pass."""
        from engine.sglang.resolution import judge

        decision, changes, given = judge(view, self.policy, self.env)
        first, rest = split_log(self.policy, decision)
        current = self._current = [self._record(view), decision, changes, rest, False]
        if self.on_decision is not None:
            self.on_decision(decision, given)
        for line in first:
            log_as(logger, original, line)
        return current

    def _kept(self, view):
        current = self._current
        if current is not None and current[0] is self._record(view):
            return current
        return None

    def _name_the_policy(self, logger, current) -> None:
        if not current[4]:
            current[4] = True
            logger.warning(self.line)

    def _refuse(self, logger, current):
        self._name_the_policy(logger, current)
        raise_refusal(current[1])

    # -- SGLang 0.5.15 and later: resolution passes, fn(view) -> {field: value} --------------------
    def dtype_pass(self, original, logger):
        """The KV-dtype pass (`_dsa_kv_cache_dtype_default`)."""
        def dsa_kv_cache_dtype_default(view) -> dict:
            current = self._decide(view, logger, original)
            decision = current[1]
            if refused_in(self.policy, decision) == "resolve":
                self._refuse(logger, current)
            return {k: v for k, v in current[2].items() if k not in self.phase_fields}
        return dsa_kv_cache_dtype_default

    def backend_pass(self, original, logger):
        """The backend pass (`_dsa_split_backend_resolution`); evaluates afresh when the dtype
        pass did not run for this record."""
        def dsa_split_backend_resolution(view) -> dict:
            current = self._kept(view) or self._decide(view, logger, original)
            decision = current[1]
            if refused_in(self.policy, decision) in ("resolve", "defaults"):
                self._refuse(logger, current)
            for line in current[3]:
                log_as(logger, original, line)
            current[3] = []
            self._name_the_policy(logger, current)
            return {k: v for k, v in current[2].items() if k in self.phase_fields}
        return dsa_split_backend_resolution

    def backend_check(self, logger):
        """SGLang's HiSparse backend check (`validate_hisparse_dsa_backend(server_args, attr,
        label)`): the launch's decision judges; on a record this process did not route (a child
        re-validating), the policy judges the resolved values."""
        def validate_hisparse_dsa_backend(server_args, attr=None, label=None) -> None:
            current = self._kept(server_args)
            if current is None:
                from engine.sglang.resolution import judge

                decision, _, _ = judge(server_args, self.policy, self.env)
                current = [self._record(server_args), decision, {}, [], False]
            if not current[1].ok:
                self._refuse(logger, current)
        return validate_hisparse_dsa_backend

    # -- SGLang 0.5.11 to 0.5.14: ServerArgs methods that write the fields -------------------------
    def dtype_method(self, original, logger):
        """`ServerArgs._set_default_{nsa,dsa}_kv_cache_dtype(self, major, quantization)`: the
        decision's KV dtype written, as SGLang writes it before its assert."""
        def set_default_kv_cache_dtype(server_args, *args, **kwargs) -> None:
            current = self._decide(server_args, logger, original)
            for k, v in current[2].items():
                if k not in self.phase_fields:
                    setattr(server_args, k, v)
            if refused_in(self.policy, current[1]) == "resolve":
                self._refuse(logger, current)
        return set_default_kv_cache_dtype

    def backend_method(self, original, logger, hisparse_line=None):
        """`ServerArgs._set_default_{nsa,dsa}_backends(self, kv_cache_dtype, major)`: the backends
        written and the chosen default's line logged, under HiSparse as a record of
        `hisparse_line` ((logger, function): SGLang's apply_hisparse_*_backend_defaults, from
        0.5.12) as SGLang logs it there."""
        def set_default_backends(server_args, *args, **kwargs) -> None:
            current = self._kept(server_args) or self._decide(server_args, logger, original)
            if refused_in(self.policy, current[1]) in ("resolve", "defaults"):
                self._refuse(logger, current)
            for k, v in current[2].items():
                if k in self.phase_fields:
                    setattr(server_args, k, v)
            line_logger, line_of = (hisparse_line if hisparse_line and getattr(server_args, "enable_hisparse", False)
                                    else (logger, original))
            for line in current[3]:
                log_as(line_logger, line_of, line)
            current[3] = []
            self._name_the_policy(logger, current)
        return set_default_backends

    def inline_check(self, original, where, logger):
        """SGLang's function holding the HiSparse checks inline (engine/sglang/inline_check.py),
        compiled from its source with them replaced by the policy's check. Raises NotInline."""
        from engine.sglang.inline_check import compile_with_check

        return compile_with_check(original, where, self.backend_check(logger))
