"""An evaluation's trace events (engine/language/interpreter.py's Event) grouped into steps: what
`hisparse explain` shows, what rule coverage and the lint count. A Trace is a tracer: pass it to
Policy.evaluate(config, tracer=...) or give it the events Policy.trace returns."""
from __future__ import annotations

from engine.explain.words import operand, tests
from engine.language.conditions import operand_inputs


class Step:
    """One thing the evaluator looked at: a stage's condition (`rule` None) or a rule, for a
    per-phase check with its `phase`. holds: the condition held (for a check: it applied);
    violated: the rule refused the config; chosen: the default rule that filled the phases;
    events: the step's events, in order."""

    __slots__ = ("stage", "rule", "holds", "phase", "violated", "chosen", "events", "trace")

    def __init__(self, event, trace):
        self.stage, self.rule, self.holds, self.phase = event.stage, event.rule, event.holds, event.phase
        self.violated = self.chosen = False
        self.events, self.trace = [event], trace

    @property
    def why(self) -> list[tuple[bool, str]]:
        """(holds, words) per test the step read: its condition's, then a requirement's or the
        allow-list's."""
        out = []
        for e in self.events:
            if e.op == "allowed":
                out.append((e.holds, f"backend {e.env['backend']} in allowed {sorted(e.value)}"))
            elif e.node is not None:
                out += tests(e.node, e.env, self.trace.user_set)
        return out

    @property
    def outcome(self) -> str:
        """What a rule that applied did, in words ("" for the others and for a stage)."""
        if self.rule is None or not self.holds:
            return ""
        if self.rule.stage == "checks":
            return "violated" if self.violated else "passed"
        if self.violated:
            return "requirement failed: evaluation stops"
        done = "; ".join(filter(None, map(self._did, self.events)))
        if any(e.op == "withheld" for e in self.events):
            done += " (not emitted: a check at defaults failed)"
        return done

    def _did(self, e) -> str:
        if e.op == "require":
            return "requirement holds"
        if e.op == "set":
            computed = self.rule.set[e.name]
            return f"{e.name} = {operand(computed) + ' = ' if operand_inputs(computed) else ''}{e.value}"
        if e.op == "fill":
            return f"{e.phase} = {e.value}"
        if e.op == "keep":
            user = self.trace.user_set[e.phase]
            return f"{e.phase} stays {e.value} ({'user' if user else self.trace.set_by.get(e.phase)})"
        if e.op == "log":
            return f"log: {e.value}"
        return ""


class Trace:
    """Steps in order; the rule that stopped evaluation; every default rule whose condition held
    when the defaults stage ran, chosen or not (what the lint needs to find shadowed defaults)."""

    def __init__(self, events=()):
        self.steps: list[Step] = []
        self.stopped_by = None
        self.default_matches: list = []
        self.user_set: dict = {}
        self.set_by: dict = {}  # phase -> the last resolve rule that wrote its backend
        self._chosen = None
        for event in events:
            self(event)

    def __call__(self, e) -> None:
        if e.op == "start":
            self.user_set = e.value
        elif e.op in ("stage", "rule"):
            self.steps.append(Step(e, self))
        elif e.op == "matches":
            self.default_matches = list(e.value)
        elif e.op == "stop":
            self.stopped_by = e.rule
        else:  # what the current step's rule did; a withheld line is the chosen default's
            step = self._chosen if e.op == "withheld" else self.steps[-1]
            step.events.append(e)
            step.violated = step.violated or e.op == "violated"
            if e.op == "chosen":
                step.chosen, self._chosen = True, step
            elif e.op == "set" and e.phase is not None:
                self.set_by[e.phase] = e.rule.name
