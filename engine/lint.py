"""Deep lint: what only the whole declared domain shows. Run by `hisparse check` after a policy
loads cleanly; exact, by enumerating every config of the domain through the interpreter.

L401 shadowed-default   a default rule whose condition holds somewhere, but earlier rules always win
L402 dead-rule          a rule whose condition holds for no config
L403 self-contradiction a default backend that the policy's own checks reject (with a counterexample)
L404 empty-allowed      an allowed-backend set that is empty
L405 unused-input       a declared input no rule, table or template reads
"""
from __future__ import annotations

from . import interpret
from .conditions import Cond
from .errors import Problem
from .model import Table

MAX_DOMAIN = 250_000  # beyond this the whole-domain analyses are skipped (said on stderr)


def lint(policy) -> tuple[list[Problem], list[str]]:
    """(problems, notes). Notes say what was not analysed and why."""
    problems = _empty_allowed(policy) + _unused_inputs(policy)
    notes = []
    size = policy.domain_size()
    if size > MAX_DOMAIN:
        notes.append(f"{policy.file}: the declared domain has {size} configs; whole-domain lint "
                     f"(L401-L403) runs up to {MAX_DOMAIN}")
        return problems, notes
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
            for tpl in (rule.log, rule.message):
                if tpl is not None:
                    read.update(f.name for f in tpl.fields)
    for table in _tables(policy):
        read |= table.keys_read()
    out = []
    for name, spec in policy.inputs.items():
        if spec.phase is None and name not in read:
            out.append(_problem(policy, "L405", f"input '{name}' is declared but no rule, table or template "
                                "reads it", spec.path, key=True))
    return out


def _domain_lint(policy) -> list[Problem]:
    held: dict[str, int] = {r.name: 0 for r in policy.rule_list}
    chosen: dict[str, int] = {}
    shadowers: dict[str, dict] = {}
    contradiction: dict[str, tuple] = {}
    for config in policy.domain():
        trace = interpret.Trace()
        d = interpret.run(policy, config, config, trace)
        for step in trace.steps:
            if step.rule is not None and step.holds and step.rule.stage != "defaults":
                held[step.rule.name] += 1
        winner = next((s.rule.name for s in trace.steps if s.chosen), None)
        for rule in trace.default_matches:
            held[rule.name] += 1
            if rule.name == winner:
                chosen[rule.name] = chosen.get(rule.name, 0) + 1
            else:
                shadowers.setdefault(rule.name, {}).setdefault(winner, 0)
                shadowers[rule.name][winner] += 1
        for v in d.violations:
            src = d.sources.get(v.phase) if v.phase else None
            if src and src != "user" and src not in contradiction and _is_default(policy, src):
                contradiction[src] = (config, v)
    out = []
    for rule in policy.rule_list:
        path = rule.path
        if held[rule.name] == 0:
            what = {"resolve": "resolve rule", "defaults": "default rule", "checks": "check"}[rule.stage]
            out.append(_problem(policy, "L402", f"{what} '{rule.name}' never applies: its condition holds for "
                                "no config of the declared domain", path))
        elif rule.stage == "defaults" and not chosen.get(rule.name):
            by = ", ".join(sorted(n for n in shadowers.get(rule.name, {}) if n))
            out.append(_problem(policy, "L401", f"default rule '{rule.name}' is never chosen: wherever it "
                                f"applies, an earlier rule wins ({by})", path))
    for name, (config, v) in contradiction.items():
        rule = policy.rule(name)
        shown = " ".join(f"{k}={_show(val)}" for k, val in config.items())
        out.append(_problem(policy, "L403", f"default rule '{name}' sets a backend that check '{v.check}' "
                            f"rejects, e.g. for {shown}: {v.message}", rule.path))
    return out


def _is_default(policy, name: str) -> bool:
    return any(r.name == name for r in policy.stages["defaults"].rules)


def _show(v) -> str:
    if v is None:
        return "unset"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
