"""Run inside an SGLang release's environment by tests/test_sglang_plugin_releases.py (not a test
module itself): the plugin in-process against that release's own code. Prints one JSON object.

    python tests/sglang_release_probe.py grid REF            the conform driver's launch path over a
                                                            grid of over 1,000 configs, natively and
                                                            with the plugin on REF
    python tests/sglang_release_probe.py full REF JSON       SGLang's own prepare_server_args and
                                                            check_server_args on each launch of JSON
                                                            (a list of argument lists; the GPU
                                                            stand-in of tests/fixtures/sglang_standin),
                                                            natively and with the plugin on REF

The plugin is registered as SGLang's load_plugins() runs it: register(), then
HookRegistry.apply_hooks()."""
from __future__ import annotations

import json
import os
import sys


def activate(ref: str) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry

    from engine.serving.sglang_plugin import register

    os.environ["HISPARSE_POLICY"] = ref
    register()
    HookRegistry.apply_hooks()


def grid(ref: str) -> dict:
    import engine
    from engine.serving.sglang_plugin import _resolve, installed_release
    from engine.sglang.conform import drivers
    from engine.sglang.conform.cases import case_of
    from engine.sglang.conform.sample import axes, stratified
    from engine.sglang.hook_targets import INLINE_CHECK, family_of

    release = installed_release()
    driver = drivers.driver_for(release)
    driver.load()
    policy = engine.load_policy(f"sglang=={release}")
    configs = stratified(axes(policy, {"dsa_model": True}), 1000, 1) + stratified(axes(policy), 200, 2)
    cases = list(dict.fromkeys(case_of(policy, c) for c in configs))
    native = [driver.run_case(c) for c in cases]
    activate(ref)
    family = family_of(release)
    inline = [t for t, role in family.replace.items() if role == INLINE_CHECK and t.endswith(".validate_hisparse")]
    if inline:  # the driver holds SGLang's validate_hisparse: run what the module holds now (the hook)
        module, _, name = inline[0].rpartition(".")
        hooked = getattr(sys.modules[module], name)
        assert getattr(hooked, "__wrapped__", None) is _resolve(inline[0]), "validate_hisparse was not hooked"
        driver._driver.check = hooked
    routed = [driver.run_case(c) for c in cases]
    differ = []
    for case, a, b in zip(cases, native, routed):
        mine = (b.ok, b.error_type, b.message, list(b.log), b.kv_cache_dtype, list(b.backends))
        theirs = (a.ok, a.error_type, a.message, list(a.log), a.kv_cache_dtype, list(a.backends))
        if mine != theirs:
            differ.append({"case": repr(case), "sglang": theirs, "plugin": mine, "stages": [a.stage, b.stage]})
    return {"release": release, "cases": len(cases), "accepted": sum(r.ok for r in native),
            "refused": sum(not r.ok for r in native),
            "lines_before_refusal": sum(bool(r.log) and not r.ok for r in native),
            "hisparse_lines": sum(any(line.startswith("HiSparse enabled") for line in r.log) for r in native),
            "differ": len(differ), "first_differences": differ[:5]}


def full(ref: str, argvs: list) -> list:
    import hisparse_test_gpu

    hisparse_test_gpu.fake_gpu()
    from sglang.srt.server_args import prepare_server_args

    def launch(argv):
        try:
            args = prepare_server_args(argv)
            args.check_server_args()
        except Exception as exc:  # SGLang's own refusal (or the policy's, with SGLang's type)
            return {"ok": False, "error": type(exc).__name__, "message": str(exc)}
        fields = [f for f in ("kv_cache_dtype", "nsa_prefill_backend", "nsa_decode_backend", "dsa_prefill_backend",
                              "dsa_decode_backend") if hasattr(args, f)]
        return {"ok": True, "values": {f: getattr(args, f) for f in fields}}

    native = [launch(argv) for argv in argvs]
    activate(ref)
    return [{"sglang": a, "plugin": launch(argv)} for a, argv in zip(native, argvs)]


if __name__ == "__main__":
    mode, ref, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    out = grid(ref) if mode == "grid" else full(ref, json.loads(rest[0]))
    print("PROBE " + json.dumps(out))
