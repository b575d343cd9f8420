"""The parts of a loaded policy: inputs, phases, allowed-backend tables, rules and stages."""
from __future__ import annotations

from engine.language.conditions import TrueCond
from engine.language.inputs import INT_MAX, INT_MIN, InputSpec, PhaseSpec, Upstream  # noqa: F401  (re-exported)
from engine.language.record import Record


class Table(Record):
    """Allowed backends keyed by the value of `key`; a row may hold a nested table."""

    FIELDS = ("key", "rows", "otherwise", "path")  # rows: typed key value -> frozenset | Table; otherwise: None when the rows cover the domain
    __slots__ = FIELDS
    DEFAULTS = {"otherwise": None, "path": ()}

    def lookup(self, env: dict) -> frozenset:
        hit = self.rows.get(env.get(self.key), self.otherwise)
        if isinstance(hit, Table):
            return hit.lookup(env)
        return hit if hit is not None else frozenset()


class Rule(Record):
    """A rule of any stage. Which fields are used depends on the stage:
    resolve: set (input -> value), log, require + message;
    defaults: set (phase -> backend), log;
    checks: for_each_phase, require or allowed, message, at (defaults: inside the defaults
    stage, stopping evaluation; checks: after it).
    accepts: lint code -> why upstream behaves so (not reported); raises: the exception upstream
    raises when the rule refuses a config; part: the upstream function the rule stands for, where
    one stage models several (the SGLang plugin answers each replaced function with its part)."""

    FIELDS = ("stage", "index", "name", "when", "set", "log", "require", "allowed", "message", "for_each_phase",
              "at", "description", "path", "line", "accepts", "raises", "part")
    __slots__ = FIELDS
    DEFAULTS = {"when": TrueCond, "set": dict, "log": None, "require": None, "allowed": None, "message": None,
                "for_each_phase": False, "at": "checks", "description": "", "path": (), "line": 0, "accepts": dict,
                "raises": "ValueError", "part": None}


class Stage(Record):
    FIELDS = ("name", "when", "rules", "description", "path")  # name: resolve | defaults | checks
    __slots__ = FIELDS
    DEFAULTS = {"description": "", "path": ()}


class CapabilityEntry(Record):
    """One entry of a backend's `runs` or `known_gaps`: the phases it covers and a condition on
    the resolved config; `text`: a gap's why (or a run's note)."""

    FIELDS = ("phases", "when", "text", "path")
    __slots__ = FIELDS
    DEFAULTS = {"text": "", "path": ()}


class Capability(Record):
    """What a backend can run (the policy's `capabilities`): it runs (phase, config) when an entry
    of `runs` covers it; `gaps` are configs upstream routes to it anyway (engine/analysis/capability.py
    reads them)."""

    FIELDS = ("backend", "runs", "gaps", "source", "path")
    __slots__ = FIELDS
    DEFAULTS = {"source": "", "path": ()}
