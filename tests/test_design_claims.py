"""What docs/design.md says of the structure, checked against the code: the exception classes
outside each package's root, the reads of SGLang's privates allowed, and where each named
constant is defined."""
import ast
import os
import re

from tests.helpers import ROOT
from tests.test_error_hierarchy import OUTSIDE_ROOT
from tests.test_private_access import ALLOWED

DESIGN = open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8").read()


def _bullet(title: str) -> str:
    """The text of the design page's bullet that starts with **title**."""
    m = re.search(r"^- \*\*" + re.escape(title) + r"\*\*:(.*?)(?=^- |^## )", DESIGN, re.S | re.M)
    assert m, f"design.md has no bullet **{title}**"
    return " ".join(m.group(1).split())


def test_the_exception_classes_outside_the_root_are_the_ones_named():
    text = _bullet("Errors")
    words = {"1": "one", "2": "two", "3": "three"}
    assert f"but {words[str(len(OUTSIDE_ROOT))]}," in text
    for dotted in OUTSIDE_ROOT:
        module, name = dotted.rsplit(".", 1)
        assert f"`{module.replace('.', '/')}.py` `{name}`" in text, dotted


def test_the_private_reads_allowed_are_the_ones_listed():
    m = re.search(r"^- `tests/test_private_access.py`:(.*?)(?=^- )", DESIGN, re.S | re.M)
    text = " ".join(m.group(1).split())
    listed = set(re.findall(r"`(_\w+)`", text)) - {"_name"}  # the page's own `x._name` pattern
    assert listed == {name for _, name in ALLOWED}


def _defined_at_top(path: str) -> set:
    tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read())
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                out.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return out


def test_every_limit_is_defined_where_the_page_says():
    clauses = _bullet("Limits").split(";")
    checked = 0
    for clause in clauses:
        paths = re.findall(r"`((?:engine|kernels_bridge)/[\w/]+\.py)`", clause)
        names = [n for n in re.findall(r"`([A-Z][A-Z0-9_]+)`", clause)]
        if len(paths) != 1:
            continue  # a clause naming several files names no constant of its own
        defined = _defined_at_top(paths[0])
        for name in names:
            assert name in defined, f"design.md says {name} is defined in {paths[0]}"
            checked += 1
    assert checked >= 10
