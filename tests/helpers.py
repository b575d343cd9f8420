"""Shared helpers for the engine tests."""
from __future__ import annotations

import os
import subprocess
import sys

import engine
from kernels_bridge.cli import main  # `hisparse`: the engine's commands and the bridge's
from engine.analysis import domain

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
MINIMAL = os.path.join(FIXTURES, "policies", "minimal.yaml")
# deprecated --nsa-* spellings that log a notice, an NVFP4 route: the former nsa-backends@3, which
# models no release (tests of the language, not of SGLang's routing)
NSA_ALIASES = os.path.join(FIXTURES, "policies", "nsa-aliases.yaml")


def run_cli(capsys, *argv):
    """Run `hisparse ARGV` in-process: (exit code, stdout, stderr)."""
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def run_process(*argv, stdin=None, env=None):
    """Run `hisparse ARGV` (python -m kernels_bridge.cli) as a fresh process (what an operator's
    script does)."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "kernels_bridge.cli", *argv], input=stdin, capture_output=True,
                          text=True, cwd=ROOT, env=full_env, timeout=120)


def write_policy(tmp_path, text: str, name: str = "policy.yaml") -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


def load_text(tmp_path, text: str, name: str = "policy.yaml") -> engine.Policy:
    return engine.load_policy(write_policy(tmp_path, text, name))


def minimal_text() -> str:
    with open(MINIMAL, encoding="utf-8") as fh:
        return fh.read()


def python_files(*folders, root: str = ROOT):
    """The path of every .py file under the `folders` (e.g. "engine") of `root` (the project), in a
    stable order."""
    for base in folders:
        for folder, dirs, files in os.walk(os.path.join(root, base)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    yield os.path.join(folder, name)


def bulk_decisions(policy, configs) -> list:
    """The bulk evaluator's (policy.probe) decisions for `configs` (canonical keys), as Decision
    objects (their not_applicable left empty: the bulk evaluator does not compute it)."""
    from engine.language.decision import Decision

    out: list = []
    n = len(policy.rule_list)
    policy.probe()([tuple(policy.complete(c).values()) for c in configs], out.append, [0] * n, [0] * n)
    assert len(out) == len(configs)
    return [Decision(policy, v, s, log, viol, c, scope) for c, (v, s, log, viol, scope) in zip(configs, out)]


def assert_bulk_equals_evaluate(policy, configs=None) -> int:
    """The bulk evaluator decides as evaluate (the interpreter) on every config of `configs`
    (default: the whole domain): acceptance, resolved values, sources, log lines, violations
    (check, phase, message, location, raises) and scope. Returns the number of configs."""
    configs = list(domain.configs(policy)) if configs is None else list(configs)
    for config, bulk in zip(configs, bulk_decisions(policy, configs)):
        d = policy.evaluate(config)
        assert bulk.outcome() == d.outcome(), config
        assert bulk.sources == d.sources, config
        assert [v.to_dict() for v in bulk.violations] == [v.to_dict() for v in d.violations], config
    return len(configs)


def assert_probe_counts_like_traces(policy, every: int = 1) -> None:
    """The lint's instrumented evaluator counts the rule hits the interpreter's traces show, on every
    `every`-th config of the domain, and decides as the interpreter does."""
    from engine.explain.trace import Trace
    from engine.language import interpreter as interpret

    n = len(policy.rule_list)
    held, chosen, want_held, want_chosen = [0] * n, [0] * n, [0] * n, [0] * n
    index = {r.name: i for i, r in enumerate(policy.rule_list)}
    sample = [config for k, config in enumerate(domain.configs(policy)) if not k % every]
    got = []
    policy.probe()([tuple(c.values()) for c in sample], got.append, held, chosen)
    assert len(got) == len(sample)
    for config, (values, sources, log, viol, scope) in zip(sample, got):
        trace = Trace()
        ref_d = interpret.run(policy, config, config, trace)
        assert (not viol, values, tuple(log), tuple(m for _, _, m in viol), scope) == ref_d.outcome(), config
        assert dict(zip(policy.phase_names, sources)) == ref_d.sources, config
        for step in trace.steps:
            if step.rule is not None and step.holds and step.rule.stage != "defaults":
                want_held[index[step.rule.name]] += 1
            if step.chosen:
                want_chosen[index[step.rule.name]] += 1
        for rule in trace.default_matches:
            want_held[index[rule.name]] += 1
    assert held == want_held and chosen == want_chosen


def plugin_active(monkeypatch, policy, record=None):
    """The SGLang plugin in this process as load_plugins() runs it (register(), then
    HookRegistry.apply_hooks()); on exit every binding SGLang's hooks replaced (the DSA family's
    and every model class's of the installed release) and every entry of SGLang's model-override
    registry are put back, and the HookRegistry is reset."""
    import contextlib

    @contextlib.contextmanager
    def active():
        from sglang.srt.plugins.hook_registry import HookRegistry

        from engine.serving import sglang_plugin
        from engine.sglang.hook_targets import CLASS_FAMILIES, class_family_of, family_of

        release = sglang_plugin.installed_release()
        targets = family_of(release).targets() + [t for cls in CLASS_FAMILIES for fam in [class_family_of(cls, release)]
                                                  if fam is not None for t in fam.targets()]
        originals = [sglang_plugin._resolve(t) for t in targets]
        bindings = [(mod, name, value) for mod in list(sys.modules.values()) if mod is not None
                    for name, value in list(getattr(mod, "__dict__", {}).items())
                    if any(value is o for o in originals)]
        base = sys.modules.get("sglang.srt.arg_groups.model_override_base")
        registry = getattr(base, "_MODEL_OVERRIDE_FNS", {})
        entries = {key: list(fns) for key, fns in registry.items()}
        monkeypatch.setenv("HISPARSE_POLICY", policy)
        if record:
            monkeypatch.setenv("HISPARSE_RECORD", record)
        try:
            sglang_plugin.register()
            HookRegistry.apply_hooks()
            yield HookRegistry
        finally:
            for mod, name, value in bindings:
                setattr(mod, name, value)
            for key, fns in entries.items():
                registry[key][:] = fns
            HookRegistry.reset()
            monkeypatch.delenv("HISPARSE_POLICY")
            monkeypatch.delenv("HISPARSE_RECORD", raising=False)

    return active()
