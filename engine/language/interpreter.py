"""The policy language's semantics as a plain walk over the loaded rules.

This is the definition the compiled evaluator (`compiler.py`) must agree with; it also records a
trace of every stage, rule and check for `hisparse explain` and for rule coverage.

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

from dataclasses import dataclass, field

from engine.language.decision import Decision
from engine.language.rules import Rule


@dataclass
class Step:
    """One thing the evaluator looked at."""

    stage: str
    rule: Rule | None  # None for the stage's own condition
    holds: bool  # the condition held (for a check: it applied)
    why: list  # [(bool, words)] for each test of the condition
    phase: str | None = None
    outcome: str = ""  # what happened, in words
    violated: bool = False
    chosen: bool = False  # the default rule that filled the phases


@dataclass
class Trace:
    steps: list = field(default_factory=list)
    stopped_by: Rule | None = None
    # every default rule whose condition held when the defaults stage ran (not only the chosen
    # one): what the lint needs to find shadowed defaults
    default_matches: list = field(default_factory=list)

    def add(self, *args, **kw) -> Step:
        step = Step(*args, **kw)
        self.steps.append(step)
        return step


def run(policy, cfg: dict, given=None, trace: Trace | None = None, prelude=()) -> Decision:
    """Evaluate a complete, canonical config (every input present and valid). `prelude`: log
    lines that come first (deprecated spellings in the config as given)."""
    env = dict(cfg)
    phases = policy.phases
    user_set = {ph: env[spec.input] is not None for ph, spec in phases.items()}
    sources = {ph: ("user" if user_set[ph] else None) for ph in phases}
    log: list[str] = list(prelude)
    raw: list = []
    index = policy.rule_index

    def ctx(extra=None) -> dict:
        out = dict(env)
        out.update({ph: env[spec.input] for ph, spec in phases.items()})
        if extra:
            out.update(extra)
        return out

    # what the decision covers, read on the config as given (before any rule rewrites it)
    scope = next((index for index, cond in policy.scope if cond.eval(env, user_set)), None)
    na = tuple(name for name, cond in policy.applies.items() if not cond.eval(env, user_set))

    def finish() -> Decision:
        values = tuple(env[name] for name in policy.input_names)
        return Decision(policy, values, tuple(sources[ph] for ph in phases), log, raw,
                        cfg if given is None else given, scope, na)

    def stage_on(stage) -> bool:
        holds = stage.when.eval(env, user_set)
        if trace is not None:
            trace.add(stage.name, None, holds, stage.when.explain(env, user_set))
        return holds

    def run_checks(rules, label="checks") -> bool:
        """Run `rules` (checks) in order, when the checks stage's condition holds; whether any failed."""
        stage = policy.stages["checks"]
        holds = stage.when.eval(env, user_set)
        if trace is not None:
            trace.add(label, None, holds, stage.when.explain(env, user_set))
        if not holds:
            return False
        before = len(raw)
        for rule in rules:
            for ph in (phases if rule.for_each_phase else (None,)):
                bound = {}
                if ph is not None:
                    bound = {"phase": ph, "backend": env[phases[ph].input]}
                scope = dict(env, **bound)
                holds = rule.when.eval(scope, user_set)
                why = rule.when.explain(scope, user_set)
                step = trace.add("checks", rule, holds, why, phase=ph) if trace else None
                if not holds:
                    continue
                if rule.require is not None:
                    passed = rule.require.eval(scope, user_set)
                    extra = {}
                    if step:
                        step.why = why + rule.require.explain(scope, user_set)
                else:
                    allowed = rule.allowed.lookup(scope)
                    passed = bound["backend"] in allowed
                    extra = {"allowed": allowed}
                    if step:
                        step.why = why + [(passed, f"backend {bound['backend']} in allowed "
                                                   f"{sorted(allowed)}")]
                if not passed:
                    raw.append((index[id(rule)], ph, rule.message.render(ctx(dict(bound, **extra)))))
                if step:
                    step.violated = not passed
                    step.outcome = "violated" if not passed else "passed"
        return len(raw) > before

    # 1. resolve
    stage = policy.stages["resolve"]
    if stage_on(stage):
        for rule in stage.rules:
            holds = rule.when.eval(env, user_set)
            step = trace.add("resolve", rule, holds, rule.when.explain(env, user_set)) if trace else None
            if not holds:
                continue
            if rule.require is not None and not rule.require.eval(env, user_set):
                message = rule.message.render(ctx())
                raw.append((index[id(rule)], None, message))
                if step:
                    step.violated = True
                    step.why = step.why + rule.require.explain(env, user_set)
                    step.outcome = "requirement failed: evaluation stops"
                    trace.stopped_by = rule
                return finish()
            done = []
            for name, value in rule.set.items():
                env[name] = value
                done.append(f"{name} = {value}")
                phase = policy.inputs[name].phase
                if phase is not None:
                    sources[phase] = rule.name
            if rule.log is not None:
                line = rule.log.render(ctx())
                log.append(line)
                done.append(f"log: {line}")
            if step:
                if rule.require is not None:
                    step.why = step.why + rule.require.explain(env, user_set)
                    done.insert(0, "requirement holds")
                step.outcome = "; ".join(done)

    # 2. defaults
    pending = None  # the chosen default's log line
    chosen = None  # its trace step
    stage = policy.stages["defaults"]
    if stage_on(stage):
        if trace is not None:
            trace.default_matches = [r for r in stage.rules if r.when.eval(env, user_set)]
        for rule in stage.rules:
            holds = rule.when.eval(env, user_set)
            step = trace.add("defaults", rule, holds, rule.when.explain(env, user_set)) if trace else None
            if not holds:
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
                step.chosen = True
                step.outcome = "; ".join(done)
                chosen = step
            break

    checks = policy.stages["checks"]
    early = [r for r in checks.rules if r.at == "defaults"]
    if early:
        if run_checks(early, "checks_at_defaults"):
            if trace is not None:
                trace.stopped_by = policy.rule_list[raw[0][0]]
                if chosen is not None and pending is not None:
                    chosen.outcome += " (not emitted: a check at defaults failed)"
            return finish()
    if pending is not None:
        log.append(pending)

    # 3. checks
    run_checks([r for r in checks.rules if r.at != "defaults"])
    return finish()
