"""Decisions and explanations as text an operator reads (and the explanation as data, its JSON form)."""
from __future__ import annotations

from engine.explain.trace import Trace
from engine.language.decision import Decision
from engine.values import one_line, show


def config_line(policy, config: dict) -> str:
    return " ".join(f"{name}={show(config.get(name))}" for name in policy.input_names)


def decision_text(d: Decision, origins: dict | None = None) -> str:
    """`origins`: where each input came from (engine.sglang.given.Given.origins); with it, the
    text says what the decision assumed about the machine and the model."""
    p = d.policy
    lines = []
    scope = ""
    if not d.in_scope:
        upstream = p.upstream.label() if p.upstream else "upstream"
        scope = f" (OUT OF SCOPE: {p.ref} does not model the verdict of {upstream} here)"
    if d.ok:
        lines.append(f"ACCEPTED by {one_line(p.ref)}{scope}")
    else:
        lines.append(f"REJECTED by {one_line(p.ref)}: {one_line(d.error)}{scope}")
    if not d.in_scope:
        out = d.out_of_scope
        lines.append(f"  out of scope: {one_line(out['why'])} ({one_line(out['where'])})")
    rules = {name: (line, stage) for name, line, stage, *_ in p.rule_meta}
    width = max(len(ph) for ph in p.phases) + 1
    column = max([16] + [len(show(b)) for b in d.backends.values()])  # the reasons aligned, whatever the backend
    for ph, backend in d.backends.items():
        src = d.sources[ph]
        if src == "user":
            why = "set by the user"
        elif src is None:
            why = "no rule chose one"
        else:
            line, stage = rules[src]
            why = f"{stage} rule {src} ({one_line(p.file)}:{line})"
        lines.append(f"  {ph + ':':<{width}} {show(backend):<{column}} {why}")
    from engine.analysis.capability import incapable

    for route in incapable(d):
        lines.append(f"  incapable: {one_line(route.text())}")
    given = p.complete(p.normalize(d.input))
    for name, value in d.config.items():
        if p.inputs[name].phase is None and given[name] != value:
            lines.append(f"  {name}: {show(given[name])} resolved to {show(value)}")
    for v in d.violations:
        where = f" [{v.phase}]" if v.phase else ""
        lines.append(f"  violation {v.check}{where} ({one_line(v.location)}): {one_line(v.message)}")
    for line in d.log:
        lines.append(f"  log: {one_line(line)}")
    if origins is not None:
        from engine.sglang.given import assumptions

        groups: dict = {}  # origin -> "name=value" in input order, origins in order of first use
        for name, value, origin in assumptions(p, d, origins):
            shown_value = "not applicable" if value is None and name in d.not_applicable else show(value)
            groups.setdefault(origin, []).append(f"{name}={shown_value}")
        if groups:
            lines.append("  assumed: " + one_line("; ".join(f"{', '.join(items)} ({origin})" for origin, items in groups.items())))
    lines.append(f"  policy: {one_line(p.ref)} {one_line(p.file)} sha256:{p.sha256[:12]}")
    return "\n".join(lines)


def explanation_text(d: Decision, events, origins: dict | None = None) -> str:
    """`events`: the decision's trace events (Policy.trace); `origins` as for decision_text."""
    p, trace = d.policy, Trace(events)
    out = [f"Policy {one_line(p.ref)} ({one_line(p.file)}, sha256:{p.sha256[:12]})"
           + (f", models {one_line(p.upstream.label())}" if p.upstream else ""),
           f"Config: {config_line(p, p.complete(p.normalize(d.input)))}"]
    current = None
    for step in trace.steps:
        if step.rule is None:
            current = "checks" if step.stage == "checks_at_defaults" else step.stage
            title = {"resolve": "1. resolve: rewrite inputs, stop on a failed requirement",
                     "defaults": "2. defaults: the first matching rule fills unset phases",
                     "checks_at_defaults": "   checks at defaults: a failed one stops evaluation before the "
                                           "default's log line",
                     "checks": "3. checks: every failed check is a violation"}[step.stage]
            out.append("")
            out.append(title)
            if step.why:
                cond = "; ".join(f"{one_line(w)} ({'yes' if ok else 'no'})" for ok, w in step.why)
                if step.holds:
                    out.append(f"   stage applies: {cond}")
                else:
                    out.append(f"   stage skipped: {cond}")
            continue
        r = step.rule
        label = f"{r.name}" + (f" [{step.phase}]" if step.phase else "") + f" (line {r.line})"
        why = "; ".join(f"{one_line(w)} ({'yes' if ok else 'no'})" for ok, w in step.why) or "always"
        if current == "checks":
            if not step.holds:
                out.append(f"   - {label}: does not apply: {why}")
            elif step.violated:
                out.append(f"   - {label}: VIOLATED: {why}")
            else:
                out.append(f"   - {label}: passed: {why}")
        elif current == "defaults":
            if step.chosen:
                out.append(f"   - {label}: CHOSEN: {why}")
                out.append(f"       {one_line(step.outcome)}")
            else:
                out.append(f"   - {label}: skipped: {why}")
        else:
            if not step.holds:
                out.append(f"   - {label}: skipped: {why}")
            elif step.violated:
                out.append(f"   - {label}: STOP: {why}")
            else:
                out.append(f"   - {label}: applied: {why}")
                if step.outcome:
                    out.append(f"       {one_line(step.outcome)}")
    if trace.stopped_by is not None:
        out.append("")
        out.append(f"Evaluation stopped at {trace.stopped_by.name}: later stages did not run.")
    out.append("")
    out.append("Result:")
    out.append(decision_text(d, origins))
    return "\n".join(out)


def explanation_json(d: Decision, events) -> dict:
    """The explanation as data (`hisparse explain --format json`): the policy and its file, the
    config completed with the policy's defaults, each stage the evaluator ran (its condition and
    every rule it tried, in order, with the result in the words of the text form), the rule
    evaluation stopped at, and the decision as `evaluate --format json` gives it."""
    from engine.analysis.capability import decision_json

    p, trace = d.policy, Trace(events)
    stages = []
    for step in trace.steps:
        if step.rule is None or not stages:
            stages.append({"stage": step.stage, "applies": step.holds, "why": _why(step.why), "rules": []})
            if step.rule is None:
                continue
        stages[-1]["rules"].append({
            "rule": step.rule.name, "location": p.location(step.rule), "phase": step.phase,
            "result": _result(stages[-1]["stage"], step), "why": _why(step.why), "outcome": step.outcome or None})
    return {"policy": dict(p.identity(), file=p.file, upstream=p.upstream.label() if p.upstream else None),
            "config": p.complete(p.normalize(d.input)), "stages": stages,
            "stopped_by": trace.stopped_by.name if trace.stopped_by is not None else None,
            "decision": decision_json(d)}


def _why(tests) -> list:
    return [{"test": words, "holds": ok} for ok, words in tests]


def _result(stage: str, step) -> str:
    if stage in ("checks", "checks_at_defaults"):
        return "does not apply" if not step.holds else "violated" if step.violated else "passed"
    if stage == "defaults":
        return "chosen" if step.chosen else "skipped"
    return "skipped" if not step.holds else "stop" if step.violated else "applied"
