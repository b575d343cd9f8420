"""The result of evaluating one config against one policy."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Violation:
    check: str  # the rule's name
    message: str
    location: str  # file:line of the rule
    phase: str | None = None  # set for per-phase checks
    stage: str = "checks"  # checks, or resolve for a requirement that stopped evaluation

    def to_dict(self) -> dict:
        out = {"check": self.check, "message": self.message, "location": self.location}
        if self.phase is not None:
            out["phase"] = self.phase
        if self.stage != "checks":
            out["stage"] = self.stage
        return out


class Decision:
    """What a policy decides for a config.

    - `ok`: no violation.
    - `config`: every input after the resolve stage, phases holding their final backends.
    - `backends` / `sources`: per phase, the backend and where it came from: "user", the name of
      the default (or resolve) rule that filled it, or None when nothing did.
    - `violations`: every failed check in order; the first is the error SGLang raises.
    - `log`: the log lines in order. `policy`: family, version, sha256 of the file.
    - `input`: the config as given.
    """

    __slots__ = ("policy", "_values", "_sources", "log", "_raw", "input")

    def __init__(self, policy, values: tuple, sources: tuple, log: list, raw: list, given):
        self.policy = policy
        self._values = values
        self._sources = sources
        self.log = log
        self._raw = raw  # [(rule index into policy.rule_list, phase or None, message)]
        self.input = given

    @property
    def ok(self) -> bool:
        return not self._raw

    @property
    def config(self) -> dict:
        return dict(zip(self.policy.input_names, self._values))

    @property
    def backends(self) -> dict:
        values = self._values
        return {ph: values[i] for ph, i in self.policy.phase_slots}

    @property
    def sources(self) -> dict:
        return dict(zip(self.policy.phase_names, self._sources))

    @property
    def violations(self) -> list[Violation]:
        rules = self.policy.rule_list
        return [Violation(rules[i].name, msg, self.policy.location(rules[i]), phase, rules[i].stage)
                for i, phase, msg in self._raw]

    @property
    def error(self) -> str | None:
        """The first violation's message: the error SGLang raises for this config."""
        return self._raw[0][2] if self._raw else None

    def outcome(self) -> tuple:
        """A hashable summary for comparing decisions: ok, resolved values, log, messages."""
        return (not self._raw, self._values, tuple(self.log), tuple(m for _, _, m in self._raw))

    def to_dict(self) -> dict:
        out = {"ok": self.ok}
        out.update(self.config)
        for ph, _ in self.policy.phase_slots:  # deprecated spellings of phase keys, e.g. nsa_*
            for alias in self.policy.phase_key_aliases.get(ph, ()):
                out.setdefault(alias, self.backends[ph])
        out["backends"] = self.backends
        out["violations"] = [v.to_dict() for v in self.violations]
        out["log"] = list(self.log)
        out["sources"] = self.sources
        out["policy"] = self.policy.identity()
        return out

    def __repr__(self) -> str:
        state = "ok" if self.ok else f"rejected: {self.error}"
        return f"<Decision {self.policy.family}@{self.policy.version} {state} backends={self.backends}>"
