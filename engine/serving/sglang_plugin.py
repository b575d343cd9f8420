"""hisparse-router as an SGLang plugin: `register()` is the entry point `hisparse_router` of group
`sglang.srt.plugins` (pyproject.toml), which SGLang's `load_plugins()` runs in every process it
starts, before the server arguments are prepared.

Without HISPARSE_POLICY it returns at once and changes nothing. With it (any policy reference the
CLI takes; HISPARSE_POLICY_DIR as --policy-dir; a release or a folder names one version per
family), each policy replaces the routing of the model classes it routes: the DSA family SGLang's
DSA routing passes and HiSparse backend check (engine/sglang/routing_hooks.py), the DeepSeek-V4
family its V4 KV-dtype pass and auto attention backend (engine/sglang/dsv4_hooks.py), the
MiniMax-M3 family the MiniMax-M3 provider of SGLang's model-override registry, in that registry
too (engine/sglang/m3_hooks.py), at the targets of engine/sglang/hook_targets.py, through SGLang's
HookRegistry. HISPARSE_RECORD=FILE appends each
decision to FILE in the --record format (engine/serving/records.py).

It fails loudly: `load_plugins()` logs and ignores a plugin's exceptions, so a problem here
(a policy that does not load, a record file that cannot be written: exit 2; an SGLang release
whose routing this does not know (before 0.5.11), or a hook target it lacks or holds in another
shape: exit 1) prints one line on stderr and raises SystemExit, which stops the launch. A hook SGLang failed to apply stops the launch at
the guard, a BEFORE hook on the resolution entry point, with RuntimeError naming the target."""
from __future__ import annotations

import os
import sys

from engine.errors import EngineError


def register() -> None:
    """SGLang's plugin entry point."""
    if "HISPARSE_POLICY" not in os.environ:
        return
    policies, shown_as = _load_policies()
    record = _record_file()
    release = installed_release()
    on_decision = None
    if record is not None:
        from engine.serving.records import append_records

        def on_decision(decision, given):
            append_records(record, [decision], [given])
    for policy in policies:
        if "dsa" in policy.models:
            _register_dsa(policy, shown_as, on_decision, release)
        if "dsv4" in policy.models:
            _register_dsv4(policy, shown_as, on_decision, release)
        if "minimax_m3" in policy.models:
            _register_m3(policy, shown_as, on_decision, release)


def _register_dsa(policy, shown_as, on_decision, release) -> None:
    from engine.sglang.hook_targets import DTYPE_METHOD, family_of
    from engine.sglang.routing_hooks import PolicyRouting

    family = family_of(release)
    if family is None:
        _stop(1, f"SGLang {release} is not a release whose DSA routing hisparse-router knows (0.5.11 and later)")
    originals = _originals(family, release)
    # before 0.5.15 the hooks run only where SGLang's own gate found a DSA model (the methods in its
    # DSA branch, the inline check after its model assert)
    env = {"dsa_model": True} if DTYPE_METHOD in family.replace.values() else {}
    routing = PolicyRouting(policy, shown_as, on_decision, env, family.reads)
    _register(family, routing, originals, release)


def _register_dsv4(policy, shown_as, on_decision, release) -> None:
    """DeepSeek-V4: the functions of the release's V4 family (hook_targets.CLASS_FAMILIES), the
    launch held against the release's own shipped version of the family (dsv4_hooks)."""
    from engine.sglang.dsv4_hooks import V4Routing

    family, shipped = _class_family(policy, release, "dsv4", "DeepSeek-V4", "0.5.12", "dsv4-backends")
    originals = _originals(family, release)
    routing = V4Routing(policy, shipped, release, family.parts, shown_as, on_decision, family.reads)
    if not family.replace:  # nothing replaced there: the launch is checked before SGLang's V4 step
        import logging

        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        step = originals[family.guard]
        HookRegistry.register(family.guard, routing.check_only(step, logging.getLogger(step.__module__)),
                              HookType.BEFORE)
        return
    _register(family, routing, originals, release)


def _class_family(policy, release, model_class, label, since, shipped_family):
    """(the functions of a model class the plugin replaces in the release, the release's own
    shipped version of that class's family, which the launch is held against); stops the launch
    where either is missing."""
    from engine.errors import HisparseError
    from engine.files.shipped import shipped_policy_dir
    from engine.sglang.hook_targets import class_family_of
    from engine.sglang.policy_sets import load_policy_set

    family = class_family_of(model_class, release)
    if family is None:
        _stop(1, f"SGLang {release} has no {label} routing hisparse-router knows ({since} and later), "
                 f"but {policy.ref} routes {label}")
    try:
        shipped = load_policy_set(f"sglang=={release}", shipped_policy_dir()).for_class(model_class)
    except HisparseError:
        shipped = None
    if shipped is None:
        _stop(1, f"no shipped {shipped_family} version models SGLang {release}: the plugin cannot hold "
                 f"{policy.ref}'s {label} decisions against that release's own code")
    return family, shipped


def _register_m3(policy, shown_as, on_decision, release) -> None:
    """MiniMax-M3: the provider SGLang registers for the MiniMax-M3 architectures in its
    model-override registry (hook_targets.CLASS_FAMILIES), replaced in the registry and in its
    module, the launch held against the release's own shipped version of the family (m3_hooks)."""
    from engine.sglang.m3_hooks import M3Routing

    family, shipped = _class_family(policy, release, "minimax_m3", "MiniMax-M3", "0.5.21", "minimax-m3-backends")
    originals = _originals(family, release)
    entries = _registry_entries(family, originals, release)
    routing = M3Routing(policy, shipped, release, shown_as, on_decision, family.reads)
    _register(family, routing, originals, release)
    _replace_registered(family, entries, release)


def _registry_entries(family, originals, release) -> list:
    """(registry list, index, target) of each place SGLang's registry holds a replaced function,
    or the launch stops naming the function, the registry and the release."""
    entries = []
    for target, where in family.registered.items():
        try:
            registry = _resolve(where.registry)
        except SGLangImportFailed as failed:
            _stop(1, failed.explain(release))
        except (ImportError, AttributeError, ValueError) as exc:
            _stop(1, f"SGLang {release} has no {where.registry} ({type(exc).__name__}: {exc}), where it "
                     f"registers {target}: the policy cannot replace its routing there")
        for key in where.keys:
            found = [i for i, fn in enumerate(registry.get(key, ()) if isinstance(registry, dict) else ())
                     if _unwrapped(fn) is _unwrapped(originals[target])]
            if len(found) != 1:
                _stop(1, f"SGLang {release}'s {where.registry} does not hold {target} for {key} "
                         f"(found it {len(found)} times): the policy cannot replace its routing there")
            entries.append((registry[key], found[0], target, key))
    return entries


def _unwrapped(fn):
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def _replace_registered(family, entries, release) -> None:
    """In each registry place, an entry that calls the module's function (the replacement once
    SGLang applied the hooks), with the original's name, so SGLang's declarations keep their
    source; a BEFORE hook on the resolution entry point stops the launch if an entry is not it."""
    import importlib

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    placed = []
    for fns, index, target, key in entries:
        module_name, _, name = target.rpartition(".")
        module = importlib.import_module(module_name)
        original = fns[index]

        def entry(*args, _module=module, _name=name, **kwargs):
            return getattr(_module, _name)(*args, **kwargs)

        entry.__name__, entry.__qualname__ = original.__name__, original.__qualname__
        entry.__module__, entry.__doc__, entry.__wrapped__ = original.__module__, original.__doc__, original
        fns[index] = entry
        placed.append((fns, entry, target, key))

    def hisparse_router_registry_guard(*args, **kwargs):
        for fns, entry, target, key in placed:
            if entry not in fns:
                raise RuntimeError(
                    f"hisparse-router: SGLang's model-override registry no longer calls the replacement of "
                    f"{target} for {key} (SGLang {release}); the launch stops so that SGLang's own code does "
                    "not route while HISPARSE_POLICY is set. Unset HISPARSE_POLICY to run SGLang's own routing.")
        return None

    HookRegistry.register(family.guard, hisparse_router_registry_guard, HookType.BEFORE)


def _originals(family, release) -> dict:
    originals = {}
    for target in family.targets():
        try:
            originals[target] = _resolve(target)
        except SGLangImportFailed as failed:
            _stop(1, failed.explain(release))
        except (ImportError, AttributeError, ValueError) as exc:
            _stop(1, f"SGLang {release} has no {target} ({type(exc).__name__}: {exc}): the policy cannot "
                     "replace its routing there")
    return originals


def installed_release() -> str:
    """The installed SGLang's version ("0.5.23"), or "unknown"."""
    from engine.sglang.registry import installed_release as installed

    return installed() or "unknown"


def _load_policies():
    """The policies HISPARSE_POLICY names (a release or a folder: one version per family), and the
    file it named, if it named one by its path."""
    from engine.errors import HisparseError
    from engine.files.catalog import looks_like_path
    from engine.sglang.policy_sets import load_policy_set

    ref = os.environ.get("HISPARSE_POLICY", "")
    try:
        found = load_policy_set(None)
    except HisparseError as exc:
        problems = exc.problems
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        _stop(2, f"HISPARSE_POLICY={ref}: {problems[0]}{more}")
    policies = found.policies
    return policies, (policies[0].file if looks_like_path(ref) and len(policies) == 1 else None)


def _record_file() -> str | None:
    path = os.environ.get("HISPARSE_RECORD")
    if path is None:
        return None
    from engine.errors import HisparseError
    from engine.files.streams import check_record_target

    if not path.strip():
        _stop(2, "HISPARSE_RECORD is set but empty: it must name a file (unset it for no records)")
    try:
        check_record_target(path)
    except HisparseError as exc:
        _stop(2, f"HISPARSE_RECORD={path}: {exc.problems[0]}")
    return path


class SGLangImportFailed(EngineError):
    """Importing an SGLang module raised: SGLang's own environment is broken (a package it imports
    is missing or fails), which says nothing about where its routing lives."""

    def __init__(self, module: str, exc: BaseException):
        super().__init__(module)
        self.module, self.exc = module, exc

    def explain(self, release: str) -> str:
        import traceback

        exc = self.exc
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            fix = (f"install the package that provides '{exc.name.split('.')[0]}' into this Python (SGLang "
                   f"imports it)")
        else:
            fix = "repair SGLang's installation in this Python"
        return (f"importing {self.module} (SGLang {release}) raised {type(exc).__name__}: {exc}{where}. That is "
                f"SGLang's environment, not its routing: {fix}, or unset HISPARSE_POLICY to see SGLang's own "
                "error")


def _resolve(target: str):
    """The function at `target` (a module path, then attributes), unwrapped. An import that fails
    for another reason than the target's own module being absent raises SGLangImportFailed; a
    missing module or attribute raises ImportError / AttributeError (the target moved)."""
    import importlib

    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
                continue  # no such module in this release: the target is an attribute of a shorter path
            raise SGLangImportFailed(module, exc) from None
        except Exception as exc:  # SGLang's module raised while importing
            raise SGLangImportFailed(module, exc) from None
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return getattr(obj, "__wrapped__", obj)  # already wrapped by another plugin's hook: the original's code
    raise ImportError(f"no module of {target} can be imported")


def _installed(target: str):
    """What stands at `target` now, found as SGLang's HookRegistry finds it (pkgutil.resolve_name of
    what holds it, then the attribute as stored there): once SGLang applied the hooks, another
    object than before."""
    import inspect
    import pkgutil

    holder, _, name = target.rpartition(".")
    return inspect.getattr_static(pkgutil.resolve_name(holder), name)


def _register(family, routing, originals, release) -> None:
    import logging

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from engine.sglang.hook_targets import BACKEND_METHOD, INLINE_CHECK
    from engine.sglang.inline_check import NotInline

    hooks = {}
    for target, role in family.replace.items():  # every hook built before any is registered
        original = originals[target]
        logger = logging.getLogger(original.__module__)
        factory = getattr(routing, role)
        if role == INLINE_CHECK:
            try:
                hooks[target] = factory(original, family.inline[target], logger)
            except NotInline as exc:
                _stop(1, f"SGLang {release}'s {target} does not hold the HiSparse check where this release "
                         f"keeps it: {exc}; the policy cannot replace its routing there")
        elif role == BACKEND_METHOD and family.hisparse_line:
            line_of = originals[family.hisparse_line]
            hooks[target] = factory(original, logger, (logging.getLogger(line_of.__module__), line_of))
        else:
            hooks[target] = factory(original, logger)
    unpatched = {target: _installed(target) for target in hooks}
    for target, hook in hooks.items():
        HookRegistry.register(target, hook, HookType.REPLACE)

    def hisparse_router_guard(*args, **kwargs):
        """Before resolution: every replacement is in place, and is the last one registered on
        its target, or the launch stops."""
        from engine.sglang.hook_targets import last_replace_hook

        for target, hook in hooks.items():
            if _installed(target) is unpatched[target]:
                why = "was not applied"
            elif last_replace_hook(target) is not hook:
                why = "is overridden by another plugin's REPLACE hook"
            else:
                continue
            raise RuntimeError(
                f"hisparse-router: the hook on {target} {why} (SGLang {release}); the launch stops so that "
                f"SGLang's own code does not route while HISPARSE_POLICY is set. Unset HISPARSE_POLICY to "
                "run SGLang's own routing.")
        return None

    HookRegistry.register(family.guard, hisparse_router_guard, HookType.BEFORE)


def _stop(code: int, message: str):
    print(f"hisparse-router: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)
