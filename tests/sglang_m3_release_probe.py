"""Run inside a release's environment (tests/test_sglang_plugin_m3.py starts it): the conform
driver's launch path over a sample of the release's MiniMax-M3 family version, natively and with
the plugin on the shipped policies (`sglang==RELEASE`), comparing acceptance, exception type and
text, resolved fields, routing lines and the MiniMax-M3 provider's INFO lines. Prints one JSON
object. No pytest: the release environments do not have it."""
from __future__ import annotations

import json
import logging
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PROVIDER_MODULE = "sglang.srt.arg_groups.model_overrides.minimax_m3"


class _Env:
    """What tests.helpers.plugin_active needs of pytest's monkeypatch."""

    def setenv(self, name, value):
        os.environ[name] = value

    def delenv(self, name, raising=True):
        os.environ.pop(name, None)


def main(sample: int, seed: int) -> dict:
    from engine.policy.sets import load_policy_set
    from engine.sglang.conform import pipeline as driver
    from engine.sglang.conform.cases import case_of
    from engine.sglang.conform.sample import configs_of
    from engine.sglang.registry import installed_release
    from tests.helpers import plugin_active

    release = installed_release()
    driver.import_sglang()
    driver.load()
    policy = load_policy_set(f"sglang=={release}").for_class("minimax_m3")
    configs, _ = configs_of(policy, n=sample, seed=seed)
    cases = list(dict.fromkeys(case_of(policy, c) for c in configs))

    def run(case):
        records = []
        handler = logging.Handler(logging.INFO)
        handler.emit = records.append
        log = logging.getLogger(PROVIDER_MODULE)
        level = log.level
        log.setLevel(logging.INFO)
        log.addHandler(handler)
        try:
            r = driver.run_case(case)
        finally:
            log.removeHandler(handler)
            log.setLevel(level)
        lines = [(x.levelname, x.getMessage()) for x in records if not x.getMessage().startswith("hisparse-router:")]
        return [r.ok, r.error_type, r.message, list(r.log), [list(v) for v in r.values], lines]

    native = [run(c) for c in cases]
    with plugin_active(_Env(), f"sglang=={release}"):
        module = sys.modules[PROVIDER_MODULE]
        replaced = getattr(module._minimax_m3_overrides, "__wrapped__", None) is not None
        routed = [run(c) for c in cases]
    differ = [{"case": repr(c), "native": a, "plugin": b} for c, a, b in zip(cases, native, routed) if a != b]
    return {"release": release, "policy": policy.ref, "replaced": replaced, "cases": len(cases),
            "accepted": sum(a[0] for a in native), "with_provider_lines": sum(bool(a[5]) for a in native),
            "differ": len(differ), "first_differences": differ[:3]}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
