"""Run inside an SGLang release's Python by tests/test_sglang_contracts.py (not a test module
itself): every function the plugin replaces in that release, called by itself as SGLang calls it
(one argument object, one backend), by SGLang's own code and by the plugin's replacement on the
release's shipped policy version, over a grid of calls. Prints one JSON object: the calls made per
function and the first differences in what came back: the return value, the exception (type and
text), the log lines (level, function, text) and the fields the call wrote.

    python tests/sglang_contract_probe.py

The argument objects are plain namespaces holding only the fields the function reads (SGLang's
own tests pass such objects), the model a namespace too; the platform and the GPU are told to
SGLang as the conform drivers tell them (engine/sglang/conform/machine.py)."""
from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import pkgutil
import sys
from types import SimpleNamespace
from unittest import mock

KV = ("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
BACKENDS = (None, "flashmla_sparse", "flashmla_kv", "fa3", "tilelang", "aiter", "trtllm", "flashinfer_sparse_mla")
MACHINES = (("cuda", (9, 0)), ("cuda", (10, 0)), ("hip", (9, 4)))
MODELS = (("DeepseekV32ForCausalLM", True), ("DeepseekV3ForCausalLM", False), ("LlamaForCausalLM", False))


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        if "hisparse-router" not in record.getMessage():  # the launch's naming line is no function's
            self.lines.append([record.levelname, record.funcName, record.getMessage()])


def outcome(fn, args, obj, fields):
    """What one call gave: (return, exception, log lines, the fields of `obj` after)."""
    lines = Lines()
    logging.getLogger("sglang").addHandler(lines)
    try:
        returned, raised = fn(*args), None
    except Exception as exc:  # the function's refusal, compared as type and text
        returned, raised = None, [type(exc).__name__, str(exc)]
    finally:
        logging.getLogger("sglang").removeHandler(lines)
    after = {f: getattr(obj, f, None) for f in fields}
    return [repr(returned), raised, lines.lines, after]


class Machine:
    """The platform and GPU of a call, told to SGLang as its release reads them."""

    def __init__(self):
        self.helpers = None
        if "sglang.srt.runtime_context" not in sys.modules or not hasattr(
                sys.modules["sglang.srt.runtime_context"], "override_platform"):
            from engine.sglang.conform.machine import PatchedHelpers

            self.helpers = PatchedHelpers()

    def __call__(self, platform, capability):
        if self.helpers is not None:
            return self.helpers.case(platform, capability)
        from engine.sglang.conform.machine import faked_gpu

        return faked_gpu(platform, capability)


def namespace(fields: dict, arch: str):
    hf = SimpleNamespace(architectures=[arch])
    model = SimpleNamespace(hf_config=hf)
    return SimpleNamespace(get_model_config=lambda: model, _model_config=model, **fields)


def calls(role: str, names: dict):
    """(fields, arch, dsa, machine, extra arguments) of each call of a function of this role.
    `names`: the release's field names of the two phases."""
    pre, dec = names["prefill"], names["decode"]
    if role in ("dtype_pass", "dtype_method"):
        for kv, (p, d), hisparse, machine, (arch, dsa) in itertools.product(
                KV, ((None, None), ("flashmla_kv", None), (None, "fa3")), (False, True), MACHINES, MODELS):
            fields = {"kv_cache_dtype": kv, pre: p, dec: d, "enable_hisparse": hisparse}
            yield fields, arch, dsa, machine, (machine[1][0], None) if role == "dtype_method" else ()
    elif role in ("backend_pass", "backend_method"):
        for kv, p, d, hisparse, machine, (arch, dsa) in itertools.product(
                ("bfloat16", "fp8_e4m3"), BACKENDS[:5], BACKENDS[:5], (False, True), MACHINES, MODELS):
            fields = {"kv_cache_dtype": kv, pre: p, dec: d, "enable_hisparse": hisparse}
            yield fields, arch, dsa, machine, (kv, machine[1][0]) if role == "backend_method" else ()
    elif role == "backend_check":
        for kv, backend, label, machine in itertools.product(
                ("bfloat16", "fp8_e4m3", "fp8_e5m2"), BACKENDS, ("prefill", "decode"), MACHINES):
            attr = names[label]
            fields = {"kv_cache_dtype": kv, pre: None, dec: None, attr: backend, "enable_hisparse": True}
            yield fields, "DeepseekV32ForCausalLM", True, machine, (attr, label)
    elif role == "inline_check":
        for kv, p, d, radix, machine in itertools.product(
                ("bfloat16", "fp8_e4m3", "fp8_e5m2"), BACKENDS[:5], BACKENDS[:5], (False, True), MACHINES):
            fields = {"kv_cache_dtype": kv, pre: p, dec: d, "enable_hisparse": True, "disable_radix_cache": radix}
            yield fields, "DeepseekV32ForCausalLM", True, machine, ()


def main() -> dict:
    import engine
    from engine.serving.sglang_plugin import _resolve, installed_release, register
    from engine.sglang.conform import drivers
    from engine.sglang.hook_targets import family_of

    release = installed_release()
    drivers.driver_for(release).load()
    from sglang.srt.plugins.hook_registry import HookRegistry

    policy = engine.load_policy(f"sglang=={release}")
    names = {ph: spec.input for ph, spec in policy.phases.items()}
    family = family_of(release)
    originals = {t: _resolve(t) for t in family.replace}
    os.environ["HISPARSE_POLICY"] = f"sglang=={release}"
    register()
    HookRegistry.apply_hooks()
    machine = Machine()
    config = sys.modules["sglang.srt.configs.model_config"]
    overrides = sys.modules.get("sglang.srt.arg_groups.overrides")
    report = {"release": release, "calls": {}, "differ": 0, "first_differences": []}
    for target, role in family.replace.items():
        if target.endswith(".check_server_args"):
            continue  # 0.5.11's: a whole ServerArgs; its HiSparse statement is held at launch level
        module, _, name = target.rpartition(".")
        owner = pkgutil.resolve_name(module)
        hooked = getattr(owner, name)
        assert hooked is not originals[target], f"{target} was not hooked"
        count = 0
        for fields, arch, dsa, (platform, capability), extra in calls(role, names):
            answers = []
            for fn in (originals[target], hooked):
                obj = namespace(fields, arch)
                arg = overrides.ResolvedView(obj) if role in ("dtype_pass", "backend_pass") else obj
                with contextlib.ExitStack() as stack:
                    stack.enter_context(machine(platform, capability))
                    stack.enter_context(mock.patch.object(config, "is_deepseek_dsa", lambda hf, _d=dsa: _d, create=True))
                    stack.enter_context(mock.patch.object(config, "is_deepseek_nsa", lambda hf, _d=dsa: _d, create=True))
                    stack.enter_context(mock.patch.object(config, "is_deepseek_v4", lambda hf: False, create=True))
                    answers.append(outcome(fn, (arg, *extra), obj, sorted(fields)))
            count += 1
            if answers[0] != answers[1]:
                report["differ"] += 1
                if len(report["first_differences"]) < 5:
                    report["first_differences"].append({"function": target, "fields": fields, "model": arch,
                                                        "machine": [platform, capability], "sglang": answers[0],
                                                        "plugin": answers[1]})
        report["calls"][target] = count
    return report


if __name__ == "__main__":
    print("PROBE " + json.dumps(main()))
