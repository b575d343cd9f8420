"""The SGLang plugin (engine/serving/sglang_plugin.py, entry point `hisparse_router` of group
`sglang.srt.plugins`) and `hisparse launch`, against SGLang 0.5.23's own code on a CPU machine.

- Real launches: `python -m sglang.launch_server` (and `sglang serve`) as subprocesses, with a
  test-only GPU stand-in (tests/fixtures/sglang_standin: a platform plugin that exists only on
  the PYTHONPATH given to these processes) and a model folder holding a config.json. A launch
  reaches the routing line, then stops for lack of the HTTP server packages; the tests read the
  routing lines, the exit code and the reason.
- In-process: SGLang's own prepare_server_args / resolve_once / check_server_args (the conform
  driver's stand-ins for the GPU), with the plugin registered by its entry point and applied by
  SGLang's HookRegistry, against the same code without it, over a grid of over 1,000 configs.

Skipped only where SGLang 0.5.23 is not importable (`make install` installs it)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import FIXTURES, ROOT

FAMILY = "dsa-backends"  # the shipped family the plugin is pointed at (the default policy's)
STANDIN = os.path.join(FIXTURES, "sglang_standin")
HISPARSE_FP8 = ["--enable-hisparse", "--disable-radix-cache", "--kv-cache-dtype", "fp8_e4m3"]
SGLANG_LINE = "HiSparse enabled (fp8_e4m3): using DSA backends prefill=flashmla_kv, decode=flashmla_kv."
EDITED_LINE = "HiSparse enabled (fp8_e4m3): using DSA backends prefill=flashmla_kv, decode=flashinfer_sparse_mla."
SITE_RULE = "This site runs HiSparse with an FP8 KV cache only; use --kv-cache-dtype fp8_e4m3."
ROUTING = re.compile(r"(HiSparse enabled|Set DSA backends|Setting KV cache dtype|When specifying --dsa)")


# -- what needs no SGLang ------------------------------------------------------------------------

def shipped_ref() -> str:
    """FAMILY@N of the shipped family's newest version (what an edited copy of it still says)."""
    import engine

    policy = engine.load_policy(FAMILY)
    return f"{policy.family}@{policy.version}"


def _pythonpath() -> str:
    """The stand-in and this checkout first, then what the tests run under (a release's unpacked
    wheel, where a release other than the installed one is tested)."""
    return os.pathsep.join([STANDIN, ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def _clean_env(**more) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HISPARSE_", "SGLANG_"))}
    env.update(more)
    return env


def test_without_hisparse_policy_the_plugin_does_nothing():
    """Registration returns before importing anything of SGLang, and registers no hook."""
    code = ("import sys; from engine.serving.sglang_plugin import register; register(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sglang'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_clean_env(),
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=_clean_env(HISPARSE_POLICY="/no/such/policy.yaml"))
    assert out.returncode == 2  # the same code with the variable set does act


def test_a_policy_that_does_not_load_stops_with_exit_2_and_one_line(tmp_path, monkeypatch, capsys):
    from engine.serving.sglang_plugin import register

    bad = tmp_path / "bad.yaml"
    bad.write_text(f"policy: {FAMILY}\nversion: 4\ninputs: [\n", encoding="utf-8")
    for ref, named in [(str(bad), f"{bad}:"), (f"{FAMILY}@99", f"{FAMILY}@99"), ("", "empty")]:
        monkeypatch.setenv("HISPARSE_POLICY", ref)
        with pytest.raises(SystemExit) as exc:
            register()
        err = capsys.readouterr().err
        assert exc.value.code == 2 and not isinstance(exc.value, Exception)  # load_plugins lets it through
        assert err.count("\n") == 1 and err.startswith("hisparse-router: HISPARSE_POLICY=") and named in err, err
    assert re.search(r"bad\.yaml:\d+:\d+: E104", _first_line_for(bad, monkeypatch, capsys))


def _first_line_for(path, monkeypatch, capsys) -> str:
    from engine.serving.sglang_plugin import register

    monkeypatch.setenv("HISPARSE_POLICY", str(path))
    with pytest.raises(SystemExit):
        register()
    return capsys.readouterr().err


def test_the_hook_families_cover_the_releases_they_name():
    from engine.sglang import hook_targets as t

    assert t.family_of("0.5.23") is t.PIPELINE and t.family_of("0.5.19") is t.PIPELINE
    assert t.family_of("0.6.0") is t.PIPELINE  # newer: driven only when its targets exist (checked at launch)
    assert t.family_of("0.5.15.post1") is t.PASSES_IN_METHODS and t.family_of("0.5.18") is t.PASSES_IN_METHODS
    assert t.family_of("0.5.14") is t.DSA_METHODS_0514 and t.family_of("0.5.13.post1") is t.DSA_METHODS_0513
    assert t.family_of("0.5.12.post1") is t.NSA_METHODS_0512 and t.family_of("0.5.11") is t.NSA_METHODS_0511
    assert t.family_of("0.5.10") is None and t.family_of("unknown") is None
    assert t.family_of("0.5.16.post1") is t.PASSES_IN_METHODS  # unlisted: the facts of the release before it
    assert t.family_of("1.0") is t.PIPELINE and t.family_of("0.6.0rc1") is t.PIPELINE
    # before 0.5.15 the methods are replaced and the guard runs before the adjustments that call them
    for family in (t.NSA_METHODS_0511, t.NSA_METHODS_0512, t.DSA_METHODS_0513, t.DSA_METHODS_0514):
        assert {t.BACKEND_METHOD, t.DTYPE_METHOD} < set(family.replace.values())
        assert family.guard.endswith("ServerArgs._handle_model_specific_adjustments")
        assert set(family.inline) == {k for k, role in family.replace.items() if role == t.INLINE_CHECK}


# SGLang-shaped functions for the inline check (0.5.11's check_server_args, 0.5.12's validate_hisparse)
INLINE_SOURCE = '''
def check_server_args(self):
    assert self.tp_size > 0, "tp_size must be positive"

    # Check hisparse
    if self.enable_hisparse:
        assert self.disable_radix_cache, "Hierarchical sparse attention currently requires --disable-radix-cache."
        for attr, label in [("nsa_prefill_backend", "prefill"), ("nsa_decode_backend", "decode")]:
            backend = getattr(self, attr)
            if backend is not None and backend != "flashmla_sparse":
                raise ValueError(f"HiSparse requires flashmla_sparse NSA {label} backend, but got {backend}.")
        if self.kv_cache_dtype != "bfloat16":
            raise ValueError(f"HiSparse requires bfloat16 KV cache, but got {self.kv_cache_dtype}.")

    assert self.schedule_conservativeness >= 0, "schedule_conservativeness must be non-negative"
    return LATER


def validate_hisparse(server_args):
    if not server_args.enable_hisparse:
        return
    allowed = {"flashmla_sparse"}
    if server_args.kv_cache_dtype not in ("bfloat16",):
        raise ValueError("HiSparse requires bfloat16")
    allowed = ALLOWED
    for backend in (server_args.nsa_decode_backend,):
        if backend not in allowed:
            raise ValueError(f"HiSparse with {backend}")
'''


@pytest.fixture
def inline_module(tmp_path):
    import importlib.util

    path = tmp_path / "sglang_shaped.py"
    path.write_text(INLINE_SOURCE, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("sglang_shaped", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_inline_check_is_replaced_by_the_policys_and_nothing_else(inline_module):
    """Only the statements from the first HiSparse raise to the end of the block are replaced: the
    asserts before and after stay the function's own, read in its module's globals, with its line
    numbers; the policy's check gets the function's first argument."""
    import types

    from engine.sglang.hook_targets import Inline
    from engine.sglang.inline_check import compile_with_check

    seen = []
    compiled = compile_with_check(inline_module.check_server_args, Inline("self.enable_hisparse", 2), seen.append)
    inline_module.LATER = "module global, read at call time"
    args = types.SimpleNamespace(tp_size=1, enable_hisparse=True, disable_radix_cache=True, nsa_prefill_backend="fa3",
                                 nsa_decode_backend=None, kv_cache_dtype="fp8_e4m3", schedule_conservativeness=1)
    assert compiled(args) == "module global, read at call time" and seen == [args]  # SGLang's raises are gone
    args.disable_radix_cache = False
    with pytest.raises(AssertionError, match="requires --disable-radix-cache") as exc:
        compiled(args)
    assert exc.traceback[-1].lineno + 1 == INLINE_SOURCE.splitlines().index(
        "        assert self.disable_radix_cache, \"Hierarchical sparse attention currently requires "
        "--disable-radix-cache.\"") + 1 and str(exc.traceback[-1].path).endswith("sglang_shaped.py")
    args.disable_radix_cache, args.schedule_conservativeness = True, -1
    with pytest.raises(AssertionError, match="schedule_conservativeness"):
        compiled(args)
    assert compiled.__qualname__ == "check_server_args" and len(seen) == 2
    seen.clear()
    validate = compile_with_check(inline_module.validate_hisparse, Inline(None, 3), seen.append)
    args = types.SimpleNamespace(enable_hisparse=True, kv_cache_dtype="fp8_e4m3", nsa_decode_backend="fa3")
    assert validate(args) is None and seen == [args]


def test_a_function_without_the_inline_check_where_expected_is_refused(inline_module):
    from engine.sglang.hook_targets import Inline
    from engine.sglang.inline_check import NotInline, compile_with_check

    for function, where, why in [
        (inline_module.check_server_args, Inline("self.enable_hisparse", 3), "3 statements"),
        (inline_module.check_server_args, Inline("self.enable_hicache", 2), "0 '# Check hisparse' statements"),
        (inline_module.check_server_args, Inline(None, 2), "does not end its body"),
        (inline_module.validate_hisparse, Inline(None, 2), "does not end its body"),
        (print, Inline(None, 2), "source cannot be read"),
    ]:
        with pytest.raises(NotInline, match=why):
            compile_with_check(function, where, print)


# -- SGLang 0.5.23 -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sglang_0523():
    from engine.sglang.conform.drivers import installed_sglang

    version, reason = installed_sglang()
    if version != "0.5.23":
        pytest.skip(f"needs SGLang 0.5.23: {reason}")
    from engine.sglang.conform import pipeline as driver

    driver.import_sglang()
    return driver


@pytest.fixture(scope="module")
def release():
    """The SGLang release the launches run (the installed one, or a release's unpacked wheel first on
    PYTHONPATH, with hisparse-router's entry point installed next to it): one whose routing the
    plugin drives, else the launch tests skip."""
    import importlib.util

    from engine.serving.sglang_plugin import installed_release
    from engine.sglang.hook_targets import family_of

    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed")
    version = installed_release()
    if family_of(version) is None:
        pytest.skip(f"SGLang {version}: the plugin drives 0.5.11 and later")
    return version


@pytest.fixture(scope="module")
def models(release, tmp_path_factory):
    from engine.sglang.conform.model_folders import ModelFolders

    return ModelFolders(str(tmp_path_factory.mktemp("models")))


@pytest.fixture(scope="module")
def edited(tmp_path_factory) -> str:
    """A copy of the shipped policy with three edits: HiSparse FP8 decode defaults to
    flashinfer_sparse_mla; the HiSparse FP8 allow-list takes flashmla_sparse too (SGLang refuses
    it); a site rule refuses HiSparse with a BF16 KV cache (a check at defaults)."""
    import engine

    shipped = engine.load_policy(FAMILY)
    text = open(shipped.file, encoding="utf-8").read()
    edits = [
        ("      when: {enable_hisparse: true, kv_cache_dtype: fp8_e4m3}\n"
         "      set: {prefill: flashmla_kv, decode: flashmla_kv}",
         "      when: {enable_hisparse: true, kv_cache_dtype: fp8_e4m3}\n"
         "      set: {prefill: flashmla_kv, decode: flashinfer_sparse_mla}"),
        ("          fp8_e4m3: [flashinfer_sparse_mla, flashmla_kv]",
         "          fp8_e4m3: [flashinfer_sparse_mla, flashmla_kv, flashmla_sparse]"),
        ("  rules:\n    - name: tilelang-fp8-hisparse",
         "  rules:\n    - name: site-hisparse-fp8-only\n      at: defaults\n"
         "      when: {dsa_model: true, enable_hisparse: true, kv_cache_dtype: bfloat16}\n"
         "      require: {enable_hisparse: false}\n"
         f"      message: {SITE_RULE}\n"
         "    - name: tilelang-fp8-hisparse"),
    ]
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    folder = tmp_path_factory.mktemp("policy") / FAMILY
    folder.mkdir()
    path = folder / f"v{shipped.version}.yaml"  # the copy keeps the shipped version number
    path.write_text(text, encoding="utf-8")
    return str(path)


def launch(argv, *, command=None, cwd=None, **env):
    """(exit code, the routing lines, the plugin's lines, all output) of a real SGLang launch."""
    env = _clean_env(PYTHONPATH=_pythonpath(), **env)
    proc = subprocess.run((command or [sys.executable, "-m", "sglang.launch_server"]) + argv, env=env,
                          cwd=cwd or ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    messages = [m.group(1) for m in re.finditer(r"^\[[^\]]*\] (.*)$", out, re.M)]
    return (proc.returncode, [m for m in messages if ROUTING.match(m)],
            [line for line in out.splitlines() if "hisparse-router" in line or "hisparse launch" in line], out)


def test_without_the_variable_sglang_routes_by_its_own_code(models):
    """(a) The plugin is installed (its entry point is found) and does nothing."""
    from importlib.metadata import entry_points

    assert [ep.value for ep in entry_points(group="sglang.srt.plugins") if ep.name == "hisparse_router"] == [
        "engine.serving.sglang_plugin:register"]
    code, routing, ours, out = launch(["--model-path", models.path("DeepseekV32ForCausalLM"), *HISPARSE_FP8])
    assert routing == [SGLANG_LINE], out[-3000:]
    assert ours == [] and code == 1 and "No module named 'uvicorn'" in out  # routed, then stopped


def test_the_shipped_policy_gives_sglangs_line_and_names_itself(models):
    """(b) HISPARSE_POLICY=<the shipped family>: SGLang's routing line, word for word, then the
    line naming the policy (family@version and sha256 prefix); with SGLang's allow-list of
    plugins naming it (and the test's stand-in, which the list filters too)."""
    import engine

    policy = engine.load_policy(FAMILY)
    code, routing, ours, out = launch(["--model-path", models.path("DeepseekV32ForCausalLM"), *HISPARSE_FP8],
                                      HISPARSE_POLICY=FAMILY, SGLANG_PLUGINS="hisparse_router,hisparse_test_gpu")
    assert routing == [SGLANG_LINE], out[-3000:]
    assert len(ours) == 1 and ours[0].endswith(
        f"hisparse-router: DSA routing decided by policy {policy.family}@{policy.version} "
        f"sha256={policy.sha256[:12]}"), out[-3000:]
    assert code == 1 and "No module named 'uvicorn'" in out


def test_hisparse_launch_runs_the_edited_policy_and_records_it(models, edited, tmp_path):
    """(c) + (h) + records: `hisparse launch --policy <edited copy> --record FILE -- python -m
    sglang.launch_server ...` checks the launch, starts SGLang with the plugin on the copy's
    bytes (it keeps version 4), SGLang logs the edited route, the exit code is SGLang's, and the
    decision SGLang's process made replays."""
    record = tmp_path / "decisions.jsonl"
    argv = ["--model-path", models.path("DeepseekV32ForCausalLM"), *HISPARSE_FP8]
    # --allow-incapable: the edited default is a route flashinfer_sparse_mla's capabilities exclude here
    proc = subprocess.run([sys.executable, "-m", "kernels_bridge.cli", "launch", "--policy", edited,
                           "--allow-incapable", "--record", str(record), "--", sys.executable, "-m",
                           "sglang.launch_server", *argv],
                          env=_clean_env(PYTHONPATH=_pythonpath()), cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "No module named 'uvicorn'" in out, out[-3000:]  # SGLang's own exit
    assert f"HISPARSE_POLICY={edited}" in out
    assert f"] {EDITED_LINE}\n" in out and SGLANG_LINE not in out
    assert re.search(rf"DSA routing decided by policy {shipped_ref()} sha256=[0-9a-f]{{12}} from "
                     + re.escape(edited), out)
    records = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 1 and records[0]["decision"]["backends"] == {
        "prefill": "flashmla_kv", "decode": "flashinfer_sparse_mla"}
    assert records[0]["input"]["dsa_model"] is True and records[0]["input"]["platform"] == "cuda"
    from tests.helpers import run_process

    same = run_process("replay", str(record), "--policy", edited)
    assert same.returncode == 0, same.stdout + same.stderr
    shipped = run_process("replay", str(record), "--policy", FAMILY)
    assert shipped.returncode == 1 and "flashinfer_sparse_mla" in shipped.stdout


def test_a_config_the_copy_refuses_stops_before_any_routing_line(models, edited):
    """(e) The copy's check at defaults refuses: SGLang's launch stops with the copy's message
    (ValueError, as SGLang's own DSA-step refusals), and no backend line was logged."""
    argv = ["--model-path", models.path("DeepseekV32ForCausalLM"), "--enable-hisparse", "--disable-radix-cache",
            "--kv-cache-dtype", "bfloat16"]
    code, routing, ours, out = launch(argv, HISPARSE_POLICY=edited)
    assert code == 1 and f"ValueError: {SITE_RULE}" in out, out[-3000:]
    assert routing == [] and len(ours) == 1 and "uvicorn" not in out


def test_sglang_serve_stops_with_exit_2_on_a_policy_that_does_not_load(models, tmp_path):
    """(f) through `sglang serve`: one line naming the file and the problem, exit 2, no traceback."""
    bad = tmp_path / "v4.yaml"
    bad.write_text(f"policy: {FAMILY}\nversion: 4\ninputs: {{kv_cache_dtype: {{type: enum, values: [a]\n",
                   encoding="utf-8")
    sglang = os.path.join(os.path.dirname(sys.executable), "sglang")
    code, routing, ours, out = launch(["serve", "--model-path", models.path("DeepseekV32ForCausalLM")],
                                      command=[sglang], HISPARSE_POLICY=str(bad))
    assert code == 2 and routing == [] and "Traceback" not in out, out[-3000:]
    assert len(ours) == 1 and re.match(rf"hisparse-router: HISPARSE_POLICY={re.escape(str(bad))}: "
                                       rf"{re.escape(str(bad))}:\d+:\d+: E10\d", ours[0]), ours


def test_hisparse_launch_refuses_without_starting_sglang(models, edited, tmp_path):
    """(h) A launch the policy refuses: the decision is printed, exit 1, and SGLang is never
    started (the command given would fail loudly if it were)."""
    from tests.helpers import run_process

    record = tmp_path / "r.jsonl"
    argv = ["--model-path", models.path("DeepseekV32ForCausalLM"), "--enable-hisparse", "--disable-radix-cache",
            "--kv-cache-dtype", "bfloat16"]
    proc = run_process("launch", "--policy", edited, "--record", str(record), "--",
                       os.path.join(str(tmp_path), "no-such-python"), "-m", "sglang.launch_server", *argv)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == f"REJECTED by {shipped_ref()}: {SITE_RULE}"
    assert "SGLang was not started" in proc.stderr and "cannot run" not in proc.stderr
    assert json.loads(record.read_text(encoding="utf-8"))["decision"]["ok"] is False
    # accepted: the command runs (here it cannot: the one line says so, exit 2)
    argv[-1] = "fp8_e4m3"
    proc = run_process("launch", "--policy", edited, "--allow-incapable", "--",
                       os.path.join(str(tmp_path), "no-such-python"), "-m", "sglang.launch_server", *argv)
    assert proc.returncode == 2 and "hisparse launch: cannot run" in proc.stderr
    proc = run_process("launch", "--policy", edited)
    assert proc.returncode == 2 and "no command" in proc.stderr


# -- in-process: the plugin registered by its entry point, applied by SGLang's HookRegistry ----------

@contextlib.contextmanager
def plugin_active(monkeypatch, policy, record=None, other_plugin=None):
    """The plugin as load_plugins() runs it (register(), then `other_plugin()` where given, then
    HookRegistry.apply_hooks()); on exit every binding SGLang's hooks replaced is put back and the
    registry reset."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from engine.serving import sglang_plugin
    from engine.sglang.hook_targets import PIPELINE

    originals = [sglang_plugin._resolve(t) for t in PIPELINE.targets()]
    bindings = [(mod, name, value) for mod in list(sys.modules.values()) if mod is not None
                for name, value in list(getattr(mod, "__dict__", {}).items())
                if any(value is o for o in originals)]
    monkeypatch.setenv("HISPARSE_POLICY", policy)
    if record:
        monkeypatch.setenv("HISPARSE_RECORD", record)
    try:
        sglang_plugin.register()
        if other_plugin is not None:
            other_plugin()
        HookRegistry.apply_hooks()
        yield HookRegistry
    finally:
        for mod, name, value in bindings:
            setattr(mod, name, value)
        HookRegistry.reset()
        monkeypatch.delenv("HISPARSE_POLICY")
        monkeypatch.delenv("HISPARSE_RECORD", raising=False)


def _grid_cases(policy):
    """Over 1,000 launches: a stratified sample of the policy's DSA domain (every value of every
    input appears) and of its whole domain."""
    from engine.sglang.conform.cases import case_of
    from engine.sglang.conform.sample import axes, stratified

    configs = stratified(axes(policy, {"dsa_model": True}), 1000, 1) + stratified(axes(policy), 200, 2)
    return list(dict.fromkeys(case_of(policy, c) for c in configs))


def test_the_shipped_policy_drives_sglangs_launch_path_as_its_own_code(sglang_0523, monkeypatch):
    """Accepted and refused alike, with the same messages and exception types, the same KV dtype
    and backends (also what a refused launch had declared), and the same routing lines in the
    same order, including those logged before a refusal. The one difference allowed: a
    --hisparse-config the policy refuses is refused at SGLang's HiSparse check instead of when
    the model runner starts, with SGLang's message."""
    import engine

    policy = engine.load_policy(FAMILY)
    cases = _grid_cases(policy)
    assert len(cases) >= 1000
    native = [sglang_0523.run_case(c) for c in cases]
    with plugin_active(monkeypatch, FAMILY):
        routed = [sglang_0523.run_case(c) for c in cases]
    assert sum(r.ok for r in native) > 100 and sum(not r.ok for r in native) > 100
    assert sum(bool(r.log) and not r.ok for r in native) > 10  # lines logged before a refusal
    earlier = 0
    for case, a, b in zip(cases, native, routed):
        assert (b.ok, b.error_type, b.message, b.log) == (a.ok, a.error_type, a.message, a.log), case
        assert (b.kv_cache_dtype, b.backends) == (a.kv_cache_dtype, a.backends), case
        if a.stage != b.stage:
            assert (a.stage, b.stage) == ("hisparse_config", "check"), case
            earlier += 1
    assert earlier < len(cases) // 10


def test_a_launch_is_decided_by_one_evaluation_without_a_trace(sglang_0523, monkeypatch):
    """The plugin evaluates the whole policy at most once per launch (once where the launch
    reaches the routing it replaces) and answers every later call from that decision (its lines
    carry their stages): no second evaluation, none with a tracer."""
    import engine
    from engine.policy.policy import Policy

    policy = engine.load_policy(FAMILY)
    cases = _grid_cases(policy)[::50]
    calls = []
    real = Policy.evaluate

    def counted(self, config, part=None, tracer=None):
        calls.append((part, tracer))
        return real(self, config, part, tracer)

    monkeypatch.setattr(Policy, "evaluate", counted)
    decided = 0
    with plugin_active(monkeypatch, FAMILY):
        for case in cases:
            calls.clear()
            result = sglang_0523.run_case(case)
            whole = [c for c in calls if c[0] is None]
            assert len(whole) <= 1 and all(tracer is None for _, tracer in calls), (case, result.message, calls)
            decided += len(whole)
    assert decided >= len(cases) // 2  # most launches reach the routing the plugin decides


def test_the_decision_reaches_a_child_process_as_sglang_sends_it(sglang_0523, models, edited, monkeypatch,
                                                                  tmp_path):
    """(d) + (g): with the edited copy, SGLang's own prepare_server_args / resolve_once /
    check_server_args accept the pairing SGLang itself refuses (HiSparse FP8 with flashmla_sparse
    decode), and the ServerArgs pickled as SGLang sends it to its scheduler process carries the
    policy's backends there."""
    from engine.sglang.conform.machine import faked_gpu
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.server_args import prepare_server_args

    argv = ["--model-path", models.path("DeepseekV32ForCausalLM"), *HISPARSE_FP8,
            "--dsa-decode-backend", "flashmla_sparse"]
    saved = dict(os.environ)
    with faked_gpu("cuda", (9, 0)):
        native = prepare_server_args(argv)
        native.resolve_once()
        with pytest.raises(ValueError, match="HiSparse supports DSA decode backend"):
            native.check_server_args()
        with plugin_active(monkeypatch, edited):
            args = prepare_server_args(argv)
            args.resolve_once()
            args.check_server_args()
    os.environ.clear()
    os.environ.update(saved)
    assert [resolution_result(args, f) for f in ("kv_cache_dtype", "dsa_prefill_backend", "dsa_decode_backend")] \
        == ["fp8_e4m3", "flashmla_kv", "flashmla_sparse"]
    import pickle

    shipped = tmp_path / "server_args.pickle"
    shipped.write_bytes(pickle.dumps(args))
    child = ("import pickle, sys; args = pickle.load(open(sys.argv[1], 'rb')); "
             "from sglang.srt.arg_groups.overrides import resolution_result; "
             "print([resolution_result(args, f) for f in ('dsa_prefill_backend', 'dsa_decode_backend')], "
             "getattr(args, '_resolution_finished', None))")
    out = subprocess.run([sys.executable, "-c", child, str(shipped)], capture_output=True, text=True, timeout=600,
                         env=_clean_env(PYTHONPATH=_pythonpath()))
    assert out.stdout.strip().splitlines()[-1:] == ["['flashmla_kv', 'flashmla_sparse'] True"], out.stderr[-3000:]


def test_a_moved_target_or_a_hook_not_applied_stops_the_launch(sglang_0523, monkeypatch, capsys):
    from engine.serving import sglang_plugin
    from engine.sglang import hook_targets

    moved = "sglang.srt.arg_groups.overrides._dsa_backend_resolution_moved"
    replace = dict(hook_targets.PIPELINE.replace)
    replace[moved] = replace.pop("sglang.srt.arg_groups.overrides._dsa_split_backend_resolution")
    monkeypatch.setattr(hook_targets.PIPELINE, "replace", replace)
    monkeypatch.setenv("HISPARSE_POLICY", FAMILY)
    with pytest.raises(SystemExit) as exc:
        sglang_plugin.register()
    err = capsys.readouterr().err
    assert exc.value.code == 1 and f"SGLang 0.5.23 has no {moved}" in err and err.count("\n") == 1
    monkeypatch.undo()
    # registered, but SGLang could not apply one hook (its target holds what it held before, as
    # when HookRegistry.apply_hooks logs a failure and goes on): the guard stops resolution
    from sglang.srt.arg_groups import hisparse_hook

    check = "sglang.srt.arg_groups.hisparse_hook.validate_hisparse_dsa_backend"
    before = hisparse_hook.validate_hisparse_dsa_backend
    with plugin_active(monkeypatch, FAMILY) as registry:
        guard = [h for _, h, _ in registry._hooks[hook_targets.PIPELINE.guard]][-1]
        assert guard() is None
        applied, hisparse_hook.validate_hisparse_dsa_backend = hisparse_hook.validate_hisparse_dsa_backend, before
        with pytest.raises(RuntimeError, match=re.escape(f"the hook on {check} was not applied (SGLang 0.5.23)")):
            guard()
        hisparse_hook.validate_hisparse_dsa_backend = applied
        assert guard() is None


def test_another_plugins_replace_registered_later_stops_the_launch(sglang_0523, monkeypatch):
    """Another plugin's REPLACE hook on a target of the policy's, registered after it, is the one
    SGLang applies: the guard stops resolution naming the target."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from engine.sglang import hook_targets

    target = "sglang.srt.arg_groups.overrides._dsa_split_backend_resolution"

    def another_plugin():
        HookRegistry.register(target, lambda view: {}, HookType.REPLACE)

    with plugin_active(monkeypatch, FAMILY, other_plugin=another_plugin) as registry:
        guard = [h for _, h, _ in registry._hooks[hook_targets.PIPELINE.guard]][-1]
        with pytest.raises(RuntimeError, match=re.escape(f"the hook on {target} is overridden by another "
                                                         "plugin's REPLACE hook (SGLang 0.5.23)")):
            guard()


def test_a_function_that_no_longer_holds_its_inline_check_stops_the_launch(sglang_0523, monkeypatch, capsys):
    """A release whose function with an inline HiSparse check (as 0.5.12's validate_hisparse) holds
    it elsewhere: 0.5.23's validate_hisparse calls validate_hisparse_dsa_backend instead. Exit 1,
    one line naming the target and the release, nothing registered."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from engine.serving import sglang_plugin
    from engine.sglang import hook_targets

    target = "sglang.srt.arg_groups.hisparse_hook.validate_hisparse"
    family = hook_targets.HookFamily("test", "a test family", {
        **hook_targets.PIPELINE.replace, target: hook_targets.INLINE_CHECK}, hook_targets.PIPELINE.guard,
        inline={target: hook_targets.Inline(None, 3)},
        reads={**hook_targets.PIPELINE.reads, hook_targets.INLINE_CHECK: hook_targets.Reads()})
    monkeypatch.setattr(hook_targets, "family_of", lambda release: family)
    monkeypatch.setenv("HISPARSE_POLICY", FAMILY)
    HookRegistry.reset()
    with pytest.raises(SystemExit) as exc:
        sglang_plugin.register()
    err = capsys.readouterr().err
    assert exc.value.code == 1 and err.count("\n") == 1, err
    assert f"SGLang 0.5.23's {target} does not hold the HiSparse check where this release keeps it" in err
    assert dict(HookRegistry._hooks) == {}


# -- a hook target that cannot be imported: SGLang's environment, or a function that moved --------

def _package(tmp_path, files: dict) -> str:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return str(tmp_path)


IMPORT_FAILURE_PROBE = """
import pytest
from engine.serving.sglang_plugin import SGLangImportFailed, _resolve

assert _resolve("fakesg.routing.route")() == 1 and _resolve("fakesg.routing.Args.check").__name__ == "check"
for target in ("fakesg.routing.gone", "fakesg.nosuch.route", "fakesg.routing.Args.gone"):
    with pytest.raises((AttributeError, ImportError)) as moved:
        _resolve(target)
    assert not isinstance(moved.value, SGLangImportFailed), target
with pytest.raises(SGLangImportFailed) as failed:
    _resolve("fakesg.broken.route")
print("BROKEN", failed.value.explain("9.9.9"))
with pytest.raises(SGLangImportFailed) as failed:
    _resolve("fakesg.raising.route")
print("RAISING", failed.value.explain("9.9.9"))
"""


def test_an_import_failure_inside_a_target_module_is_named_as_the_environment(tmp_path):
    """A module that raises while importing (here: it imports a package that is absent) is
    SGLang's environment, reported with the real exception and where it was raised; a module or
    function that does not exist is a target that moved. (In a process whose PYTHONPATH holds the
    stand-in package.)"""
    root = _package(tmp_path, {
        "fakesg/__init__.py": "",
        "fakesg/routing.py": "def route():\n    return 1\n\nclass Args:\n    def check(self):\n        pass\n",
        "fakesg/broken.py": "import absent_vision_package\n\ndef route():\n    return 1\n",
        "fakesg/raising.py": "raise RuntimeError('CUDA driver too old')\n",
    })
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, ROOT]))
    proc = subprocess.run([sys.executable, "-c", IMPORT_FAILURE_PROBE], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("BROKEN ", "RAISING ")))
    text = lines["BROKEN"]
    assert text.startswith("importing fakesg.broken (SGLang 9.9.9) raised ModuleNotFoundError: No module named "
                           "'absent_vision_package' at ") and "broken.py:1" in text, text
    assert "SGLang's environment, not its routing" in text and "'absent_vision_package'" in text.split(": ", 2)[2]
    assert "raised RuntimeError: CUDA driver too old at " in lines["RAISING"]


BLOCK_TORCHVISION = """
import importlib.abc, sys
class _NoTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torchvision":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NoTorchvision())
"""


def test_sglang_without_a_package_it_imports_is_reported_as_such(sglang_0523):
    """SGLang 0.5.23 in a Python without torchvision (which its config package imports): the plugin
    names that import and says it is SGLang's environment, not that the release is unsupported."""
    code = BLOCK_TORCHVISION + "from engine.serving.sglang_plugin import register; register()"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=_clean_env(HISPARSE_POLICY="sglang==0.5.23"))
    err = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1 and err.startswith("hisparse-router: importing sglang."), out.stderr[-2000:]
    assert "raised ModuleNotFoundError: No module named 'torchvision' at " in err and "has no" not in err, err
    assert "SGLang's environment, not its routing" in err
