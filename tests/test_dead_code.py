"""No dead code in the packages: every top-level function, class and constant defined in engine/ or
kernels_bridge/ is referenced somewhere (its own module, another module, bench/, tools/, tests/, or
the console script in pyproject.toml), by a name, an attribute or an import. A name counts as
referenced only outside its own definition (recursion does not keep a function alive). Public API
that only documentation names is allowed below, each with its reason."""
import ast
import os
import re

from tests.helpers import ROOT, python_files

PACKAGES = ("engine", "kernels_bridge")
CORPUS = ("engine", "kernels_bridge", "bench", "tools", "tests")

# name -> why it stays although no code references it
ALLOWED: dict[str, str] = {
}


def _files(folders):
    return python_files(*folders, root=ROOT)  # ROOT read at call time: the self-test moves it


def _definitions(tree):
    """(name, node) of each top-level function, class and constant (NAME = ...) of a module."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name) and name.id.isupper():
                        yield name.id, node


def _references(tree):
    """Every name a module refers to, each with the top-level definition it occurs in (None at
    module level)."""
    for top in tree.body:
        owner = top.name if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
        for node in ast.walk(top):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store):
                yield node.id, owner
            elif isinstance(node, ast.Attribute):
                yield node.attr, owner
            elif isinstance(node, ast.alias):
                yield node.name.rsplit(".", 1)[-1], owner


def _module(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _imported(tree) -> set:
    """The modules a file imports (`from a.b import c` imports a.b and, c being maybe a module,
    a.b.c)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def unreferenced() -> list[str]:
    """'path:line name' of every definition in PACKAGES that nothing references. A private name
    (_name) counts as referenced only from its own module or a file that imports that module."""
    used: dict[str, set] = {}  # name -> {(path, owner)}
    trees, imports = {}, {}
    for path in _files(CORPUS):
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        trees[path], imports[path] = tree, _imported(tree)
        for name, owner in _references(tree):
            used.setdefault(name, set()).add((path, owner))
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as fh:
        for name in re.findall(r'^\w[\w-]* = "[\w.]+:(\w+)"', fh.read(), re.M):
            used.setdefault(name, set()).add(("pyproject.toml", None))
    dead = []
    for path in _files(PACKAGES):
        for name, node in _definitions(trees[path]):
            if name.startswith("__") and name.endswith("__"):
                continue  # the interpreter's names (__getattr__, __all__)
            uses = {(p, o) for p, o in used.get(name, ()) if not (p == path and o == name)
                    and (not name.startswith("_") or p == path or _module(path) in imports.get(p, ()))}
            if not uses and name not in ALLOWED:
                dead.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {name}")
    return dead


def test_every_definition_is_referenced():
    assert not unreferenced(), "dead code (remove it, or allow it with a reason):\n" + "\n".join(unreferenced())


def test_the_allowed_names_exist_and_are_documented():
    defined = {name for path in _files(PACKAGES)
               for name, _ in _definitions(ast.parse(open(path, encoding="utf-8").read()))}
    docs = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    for folder, _, files in os.walk(os.path.join(ROOT, "docs")):
        docs += "".join(open(os.path.join(folder, f), encoding="utf-8").read() for f in files if f.endswith(".md"))
    for name, reason in ALLOWED.items():
        assert name in defined, f"{name} is allowed but no longer defined"
        assert name in docs and reason, f"{name} is allowed as documented API but the docs do not name it"


def test_the_scan_finds_a_dead_function(tmp_path, monkeypatch):
    """The scan reports an unreferenced function and a self-recursive one, and not a used one."""
    import tests.test_dead_code as scan

    pkg = tmp_path / "engine"
    pkg.mkdir()
    (pkg / "m.py").write_text("def used():\n    return 1\n\n\ndef dead():\n    return used()\n\n\n"
                              "def loop(n):\n    return loop(n - 1)\n\n\nLIMIT = 3\n\n\n"
                              "def _private():\n    pass\n")
    # another module's _private, used there, does not keep this one alive; an importer's does
    (pkg / "other.py").write_text("def _private():\n    pass\n\n\n_private()\n")
    monkeypatch.setattr(scan, "ROOT", str(tmp_path))
    monkeypatch.setattr(scan, "PACKAGES", ("engine",))
    monkeypatch.setattr(scan, "CORPUS", ("engine",))
    (tmp_path / "pyproject.toml").write_text("")
    assert sorted(line.split()[1] for line in scan.unreferenced()) == ["LIMIT", "_private", "dead", "loop"]
    (pkg / "user.py").write_text("import engine.m\n\nengine.m._private()\n")
    assert sorted(line.split()[1] for line in scan.unreferenced()) == ["LIMIT", "dead", "loop"]
