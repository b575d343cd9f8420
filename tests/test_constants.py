"""Each limit is defined once and imported where it is used: no two modules of engine/ and
kernels_bridge/ define a large constant (a size, a bound, a byte limit) to the same value, and
the integer bounds (int32, int64) are written out only where they are defined."""
import ast
import os

from tests.helpers import ROOT, python_files

PACKAGES = ("engine", "kernels_bridge")
# the integer bounds -> the one module that may write them out
BOUNDS = {2 ** 31 - 1: "kernels_bridge/validate.py", 2 ** 63 - 1: "engine/values.py",
          -(2 ** 63): "engine/values.py"}
LARGE = 2 ** 15  # constants below this (64 dims, 128 heads, a depth of 64) coincide by nature


def _modules():
    for path in python_files(*PACKAGES):
        yield os.path.relpath(path, ROOT), ast.parse(open(path, encoding="utf-8").read())


def _number(node):
    """The value of an expression of integer literals (2 ** 31 - 1, 16 << 20), else None."""
    if not all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop))
               for n in ast.walk(node)):
        return None
    try:
        value = eval(compile(ast.Expression(node), "<constant>", "eval"), {"__builtins__": {}})
    except Exception:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _outermost_numbers(tree):
    """(value, line) of each maximal integer-literal expression of a module."""
    seen = set()
    for node in ast.walk(tree):
        if id(node) in seen or not isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Constant)):
            continue
        value = _number(node)
        if value is not None:
            seen.update(id(n) for n in ast.walk(node))
            yield value, node.lineno


def test_integer_bounds_are_written_once():
    stray = []
    for rel, tree in _modules():
        for value, line in _outermost_numbers(tree):
            if value in BOUNDS and BOUNDS[value] != rel.replace(os.sep, "/"):
                stray.append(f"{rel}:{line} writes {value} (import it from {BOUNDS[value]})")
    assert not stray, "\n".join(stray)


def test_no_two_modules_define_a_large_constant_alike():
    by_value: dict[int, list[str]] = {}
    for rel, tree in _modules():
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = _number(node.value)
                if value is not None and abs(value) >= LARGE:
                    by_value.setdefault(value, []).append(f"{rel}:{node.targets[0].id}")
    twice = {v: names for v, names in by_value.items() if len({n.split(":")[0] for n in names}) > 1}
    assert not twice, f"the same limit defined in several modules: {twice}"


def test_the_scan_sees_expressions_and_names():
    tree = ast.parse("A = 2 ** 31 - 1\ndef f(x):\n    return x < 16 << 20\n")
    assert sorted(v for v, _ in _outermost_numbers(tree)) == [16 << 20, 2 ** 31 - 1]
    assert _number(ast.parse("-(2 ** 63)", mode="eval").body) == -(2 ** 63)
    assert _number(ast.parse("INT_MAX", mode="eval").body) is None
