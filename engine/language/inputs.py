"""A policy's inputs, phases and upstream: what reading a config needs of the policy."""
from __future__ import annotations

from engine.language.record import Frozen, Record
from engine.values import INT_MAX, INT_MIN


class InputSpec(Record):
    """One config input. type: bool | enum | int | str; values: enum: the allowed values, int and
    str: representative ones, bool: (False, True); flags: command-line spellings, primary first;
    phase: the phase whose backend it holds (phase inputs are nullable enums over the phase's
    backends, default unset); deprecated: flag -> log line when used; removed: flag -> note naming
    the replacement; env: the environment variable it is (None: a server flag)."""

    FIELDS = ("name", "type", "values", "default", "nullable", "minimum", "maximum", "description", "flags",
              "phase", "path", "deprecated", "removed", "env")
    __slots__ = FIELDS
    DEFAULTS = {"nullable": False, "minimum": None, "maximum": None, "description": "", "flags": (),
                "phase": None, "path": (), "deprecated": dict, "removed": dict, "env": None}

    def domain(self) -> list:
        """The values used when the whole domain is enumerated."""
        return list(self.values) + ([None] if self.nullable else [])

    def describe_domain(self) -> str:
        if self.type == "enum":
            text = "one of " + ", ".join(self.values)
        elif self.type == "int":
            bounds = [f"{sign} {n}" for sign, n in ((">=", self.minimum), ("<=", self.maximum)) if n is not None]
            text = "an integer" + (" " + " and ".join(bounds) if bounds else "")
        else:
            text = "true or false" if self.type == "bool" else "a string"
        return text + (" (or null for unset)" if self.nullable else "")

    def accepts(self, value) -> bool:
        if value is None:
            return self.nullable
        if self.type == "bool":
            return value is True or value is False
        if self.type == "enum":
            return isinstance(value, str) and value in self.values
        if self.type == "str":
            return isinstance(value, str)
        if type(value) is not int or not INT_MIN <= value <= INT_MAX:
            return False  # 64-bit, as files are read: a 5000-digit integer cannot even be printed
        return (self.minimum is None or value >= self.minimum) and (self.maximum is None or value <= self.maximum)

    @property
    def flag(self) -> str:
        return self.flags[0] if self.flags else "--" + self.name.replace("_", "-")


class PhaseSpec(Record):
    FIELDS = ("name", "input", "flags", "description", "path", "backends")  # backends: those it accepts
    __slots__ = FIELDS
    DEFAULTS = {"flags": (), "description": "", "path": (), "backends": ()}


class Upstream(Frozen):
    """What a policy version models (see the schema's `upstream`)."""

    FIELDS = ("project", "releases", "commit", "pr", "note", "leaves_out")
    __slots__ = FIELDS

    # releases: the exact release strings modelled, in order ("0.5.15" does not cover "0.5.15.post1");
    # leaves_out: ((where, why, has a when), ...)
    DEFAULTS = {"releases": (), "commit": None, "pr": None, "note": "", "leaves_out": ()}

    def label(self) -> str:
        """e.g. "sglang 0.5.22, 0.5.23", "sglang PR #23013 (1f2e3d4)"."""
        parts = [self.project]
        if self.releases:
            parts.append(", ".join(self.releases))
        if self.pr:
            parts.append(f"PR #{self.pr}")
        if self.commit:
            parts.append(f"({self.commit[:12]})" if len(parts) > 1 else self.commit[:12])
        return " ".join(parts)

    def models(self, release: str) -> bool:
        """Whether this version models exactly that release of its project."""
        return release in self.releases
