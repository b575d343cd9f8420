"""Conditions of the policy language: parsed once into a small tree, then evaluated (the
interpreter) or turned into a Python expression (the compiled evaluator); engine/explain words
them.

A condition is a mapping; its entries all hold (AND):
    input: VALUE                 equality
    input: {in: [..]} / {not_in: [..]} / {"==": x} / {"!=": x} / {">=": n} ... / {set: bool}
    input: {multiple_of: n}      an integer multiple of n (never for an unset value or a zero n)
    input: {lower_in: [..]}      a string whose lower-case form is listed (SGLang's `.lower() in`)
    any: [cond, ...]   all: [cond, ...]   not: cond
    user_set: {phase: bool, ...}  whether the user set that phase's backend
Operands of comparisons may be {input: NAME}, the current value of another input, or
{product: [n | {input: NAME}, ...]}, a product of integers and inputs (unset when a factor is), or
{quotient: [...]}, the first factor floor-divided by the others in turn (unset when a factor is
unset or a divisor is 0). The same operands give a resolve rule's `set` a computed value.
"""
from __future__ import annotations

import functools
import operator

from engine.language.record import Frozen

COMBINATORS = ("any", "all", "not", "user_set")
_ORDER = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


class InputRef(Frozen):
    """An operand that reads another input's current value."""

    FIELDS = ("name",)
    __slots__ = FIELDS


class Product(Frozen):
    """An operand: the product of its factors (integers and InputRefs); None when one is unset."""

    FIELDS = ("factors",)
    __slots__ = FIELDS
    SIGN, DIVIDES = " * ", False

    def value(self, env):
        values = [env.get(f.name) if isinstance(f, InputRef) else f for f in self.factors]
        if None in values or (self.DIVIDES and 0 in values[1:]):
            return None
        return functools.reduce(operator.floordiv if self.DIVIDES else operator.mul, values)

    def py(self, names) -> str:
        parts = [names[f.name] if isinstance(f, InputRef) else repr(f) for f in self.factors]
        guard = [f"{p} is None" for p, f in zip(parts, self.factors) if isinstance(f, InputRef)]
        if self.DIVIDES:
            if "0" in parts[1:]:
                return "None"
            guard += [f"{p} == 0" for p in parts[1:] if not p.lstrip("-").isdigit()]
        body = self.SIGN.join(parts)
        return f"(None if {' or '.join(guard)} else {body})" if guard else f"({body})"

    def words(self) -> str:  # as written (explain, and a load problem, quote it)
        return self.SIGN.join(f.name if isinstance(f, InputRef) else str(f) for f in self.factors)

    def inputs(self) -> set:
        return {f.name for f in self.factors if isinstance(f, InputRef)}


class Quotient(Product):
    """An operand: the first factor floor-divided by each of the others, as Python's `//`; None
    when one is unset or a divisor is 0."""

    __slots__ = ()
    SIGN, DIVIDES = " // ", True


def operand_value(operand, env):
    """A `set` value or comparison operand, evaluated: an input's current value, a product or a
    quotient, or the constant itself."""
    if isinstance(operand, InputRef):
        return env.get(operand.name)
    return operand.value(env) if isinstance(operand, Product) else operand


def operand_py(operand, names) -> str:
    if isinstance(operand, InputRef):
        return names[operand.name]
    return operand.py(names) if isinstance(operand, Product) else repr(operand)


def operand_inputs(operand) -> set:
    if isinstance(operand, InputRef):
        return {operand.name}
    return operand.inputs() if isinstance(operand, Product) else set()


class Cond(Frozen):
    """Base of the condition tree: eval(env, user_set) -> bool; py(names): a Python expression over
    the local names in `names` (input -> variable); inputs(): the inputs read. `path`: where it
    sits in the YAML."""

    __slots__ = ()
    DEFAULTS = {"path": ()}
    path = ()

    def inputs(self) -> set[str]:
        return set()


class TrueCond(Cond):
    """No `when`: always holds."""

    __slots__ = ()

    def eval(self, env, user_set):
        return True

    def py(self, names):
        return "True"


class Test(Cond):
    FIELDS = ("input", "op", "operand", "path")  # operand: a scalar, a frozenset (in/not_in), a bool (set) or an InputRef
    __slots__ = FIELDS

    def eval(self, env, user_set):
        value, op, other = env.get(self.input), self.op, self.operand
        if op == "in":
            return value in other
        if op == "not_in":
            return value not in other
        if op == "set":
            return (value is not None) is other
        if op == "lower_in":
            return isinstance(value, str) and value.lower() in other
        if isinstance(other, (InputRef, Product)):  # read on the config
            other = operand_value(other, env)
        if op == "==" or op == "!=":  # True == 1 in Python; a policy never means that
            return (value == other and type(value) is type(other)) is (op == "==")
        if value is None or other is None:  # ordering never holds for an unset value
            return False
        if op == "multiple_of":
            return other != 0 and value % other == 0
        return _ORDER[op](value, other)

    def py(self, names):
        var, op = names[self.input], self.op
        if op == "set":
            return f"({var} is {'not ' if self.operand else ''}None)"
        if op == "lower_in":
            members = ", ".join(repr(m) for m in sorted(self.operand))
            return f"({var} is not None and {var}.lower() in ({members},))"
        if op in ("in", "not_in"):
            members = sorted(self.operand, key=repr)
            neg = "not " if op == "not_in" else ""
            if len(members) == 1:
                return _py_eq(var, members[0], negate=op == "not_in")
            # a tuple literal of constants: CPython folds it and `in` is a short scan
            return f"({var} {neg}in ({', '.join(repr(m) for m in members)},))"
        guard = "" if ("nonnull", var) in names else f"{var} is not None and "
        if isinstance(self.operand, (InputRef, Product)):
            other = operand_py(self.operand, names)
            if op in ("==", "!="):
                return f"({var} {op} {other})"
            if op == "multiple_of":  # the operand evaluated once, in a one-item loop
                return (f"any({var} is not None and _d is not None and _d != 0 and {var} % _d == 0 "
                        f"for _d in ({other},))")
            guards = "".join(f"{v} is not None and " for v in (var, other) if ("nonnull", v) not in names)
            return f"({guards}{var} {op} {other})"
        if op == "multiple_of":
            return f"({guard}{self.operand!r} != 0 and {var} % {self.operand!r} == 0)"
        if op in ("==", "!="):
            return _py_eq(var, self.operand, negate=op == "!=")
        return f"({guard}{var} {op} {self.operand!r})"

    def inputs(self):
        return {self.input} | operand_inputs(self.operand)


class UserSet(Cond):
    FIELDS = ("phase", "expected", "path")
    __slots__ = FIELDS

    def eval(self, env, user_set):
        return user_set[self.phase] is self.expected

    def py(self, names):
        var = names[("user_set", self.phase)]
        return var if self.expected else f"(not {var})"


class All(Cond):
    FIELDS = ("items", "path")
    __slots__ = FIELDS
    JOIN = "and"

    def eval(self, env, user_set):
        return all(c.eval(env, user_set) for c in self.items)

    def py(self, names):
        return "(" + f" {self.JOIN} ".join(c.py(names) for c in self.items) + ")"

    def inputs(self):
        return set().union(*(c.inputs() for c in self.items))


class Any(All):
    """Holds when one of its items does."""

    __slots__ = ()
    JOIN = "or"

    def eval(self, env, user_set):
        return any(c.eval(env, user_set) for c in self.items)


class Not(Cond):
    FIELDS = ("item", "path")
    __slots__ = FIELDS

    def eval(self, env, user_set):
        return not self.item.eval(env, user_set)

    def py(self, names):
        return f"(not {self.item.py(names)})"

    def inputs(self):
        return self.item.inputs()


def conj(*conds: Cond) -> Cond:
    """AND of conditions, dropping the always-true ones."""
    items = tuple(c for c in conds if not isinstance(c, TrueCond))
    if not items:
        return TrueCond()
    return items[0] if len(items) == 1 else All(items)


def _py_eq(var: str, value, negate: bool = False) -> str:
    if value is None or isinstance(value, bool):
        return f"({var} is {'not ' if negate else ''}{value!r})"
    return f"({var} {'!=' if negate else '=='} {value!r})"
