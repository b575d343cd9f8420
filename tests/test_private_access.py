"""No module reaches into another's private attributes: in engine/ and kernels_bridge/, `x._name`
(x not self or cls) is allowed only when `_name` is defined in the same module (a method, a class
attribute, `self._name = ...`, or a module-level name), so a class's private state is read only by
its own module, and other modules go through a public accessor. Exceptions are listed with their
reasons."""
import ast
import os
import re

from tests.helpers import ROOT, python_files

PACKAGES = ("engine", "kernels_bridge")

# (module path, attribute) -> why it may be reached from outside its defining module. SGLang's
# privates are read only by the named adapters of engine/sglang/hook_targets.py, each with its
# releases and reason in its docstring (docs/design.md lists them; tests/test_design_claims.py
# holds the page to this table).
_HOOKS = "engine/sglang/hook_targets.py"
ALLOWED: dict[tuple[str, str], str] = {
    (_HOOKS, "_hooks"): "last_replace_hook: SGLang's HookRegistry keeps the registered hooks only there; the "
                        "plugin's guard checks that no other plugin's REPLACE hook overrides the policy's",
    (_HOOKS, "_DEEPSEEK_FAMILY_ARCHS"): "deepseek_family_archs: SGLang's own list of DSA architectures, so that "
                                        "the policy's model inputs follow the installed release",
    (_HOOKS, "_is_hip"): "hisparse_hook_is_hip: what 0.5.14-0.5.18's HiSparse check asks for ROCm",
    (_HOOKS, "_resolution_finished"): "resolution_finished: whether a 0.5.2x record is resolved",
    (_HOOKS, "_PLATFORM_PROBES"): "platform_fact_names: the platform facts override_platform accepts differ by "
                                  "release and are listed only there",
    (_HOOKS, "_PLATFORM_VALUES"): "platform_fact_names: the other half of the facts override_platform accepts",
    (_HOOKS, "_handle_model_specific_adjustments"): "handle_model_specific_adjustments: the conform driver runs "
                                                    "SGLang 0.5.11 to 0.5.18's own routing code, this method",
    (_HOOKS, "_quantization_explicitly_unset"): "post_init_effects: what 0.5.11-0.5.18's __post_init__ sets on "
                                                "`--quantization unquant`, which their routing reads",
    (_HOOKS, "_parse_cuda_graph_config"): "post_init_effects: the effect of 0.5.14-0.5.18's __post_init__ their "
                                          "routing reads (the CUDA graph flags parsed), as the release's own code",
    (_HOOKS, "_hisparse_validation"): "hisparse_validation: 0.5.15-0.5.18's HiSparse check, the pass "
                                      "check_server_args runs at its slot",
    (_HOOKS, "_resolved_overrides"): "begin_declarations, declarations_pending: 0.5.15 on, the stash where "
                                     "the passes declare",
    (_HOOKS, "_declarations_materialized"): "declarations_pending: whether the stash was written to the fields",
    ("engine/sglang/conform/startup.py", "_data"):
        "not SGLang's: CPython's os.environ keeps its raw mapping there, a cheap snapshot of the environment "
        "per conform case (os.environ itself when absent)",
}


def _defined(tree) -> set:
    """Every private name a module defines: functions, classes and methods, module and class
    attributes, attributes assigned on self or cls (self._x = ...; one assigned on another object
    is a reach into it), keyword fields of namedtuples."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _on_self(node):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).rsplit(".", 1)[-1])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if n.startswith("_")}


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def _private(name) -> bool:
    return isinstance(name, str) and name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


_BY_NAME = ("getattr", "hasattr", "setattr", "delattr")


def _touches(tree):
    """(line, how it reads, name, by_key) of each private name the module touches on another
    object: `x._name` (read or written), `getattr(x, "_name")` and its kin, and `x["_name"]` (a
    namespace read by key: `by_key`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _on_self(node):
            yield node.lineno, f"{ast.unparse(node.value)}.{node.attr}", node.attr, False
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BY_NAME
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and _private(node.args[1].value)
              and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls"))):
            yield node.lineno, ast.unparse(node), node.args[1].value, False
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and _private(node.slice.value):
            yield node.lineno, ast.unparse(node), node.slice.value, True


def reaches(source: str, rel: str = "<module>", project: frozenset = frozenset(), allowed=None) -> list[str]:
    """'path:line x._name' of each private name touched on something other than self/cls that the
    module does not define itself (by key: that no module of the packages defines, `project`),
    and not `allowed` (default ALLOWED)."""
    allowed = ALLOWED if allowed is None else allowed
    tree = ast.parse(source)
    own = _defined(tree)
    out = [f"{rel}:{line} {shown}" for line, shown, name, by_key in _touches(tree)
           if name not in own and not (by_key and name in project) and (rel, name) not in allowed]
    for node in ast.walk(tree):  # `from engine.x import _name`: the same reach, by import
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
            out += [f"{rel}:{node.lineno} from {node.module} import {a.name}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def _sources():
    for path in python_files(*PACKAGES):
        yield os.path.relpath(path, ROOT).replace(os.sep, "/"), open(path, encoding="utf-8").read()


def _project_names(sources: dict) -> frozenset:
    """The private names the packages define, in code or in the code they generate (`def _x(` in
    a string: the compiled probe's namespace)."""
    names = set()
    for text in sources.values():
        tree = ast.parse(text)
        names |= _defined(tree)
        names.update(m for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
                     for m in re.findall(r"\bdef (_\w+)\(", node.value))
    return frozenset(names)


def test_no_module_reads_another_modules_private_attributes():
    sources = dict(_sources())
    project = _project_names(sources)
    found = [line for rel, text in sources.items() for line in reaches(text, rel, project)]
    assert not found, "private attributes read across modules (add a public accessor):\n" + "\n".join(found)


def test_the_allowed_reaches_still_exist():
    """Each allowed reach is made where it is allowed: the scan, without the allowance, finds it."""
    sources = dict(_sources())
    project = _project_names(sources)
    for (rel, name), reason in ALLOWED.items():
        bare = {k: v for k, v in ALLOWED.items() if k != (rel, name)}
        assert reason and any(line.endswith(name) or f"'{name}'" in line or f'"{name}"' in line
                              for line in reaches(sources[rel], rel, project, bare)), \
            f"{rel}: {name} is allowed but not used"


def test_sglangs_privates_are_read_only_in_hook_targets():
    assert {rel for rel, name in ALLOWED if name != "_data"} == {_HOOKS}


def test_the_scan_sees_a_reach():
    text = ("class A:\n    def __init__(self):\n        self._own = 1\n\n    def f(self, other):\n"
            "        return other._own + self._own\n\n\ndef g(decision):\n    return decision._values\n\n\n"
            "from engine.policy.loader import _display_dir\n")
    assert reaches(text) == ["<module>:10 decision._values",
                             "<module>:13 from engine.policy.loader import _display_dir"]


def test_the_scan_sees_a_reach_by_name_by_key_and_by_writing():
    text = ("def f(sa, g):\n    sa._stash = []\n    getattr(sa, '_done', False)\n"
            "    return g['_ARCHS'], g['_probe']\n")
    assert reaches(text, project=frozenset({"_probe"})) == [
        "<module>:2 sa._stash", "<module>:3 getattr(sa, '_done', False)", "<module>:4 g['_ARCHS']"]
