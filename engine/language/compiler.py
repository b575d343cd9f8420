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


def compile_probe(policy, count: bool = True) -> tuple[str, dict]:
    """Python source of `_probe(configs, sink, held, chosen)` for `policy`, and the namespace
    (constants) it runs in: the evaluation in a loop over `configs` (tuples of valid canonical
    values, in input order, so nothing is looked up or checked), calling for each config, with
    `count`, sink((values, sources, log, violations, scope)) and counting which rule conditions
    held and which default was chosen; without, sink((rewritten values and backends, log, first
    violation, scope)) (scope: the index of the leaves_out entry the config lies in, or None): the
    outcome as diff and table compare it (policy.written: the inputs rules rewrite)."""
    src = _Source(policy, count)
    src.loop_head()
    src.resolve()
    early, late = policy.check_order
    src.defaults(early)
    if early:  # a failure stops evaluation before the default's log line
        src.checks(early)
        src.emit("if viol:")
        src.finish("    ")
        src.emit("if dlog is not None:")
        src.emit("    log.append(dlog)")
    src.checks(late)  # every failure is a violation, in order
    src.emit(src.result)
    return "def _probe(configs, sink, held, chosen):\n" + "\n".join(src.lines) + "\n", src.consts


class _Source:
    """The probe's source as it is generated: its lines (the loop body indented by `depth`), the
    constants they name, and the expressions conditions (`var`) and templates (`tpl`) read."""

    def __init__(self, policy, count: bool):
        self.policy, self.count, self.index = policy, count, policy.rule_index
        self.lines: list[str] = []
        self.consts: dict[str, object] = {}
        self.depth = 1
        inputs = policy.inputs
        self.var = var = {name: f"v_{name}" for name in inputs}  # condition names -> expressions
        for ph in policy.phases:
            var[("user_set", ph)] = f"u_{ph}"
        for name, spec in inputs.items():
            if not spec.nullable:  # lets comparisons skip their None guard
                var[("nonnull", var[name])] = True
        self.tpl = dict(var)  # template fields -> variables
        for ph, spec in policy.phases.items():
            self.tpl[ph] = var[spec.input]
        if count:
            parts = ("(" + "".join(f"{var[n]}, " for n in inputs) + "), ("
                     + "".join(f"s_{ph}, " for ph in policy.phases) + "), log, viol, scope")
        else:  # only what tells outcomes apart, hashable as it is
            shown = [var[n] for n in policy.written] + [var[spec.input] for spec in policy.phases.values()]
            parts = "(" + "".join(f"{v}, " for v in shown) + "), tuple(log), viol[0] if viol else None, scope"
        self.result = f"sink(({parts}))"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def const(self, prefix: str, value) -> str:
        name = f"_{prefix}{len(self.consts)}"
        self.consts[name] = value
        return name

    def finish(self, indent: str = "") -> None:
        """Every way an evaluation ends hands its result to the sink and goes on with the next
        config (a `return` would end the whole loop)."""
        self.emit(indent + self.result)
        self.emit(indent + "continue")

    def tally(self, rule, what: str = "held") -> None:
        if self.count:
            self.emit(f"{what}[{self.index[id(rule)]}] += 1")

    @contextmanager
    def block(self, cond: Cond, var: dict | None = None):
        """`if COND:` around the body (COND over `var`, default the config's), or nothing when
        COND always holds."""
        always = isinstance(cond, TrueCond)
        if not always:
            self.emit(f"if {cond.py(var or self.var)}:")
            self.depth += 1
        start = len(self.lines)
        yield
        if len(self.lines) == start:
            self.emit("pass")  # keeps an empty body valid
        if not always:
            self.depth -= 1

    def loop_head(self) -> None:
        """The loop over configs, each phase's user_set and source, and what the decision covers,
        read on the config as given: the first leaves_out entry whose condition holds (None: in
        scope)."""
        policy, var = self.policy, self.var
        self.emit("for (" + "".join(f"{var[n]}, " for n in policy.inputs) + ") in configs:")
        self.depth += 1
        for ph, spec in policy.phases.items():
            self.emit(f"u_{ph} = {var[spec.input]} is not None")
            self.emit(f"s_{ph} = 'user' if u_{ph} else None")
        self.emit("log, viol, scope = [], [], None")
        for n, (index, cond) in enumerate(policy.scope):
            self.emit(f"{'if' if n == 0 else 'elif'} {cond.py(var)}:")
            self.emit(f"    scope = {index!r}")

    def resolve(self) -> None:
        """Rewrite inputs, log, stop on a failed requirement."""
        stage, var = self.policy.stages["resolve"], self.var
        with self.block(stage.when):
            for rule in stage.rules:
                self.emit(f"# resolve {_comment(rule.name)} (line {rule.line})")
                with self.block(rule.when):
                    self.tally(rule)
                    if rule.require is not None:
                        self.emit(f"if not {rule.require.py(var)}:")
                        self.emit(f"    viol.append(({self.index[id(rule)]}, None, {rule.message.fstring(self.tpl)}))")
                        self.finish("    ")
                    for name, value in rule.set.items():
                        self.emit(f"{var[name]} = {operand_py(value, var)}")
                        phase = self.policy.inputs[name].phase
                        if phase is not None:
                            self.emit(f"s_{phase} = {rule.name!r}")
                    if rule.log is not None:
                        self.emit(f"log.append({rule.log.fstring(self.tpl)})")

    def defaults(self, early: list) -> None:
        """The first matching rule fills each unset phase; with checks placed `at: defaults`
        (`early`), its log line waits for them (upstream raises inside its backend step, before
        logging)."""
        if early:
            self.emit("dlog = None")
        stage = self.policy.stages["defaults"]
        with self.block(stage.when):
            if self.count:  # every default whose condition holds, chosen or not
                for rule in stage.rules:
                    self.emit(f"if {rule.when.py(self.var)}:")
                    self.emit(f"    held[{self.index[id(rule)]}] += 1")
            for i, rule in enumerate(stage.rules):
                self.default(rule, i, early)
                if isinstance(rule.when, TrueCond):
                    break  # an unconditional default always wins: the rules after it never run

    def default(self, rule, i: int, early: list) -> None:
        head = "else" if isinstance(rule.when, TrueCond) and i else ("if" if i == 0 else "elif")
        test = "" if head == "else" else " " + rule.when.py(self.var)
        self.emit(f"{head}{test}:  # default {_comment(rule.name)} (line {rule.line})")
        self.depth += 1
        self.tally(rule, "chosen")
        for ph, backend in rule.set.items():
            v = self.var[self.policy.phases[ph].input]
            self.emit(f"if {v} is None:")
            self.emit(f"    {v} = {backend!r}")
            self.emit(f"    s_{ph} = {rule.name!r}")
        if rule.log is not None:
            self.emit(f"{'dlog = ' if early else 'log.append('}{rule.log.fstring(self.tpl)}{'' if early else ')'}")
        if not rule.set and rule.log is None:
            self.emit("pass")
        self.depth -= 1

    def checks(self, rules) -> None:
        with self.block(self.policy.stages["checks"].when):
            for rule in rules:
                self.emit(f"# check {_comment(rule.name)} (line {rule.line})")
                if not rule.for_each_phase:
                    self.check(rule, self.var, self.tpl, None)
                    continue
                for ph, spec in self.policy.phases.items():
                    backend = self.var[spec.input]
                    self.check(rule, dict(self.var, backend=backend, phase=repr(ph)),
                               dict(self.tpl, backend=backend, phase=Literal(ph)), ph)

    def check(self, rule: Rule, var: dict, tpl: dict, phase: str | None) -> None:
        idx = self.index[id(rule)]
        with self.block(rule.when, var):
            self.tally(rule)
            if rule.require is not None:
                self.emit(f"if not {rule.require.py(var)}:")
                self.emit(f"    viol.append(({idx}, {phase!r}, {rule.message.fstring(tpl)}))")
                return
            # allowed: the phase's backend must lie in the table's set for the current inputs
            leaves: list[frozenset] = []
            choice = _table_expr(rule.allowed, var, leaves)
            sets = self.const("sets", tuple(leaves))
            forms = {(f.spec, f.conversion) for f in rule.message.fields if f.name == "allowed"}
            local_tpl = dict(tpl)
            for spec, conversion in sorted(forms):  # each form's text per set, by the one renderer
                texts = self.const("text", tuple(render_field(s, spec, conversion) for s in leaves))
                local_tpl[("allowed", spec, conversion)] = f"{texts}[_i]"
            self.emit(f"_i = {choice}")
            self.emit(f"if {var['backend']} not in {sets}[_i]:")
            self.emit(f"    viol.append(({idx}, {phase!r}, {rule.message.fstring(local_tpl)}))")


def _comment(text: str) -> str:
    """A name as comment text: printable characters only, so no name can end the comment's line
    (the schema already restricts names; this keeps the generated source sound regardless)."""
    return "".join(c if c.isprintable() else "?" for c in text)


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
