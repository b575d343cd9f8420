"""Classes of configs that the rules cannot tell apart, so that whole-domain analyses evaluate one
config per class instead of every config.

Most inputs matter only on some paths (sm_minor only where a TileLang FP8 check is reached,
disable_radix_cache only with HiSparse), so a domain of hundreds of thousands of configs falls into
a few thousand classes that each follow one path: every condition the bulk evaluator tests, and
every value the analysis reads, is the same on all configs of a class. A class is a cube (a set of
value indices per input); its first config in domain order (the smallest index on every axis)
stands for it and is evaluated by the bulk evaluator like any other config, so every result, count
and counterexample is still the evaluator's.

The classes are found by walking the stages over cubes: a condition is evaluated, by the
language's own eval, on every combination of the values of the inputs it reads; where it is not
the same on all of them, the cube is split along one of those inputs into groups of values that
decide it alike, and each part is walked on. Past a work budget the walk gives up and the caller
enumerates configs one by one.
"""
from __future__ import annotations

import itertools

from engine.analysis.capability import can_run, known_gap
from engine.language import conditions
from engine.language.rules import Table

_LIMIT = 4096  # the most value combinations one test is evaluated on at once; beyond, split first
_COMPUTED = (conditions.InputRef, conditions.Product)
_IF, _FORK, _READ, _FIRST, _SET, _SRC, _USER, _SCOPE, _VIOL, _STOP, _GOTO, _CLEAN, _CAP, _END = range(14)


def keys_read(table) -> set:
    """The inputs an allowed-backend table (nested ones too) is keyed on."""
    out = {table.key}
    for row in (*table.rows.values(), table.otherwise):
        if isinstance(row, Table):
            out |= keys_read(row)
    return out


class Const:
    """A name bound to a fixed value (`phase` in a per-phase check)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class Test:
    """fn(env, user_set) -> a hashable result, reading the current values of `names` (names no
    input has are left out of env). user: fn reads user_set; by_source: user_set says whether the
    user's value is still the phase's backend, as the lint reads it, else whether the phase's input
    was given. A condition's all/any/not is kept as `kind` over `items`, so that a cube is split
    on the first part that is not decided on all of it, not on every input the whole reads."""

    __slots__ = ("fn", "names", "user", "by_source", "kind", "items")

    def __init__(self, fn, names, user=False, by_source=False, kind=None, items=()):
        self.fn, self.names, self.user, self.by_source = fn, tuple(sorted(names)), user or by_source, by_source
        self.kind, self.items = kind, items


def _cond(c) -> Test:
    kind = {conditions.All: "all", conditions.Any: "any", conditions.Not: "not"}.get(type(c))
    if kind is not None:
        return Test(None, (), kind=kind, items=[_cond(i) for i in (c.items if kind != "not" else (c.item,))])
    # a comparison reads inputs only; anything else (user_set) may read who set the phases
    return Test(c.eval, c.inputs(), user=type(c) is not conditions.Test)


def _values(names) -> Test:
    names = tuple(sorted(names))
    return Test(lambda env, us: tuple(env.get(n) for n in names), names)


class _Program:
    """The stages as a list of steps over cubes, in the bulk evaluator's order."""

    def __init__(self, policy, lint: bool, extra=()):
        self.ops: list = []
        self.policy = policy
        phases = policy.phases
        self.finals: list[int] = []  # _GOTO steps to patch to the end
        for spec in phases.values():  # whether the user set each phase: fixed on a whole class
            self.op(_FORK, Test(lambda env, us, n=spec.input: env[n] is None, [spec.input]), None)
        self.op(_USER)  # each phase the user set has the user as its source
        after = []
        for index, cond in policy.scope:  # the first leaves_out entry that holds
            at = self.op(_IF, _cond(cond), None, None)
            self.op(_SCOPE, index)
            after.append(self.op(_GOTO, None))
            self.patch([at])
        self.patch(after)
        self.resolve(lint)
        self.defaults(lint)
        early, late = policy.check_order
        if early:
            self.checks(early, lint)
            self.op(_STOP)
        self.checks(late, lint)
        self.final = len(self.ops)  # where every way an evaluation ends goes on
        self.patch(self.finals)
        if lint:  # what the capability scan reads on an accepted config in scope
            self.op(_CLEAN)
            for i, spec in enumerate(phases.values()):
                self.op(_FORK, _values([spec.input]), None)
                self.op(_CAP, i)
        else:  # what an outcome holds: resolved values, backends, given values the caller names
            names = list(policy.written) + [spec.input for spec in phases.values()] + list(extra)
            self.op(_READ, _values(names), None)
        self.op(_END)

    def op(self, *step) -> int:
        self.ops.append(step)
        return len(self.ops) - 1

    def patch(self, at: list) -> None:
        """Make the steps `at` (None: none) go next to the step about to be added."""
        for i in at:
            if i is not None:
                self.ops[i] = self.ops[i][:-1] + (len(self.ops),)

    def when(self, cond, bind=None) -> int | None:
        """An _IF on `cond` to patch with where to go when it does not hold (None: always holds)."""
        return None if isinstance(cond, conditions.TrueCond) else self.op(_IF, _cond(cond), bind, None)

    def fields(self, template, lint: bool, first: bool = False, bind=None, table=None) -> None:
        """Note the inputs a rendered line reads (an outcome holds its text; the lint reads none);
        `first`: a violation's message, which an outcome holds only for the first."""
        if lint or template is None:
            return
        phases = self.policy.phases
        names = set()
        for f in template.fields:
            if f.name == "allowed" and table is not None:
                names |= keys_read(table)
            else:
                names.add(phases[f.name].input if f.name in phases else f.name)
        self.op(_FIRST if first else _READ, _values(names), bind)

    def resolve(self, lint: bool) -> None:
        policy = self.policy
        stage = policy.stages["resolve"]
        skip = self.when(stage.when)
        for rule in stage.rules:
            nxt = self.when(rule.when)
            if rule.require is not None:
                ok = self.op(_IF, _cond(rule.require), None, None)
                fail = self.op(_GOTO, None)
                self.patch([ok])
                self.fields(rule.message, lint, first=True)
                self.op(_VIOL)
                self.finals.append(self.op(_GOTO, None))
                self.patch([fail])
            for name, value in rule.set.items():
                phase = policy.inputs[name].phase
                self.op(_SET, name, value)
                if phase is not None:
                    self.op(_SRC, policy.phase_names.index(phase), rule.name)
            self.fields(rule.log, lint)
            self.patch([nxt])
        self.patch([skip])

    def defaults(self, lint: bool) -> None:
        policy = self.policy
        stage = policy.stages["defaults"]
        skip = self.when(stage.when)
        if lint:  # the counting evaluator tests every default's condition
            for rule in stage.rules:
                self.op(_FORK, _cond(rule.when), None)
        done = []
        for rule in stage.rules:
            nxt = self.when(rule.when)
            for ph, backend in rule.set.items():
                name = policy.phases[ph].input
                unset = self.op(_IF, Test(lambda env, us, n=name: env[n] is None, [name]), None, None)
                self.op(_SET, name, backend)
                self.op(_SRC, policy.phase_names.index(ph), rule.name)
                self.patch([unset])
            self.fields(rule.log, lint)
            done.append(self.op(_GOTO, None))
            if nxt is None:
                break  # an unconditional default always wins
            self.patch([nxt])
        self.patch(done + [skip])

    def checks(self, rules, lint: bool) -> None:
        policy = self.policy
        skip = self.when(policy.stages["checks"].when)
        for rule in rules:
            for ph in (policy.phase_names if rule.for_each_phase else (None,)):
                bind = None if ph is None else {"backend": policy.phases[ph].input, "phase": Const(ph)}
                nxt = self.when(rule.when, bind)
                if rule.require is not None:
                    test = _cond(rule.require)
                else:
                    table = rule.allowed
                    test = Test(lambda env, us, t=table: env.get("backend") in t.lookup(env),
                                keys_read(table) | {"backend"})
                ok = self.op(_IF, test, bind, None)
                passed = self.op(_GOTO, None)
                self.patch([ok])
                self.fields(rule.message, lint, first=True, bind=bind, table=rule.allowed)
                self.op(_VIOL)
                self.patch([passed, nxt])
        self.patch([skip])


class Classes:
    """The classes of `domains` (value lists in the policy's input order) under `policy`."""

    def __init__(self, policy, domains: list[list], lint: bool, extra=(), admitting=None):
        self.policy, self.domains, self.lint = policy, domains, lint
        # (fn(phase, backend, env) -> the check admitting a user's backend, the inputs it reads)
        self.admitting = admitting
        self.axis = {name: i for i, name in enumerate(policy.input_names)}
        self.program = _Program(policy, lint, extra)
        self.phase_axes = [self.axis[spec.input] for spec in policy.phases.values()]
        self.cache: dict = {}  # (plan, what it reads of the cube) -> value()
        self.plans: dict = {}  # (test, bind) -> [(name, fixed value or input, fixed)]
        self.caps: dict = {}  # (phase, backend) -> (capability test, admitting-check test)
        self.work = 0

    def cubes(self, budget: int) -> list[tuple] | None:
        """The classes as (cube, axes): a cube is a tuple of value-index tuples, one per axis;
        axes: those whose value an outcome shows (passed through or rendered into a line), on
        which its outcome may still differ (never for the lint). In domain order of their first
        configs; None once the walk has done more than `budget` steps."""
        ops, final = self.program.ops, self.program.final
        n = len(self.policy.phases)
        stack = [(0, tuple(tuple(range(len(d))) for d in self.domains), {}, (None,) * n, 0, None, frozenset())]
        leaves = []
        while stack:
            pc, cube, consts, sources, viol, scope, reads = stack.pop()
            while True:
                self.work += 1
                op = ops[pc]
                kind = op[0]
                if kind == _READ or kind == _FIRST:
                    if kind == _READ or not viol:
                        reads = reads | self.reads(op[1], op[2], consts)
                    pc += 1
                elif kind <= _FORK:
                    hit = self.value(op[1], op[2], cube, consts, sources)
                    if hit[0]:  # split: each part starts over at this step
                        a, groups = hit[1], hit[2]
                        for g in reversed(groups):
                            stack.append((pc, cube[:a] + (g,) + cube[a + 1:], consts, sources, viol, scope, reads))
                        break
                    pc = op[3] if kind == _IF and not hit[1] else pc + 1
                elif kind == _SET:
                    value = op[2]
                    if isinstance(value, _COMPUTED):  # one value per class: split to single values first
                        split = self.single(value, cube, consts)
                        if split is not None:
                            a, groups = split
                            for g in reversed(groups):
                                stack.append((pc, cube[:a] + (g,) + cube[a + 1:], consts, sources, viol, scope,
                                              reads))
                            break
                        value = conditions.operand_value(value, self.env_of(value, cube, consts))
                    consts = dict(consts)
                    consts[op[1]] = value
                    pc += 1
                elif kind == _SRC:
                    sources = sources[:op[1]] + (op[2],) + sources[op[1] + 1:]
                    pc += 1
                elif kind == _USER:
                    sources = tuple("user" if self.domains[a][cube[a][0]] is not None else None
                                    for a in self.phase_axes)
                    pc += 1
                elif kind == _SCOPE:
                    scope = op[1]
                    pc += 1
                elif kind == _VIOL:
                    viol += 1
                    pc += 1
                elif kind == _STOP:
                    pc = final if viol else pc + 1
                elif kind == _GOTO:
                    pc = op[1]
                elif kind == _CLEAN:
                    pc = len(ops) - 1 if viol or scope is not None else pc + 1
                elif kind == _CAP:
                    split = self.capability(op[1], cube, consts, sources)
                    if split is not None:
                        a, groups = split
                        for g in reversed(groups):
                            stack.append((pc, cube[:a] + (g,) + cube[a + 1:], consts, sources, viol, scope, reads))
                        break
                    pc += 1
                else:
                    leaves.append((cube, reads))
                    break
            if self.work > budget:
                return None
        leaves.sort(key=lambda leaf: tuple(s[0] for s in leaf[0]))
        return leaves

    def single(self, operand, cube, consts):
        """None when every input a computed value reads has one value on the cube; else the first
        axis that has more, as (axis, one group per value)."""
        for name in sorted(conditions.operand_inputs(operand)):
            if name not in consts and len(cube[self.axis[name]]) > 1:
                return self.axis[name], [(i,) for i in cube[self.axis[name]]]
        return None

    def env_of(self, operand, cube, consts) -> dict:
        return {name: consts[name] if name in consts else self.domains[self.axis[name]][cube[self.axis[name]][0]]
                for name in conditions.operand_inputs(operand)}

    def value(self, test: Test, bind, cube, consts, sources) -> tuple:
        """(False, result) when `test` gives one result on the whole cube, else (True, axis, groups):
        the cube's values on that axis in groups that decide it alike (on the other axes)."""
        if test.kind is not None:
            return self.compound(test, bind, cube, consts, sources)
        plan = self.plans.get((test, id(bind)))
        if plan is None:  # each name: its fixed value, or the input whose current value it reads
            plan = self.plans[(test, id(bind))] = [
                (name, src.value if type(src) is Const else src, type(src) is Const)
                for name in test.names for src in [bind.get(name, name) if bind else name]
                if type(src) is Const or src in self.axis]
        parts = [id(plan)]
        for name, src, fixed in plan:
            if not fixed:
                parts.append(consts[src] if src in consts else cube[self.axis[src]])
        if test.user:
            parts.append(tuple(s == "user" for s in sources) if test.by_source else
                         tuple(self.domains[a][cube[a][0]] is not None for a in self.phase_axes))
        key = tuple(parts)
        hit = self.cache.get(key)
        if hit is None:
            hit = self.cache[key] = self.evaluate(test, plan, cube, consts, sources)
        return hit

    def reads(self, test: Test, bind, consts) -> frozenset:
        """The axes whose given values `test` reads (names the rules have rewritten are fixed)."""
        out = []
        for name in test.names:
            src = bind.get(name, name) if bind else name
            if type(src) is not Const and src not in consts and src in self.axis:
                out.append(self.axis[src])
        return frozenset(out)

    def compound(self, test: Test, bind, cube, consts, sources) -> tuple:
        """all/any/not over the parts' results: decided when a part decides it on the whole cube
        (or all parts are decided); else split on the first undecided part."""
        if test.kind == "not":
            hit = self.value(test.items[0], bind, cube, consts, sources)
            return hit if hit[0] else (False, not hit[1])
        decisive = test.kind == "any"  # the result that ends all (False) or any (True)
        split = None
        for item in test.items:
            hit = self.value(item, bind, cube, consts, sources)
            if not hit[0]:
                if bool(hit[1]) is decisive:
                    return (False, decisive)
            elif split is None:
                split = hit
        return split if split is not None else (False, not decisive)

    def evaluate(self, test: Test, plan, cube, consts, sources) -> tuple:
        env = {}
        free = []
        for name, src, fixed in plan:
            if fixed:
                env[name] = src
            elif src in consts:
                env[name] = consts[src]
            else:
                free.append((name, self.axis[src]))
        if test.by_source:
            us = tuple(s == "user" for s in sources)
        else:
            us = tuple(self.domains[a][cube[a][0]] is not None for a in self.phase_axes)
        axes = list(dict.fromkeys(a for _, a in free))
        sets = [cube[a] for a in axes]
        count = 1
        for s in sets:
            count *= len(s)
        if count > _LIMIT:  # too many combinations: split the widest axis into single values
            k = max(range(len(sets)), key=lambda i: len(sets[i]))
            return (True, axes[k], [(v,) for v in sets[k]])
        user_set = dict(zip(self.policy.phase_names, us))
        where = [(name, axes.index(a), self.domains[a]) for name, a in free]
        results = []
        for combo in itertools.product(*sets):
            for name, k, dom in where:
                env[name] = dom[combo[k]]
            results.append(test.fn(env, user_set))
        self.work += count
        first = results[0]
        if all(r == first and type(r) is type(first) for r in results):
            return (False, first)
        return (True,) + _best_split(axes, sets, results)

    def capability(self, i: int, cube, consts, sources):
        """For the capability scan: split until phase i's verdict and admitting check are the same
        on the whole cube (its backend already is); None when they are."""
        policy = self.policy
        ph = policy.phase_names[i]
        name = policy.phases[ph].input
        backend = consts[name] if name in consts else self.domains[self.axis[name]][cube[self.axis[name]][0]]
        cap = policy.capabilities.get(backend)
        if cap is None:
            return None
        tests = self.caps.get((ph, backend))
        if tests is None:
            tests = self.caps[(ph, backend)] = self.capability_tests(ph, backend, cap)
        verdict = self.value(tests[0], None, cube, consts, sources)
        if verdict[0]:
            return verdict[1:]
        if verdict[1][0] or sources[i] != "user":
            return None
        admitted = self.value(tests[1], None, cube, consts, sources)
        return admitted[1:] if admitted[0] else None

    def capability_tests(self, ph, backend, cap):
        reads = set().union(*[e.when.inputs() for e in cap.runs + cap.gaps] or [set()]) & set(self.axis)
        verdict = Test(lambda env, us: (can_run(cap, ph, env, us), id(known_gap(cap, ph, env, us))), reads,
                       by_source=True)
        admit, reads = self.admitting
        return verdict, Test(lambda env, us: id(admit(ph, backend, env)), set(reads) & set(self.axis))


def _best_split(axes: list[int], sets: list[tuple], results: list) -> tuple:
    """(axis, groups): of the axes, the one whose values fall into the fewest groups that give the
    same results on every combination of the others (groups in order of their first value)."""
    best = None
    sizes = [len(s) for s in sets]
    for k, a in enumerate(axes):
        if sizes[k] == 1:
            continue
        inner = 1
        for s in sizes[k + 1:]:
            inner *= s
        outer = len(results) // (inner * sizes[k])
        groups: dict = {}
        for j, v in enumerate(sets[k]):
            column = tuple((r, type(r)) for o in range(outer)
                           for r in results[(o * sizes[k] + j) * inner:(o * sizes[k] + j + 1) * inner])
            groups.setdefault(column, []).append(v)
        if len(groups) > 1 and (best is None or len(groups) < len(best[1])):
            best = (a, [tuple(g) for g in groups.values()])
    return best
