"""Imports run one way: every import of engine/, kernels_bridge/, bench/ and tools/ (module level,
function-local, `importlib.import_module("name")`, and a string naming a project module, which is
how a table of drivers is imported) goes from a layer to one below it or within it, never up, and
no modules import each other in a cycle. Tests may import anything except bench/ (they may run a
bench command as a process, an end-to-end check of a documented command); nothing imports tests.
No Python of the repository changes sys.path: packages are imported as installed (`pip install
-e .`), child processes get PYTHONPATH in their environment. (A module name built at run time, as
in kernels_bridge's lazy exports, is not followed: those stay inside their own package.)

The checker is plain functions over {module: source}, tested on a small synthetic tree below so
that a pass on the real tree means something."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The layers, lowest first: (modules and packages, why the layer sits there). A module imports
# only from its own layer and the ones below. "engine" is the package's own __init__ (the public
# facade) and nothing else; every other module must fall in a listed package.
LAYERS = [
    (("engine.errors", "engine.values", "engine.suggest", "engine.version", "engine.progress",
      "engine.sglang.registry"),
     "base: problems and error types, value parsing and display, did-you-mean, the version, the progress "
     "line, and SGLang's release registry (data and one release parser, the standard library only: the "
     "policy files' release references, the plugin, conform and the model reader all read it)"),
    (("engine.files",), "reading files and streams safely, where the shipped policy files lie, which file a "
                        "reference names, a document's shape against a shipped JSON Schema"),
    (("engine.language",), "what a policy document means: inputs, rules, conditions, parts, compiled evaluator"),
    (("engine.policy",), "a loaded policy: loading, caching, evaluating"),
    (("engine.explain",), "policies and evaluations in words: conditions, capabilities, trace events as steps"),
    (("engine.analysis",), "whole-domain analyses of loaded policies: diff, table, lint, policy tests"),
    (("engine.sglang",), "SGLang's side: launch commands, config files, models, ServerArgs, conform (uses analysis)"),
    (("engine.serving",), "long-running use: the reloading store and decision records (reads SGLang sources)"),
    (("engine.cli",), "the engine's hisparse commands: parse, run, print; offers a registry for more"),
    (("engine",), "the public facade (load_policy, evaluate, ...): for users, never for engine's own modules"),
    (("kernels_bridge",), "torch: runs the backend the engine chose; adds attend and doctor to hisparse"),
    (("bench", "tools"), "measurements and maintenance scripts over the shipped packages"),
]
LAYERED = ("engine", "kernels_bridge", "bench", "tools")  # the folders the layers cover
TESTS = "tests"
FACADE = "engine"
# skipped when scanning the repository: environments, build output, git's own files
SKIP_DIRS = {".git", "build", "dist", "__pycache__", "node_modules"}


# -- the checker --------------------------------------------------------------------------------

def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def python_files(root: Path):
    """Every .py file of the repository, outside hidden folders (.venv, .git) and build output."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(p in SKIP_DIRS or p.startswith(".") or p.endswith(".egg-info") for p in rel[:-1]):
            continue
        yield path


def known_target(name: str, modules) -> str | None:
    """The project module an import of `name` loads: the longest prefix that is one."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(module: str, source: str, modules, is_package: bool = False, names_count: bool = True):
    """[(target module, line)] for every import in `source` of a module in `modules`: import
    statements anywhere (function bodies too), relative ones resolved, `import_module("x")` /
    `__import__("x")` with a literal, and, with `names_count`, any string that is exactly a
    project module's dotted name (a module imported by name from a table)."""
    found = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                start = ".".join(base + ([node.module] if node.module else []))
            else:
                start = node.module
            names = [f"{start}.{a.name}" if f"{start}.{a.name}" in modules else start for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        elif (names_count and isinstance(node, ast.Constant) and isinstance(node.value, str)
              and "." in node.value and node.value in modules):
            names = [node.value]
        for name in names:
            target = known_target(name, modules)
            if target is not None and target != module:
                found.add((target, node.lineno))
    return sorted(found)


def graph_of(sources: dict, packages=frozenset(), names_count=lambda module: True) -> dict:
    """module -> [(target, line)] for {module: source}; `packages`: the modules that are a
    package's __init__ (relative imports start there)."""
    modules = set(sources)
    return {m: imports_of(m, src, modules, m in packages, names_count(m)) for m, src in sources.items()}


def layer_of(module: str, layers=LAYERS, facade=FACADE) -> int | None:
    best, best_len = None, -1
    for i, (names, _) in enumerate(layers):
        for name in names:
            exact_only = name == facade
            if module == name or (not exact_only and module.startswith(name + ".")):
                if len(name) > best_len:
                    best, best_len = i, len(name)
    return best


def cycles(graph: dict) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one module (Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w, _ in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _top(module: str) -> str:
    return module.split(".")[0]


def layer_problems(graph: dict, layers=LAYERS, facade=FACADE, layered=LAYERED, tests=TESTS) -> list[str]:
    """Every import that breaks the rules, as `module:line -> target: why`."""
    problems = []
    for module, targets in sorted(graph.items()):
        top = _top(module)
        if top in layered and layer_of(module, layers, facade) is None:
            problems.append(f"{module}: in no layer (add it to LAYERS)")
            continue
        for target, line in targets:
            where = f"{module}:{line} -> {target}"
            if top == tests:
                if _top(target) == "bench":
                    problems.append(f"{where}: tests never import bench (the bench is not the product)")
                continue
            if top not in layered:
                continue
            if _top(target) == tests:
                problems.append(f"{where}: only tests import tests")
                continue
            if top == "engine" and _top(target) == "kernels_bridge":
                problems.append(f"{where}: engine never imports kernels_bridge, not even lazily")
                continue
            here, there = layer_of(module, layers, facade), layer_of(target, layers, facade)
            if there is not None and there > here:
                problems.append(f"{where}: an upward import ({layers[here][0][0]} is below "
                                f"{layers[there][0][0]})")
    return problems


# sys.path changed by any means: a method that changes it, an item or the whole list assigned,
# its name imported from sys, pytest's prepending helper, site's addsitedir
SYS_PATH = re.compile(r"\bsys\.path\s*(?:\.\s*(?:insert|append|extend|remove|pop|clear)\s*\(|\[[^\]]*\]\s*=(?!=)"
                      r"|\+?=(?!=))|\bfrom\s+sys\s+import\s+(?:\(\s*)?(?:\w+\s*,\s*)*path\b|\bsyspath_prepend\b"
                      r"|\bsite\.addsitedir\b")


def sys_path_changes(source: str) -> list[int]:
    """The lines of `source` that change sys.path, in code or in a script held in a string."""
    return sorted({source.count("\n", 0, m.start()) + 1 for m in SYS_PATH.finditer(source)})


# -- the repository -----------------------------------------------------------------------------

def _repository():
    sources, packages = {}, set()
    for path in python_files(ROOT):
        if _top(module_name(path, ROOT)) in LAYERED + (TESTS,):
            name = module_name(path, ROOT)
            sources[name] = path.read_text(encoding="utf-8")
            if path.name == "__init__.py":
                packages.add(name)
    # a string naming a module counts in the layered code; tests may name one to run it
    return graph_of(sources, packages, names_count=lambda m: _top(m) != TESTS)


@pytest.fixture(scope="module")
def repository():
    return _repository()


def test_every_layered_module_is_found_and_in_a_layer(repository):
    for package in ("engine.cli", "engine.policy.loader", "kernels_bridge.dispatch", "bench.common"):
        assert package in repository
    assert [m for m in repository if _top(m) in LAYERED and layer_of(m) is None] == []


def test_no_import_cycles(repository):
    found = cycles(repository)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_imports_go_down_the_layers(repository):
    found = layer_problems(repository)
    assert not found, "\n".join(found)


def test_engine_never_names_kernels_bridge(repository):
    found = [f"{m}:{line} -> {t}" for m, ts in repository.items() if _top(m) == "engine"
             for t, line in ts if _top(t) == "kernels_bridge"]
    assert not found, "\n".join(found)


def test_no_python_of_the_repository_changes_sys_path():
    found = [f"{path.relative_to(ROOT)}:{line}" for path in python_files(ROOT)
             for line in sys_path_changes(path.read_text(encoding="utf-8"))]
    assert not found, "sys.path changed at:\n" + "\n".join(found)


# -- the checker on a small synthetic tree: it finds what it must -------------------------------

SYNTHETIC_LAYERS = [(("app.base",), "bottom"), (("app.core",), "middle"), (("app",), "facade"),
                    (("bridge",), "top")]


def _synthetic(sources: dict):
    return graph_of(sources, packages={"app", "app.core"})


def test_checker_finds_a_cycle_through_a_lazy_import():
    graph = _synthetic({
        "app.core": "", "app.core.a": "from app.core.b import x\n",
        "app.core.b": "def f():\n    from app.core import a\n    return a\n",
        "app.core.c": "import app.core.a\n",
    })
    assert cycles(graph) == [["app.core.a", "app.core.b"]]


def test_checker_finds_upward_imports_of_every_form():
    graph = _synthetic({
        "app": "", "app.core": "", "app.base": "",
        "app.base.low": ("import importlib\n"
                         "def f():\n    import app.core.mid\n"             # lazy, upward
                         "def g():\n    return importlib.import_module('app.core.mid')\n"
                         "DRIVERS = {'x': 'app.core.mid'}\n"),             # a module by name
        "app.core.mid": "from ..base import low\nfrom . import other\n",  # relative, downward
        "app.core.other": "from app import thing\n",                      # the facade, upward
    })
    lines = {(m, t, line) for m, ts in graph.items() for t, line in ts}
    assert ("app.core.mid", "app.base.low", 1) in lines and ("app.core.mid", "app.core.other", 2) in lines
    problems = layer_problems(graph, SYNTHETIC_LAYERS, facade="app", layered=("app", "bridge"))
    assert problems == [
        "app.base.low:3 -> app.core.mid: an upward import (app.base is below app.core)",
        "app.base.low:5 -> app.core.mid: an upward import (app.base is below app.core)",
        "app.base.low:6 -> app.core.mid: an upward import (app.base is below app.core)",
        "app.core.other:1 -> app: an upward import (app.core is below app)",
    ]


def test_checker_rules_for_tests_bench_and_the_bridge():
    layers = [(("engine.x",), "engine"), (("kernels_bridge",), "bridge"), (("bench",), "bench")]
    graph = graph_of({
        "engine.x": "def f():\n    import kernels_bridge\n", "engine.y": "",
        "kernels_bridge": "import tests.helpers\n", "bench.run": "import kernels_bridge\n",
        "tests.helpers": "", "tests.test_a": "from bench import run\nimport kernels_bridge\n",
    }, packages={"kernels_bridge"})
    problems = layer_problems(graph, layers, facade="", layered=("engine", "kernels_bridge", "bench"))
    assert problems == [
        "engine.x:2 -> kernels_bridge: engine never imports kernels_bridge, not even lazily",
        "engine.y: in no layer (add it to LAYERS)",
        "kernels_bridge:1 -> tests.helpers: only tests import tests",
        "tests.test_a:1 -> bench.run: tests never import bench (the bench is not the product)",
    ]


def test_checker_finds_sys_path_changes_in_code_and_in_scripts():
    path = "sys" + ".path"  # split, so that this file is not itself one of the cases
    source = "\n".join([
        "import sys",
        f"{path}.insert(0, 'x')",
        f"x = {path}[0]",                               # reading it is fine
        f"SCRIPT = '''\nimport sys; {path}.append(r)\n'''",
        f"{path}[:] = []",
        f"{path} = ['a']",
        f"if {path} == []: pass",
        "from sys import argv, " + "path",
        "monkeypatch.sys" + "path_prepend('x')",
    ])
    assert sys_path_changes(source) == [2, 5, 7, 8, 10, 11]
