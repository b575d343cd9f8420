"""A policy's inputs, phases and upstream: what reading a config needs of the policy."""
from __future__ import annotations

from engine.language.record import Frozen, Record
from engine.values import INT_MAX, INT_MIN


class InputSpec(Record):
    """One config input. Phase inputs (the backend of a phase) are inputs of type enum over the
    declared backends, nullable, default unset."""

    FIELDS = ("name", "type", "values", "default", "nullable", "minimum", "maximum", "description", "flags",
              "phase", "path", "deprecated", "removed")
    __slots__ = FIELDS

    def __init__(self, name: str, type: str, values: tuple, default, nullable: bool = False,
                 minimum: int | None = None, maximum: int | None = None, description: str = "",
                 flags: tuple = (), phase: str | None = None, path: tuple = (), deprecated: dict | None = None,
                 removed: dict | None = None):
        self.name = name
        self.type = type  # bool | enum | int
        self.values = values  # enum: allowed values; int: representative values; bool: (False, True)
        self.default = default
        self.nullable = nullable
        self.minimum = minimum
        self.maximum = maximum
        self.description = description
        self.flags = flags  # command-line spellings, primary first
        self.phase = phase  # the phase this input holds the backend of
        self.path = path
        self.deprecated = {} if deprecated is None else deprecated  # deprecated flag -> log line when used
        self.removed = {} if removed is None else removed  # removed flag -> note naming its replacement

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


class PhaseSpec(Record):
    FIELDS = ("name", "input", "flags", "description", "path", "backends")
    __slots__ = FIELDS

    def __init__(self, name: str, input: str, flags: tuple = (), description: str = "", path: tuple = (),
                 backends: tuple = ()):
        self.name = name
        self.input = input
        self.flags = flags
        self.description = description
        self.path = path
        self.backends = backends  # the backends this phase accepts


class Upstream(Frozen):
    """What a policy version models (see the schema's `upstream`)."""

    FIELDS = ("project", "releases", "commit", "pr", "note", "leaves_out")
    __slots__ = FIELDS

    def __init__(self, project: str, releases: tuple = (), commit: str | None = None,
                 pr: int | None = None, note: str = "", leaves_out: tuple = ()):
        # releases: the exact release strings modelled, in order ("0.5.15" does not cover "0.5.15.post1")
        for name, value in zip(self.FIELDS, (project, tuple(releases), commit, pr, note, leaves_out)):
            object.__setattr__(self, name, value)  # leaves_out: ((where, why, has a when), ...)

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

    def left_out(self, where: str | None) -> str | None:
        """The reason when `where` ("path/file.py:LINE function") lies in a left-out place."""
        entry = self.left_out_entry(where)
        return None if entry is None else entry[1]

    def left_out_entry(self, where: str | None) -> tuple | None:
        """The leaves_out entry (where, why, has a when) whose place `where` ("path/file.py:LINE
        function") lies in, or None."""
        if not where:
            return None
        path, _, rest = where.partition(":")
        func = rest.split(" ", 1)[1] if " " in rest else ""
        for entry in self.leaves_out:
            p_path, _, p_func = entry[0].partition(":")
            # a suffix at a path boundary: "hook.py" is not "kv_cache_hook.py"
            if (path == p_path or path.endswith("/" + p_path)) and (not p_func or p_func == func):
                return entry
        return None
