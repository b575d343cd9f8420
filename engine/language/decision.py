"""The result of evaluating one config against one policy."""
from __future__ import annotations

from collections import namedtuple


class Violation(namedtuple("Violation", "check message location phase stage raises part",
                           defaults=(None, "checks", "ValueError", None))):
    """check: the rule's name; location: file:line of the rule; phase: set for per-phase checks;
    stage: checks, or resolve for a requirement that stopped evaluation; raises: the exception
    upstream raises for it (the rule's `raises`); part: the rule's `part`, if it has one."""

    __slots__ = ()

    def to_dict(self) -> dict:
        """The fields in order, but an unset phase or part, and the stage when it is checks."""
        return {k: v for k, v in zip(self._fields, self) if v is not None and (k, v) != ("stage", "checks")}


class Decision:
    """What a policy decides for a config. Read-only: its attributes cannot be set and every
    container it gives out is a fresh copy.

    - `ok`: no violation.
    - `config`: every input after the resolve stage, phases holding their final backends.
    - `backends` / `sources`: per phase, the backend and where it came from: "user", the name of
      the default (or resolve) rule that filled it, or None when nothing did.
    - `violations`: every failed check in order; the first is the error SGLang raises.
    - `log`: the log lines in order. `policy`: family, version, sha256 of the file.
    - `input`: the config as given.
    - `in_scope`: whether the version models upstream's verdict for this config (False: the config
      lies in a place its `upstream.leaves_out` names, and `out_of_scope` says which and why).
    - `not_applicable`: the inputs that mean nothing for this config (their `applies` fails).
    """

    __slots__ = ("_policy", "_values", "_sources", "_log", "_raw", "_input", "_scope", "_na", "_log_stages")

    def __init__(self, policy, values: tuple, sources: tuple, log, raw, given, scope=None, na=(), log_stages=None):
        # raw: ((rule index into policy.rule_list, phase or None, message), ...); scope: index of the
        # upstream.leaves_out entry the config lies in, or None; na: inputs whose `applies` condition
        # does not hold for the config; log_stages: the stage that made each log line: parse (a
        # deprecated spelling's notice), resolve, defaults
        self._policy, self._values, self._input, self._scope = policy, values, given, scope
        self._sources, self._log, self._raw = tuple(sources), tuple(log), tuple(raw)
        self._na, self._log_stages = tuple(na), tuple(log_stages or ())

    policy = property(lambda self: self._policy)
    input = property(lambda self: self._input)
    # the resolved values in the policy's input order (`config` without the dict), for code that
    # compares decisions in bulk
    values = property(lambda self: self._values)
    ok = property(lambda self: not self._raw)
    log = property(lambda self: list(self._log))
    config = property(lambda self: dict(zip(self._policy.input_names, self._values)))
    sources = property(lambda self: dict(zip(self._policy.phase_names, self._sources)))
    in_scope = property(lambda self: self._scope is None)
    not_applicable = property(lambda self: list(self._na))

    def lines_outside(self, stage: str) -> list:
        """The log lines every other stage or part made, in order."""
        return [line for line, at in zip(self._log, self._log_stages) if at != stage]

    def lines_of(self, stage: str) -> list:
        """The log lines the stage made (parse, resolve or defaults) or the rules of one `part`
        made, in order (a line of a rule with a part is that part's, not its stage's)."""
        return [line for line, at in zip(self._log, self._log_stages) if at == stage]

    @property
    def backends(self) -> dict:
        values = self._values
        return {ph: values[i] for ph, i in self._policy.phase_slots}

    @property
    def violations(self) -> list[Violation]:
        p = self._policy
        return [Violation(p.rule_meta[i][0], msg, f"{p.file}:{p.rule_meta[i][1]}", phase, *p.rule_meta[i][2:])
                for i, phase, msg in self._raw]

    @property
    def out_of_scope(self) -> dict | None:
        """{"where": ..., "why": ...} of the leaves_out entry the config lies in, or None."""
        if self._scope is None:
            return None
        where, why = self._policy.upstream.leaves_out[self._scope][:2]
        return {"where": where, "why": why}

    @property
    def error(self) -> str | None:
        """The first violation's message: the error SGLang raises for this config."""
        return self._raw[0][2] if self._raw else None

    @property
    def failed_check(self) -> str | None:
        """The name of the first failed check (whose message is `error`), or None."""
        return self._policy.rule_meta[self._raw[0][0]][0] if self._raw else None

    def outcome(self) -> tuple:
        """A hashable summary for comparing decisions: ok, resolved values, log, messages."""
        return (not self._raw, self._values, self._log, tuple(m for _, _, m in self._raw), self._scope)

    # what equal decisions share (a Policy compares by identity)
    _compared = property(lambda d: (d._policy, d._values, d._sources, d._log, d._raw, d._scope, d._na))

    def __eq__(self, other):
        return self._compared == other._compared if isinstance(other, Decision) else NotImplemented

    def __hash__(self):
        return hash(self._compared)

    def to_dict(self) -> dict:
        out = {"ok": self.ok, "in_scope": self.in_scope}
        if self._scope is not None:
            out["out_of_scope"] = self.out_of_scope
        out.update(self.config)
        for name in self._na:  # an input that means nothing here is not reported with a value
            out[name] = None
        if self._na:
            out["not_applicable"] = list(self._na)
        for ph, _ in self._policy.phase_slots:  # deprecated spellings of phase keys, e.g. nsa_*
            for alias in self._policy.phase_key_aliases.get(ph, ()):
                out.setdefault(alias, self.backends[ph])
        out["backends"] = self.backends
        out["violations"] = [v.to_dict() for v in self.violations]
        out["log"] = list(self._log)
        out["sources"] = self.sources
        out["policy"] = self._policy.identity()
        return out

    def __repr__(self) -> str:
        state = "ok" if self.ok else f"rejected: {self.error}"
        if self._scope is not None:
            state += " (out of scope)"
        p = self._policy
        return f"<Decision {p.family}@{p.version} {state} backends={self.backends}>"
