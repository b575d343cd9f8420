"""What docs/design.md says of the structure, checked against the code: the exception classes
outside each package's root, the reads of SGLang's privates allowed and the adapters that make
them, and where each named constant is defined. Each list is parsed from the page, so that the
page and the code cannot drift apart."""
import ast
import inspect
import os
import re

import pytest

from tests.helpers import ROOT, python_files
from tests.test_error_hierarchy import PACKAGES as ROOTS
from tests.test_error_hierarchy import _exception_classes, _modules, _root
from tests.test_private_access import ALLOWED, _touches

DESIGN = open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8").read()
HOOK_TARGETS = "engine/sglang/hook_targets.py"
WORDS = {0: "none", 1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}


def _bullet(title: str) -> str:
    """The text of the design page's bullet that starts with **title**."""
    m = re.search(r"^- \*\*" + re.escape(title) + r"\*\*:(.*?)(?=^- |^## )", DESIGN, re.S | re.M)
    assert m, f"design.md has no bullet **{title}**"
    return " ".join(m.group(1).split())


def _test_bullet(path: str) -> str:
    """The text of the design page's bullet on the test file `path`."""
    m = re.search(r"^- `" + re.escape(path) + r"`:(.*?)(?=^- |^## )", DESIGN, re.S | re.M)
    assert m, f"design.md has no bullet on {path}"
    return " ".join(m.group(1).split())


# -- the exception roots ----------------------------------------------------------------------------

def named_outside_root(text: str) -> set:
    """The classes the Errors bullet names as outside engine's root: each written `path.py` `Name`."""
    return {f"{path[:-3].replace('/', '.')}.{name}"
            for path, name in re.findall(r"`((?:engine|kernels_bridge)/[\w/]+\.py)` `(\w+)`", text)}


def outside_root(package: str) -> set:
    """Every exception class of `package`'s modules (imported, each one walked) that does not derive
    from its root."""
    root = _root(ROOTS[package])
    return {f"{module.__name__}.{cls.__qualname__}" for module in _modules(package)
            for cls in _exception_classes(module) if not issubclass(cls, root)}


def test_the_exception_classes_outside_engines_root_are_the_ones_named():
    text = _bullet("Errors")
    named = named_outside_root(text.split("Every one of `kernels_bridge`")[0])
    found = outside_root("engine")
    assert found == named, f"outside EngineError: the code has {sorted(found)}, design.md names {sorted(named)}"
    assert f"but {WORDS[len(found)]}," in text  # the count the page gives in words


def test_no_exception_class_of_the_bridge_is_outside_its_root():
    text = _bullet("Errors")
    assert "Every one of `kernels_bridge` derives from `kernels_bridge.errors.BridgeError`" in text
    assert outside_root("kernels_bridge") == set()


def test_the_class_list_is_read_from_the_page():
    """The parser finds the classes the bullet names, and only those: it could fail."""
    text = ("every exception class derives from `engine.errors.EngineError`, but two: `engine/a/b.py` `Oops`, "
            "a SystemExit, and `engine/c.py` `_Alarm` (a `BaseException`)")
    assert named_outside_root(text) == {"engine.a.b.Oops", "engine.c._Alarm"}
    assert len(named_outside_root(_bullet("Errors"))) >= 2


# -- SGLang's privates ------------------------------------------------------------------------------

def listed_adapters(text: str) -> dict:
    """adapter -> the private names the page says it reads: each written `adapter` (`_a`, `_b`...)."""
    return {name: set(re.findall(r"`(_\w+)`", inside)) for name, inside in re.findall(r"`(\w+)` \(([^()]*)\)", text)
            if not name.startswith("_")}


def adapters_in_code() -> dict:
    """Every top-level function of hook_targets.py that touches a private name on another object ->
    the names it touches."""
    tree = ast.parse(open(os.path.join(ROOT, HOOK_TARGETS), encoding="utf-8").read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            names = {name for _, _, name, _ in _touches(node)}
            if names:
                out[node.name] = names
    return out


def test_the_private_reads_allowed_are_the_ones_listed():
    text = _test_bullet("tests/test_private_access.py")
    listed = set(re.findall(r"`(_\w+)`", text)) - {"_name"}  # the page's own `x._name` pattern
    assert listed == {name for _, name in ALLOWED}


def test_the_adapters_listed_are_those_of_hook_targets_and_read_what_is_said():
    listed = listed_adapters(_test_bullet("tests/test_private_access.py"))
    assert listed == adapters_in_code()
    assert {name for names in listed.values() for name in names} == {n for rel, n in ALLOWED if rel == HOOK_TARGETS}


def test_the_adapter_list_is_read_from_the_page():
    text = "through: `alpha` (`_a`: why), `beta` (`_b`, `_c`) and `x._name` (`_skip`)"
    assert listed_adapters(text) == {"alpha": {"_a"}, "beta": {"_b", "_c"}}


def test_every_adapter_says_why():
    from engine.sglang import hook_targets

    for name in adapters_in_code():
        doc = inspect.getdoc(getattr(hook_targets, name)) or ""
        assert re.search(r"0\.5\.\d+", doc) and len(doc) > 80, f"hook_targets.{name}: which releases, and why?"


# -- the constants ----------------------------------------------------------------------------------

def _defined_at_top(tree) -> set:
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                out.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return out


def _definitions() -> dict:
    """path -> the names each module of the project's code (not its tests: their oracles are
    independent on purpose) defines at its top level."""
    return {os.path.relpath(path, ROOT).replace(os.sep, "/"):
            _defined_at_top(ast.parse(open(path, encoding="utf-8").read()))
            for path in python_files("engine", "kernels_bridge", "bench", "tools")}


def page_constants(text: str) -> dict:
    """name -> the one module the Limits bullet says defines it (clauses naming several files name
    no constant of their own)."""
    out = {}
    for clause in text.split(";"):
        paths = re.findall(r"`((?:engine|kernels_bridge)/[\w/]+\.py)`", clause)
        if len(paths) == 1:
            out.update((name, paths[0]) for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", clause))
    return out


def test_every_limit_is_defined_where_the_page_says_and_nowhere_else():
    where = page_constants(_bullet("Limits"))
    assert len(where) >= 10 and where["FP8_ROW_BYTES"] == "kernels_bridge/layout.py"
    definitions = _definitions()
    for name, path in where.items():
        assert name in definitions[path], f"design.md says {name} is defined in {path}"
        others = sorted(p for p, names in definitions.items() if name in names and p != path)
        assert not others, f"{name} is defined in {path}, as design.md says, but also in {others}"


@pytest.mark.parametrize("clause, expected", [
    ("the bound `X_MAX` in `engine/a.py`", {"X_MAX": "engine/a.py"}),
    ("the limits in `engine/a.py` and `engine/b.py`", {}),
])
def test_the_constant_list_is_read_from_the_page(clause, expected):
    assert page_constants(clause) == expected
