"""The parts of a loaded policy: inputs, phases, allowed-backend tables, rules and stages."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.language.conditions import Cond, TrueCond
from engine.language.inputs import INT_MAX, INT_MIN, InputSpec, PhaseSpec, Upstream  # noqa: F401  (re-exported)
from engine.language.templates import Template


@dataclass
class Table:
    """Allowed backends keyed by the value of `key`; a row may hold a nested table."""

    key: str
    rows: dict  # typed key value -> frozenset | Table
    otherwise: object = None  # frozenset | Table | None (None: the rows cover the whole domain)
    path: tuple = ()

    def lookup(self, env: dict) -> frozenset:
        hit = self.rows.get(env.get(self.key), self.otherwise)
        if isinstance(hit, Table):
            return hit.lookup(env)
        return hit if hit is not None else frozenset()

    def leaves(self):
        """Every backend set in the table, with its YAML path."""
        for key, row in list(self.rows.items()) + [("otherwise", self.otherwise)]:
            if isinstance(row, Table):
                yield from row.leaves()
            elif row is not None:
                yield key, row

    def keys_read(self) -> set:
        out = {self.key}
        for row in list(self.rows.values()) + [self.otherwise]:
            if isinstance(row, Table):
                out |= row.keys_read()
        return out


@dataclass
class Rule:
    """A rule of any stage. Which fields are used depends on the stage:
    resolve: set (input -> value), log, require + message;
    defaults: set (phase -> backend), log;
    checks: for_each_phase, require or allowed, message, at (defaults: inside the defaults
    stage, stopping evaluation; checks: after it)."""

    stage: str
    index: int
    name: str
    when: Cond = field(default_factory=TrueCond)
    set: dict = field(default_factory=dict)
    log: Template | None = None
    require: Cond | None = None
    allowed: Table | None = None
    message: Template | None = None
    for_each_phase: bool = False
    at: str = "checks"
    description: str = ""
    path: tuple = ()
    line: int = 0
    accepts: dict = field(default_factory=dict)  # lint code -> why upstream behaves so (not reported)

    @property
    def kind(self) -> str:
        if self.stage == "checks":
            return "check"
        if self.stage == "resolve" and self.require is not None:
            return "require"
        return "rule"


@dataclass
class Stage:
    name: str  # resolve | defaults | checks
    when: Cond
    rules: list
    description: str = ""
    path: tuple = ()
