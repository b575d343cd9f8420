"""The policy language's semantics: the evaluator of single decisions, as a walk over the loaded
rules. With a Trace it also records every stage, rule and check tried, in words, for `hisparse
explain`, rule coverage and the lint; without one it builds no words. Whole domains use the bulk
evaluator (compiler.py), which tests hold to this one.

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
"""
from __future__ import annotations

from engine.language.conditions import operand_inputs, operand_value, operand_words
from engine.language.decision import Decision
from engine.language.record import Record


class Step(Record):
    """One thing the evaluator looked at. rule: None for the stage's own condition; holds: the
    condition held (for a check: it applied); why: [(bool, words)] per test of the condition;
    chosen: the default rule that filled the phases."""

    FIELDS = ("stage", "rule", "holds", "why", "phase", "outcome", "violated", "chosen")
    __slots__ = FIELDS
    DEFAULTS = {"phase": None, "outcome": "", "violated": False, "chosen": False}


class Trace:
    """Steps in order; the rule that stopped evaluation; every default rule whose condition held
    when the defaults stage ran, chosen or not (what the lint needs to find shadowed defaults)."""

    def __init__(self):
        self.steps: list[Step] = []
        self.stopped_by = None
        self.default_matches: list = []

    def add(self, stage, rule, cond, env, user_set, phase=None) -> Step:
        step = Step(stage, rule, cond.eval(env, user_set), cond.explain(env, user_set), phase)
        self.steps.append(step)
        return step


class Part:
    """A part of a policy to evaluate alone: its stages, which checks of the checks stage
    (`check(rule, phase)`; None: every one), and which resolve rules (`rules`: the rules' `part`
    names; None: every one). What one upstream function does, called by itself."""

    def __init__(self, stages, check=None, rules=None):
        self.stages, self.check = frozenset(stages), check
        self.rules = None if rules is None else frozenset(rules)


WHOLE = Part(("resolve", "defaults", "checks"))


def run(policy, cfg: dict, given=None, trace: Trace | None = None, prelude=(), part: Part = WHOLE) -> Decision:
    """Evaluate a complete, canonical config (every input present and valid). `prelude`: log
    lines that come first (deprecated spellings in the config as given). `part`: the stages (and
    checks) to run; the others are skipped, the config passing through them unchanged."""
    env = dict(cfg)
    phases = policy.phases
    user_set = {ph: env[spec.input] is not None for ph, spec in phases.items()}
    sources = {ph: ("user" if user_set[ph] else None) for ph in phases}
    log: list[str] = list(prelude)
    stages = ["parse"] * len(log)  # the stage that made each log line
    raw: list = []
    index = policy.rule_index

    def ctx(extra=()) -> dict:  # template fields: the inputs, each phase's backend, and `extra`
        out = dict(env)
        out.update({ph: env[spec.input] for ph, spec in phases.items()})
        out.update(extra)
        return out

    def holds(stage, rule, cond, phase=None) -> tuple:
        """Whether `cond` holds, and the trace step recording it (None without a trace)."""
        if trace is None:
            return cond.eval(env, user_set), None
        step = trace.add(stage, rule, cond, env, user_set, phase)
        return step.holds, step

    # what the decision covers, read on the config as given (before any rule rewrites it)
    scope = next((i for i, cond in policy.scope if cond.eval(env, user_set)), None)
    na = tuple(name for name, cond in policy.applies.items() if not cond.eval(env, user_set))

    def finish() -> Decision:
        return Decision(policy, tuple(env[name] for name in policy.input_names),
                        tuple(sources[ph] for ph in phases), log, raw, cfg if given is None else given, scope, na,
                        stages)

    def run_checks(rules, label) -> bool:
        """Run `rules` (checks) in order when the checks stage's condition holds; whether any failed."""
        if not holds(label, None, policy.stages["checks"].when)[0]:
            return False
        before = len(raw)
        for rule in rules:
            for ph in (phases if rule.for_each_phase else (None,)):
                if part.check is not None and not part.check(rule, ph):
                    continue
                if ph is not None:  # reserved names: never an input's
                    env["phase"], env["backend"] = ph, env[phases[ph].input]
                applies, step = holds("checks", rule, rule.when, ph)
                if applies:
                    extra = {"phase": ph, "backend": env["backend"]} if ph is not None else {}
                    if rule.require is not None:
                        passed = rule.require.eval(env, user_set)
                        if step:
                            step.why = step.why + rule.require.explain(env, user_set)
                    else:
                        extra["allowed"] = allowed = rule.allowed.lookup(env)
                        passed = env["backend"] in allowed
                        if step:
                            step.why = step.why + [(passed, f"backend {env['backend']} in allowed {sorted(allowed)}")]
                    if not passed:
                        raw.append((index[id(rule)], ph, rule.message.render(ctx(extra))))
                    if step:
                        step.violated, step.outcome = not passed, "violated" if not passed else "passed"
                if ph is not None:
                    del env["phase"], env["backend"]
        return len(raw) > before

    # 1. resolve
    stage = policy.stages["resolve"]
    if "resolve" in part.stages and holds("resolve", None, stage.when)[0]:
        for rule in stage.rules:
            if part.rules is not None and rule.part not in part.rules:
                continue
            applies, step = holds("resolve", rule, rule.when)
            if not applies:
                continue
            if rule.require is not None and not rule.require.eval(env, user_set):
                raw.append((index[id(rule)], None, rule.message.render(ctx())))
                if step:
                    step.violated = True
                    step.why = step.why + rule.require.explain(env, user_set)
                    step.outcome = "requirement failed: evaluation stops"
                    trace.stopped_by = rule
                return finish()
            done = ["requirement holds"] if rule.require is not None else []
            for name, value in rule.set.items():
                computed = operand_inputs(value)
                shown = f"{operand_words(value)} = " if computed else ""
                value = env[name] = operand_value(value, env)
                done.append(f"{name} = {shown}{value}")
                phase = policy.inputs[name].phase
                if phase is not None:
                    sources[phase] = rule.name
            if rule.log is not None:
                log.append(rule.log.render(ctx()))
                stages.append(rule.part or "resolve")
                done.append(f"log: {log[-1]}")
            if step:
                if rule.require is not None:
                    step.why = step.why + rule.require.explain(env, user_set)
                step.outcome = "; ".join(done)

    # 2. defaults
    pending = chosen = None  # the chosen default's log line and trace step
    stage = policy.stages["defaults"]
    if "defaults" in part.stages and holds("defaults", None, stage.when)[0]:
        if trace is not None:
            trace.default_matches = [r for r in stage.rules if r.when.eval(env, user_set)]
        for rule in stage.rules:
            applies, step = holds("defaults", rule, rule.when)
            if not applies:
                continue
            done = []
            for ph, backend in rule.set.items():
                key = phases[ph].input
                if env[key] is None:
                    env[key] = backend
                    sources[ph] = rule.name
                    done.append(f"{ph} = {backend}")
                else:
                    done.append(f"{ph} stays {env[key]} ({'user' if user_set[ph] else sources[ph]})")
            if rule.log is not None:
                pending = rule.log.render(ctx())
                done.append(f"log: {pending}")
            if step:
                step.chosen, step.outcome, chosen = True, "; ".join(done), step
            break

    early, late = policy.check_order
    if early and "defaults" in part.stages and run_checks(early, "checks_at_defaults"):
        if trace is not None:
            trace.stopped_by = policy.rule_list[raw[0][0]]
            if chosen is not None and pending is not None:
                chosen.outcome += " (not emitted: a check at defaults failed)"
        return finish()
    if pending is not None:
        log.append(pending)
        stages.append("defaults")

    # 3. checks
    if "checks" in part.stages:
        run_checks(late, "checks")
    return finish()
