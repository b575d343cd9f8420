"""The policy language's semantics: the evaluator of single decisions, as a walk over the loaded
rules. Whole domains use the bulk evaluator (compiler.py), which tests hold to this one.

Semantics, in order:
1. resolve (when its stage condition holds): each rule whose `when` holds, in order: if it has a
   `require` that fails, evaluation stops with that violation; else its `set` rewrites inputs and
   its `log` line is emitted (rendered after the rewrite).
2. defaults (when its stage condition holds): the first rule whose `when` holds fills every phase
   that is still unset and emits its log line (rendered with the phases' final values).
   Checks placed `at: defaults` run here, after the phases are filled and before that log line:
   if any fails, evaluation stops and the line is never emitted (upstream raises there).
3. checks (when its stage condition holds): every check whose `when` holds and whose requirement
   fails is a violation, in order; per-phase checks run once per phase, in declared order, with
   {phase} and {backend} bound.
A stage's condition is read once, when the stage starts.

With a tracer, each thing the evaluator reads or does is reported to it as an Event, in order, as
OPA's topdown tracer reports its steps; engine/explain turns them into words. Without one, no
event is made.
"""
from __future__ import annotations

from collections import namedtuple

from engine.language.conditions import operand_value
from engine.language.decision import Decision


class Event(namedtuple("Event", ("op", "stage", "rule", "phase", "node", "holds", "env", "name", "value"),
                       defaults=(None,) * 8)):
    """One step of an evaluation. `stage`: resolve, defaults, checks (the stage of `rule`), or
    checks_at_defaults for the stage condition read before the checks placed `at: defaults`;
    `phase`: the phase a per-phase check runs for; `node`: the condition read; `holds`: its value;
    `env`: the inputs' values it was read on (with {phase} and {backend} in a per-phase check).

    start     env: the config; value: phase -> whether the user set its backend
    stage     a stage's condition read (no rule)
    rule      a rule's `when` read
    require   a rule's requirement read (in the checks stage: holds, the check passed)
    allowed   a per-phase check's allow-list read: value, the set; holds, the backend is in it
    set       a resolve rule wrote input `name` (of `phase`, for a phase's backend): value
    chosen    the default rule that fills the phases
    fill      it filled `phase` with backend `value`
    keep      it left `phase` at backend `value`, set before it
    matches   value: every default rule whose `when` holds as the defaults stage starts
    log       a rule rendered its log line, `value` (a default's waits for the checks at defaults)
    withheld  a check at defaults failed: the default's log line `value` is not emitted
    violated  `rule` refused the config: value, the message
    stop      evaluation stops at `rule`: later stages do not run
    """

    __slots__ = ()


class Part:
    """A part of a policy to evaluate alone: its stages, which checks of the checks stage
    (`check(rule, phase)`; None: every one), and which resolve rules (`rules`: the rules' `part`
    names; None: every one). What one upstream function does, called by itself."""

    def __init__(self, stages, check=None, rules=None):
        self.stages, self.check = frozenset(stages), check
        self.rules = None if rules is None else frozenset(rules)


WHOLE = Part(("resolve", "defaults", "checks"))


def run(policy, cfg: dict, given=None, tracer=None, prelude=(), part: Part = WHOLE) -> Decision:
    """Evaluate a complete, canonical config (every input present and valid). `prelude`: log
    lines that come first (deprecated spellings in the config as given). `part`: the stages (and
    checks) to run; the others are skipped, the config passing through them unchanged.
    `tracer`: called with each Event, in order."""
    ev = _Run(policy, cfg, prelude, part) if tracer is None else _Traced(policy, cfg, prelude, part, tracer)
    env, user_set = ev.env, ev.user_set
    # what the decision covers, read on the config as given (before any rule rewrites it)
    scope = next((i for i, cond in policy.scope if cond.eval(env, user_set)), None)
    na = tuple(name for name, cond in policy.applies.items() if not cond.eval(env, user_set))
    ev.stages_in_order()
    return Decision(policy, tuple(env[name] for name in policy.input_names), tuple(ev.sources.values()), ev.log,
                    ev.raw, cfg if given is None else given, scope, na, ev.log_stages)


class _Run:
    """One evaluation: the config as the rules rewrite it (`env`), which phases' backends the user
    set, where each phase's backend came from, the log lines with the stage that made each, and
    the violations: (rule index into policy.rule_list, phase or None, message)."""

    __slots__ = ("policy", "part", "env", "user_set", "sources", "log", "log_stages", "raw")

    def __init__(self, policy, cfg: dict, prelude, part: Part):
        self.policy, self.part, self.env = policy, part, dict(cfg)
        self.user_set = {ph: cfg[spec.input] is not None for ph, spec in policy.phases.items()}
        self.sources = {ph: "user" if user else None for ph, user in self.user_set.items()}
        self.log, self.raw = list(prelude), []
        self.log_stages = ["parse"] * len(self.log)

    def stages_in_order(self) -> None:
        stages = self.part.stages
        if "resolve" in stages and not self.resolve():
            return
        line = self.defaults() if "defaults" in stages else None
        early, late = self.policy.check_order
        if early and "defaults" in stages and self.checks(early, "checks_at_defaults"):
            self.note("stop", self.policy.rule_list[self.raw[0][0]])
            if line is not None:
                self.note("withheld", stage="defaults", value=line)
            return
        if line is not None:
            self.log.append(line)
            self.log_stages.append("defaults")
        if "checks" in stages:
            self.checks(late, "checks")

    def resolve(self) -> bool:
        """Stage 1; False when a requirement failed (evaluation stops)."""
        stage = self.policy.stages["resolve"]
        if not self.enter("resolve", stage):
            return True
        only = self.part.rules
        for rule in stage.rules:
            if (only is not None and rule.part not in only) or not self.holds("rule", rule, rule.when):
                continue
            if rule.require is not None and not self.holds("require", rule, rule.require):
                self.violate(rule, None)
                self.note("stop", rule)
                return False
            for name, value in rule.set.items():
                value = self.env[name] = operand_value(value, self.env)
                phase = self.policy.inputs[name].phase
                if phase is not None:
                    self.sources[phase] = rule.name
                self.note("set", rule, phase=phase, name=name, value=value)
            if rule.log is not None:
                self.log.append(rule.log.render(self.fields()))
                self.log_stages.append(rule.part or "resolve")
                self.note("log", rule, value=self.log[-1])
        return True

    def defaults(self) -> str | None:
        """Stage 2: the first default whose `when` holds fills the unset phases. Its log line,
        rendered (the caller emits it after the checks at defaults), or None."""
        stage = self.policy.stages["defaults"]
        if not self.enter("defaults", stage):
            return None
        rule = next((r for r in stage.rules if self.holds("rule", r, r.when)), None)
        if rule is None:
            return None
        self.note("chosen", rule)
        env, phases = self.env, self.policy.phases
        for ph, backend in rule.set.items():
            if env[phases[ph].input] is None:
                env[phases[ph].input], self.sources[ph] = backend, rule.name
                self.note("fill", rule, phase=ph, value=backend)
            else:
                self.note("keep", rule, phase=ph, value=env[phases[ph].input])
        if rule.log is None:
            return None
        line = rule.log.render(self.fields())
        self.note("log", rule, value=line)
        return line

    def checks(self, rules, label: str) -> bool:
        """Stage 3 (`label` checks_at_defaults: the checks placed there): `rules` in order, a
        per-phase check once per phase with {phase} and {backend} bound (reserved names: never an
        input's). Whether any failed."""
        if not self.enter(label, self.policy.stages["checks"]):
            return False
        before, only, env = len(self.raw), self.part.check, self.env
        for rule in rules:
            for ph in (self.policy.phases if rule.for_each_phase else (None,)):
                if only is not None and not only(rule, ph):
                    continue
                if ph is None:
                    self.check(rule, None)
                    continue
                env["phase"], env["backend"] = ph, env[self.policy.phases[ph].input]
                self.check(rule, ph)
                del env["phase"], env["backend"]
        return len(self.raw) > before

    def check(self, rule, phase) -> None:
        if not self.holds("rule", rule, rule.when, phase):
            return
        if rule.require is not None:
            if not self.holds("require", rule, rule.require, phase):
                self.violate(rule, phase)
            return
        allowed, passed = self.allows(rule, phase)
        if not passed:
            self.violate(rule, phase, allowed)

    def violate(self, rule, phase, allowed=None) -> None:
        message = rule.message.render(self.fields(allowed))
        self.raw.append((self.policy.rule_index[id(rule)], phase, message))
        self.note("violated", rule, phase=phase, value=message)

    def fields(self, allowed=None) -> dict:
        """A template's fields: the inputs ({phase} and {backend} too in a per-phase check), each
        phase's backend by the phase's name, and a check's allow-list."""
        out = dict(self.env)
        out.update({ph: self.env[spec.input] for ph, spec in self.policy.phases.items()})
        if allowed is not None:
            out["allowed"] = allowed
        return out

    # What the evaluator reads, and what it notes for a tracer (_Traced reports each as an Event).
    def enter(self, label: str, stage) -> bool:
        return stage.when.eval(self.env, self.user_set)

    def holds(self, op: str, rule, cond, phase=None) -> bool:
        return cond.eval(self.env, self.user_set)

    def allows(self, rule, phase) -> tuple:
        """The allow-list of a per-phase check, and whether the phase's backend is in it."""
        allowed = rule.allowed.lookup(self.env)
        return allowed, self.env["backend"] in allowed

    def note(self, op: str, rule=None, **fields) -> None:
        pass


class _Traced(_Run):
    """A run that reports to `tracer` each condition it reads and each thing it does."""

    __slots__ = ("tracer",)

    def __init__(self, policy, cfg, prelude, part, tracer):
        super().__init__(policy, cfg, prelude, part)
        self.tracer = tracer
        tracer(Event("start", env=dict(self.env), value=dict(self.user_set)))

    def enter(self, label, stage):
        held = super().enter(label, stage)
        self.tracer(Event("stage", label, None, None, stage.when, held, dict(self.env)))
        if held and label == "defaults":  # the defaults a chosen one shadows, for the lint
            self.note("matches", stage=label, value=[r for r in stage.rules if r.when.eval(self.env, self.user_set)])
        return held

    def holds(self, op, rule, cond, phase=None):
        held = super().holds(op, rule, cond, phase)
        self.tracer(Event(op, rule.stage, rule, phase, cond, held, dict(self.env)))
        return held

    def allows(self, rule, phase):
        allowed, passed = super().allows(rule, phase)
        self.tracer(Event("allowed", rule.stage, rule, phase, None, passed, dict(self.env), value=allowed))
        return allowed, passed

    def note(self, op, rule=None, **fields):
        fields.setdefault("stage", rule.stage if rule else None)
        self.tracer(Event(op, rule=rule, **fields))
