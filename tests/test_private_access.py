"""No module reaches into another's private attributes: in engine/ and kernels_bridge/, `x._name`
(x not self or cls) is allowed only when `_name` is defined in the same module (a method, a class
attribute, `self._name = ...`, or a module-level name), so a class's private state is read only by
its own module, and other modules go through a public accessor. Exceptions are listed with their
reasons."""
import ast
import os

from tests.helpers import ROOT, python_files

PACKAGES = ("engine", "kernels_bridge")

# (module path, attribute) -> why it may be reached from outside its defining module
ALLOWED: dict[tuple[str, str], str] = {
    ("engine/sglang/conform/machine.py", "_PLATFORM_PROBES"):
        "the platform facts SGLang's override_platform accepts differ by release and are listed only "
        "there; the conform driver offers each release exactly the facts it knows",
    ("engine/sglang/conform/machine.py", "_PLATFORM_VALUES"):
        "as _PLATFORM_PROBES: the other half of the facts override_platform accepts",
    ("engine/sglang/resolution.py", "_DEEPSEEK_FAMILY_ARCHS"):
        "SGLang's own list of DSA architectures, read from its module so that the policy's model "
        "inputs follow the installed release",
    ("engine/serving/sglang_plugin.py", "_patched"):
        "SGLang's HookRegistry keeps the targets it applied hooks to only there; the plugin's guard "
        "reads it so that a hook SGLang failed to apply stops the launch",
    ("engine/serving/sglang_plugin.py", "_hooks"):
        "SGLang's HookRegistry keeps the registered hooks only there; the guard checks that no other "
        "plugin's REPLACE hook overrides the policy's",
    ("engine/sglang/conform/prepipeline.py", "_handle_model_specific_adjustments"):
        "the conform driver runs SGLang 0.5.11 to 0.5.18's own routing code, which is this method "
        "(0.5.15-0.5.18: it runs their DSA passes)",
    ("engine/sglang/conform/startup.py", "_parse_cuda_graph_config"):
        "the effect of SGLang 0.5.14-0.5.18's __post_init__ that their routing reads (the CUDA graph "
        "flags parsed), run as the release's own code",
    ("engine/sglang/conform/transitional.py", "_hisparse_validation"):
        "SGLang 0.5.15-0.5.18's HiSparse check, the pass check_server_args runs at its slot",
}


def _defined(tree) -> set:
    """Every private name a module defines: functions, classes and methods, module and class
    attributes, attributes assigned on any object (self._x = ...), keyword fields of namedtuples."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).rsplit(".", 1)[-1])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if n.startswith("_")}


def reaches(source: str, rel: str = "<module>") -> list[str]:
    """'path:line x._name' of each private attribute read on something other than self/cls that the
    module does not define itself."""
    tree = ast.parse(source)
    own = _defined(tree)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if name in own or (rel, name) in ALLOWED:
            continue
        out.append(f"{rel}:{node.lineno} {ast.unparse(node.value)}.{name}")
    for node in ast.walk(tree):  # `from engine.x import _name`: the same reach, by import
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
            out += [f"{rel}:{node.lineno} from {node.module} import {a.name}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def _sources():
    for path in python_files(*PACKAGES):
        yield os.path.relpath(path, ROOT).replace(os.sep, "/"), open(path, encoding="utf-8").read()


def test_no_module_reads_another_modules_private_attributes():
    found = [line for rel, text in _sources() for line in reaches(text, rel)]
    assert not found, "private attributes read across modules (add a public accessor):\n" + "\n".join(found)


def test_the_allowed_reaches_still_exist():
    sources = dict(_sources())
    for (rel, name), reason in ALLOWED.items():
        assert reason and f"._{name.lstrip('_')}" in sources[rel], f"{rel}: {name} is allowed but not used"


def test_the_scan_sees_a_reach():
    text = ("class A:\n    def __init__(self):\n        self._own = 1\n\n    def f(self, other):\n"
            "        return other._own + self._own\n\n\ndef g(decision):\n    return decision._values\n\n\n"
            "from engine.policy.loader import _display_dir\n")
    assert reaches(text) == ["<module>:10 decision._values",
                             "<module>:13 from engine.policy.loader import _display_dir"]
