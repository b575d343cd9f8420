"""Deep lint: what only the whole declared domain shows. Run by `hisparse check` after a policy
loads cleanly; exact over the whole domain, by evaluating one config per class of configs that meet
the same conditions (classes.py) through the compiled rules in bulk (domain.py; the interpreter
only to name the winners of a shadowed default).

L401 shadowed-default   a default rule whose condition holds somewhere, but earlier rules always win
L402 dead-rule          a rule whose condition holds for no config
L403 self-contradiction a default backend that the policy's own checks reject, at defaults or after
                        (with a counterexample)
L404 empty-allowed      an allowed-backend set that is empty
L405 unused-input       a declared input no rule, table, template or scope condition reads
L406 deprecated-notice  a deprecated flag whose notice does not name it (upstream's notices name
                        the spelling typed; one that names another flag was copied from it)
L407 incapable-route    a default rule, or an allow-list a check admits a user's backend by, routes a
                        config in scope to a backend whose declared capabilities (`capabilities`) do
                        not cover that phase and config (with a counterexample); a config a
                        capability lists under `known_gaps` is a note instead

A rule's `accepts: {CODE: why}` marks a rule-anchored finding (L401-L403) as upstream's own
behaviour: it is not reported.
"""
from __future__ import annotations

import engine.language.interpreter as interpret
from engine.explain.trace import Trace
from engine.explain.words import capability_words
from engine.language.conditions import Cond, operand_inputs
from engine.analysis.capability import can_run, known_gap
from engine.analysis.classes import keys_read
import engine.analysis.domain as domain
from engine.analysis.domain import MAX_CONFIGS, max_work, too_much_work  # beyond them the whole-domain checks are skipped (said on stderr)
from engine.errors import Problem
from engine.language.rules import Table
from engine.values import show as _show, shown as _shown


def lint(policy) -> tuple[list[Problem], list[str]]:
    """(problems, notes). Notes say what was not analysed and why."""
    problems = _empty_allowed(policy) + _unused_inputs(policy) + _deprecated_notices(policy)
    notes = []
    size = domain.config_count(policy)
    if size > MAX_CONFIGS:
        notes.append(f"{policy.file}: the declared domain has {size} configs; whole-domain lint "
                     f"(L401-L403) runs up to {MAX_CONFIGS}")
        return problems, notes
    work = too_much_work(size, len(policy.rule_meta))
    if work is not None:
        notes.append(f"{policy.file}: {size:,} configs x {len(policy.rule_meta):,} rules = {work:,} rule "
                     f"evaluations; whole-domain lint (L401-L403) runs up to {max_work():,} "
                     "(HISPARSE_MAX_WORK raises it)")
        return problems, notes
    if policy.capabilities:  # one pass over the domain feeds both
        consume, finish = _capability_scan(policy)
        problems += _domain_lint(policy, consume)
        found, gaps = finish()
        problems += found
        notes += gaps
    else:
        problems += _domain_lint(policy)
    return sorted(problems, key=lambda p: (p.line, p.col, p.code)), notes


def _at(policy, path, key=False) -> tuple[int, int]:
    if policy.doc is None:
        return (0, 0)
    return policy.doc.pos(path, key=key)


def _problem(policy, code, message, path, key=False) -> Problem:
    line, col = _at(policy, path, key)
    return Problem(code, message, policy.file, line, col)


def _tables(policy):
    seen = set()
    for name, table in policy.tables.items():
        seen.add(id(table))
        yield table
    for rule in policy.rule_list:
        if rule.allowed is not None and id(rule.allowed) not in seen:
            seen.add(id(rule.allowed))
            yield rule.allowed


def _empty_allowed(policy) -> list[Problem]:
    out = []

    def walk(table: Table):
        for key, row in list(table.rows.items()) + [("otherwise", table.otherwise)]:
            if isinstance(row, Table):
                walk(row)
            elif row is not None and not row:
                path = table.path + (("otherwise",) if key == "otherwise" else ("rows", _row_text(key)))
                out.append(_problem(policy, "L404", f"empty allowed set for {table.key} = {_row_text(key)}: "
                                    "every backend is refused there", path))

    for table in _tables(policy):
        walk(table)
    return out


def _row_text(key) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _unused_inputs(policy) -> list[Problem]:
    read: set = set()

    def cond(c: Cond):
        read.update(c.inputs())

    for stage in policy.stages.values():
        cond(stage.when)
        for rule in stage.rules:
            cond(rule.when)
            if rule.require is not None:
                cond(rule.require)
            for value in rule.set.values():  # a computed value reads its inputs
                read.update(operand_inputs(value))
            for tpl in (rule.log, rule.message):
                if tpl is not None:
                    read.update(f.name for f in tpl.fields)
    for table in _tables(policy):
        read |= keys_read(table)
    # what a decision says of its config: out of scope (leaves_out[].when), not applicable (applies)
    for _, c in policy.scope:
        cond(c)
    for c in policy.applies.values():
        cond(c)
    out = []
    for name, spec in policy.inputs.items():
        if spec.phase is None and name not in read:
            out.append(_problem(policy, "L405", f"input '{name}' is declared but no rule, table or template "
                                "reads it", spec.path, key=True))
    return out


def _deprecated_notices(policy) -> list[Problem]:
    out = []
    for spec in policy.inputs.values():
        for flag, text in spec.deprecated.items():
            if flag not in text:
                out.append(_problem(policy, "L406", f"the notice of deprecated flag {flag} does not name it: "
                                    f"{_shown(text)}", spec.path + ("deprecated_flags", flag, "log")))
    return out


def _domain_lint(policy, also=None) -> list[Problem]:
    """L401-L403 from one counting pass over one config per class of the domain (classes.py: the
    configs of a class meet the same conditions, so the counts say which rules hold or are chosen
    somewhere, and a class's first config is its first counterexample). `also(chunk, configs,
    weights)`: another consumer of every chunk of results with its configs and their classes' sizes,
    in domain order."""
    import itertools

    rules = policy.rule_list
    held = [0] * len(rules)
    chosen = [0] * len(rules)
    contradiction: dict[str, tuple] = {}
    defaults = {r.name for r in policy.stages["defaults"].rules}
    phase_index = {ph: i for i, ph in enumerate(policy.phase_names)}
    reads = _phases_read(policy)
    names = policy.input_names
    with domain.no_gc():
        gates, gate_reads = _gates(policy)
        admitting = (lambda ph, backend, env: _admitting_check(policy, gates, ph, backend, env),
                     gate_reads | {spec.input for spec in policy.phases.values()})
        configs, weights = domain.classes(policy, lint=True, admitting=admitting)
        classes = configs if isinstance(configs, list) else None
        configs, again = itertools.tee(configs)
        weights = iter(weights)
        for chunk in domain.results(policy, configs, held, chosen):
            combos = list(itertools.islice(again, len(chunk)))
            sizes = list(itertools.islice(weights, len(chunk)))
            if also is not None:
                also(chunk, combos, sizes)
            for (_, sources, _, viol, _), combo in zip(chunk, combos):
                for index, phase, message in viol:
                    if phase is not None:
                        src = sources[phase_index[phase]]
                    elif index in reads:  # a whole-config check (at: defaults or not): blame the
                        # default that filled every phase it reads, when one did
                        filled = {sources[phase_index[ph]] for ph in reads[index]}
                        src = filled.pop() if len(filled) == 1 else None
                    else:
                        continue
                    if src in defaults and src not in contradiction:
                        contradiction[src] = (dict(zip(names, combo)), rules[index].name, message)
    out = []

    def report(rule, code: str, message: str) -> None:
        if code not in rule.accepts:
            out.append(_problem(policy, code, message, rule.path))

    shadowed = [r for i, r in enumerate(rules) if r.stage == "defaults" and held[i] and not chosen[i]]
    winners = _winners(policy, shadowed, classes) if shadowed else {}
    for i, rule in enumerate(rules):
        if held[i] == 0:
            what = {"resolve": "resolve rule", "defaults": "default rule", "checks": "check"}[rule.stage]
            report(rule, "L402", f"{what} '{rule.name}' never applies: its condition holds for no config "
                   "of the declared domain")
        elif rule in shadowed:
            by = ", ".join(sorted(winners.get(rule.name, ())))
            report(rule, "L401", f"default rule '{rule.name}' is never chosen: wherever it applies, an "
                   f"earlier rule wins ({by})")
    for name, (config, check, message) in contradiction.items():
        rule = policy.rule(name)
        shown = " ".join(f"{k}={_show(val)}" for k, val in config.items())
        report(rule, "L403", f"default rule '{name}' sets a backend that check '{check}' rejects, e.g. "
               f"for {shown}: {message}")
    return out


def _phases_read(policy) -> dict:
    """Rule index -> the phases whose backend a check without for_each reads (in `when` or
    `require`), for the checks that read any."""
    by_input = {spec.input: ph for ph, spec in policy.phases.items()}
    out = {}
    for i, rule in enumerate(policy.rule_list):
        if rule.stage != "checks" or rule.for_each_phase:
            continue
        names = rule.when.inputs() | (rule.require.inputs() if rule.require is not None else set())
        phases = {by_input[n] for n in names if n in by_input}
        if phases:
            out[i] = phases
    return out


def _winners(policy, shadowed, classes=None) -> dict:
    """For each shadowed default, the rules chosen where it applies (a second, traced pass; over
    one config per class when there are classes: the defaults that apply, and the one chosen, are
    the same on a whole class)."""
    names = {r.name for r in shadowed}
    out: dict = {n: set() for n in names}
    configs = domain.configs(policy) if classes is None else (dict(zip(policy.input_names, c)) for c in classes)
    for config in configs:
        trace = Trace()
        interpret.run(policy, config, config, trace)
        matched = {r.name for r in trace.default_matches} & names
        if matched:
            winner = next((s.rule.name for s in trace.steps if s.chosen), None)
            for n in matched:
                out[n].add(winner)
    return out



def _capability_scan(policy):
    """(consume, finish) for L407 over the whole domain: consume(chunk, configs, weights) reads each
    chunk of counting results with its configs and the number of configs each stands for, in
    domain order; finish() gives (problems, notes). Every
    accepted config in scope whose phase backend was put there by a default (or resolve) rule, or
    admitted by a per-phase allow-list check, must be one that backend's capabilities cover. One
    problem per (rule, phase, backend), with the first counterexample in domain order; known gaps
    are counted into notes."""
    caps = policy.capabilities
    names = policy.input_names
    slots = [(i, phase, slot) for i, (phase, slot) in enumerate(policy.phase_slots)]
    gates, gate_reads = _gates(policy)
    # what a verdict depends on, as positions in the values: the inputs a capability reads, and
    # the inputs the allow-list checks read (with the phase backends), so each is decided once
    where = {n: k for k, n in enumerate(names)}
    reads = {b: [where[n] for n in sorted(set().union(*[e.when.inputs() for e in c.runs + c.gaps] or [set()]))
                 if n in where] for b, c in caps.items()}
    picks = {b: domain.reorder(idx) for b, idx in reads.items()}  # this loop sees every config
    gate_idx = sorted({where[n] for n in gate_reads if n in where} | {slot for _, _, slot in slots})
    verdicts: dict = {}  # (backend, phase, the values it reads, who set each phase) -> None | gap | "no"
    admitted: dict = {}  # (phase, backend, the values the allow-lists read) -> the admitting check or None
    found: dict = {}  # (rule name, phase, backend) -> (config as given, resolved config, rule)
    gaps: dict = {}  # (backend, phase, gap text) -> count

    def consume(chunk, combos, weights) -> None:
        for (values, sources, _, viol, scope), combo, weight in zip(chunk, combos, weights):
            if viol or scope is not None:
                continue
            for i, phase, slot in slots:
                backend = values[slot]
                cap = caps.get(backend)
                if cap is None:
                    continue
                vkey = (backend, phase, picks[backend](values), sources)
                verdict = verdicts.get(vkey, 0)
                if verdict == 0:
                    env = dict(zip(names, values))
                    user_set = {ph: src == "user" for ph, src in zip(policy.phase_names, sources)}
                    verdict = verdicts[vkey] = None if can_run(cap, phase, env, user_set) else \
                        (known_gap(cap, phase, env, user_set) or "no")
                if verdict is None:
                    continue
                src = sources[i]
                if src == "user":
                    akey = (phase, backend, tuple(values[k] for k in gate_idx))
                    if akey not in admitted:
                        admitted[akey] = _admitting_check(policy, gates, phase, backend, dict(zip(names, values)))
                    rule = admitted[akey]
                    if rule is None:
                        continue  # no allow-list vouches for it: the user's own choice
                else:
                    rule = policy.rule(src) if src else None
                    if rule is None:
                        continue
                if verdict != "no":
                    gkey = (backend, phase, verdict.text)
                    gaps[gkey] = gaps.get(gkey, 0) + weight
                    continue
                fkey = (rule.name, phase, backend)
                if fkey not in found:  # the config as given: phases a default fills are unset
                    found[fkey] = (dict(zip(names, combo)), dict(zip(names, values)), rule)

    def finish() -> tuple[list[Problem], list[str]]:
        return _capability_problems(policy, found, gaps)

    return consume, finish


def _capability_problems(policy, found: dict, gaps: dict) -> tuple[list[Problem], list[str]]:
    caps = policy.capabilities
    out = []
    for (name, phase, backend), (config, env, rule) in found.items():
        cap = caps[backend]
        shown = " ".join(f"{k}={_show(v)}" for k, v in config.items())
        rewritten = [f"{k}={_show(env[k])}" for k, v in config.items()
                     if policy.inputs[k].phase is None and env[k] != v]
        if rewritten:  # what the capabilities were read on
            shown += f" (resolved: {' '.join(rewritten)})"
        line = _at(policy, cap.path, key=True)[0]
        if rule.stage == "checks":
            what = f"check '{name}' admits {backend} for the {phase} phase by its allow-list"
            path = _row_path(rule.allowed, env) or rule.path  # the row for the resolved config
        else:
            what = f"{rule.stage} rule '{name}' routes the {phase} phase to {backend}"
            path = rule.path
        out.append(_problem(policy, "L407", f"{what}, which cannot run it, e.g. for {shown}: "
                            f"{capability_words(cap, phase)} (capabilities of {backend}, line {line})", path))
    by_reason: dict = {}  # one note per stated gap: which routes, how many
    for (backend, phase, text), n in gaps.items():
        by_reason.setdefault(text, []).append(f"{backend} {phase} {n}")
    notes = [f"{policy.file}: known gap, routes to a backend that cannot run them ({', '.join(routes)}): {text}"
             for text, routes in by_reason.items()]
    return out, notes


def _gates(policy) -> tuple[list, set]:
    """(the per-phase allow-list checks, the inputs they and the checks stage's condition read)."""
    gates = [r for r in policy.stages["checks"].rules if r.for_each_phase and r.allowed is not None]
    reads = set(policy.stages["checks"].when.inputs())
    for r in gates:
        reads |= r.when.inputs() | keys_read(r.allowed)
    return gates, reads


def _admitting_check(policy, gates, phase: str, backend: str, env: dict):
    """The first per-phase allow-list check that applies to this phase and whose allowed set holds
    the backend (the allow-list that admits the user's choice), or None."""
    user_set = {ph: env[spec.input] is not None for ph, spec in policy.phases.items()}
    scope = dict(env, backend=backend, phase=phase)
    scope.update({ph: env[spec.input] for ph, spec in policy.phases.items()})
    if not policy.stages["checks"].when.eval(scope, user_set):
        return None
    for rule in gates:
        if rule.when.eval(scope, user_set) and backend in rule.allowed.lookup(scope):
            return rule
    return None


def _row_path(table, env: dict):
    """The YAML path of the row of `table` (nested tables followed) that applies to `env`."""
    while table is not None:
        value = env.get(table.key)
        if value in table.rows:
            row, path = table.rows[value], table.path + ("rows", _row_text(value))
        else:
            row, path = table.otherwise, table.path + ("otherwise",)
        if not isinstance(row, Table):
            return path
        table = row
    return None
