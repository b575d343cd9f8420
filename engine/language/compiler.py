"""The bulk evaluator: a policy compiled into one straight-line Python loop over many configs.

Whole-domain work (diff, table, lint, conform) evaluates hundreds of thousands of configs, where a
walk over the rules costs about 20x more. The generated loop does the work of a hand-written
if/else: local variables instead of dict look-ups, conditions as inline expressions, per-phase
checks unrolled, messages as f-strings, allowed sets and their rendered text as constants. Only
checked policy data reaches the source, and only through repr(), so the text compiled is fully
determined by the schema-checked policy. It is generated in memory, never stored.

`interpreter.py` defines the semantics; tests hold this loop to it on every config of every
shipped version's domain.
"""
from __future__ import annotations

from contextlib import contextmanager

from engine.language.conditions import Cond, TrueCond, operand_py
from engine.language.rules import Rule, Table
from engine.language.templates import Literal, render_field


class _Emitter:
    def __init__(self):
        self.lines: list[str] = []
        self.consts: dict[str, object] = {}
        self.depth = 1

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def const(self, prefix: str, value) -> str:
        name = f"_{prefix}{len(self.consts)}"
        self.consts[name] = value
        return name


def compile_probe(policy, count: bool = True) -> tuple[str, dict]:
    """Python source of `_probe(configs, sink, held, chosen)` for `policy`, and the namespace
    (constants) it runs in: the evaluation in a loop over `configs` (tuples of valid canonical
    values, in input order, so nothing is looked up or checked), calling for each config, with
    `count`, sink((values, sources, log, violations, scope)) and counting which rule conditions
    held and which default was chosen; without, sink((rewritten values and backends, log, first
    violation, scope)) (scope: the index of the leaves_out entry the config lies in, or None): the
    outcome as diff and table compare it (policy.written: the inputs rules rewrite)."""
    e = _Emitter()
    inputs = policy.inputs
    var = {name: f"v_{name}" for name in inputs}  # condition names -> expressions
    for ph in policy.phases:
        var[("user_set", ph)] = f"u_{ph}"
    for name, spec in inputs.items():
        if not spec.nullable:  # lets comparisons skip their None guard
            var[("nonnull", var[name])] = True
    tpl = dict(var)  # template fields -> variables
    for ph, spec in policy.phases.items():
        tpl[ph] = var[spec.input]

    e.emit("for (" + "".join(f"{var[n]}, " for n in inputs) + ") in configs:")
    e.depth += 1
    for ph, spec in policy.phases.items():
        e.emit(f"u_{ph} = {var[spec.input]} is not None")
        e.emit(f"s_{ph} = 'user' if u_{ph} else None")
    e.emit("log = []")
    e.emit("viol = []")
    # what the decision covers, read on the config as given: the first leaves_out entry whose
    # condition holds (None: in scope)
    e.emit("scope = None")
    for n, (index, cond) in enumerate(policy.scope):
        e.emit(f"{'if' if n == 0 else 'elif'} {cond.py(var)}:")
        e.emit(f"    scope = {index!r}")
    if count:
        parts = ("(" + "".join(f"{var[n]}, " for n in inputs) + "), ("
                 + "".join(f"s_{ph}, " for ph in policy.phases) + "), log, viol, scope")
    else:  # only what tells outcomes apart, hashable as it is
        shown = [var[n] for n in policy.written] + [var[spec.input] for spec in policy.phases.values()]
        parts = "(" + "".join(f"{v}, " for v in shown) + "), tuple(log), viol[0] if viol else None, scope"
    # every way an evaluation ends hands its result to the sink and goes on with the next config
    # (a `return` would end the whole loop)
    finish = [f"sink(({parts}))", "continue"]
    index = policy.rule_index

    def tally(rule, what="held"):
        if count:
            e.emit(f"{what}[{index[id(rule)]}] += 1")

    # resolve: rewrite inputs, log, stop on a failed requirement
    st = policy.stages["resolve"]
    with _block(e, st.when, var):
        for rule in st.rules:
            e.emit(f"# resolve {_comment(rule.name)} (line {rule.line})")
            with _block(e, rule.when, var):
                tally(rule)
                if rule.require is not None:
                    e.emit(f"if not {rule.require.py(var)}:")
                    e.emit(f"    viol.append(({index[id(rule)]}, None, {rule.message.fstring(tpl)}))")
                    for line in finish:
                        e.emit(f"    {line}")
                for name, value in rule.set.items():
                    e.emit(f"{var[name]} = {operand_py(value, var)}")
                    phase = inputs[name].phase
                    if phase is not None:
                        e.emit(f"s_{phase} = {rule.name!r}")
                if rule.log is not None:
                    e.emit(f"log.append({rule.log.fstring(tpl)})")

    # defaults: the first matching rule fills each unset phase; with checks placed `at: defaults`,
    # its log line waits for them (upstream raises inside its backend step, before logging)
    checks = policy.stages["checks"]
    early = [r for r in checks.rules if r.at == "defaults"]
    if early:
        e.emit("dlog = None")
    st = policy.stages["defaults"]
    with _block(e, st.when, var):
        if count:  # every default whose condition holds, chosen or not
            for rule in st.rules:
                e.emit(f"if {rule.when.py(var)}:")
                e.emit(f"    held[{index[id(rule)]}] += 1")
        for i, rule in enumerate(st.rules):
            head = "else" if isinstance(rule.when, TrueCond) and i else ("if" if i == 0 else "elif")
            test = "" if head == "else" else " " + rule.when.py(var)
            e.emit(f"{head}{test}:  # default {_comment(rule.name)} (line {rule.line})")
            e.depth += 1
            tally(rule, "chosen")
            for ph, backend in rule.set.items():
                v = var[policy.phases[ph].input]
                e.emit(f"if {v} is None:")
                e.emit(f"    {v} = {backend!r}")
                e.emit(f"    s_{ph} = {rule.name!r}")
            if rule.log is not None:
                e.emit(f"{'dlog = ' if early else 'log.append('}{rule.log.fstring(tpl)}{'' if early else ')'}")
            if not rule.set and rule.log is None:
                e.emit("pass")
            e.depth -= 1
            if isinstance(rule.when, TrueCond):
                break  # an unconditional default always wins: the rules after it never run

    def run_checks(rules):
        with _block(e, checks.when, var):
            for rule in rules:
                e.emit(f"# check {_comment(rule.name)} (line {rule.line})")
                if rule.for_each_phase:
                    for ph, spec in policy.phases.items():
                        pvar = dict(var, backend=var[spec.input], phase=repr(ph))
                        ptpl = dict(tpl, backend=var[spec.input], phase=Literal(ph))
                        _check(e, rule, index[id(rule)], pvar, ptpl, ph, count)
                else:
                    _check(e, rule, index[id(rule)], var, tpl, None, count)

    if early:  # a failure stops evaluation before the default's log line
        run_checks(early)
        e.emit("if viol:")
        for line in finish:
            e.emit(f"    {line}")
        e.emit("if dlog is not None:")
        e.emit("    log.append(dlog)")
    # checks: every failure is a violation, in order
    run_checks([r for r in checks.rules if r.at != "defaults"])
    e.emit(finish[0])

    return "def _probe(configs, sink, held, chosen):\n" + "\n".join(e.lines) + "\n", e.consts


def _comment(text: str) -> str:
    """A name as comment text: printable characters only, so no name can end the comment's line
    (the schema already restricts names; this keeps the generated source sound regardless)."""
    return "".join(c if c.isprintable() else "?" for c in text)


@contextmanager
def _block(e: _Emitter, cond: Cond, var: dict):
    """`if COND:` around the body, or nothing when COND always holds."""
    always = isinstance(cond, TrueCond)
    if not always:
        e.emit(f"if {cond.py(var)}:")
        e.depth += 1
    start = len(e.lines)
    yield
    if len(e.lines) == start:
        e.emit("pass")  # keeps an empty body valid
    if not always:
        e.depth -= 1


def _check(e: _Emitter, rule: Rule, idx: int, var: dict, tpl: dict, phase: str | None,
           probe: bool = False) -> None:
    with _block(e, rule.when, var):
        if probe:
            e.emit(f"held[{idx}] += 1")
        if rule.require is not None:
            e.emit(f"if not {rule.require.py(var)}:")
            e.emit(f"    viol.append(({idx}, {phase!r}, {rule.message.fstring(tpl)}))")
            return
        # allowed: the phase's backend must lie in the table's set for the current inputs
        leaves: list[frozenset] = []
        choice = _table_expr(rule.allowed, var, leaves)
        sets = e.const("sets", tuple(leaves))
        forms = {(f.spec, f.conversion) for f in rule.message.fields if f.name == "allowed"}
        local_tpl = dict(tpl)
        for spec, conversion in sorted(forms):  # each form's text per set, by the one renderer
            texts = e.const("text", tuple(render_field(s, spec, conversion) for s in leaves))
            local_tpl[("allowed", spec, conversion)] = f"{texts}[_i]"
        e.emit(f"_i = {choice}")
        e.emit(f"if {var['backend']} not in {sets}[_i]:")
        e.emit(f"    viol.append(({idx}, {phase!r}, {rule.message.fstring(local_tpl)}))")


def _table_expr(table: Table, var: dict, leaves: list) -> str:
    """A conditional expression choosing the index (into `leaves`) of the table's set."""

    def leaf(row) -> str:
        if isinstance(row, Table):
            return "(" + _table_expr(row, var, leaves) + ")"
        leaves.append(row if row is not None else frozenset())
        return str(len(leaves) - 1)

    key = var[table.key]
    parts = []
    for value, row in table.rows.items():
        test = f"{key} is {value!r}" if isinstance(value, bool) else f"{key} == {value!r}"
        parts.append(f"{leaf(row)} if {test} else ")
    return "".join(parts) + leaf(table.otherwise)
