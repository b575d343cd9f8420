"""The parts of a loaded policy: inputs, phases, allowed-backend tables, rules and stages."""
from __future__ import annotations

from dataclasses import dataclass, field

from .conditions import Cond, TrueCond
from .templates import Template

INT_MIN, INT_MAX = -(2 ** 63), 2 ** 63 - 1  # the range of an int input (and of integers in files)


@dataclass
class InputSpec:
    """One config input. Phase inputs (the backend of a phase) are inputs of type enum over the
    declared backends, nullable, default unset."""

    name: str
    type: str  # bool | enum | int
    values: tuple  # enum: allowed values; int: representative values; bool: (False, True)
    default: object
    nullable: bool = False
    minimum: int | None = None
    maximum: int | None = None
    description: str = ""
    flags: tuple = ()  # command-line spellings, primary first
    phase: str | None = None  # the phase this input holds the backend of
    path: tuple = ()
    deprecated: dict = field(default_factory=dict)  # deprecated flag -> log line when used
    removed: dict = field(default_factory=dict)  # removed flag -> note naming its replacement

    def domain(self) -> list:
        """The values used when the whole domain is enumerated."""
        return list(self.values) + ([None] if self.nullable else [])

    def describe_domain(self) -> str:
        if self.type == "bool":
            text = "true or false"
        elif self.type == "enum":
            text = "one of " + ", ".join(self.values)
        else:
            bounds = ([f">= {self.minimum}"] if self.minimum is not None else []) + (
                [f"<= {self.maximum}"] if self.maximum is not None else [])
            text = "an integer" + (" " + " and ".join(bounds) if bounds else "")
        return text + (" (or null for unset)" if self.nullable else "")

    def accepts(self, value) -> bool:
        if value is None:
            return self.nullable
        if self.type == "bool":
            return value is True or value is False
        if self.type == "enum":
            return isinstance(value, str) and value in self.values
        if type(value) is not int or not INT_MIN <= value <= INT_MAX:
            return False  # 64-bit, as files are read: a 5000-digit integer cannot even be printed
        if self.minimum is not None and value < self.minimum:
            return False
        return self.maximum is None or value <= self.maximum

    @property
    def flag(self) -> str:
        return self.flags[0] if self.flags else "--" + self.name.replace("_", "-")


@dataclass
class PhaseSpec:
    name: str
    input: str
    flags: tuple = ()
    description: str = ""
    path: tuple = ()
    backends: tuple = ()  # the backends this phase accepts


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

    @property
    def kind(self) -> str:
        if self.stage == "checks":
            return "check"
        if self.stage == "resolve" and self.require is not None:
            return "require"
        return "rule"


@dataclass(frozen=True)
class Upstream:
    """What a policy version models (see the schema's `upstream`)."""

    project: str
    version: str | None = None
    commit: str | None = None
    pr: int | None = None
    note: str = ""
    leaves_out: tuple = ()  # ((where, why), ...)

    def label(self) -> str:
        """e.g. "sglang 0.5.23", "sglang PR #23013 (1f2e3d4)"."""
        parts = [self.project]
        if self.version:
            parts.append(self.version)
        if self.pr:
            parts.append(f"PR #{self.pr}")
        if self.commit:
            parts.append(f"({self.commit[:12]})" if len(parts) > 1 else self.commit[:12])
        return " ".join(parts)

    def left_out(self, where: str | None) -> str | None:
        """The reason when `where` ("path/file.py:LINE function") lies in a left-out place."""
        if not where:
            return None
        path, _, rest = where.partition(":")
        func = rest.split(" ", 1)[1] if " " in rest else ""
        for place, why in self.leaves_out:
            p_path, _, p_func = place.partition(":")
            # a suffix at a path boundary: "hook.py" is not "kv_cache_hook.py"
            if (path == p_path or path.endswith("/" + p_path)) and (not p_func or p_func == func):
                return why
        return None


@dataclass
class Stage:
    name: str  # resolve | defaults | checks
    when: Cond
    rules: list
    description: str = ""
    path: tuple = ()
