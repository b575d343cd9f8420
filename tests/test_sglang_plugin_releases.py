"""The SGLang plugin against an older SGLang release's own code: the release environment named by
HISPARSE_PLUGIN_RELEASE_ENV (a folder ENVS/sglang-X of tools/sglang-env.sh, whose bin/python runs
the release's unpacked wheel on its base environment).

Collected only with that variable set: tools/conform-releases.sh (make conform-releases, which CI
runs after `make test`) builds the environments and runs this module once for each release it
lists in PLUGIN_RELEASES, one of every hook family the plugin drives before 0.5.19
(engine/sglang/hook_targets.py). `make test` does not collect it (tests/conftest.py); run by hand
without the variable it stops with an error, never a silent pass.

In the release's environment, as subprocesses (this module runs under the project's own Python):
- real launches, `python -m sglang.launch_server`, with the test-only GPU stand-in
  (tests/fixtures/sglang_standin) and hisparse-router's entry point as pyproject.toml declares it
  (a dist-info written here), cases (a) no policy, (b) the release's shipped version, (c) an
  edited copy changes the line (and records the decision), (e) a config the copy refuses at
  defaults stops before any routing line, (f) a policy that does not load exits 2, and a release
  the plugin would have to refuse for a moved target;
- in-process (tests/sglang_release_probe.py): the conform driver's launch path over a grid of
  over 1,000 configs, natively and with the plugin on the shipped version, which must agree on
  acceptance, messages, exception types, dtypes, backends and routing lines; and SGLang's own
  prepare_server_args + check_server_args on HiSparse launches, where (d) an edited allow-list
  lets through what the release refuses, in its own HiSparse check;
- from 0.5.12, DeepSeek-V4 launches: the shipped V4 version gives SGLang's own lines and refusals,
  an edited copy routes the launch (the plugin replaces V4's KV-dtype pass, 0.5.15 on) or stops it
  before routing (0.5.12-0.5.14, where it replaces nothing of V4). tools/conform-releases.sh runs
  these alone on V4_RELEASES too (`-k v4`)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import FIXTURES, ROOT

VARIABLE = "HISPARSE_PLUGIN_RELEASE_ENV"
if not os.environ.get(VARIABLE):
    raise RuntimeError(f"{__name__} needs {VARIABLE}=ENVS/sglang-X (a release environment of tools/sglang-env.sh); "
                       "tools/conform-releases.sh runs it so")

STANDIN = os.path.join(FIXTURES, "sglang_standin")
PROBE = os.path.join(ROOT, "tests", "sglang_release_probe.py")
ROUTING = re.compile(r"(HiSparse enabled|Set [DN]SA backends|Setting KV cache dtype|When specifying --)")
SITE_RULE = "This site runs HiSparse with a BF16 KV cache only; use --kv-cache-dtype bfloat16."
HISPARSE = ["--enable-hisparse", "--disable-radix-cache"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """(base python, PYTHONPATH, release) of the release environment: the stand-in, the entry point,
    this checkout and the release's wheel, in that order."""
    folder = os.environ[VARIABLE]
    launcher = open(os.path.join(folder, "bin", "python"), encoding="utf-8").read()
    wheel = re.search(r'PYTHONPATH="([^:"]+):', launcher)
    python = re.search(r'exec "([^"]+)"', launcher)
    assert wheel and python, f"{folder}/bin/python is not a launcher of tools/sglang-env.sh"
    release = os.path.basename(folder.rstrip("/")).removeprefix("sglang-")
    entry = tmp_path_factory.mktemp("entry-point")
    dist = entry / "hisparse_router-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hisparse-router\nVersion: 0\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text(_entry_points(), encoding="utf-8")
    path = os.pathsep.join([STANDIN, str(entry), ROOT, wheel.group(1)])
    return python.group(1), path, release


def _entry_points() -> str:
    """The `sglang.srt.plugins` entry points pyproject.toml declares, as a dist-info lists them."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        group = tomllib.load(f)["project"]["entry-points"]["sglang.srt.plugins"]
    assert group == {"hisparse_router": "engine.serving.sglang_plugin:register"}
    return "[sglang.srt.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in group.items())


def _run(env, argv, timeout=600, standin=True, **more):
    """The release's Python on `argv`; without the GPU stand-in where SGLang is not launched."""
    python, path, _ = env
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HISPARSE_", "SGLANG_"))}
    clean.update(PYTHONPATH=path if standin else path.split(os.pathsep, 1)[1], **more)
    return subprocess.run([python, "-W", "ignore", *argv], env=clean, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _probe(env, *argv, **more) -> dict:
    proc = _run(env, [PROBE, *argv], standin=argv[0] == "full", **more)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("PROBE "):])


def model_folder(env, tmp_path_factory, architecture: str) -> str:
    """A model folder of `architecture` holding a config.json the release's transformers reads."""
    folder = tmp_path_factory.mktemp("models")
    code = ("import sys; from engine.sglang.conform.model_folders import ModelFolders; "
            "print('FOLDER', ModelFolders(sys.argv[1]).path(sys.argv[2]))")
    proc = _run(env, ["-c", code, str(folder), architecture], standin=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = [line[len("FOLDER "):] for line in proc.stdout.splitlines() if line.startswith("FOLDER ")]
    assert os.path.isfile(os.path.join(path, "config.json")), path
    return path


@pytest.fixture(scope="module")
def model(env, tmp_path_factory) -> str:
    """A DeepSeek-V3.2 folder."""
    return model_folder(env, tmp_path_factory, "DeepseekV32ForCausalLM")


@pytest.fixture(scope="module")
def shipped(env):
    import engine

    return engine.load_policy(f"sglang=={env[2]}")


@pytest.fixture(scope="module")
def edited(shipped, tmp_path_factory) -> str:
    """A copy of the release's shipped version (keeping its number), with three edits: a BF16 KV
    cache without HiSparse on SM9 decodes with flashmla_sparse (SGLang: fa3); HiSparse with BF16
    allows decode fa3 (SGLang refuses it); a site rule, at defaults, refuses HiSparse with FP8."""
    text = open(shipped.file, encoding="utf-8").read()
    rule = "    - name: bf16\n      set: {prefill: flashmla_sparse, decode: fa3}"
    edits = [(rule, rule.replace("decode: fa3", "decode: flashmla_sparse"))]
    if "require: {backend: flashmla_sparse}" in text:  # 0.5.11's check: flashmla_sparse only
        edits.append(("require: {backend: flashmla_sparse}", "require: {backend: {in: [flashmla_sparse, fa3]}}"))
    else:
        edits.append(("bfloat16: [flashmla_sparse]", "bfloat16: [flashmla_sparse, fa3]"))
    checks = text.index("\nchecks:")
    rules = text.index("\n  rules:\n", checks) + len("\n  rules:\n")
    text = (text[:rules] + "    - name: site-hisparse-fp8-only\n      at: defaults\n"
            "      when: {dsa_model: true, enable_hisparse: true, kv_cache_dtype: fp8_e4m3}\n"
            "      require: {enable_hisparse: false}\n"
            f"      message: {SITE_RULE}\n" + text[rules:])
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    folder = tmp_path_factory.mktemp("policy") / shipped.family
    folder.mkdir()
    path = folder / f"v{shipped.version}.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def launch(env, model, flags, **more):
    """(exit code, routing lines, the plugin's lines, all output) of `python -m sglang.launch_server`."""
    proc = _run(env, ["-m", "sglang.launch_server", "--model-path", model, *flags], **more)
    out = proc.stdout + proc.stderr
    messages = [m.group(1) for m in re.finditer(r"^\[[^\]]*\] (.*)$", out, re.M)]
    return (proc.returncode, [m for m in messages if ROUTING.match(m)],
            [line for line in out.splitlines() if "hisparse-router" in line], out)


def _lines(policy, config) -> list:
    decision = policy.evaluate(config)
    assert decision.ok, decision.error
    return list(decision.log)


def test_the_environment_runs_the_release_it_is_named_after(env):
    proc = _run(env, ["-c", "import importlib.metadata as m; print(m.version('sglang'))"])
    assert proc.stdout.strip() == env[2], proc.stderr[-2000:]
    from engine.sglang.hook_targets import family_of

    assert family_of(env[2]) is not None


@pytest.fixture(scope="module")
def native(env, model):
    """SGLang's own launch of HiSparse with the KV dtype left to auto."""
    return launch(env, model, HISPARSE)


def test_a_without_the_variable_sglang_routes_by_its_own_code(native, shipped):
    """(a) SGLang's own lines (those the release's shipped version models), nothing of the plugin;
    the launch routes, then stops for lack of the HTTP server packages."""
    code, routing, ours, out = native
    assert routing == _lines(shipped, {"dsa_model": True, "enable_hisparse": True, "disable_radix_cache": True}), \
        out[-3000:]
    assert any(line.startswith("HiSparse enabled") for line in routing)
    assert ours == [] and code == 1 and "No module named 'uvicorn'" in out


def test_b_the_shipped_version_gives_sglangs_lines_and_names_itself(env, model, shipped, native):
    """(b) HISPARSE_POLICY=installed (the version modelling the installed release): SGLang's lines
    word for word, then the line naming the policy; also with SGLANG_PLUGINS naming it."""
    code, routing, ours, out = launch(env, model, HISPARSE, HISPARSE_POLICY="installed",
                                      SGLANG_PLUGINS="hisparse_router,hisparse_test_gpu")
    assert routing == native[1] and routing, out[-3000:]
    assert len(ours) == 1 and ours[0].endswith(
        f"hisparse-router: DSA routing decided by policy {shipped.family}@{shipped.version} "
        f"sha256={shipped.sha256[:12]}"), out[-3000:]
    assert code == 1 and "No module named 'uvicorn'" in out


def test_c_an_edited_copy_changes_the_line_and_records_it(env, model, shipped, edited, tmp_path):
    """(c) BF16 without HiSparse on SM9: SGLang decodes with fa3, the copy with flashmla_sparse; the
    decision the launch made is recorded and replays."""
    import engine

    config = {"dsa_model": True, "kv_cache_dtype": "bfloat16"}
    flags = ["--kv-cache-dtype", "bfloat16"]
    code, routing, _, out = launch(env, model, flags)
    assert routing == _lines(shipped, config) and routing[-1].endswith("decode=fa3."), out[-3000:]
    record = tmp_path / "decisions.jsonl"
    code, routing, ours, out = launch(env, model, flags, HISPARSE_POLICY=edited, HISPARSE_RECORD=str(record))
    assert routing == _lines(engine.load_policy(edited), config), out[-3000:]
    assert routing[-1].endswith("prefill=flashmla_sparse, decode=flashmla_sparse."), routing
    assert len(ours) == 1 and ours[0].endswith(f" from {edited}") and code == 1 and "uvicorn" in out
    records = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    assert [r["decision"]["backends"] for r in records] == [{"prefill": "flashmla_sparse", "decode": "flashmla_sparse"}]
    from tests.helpers import run_process

    assert run_process("replay", str(record), "--policy", edited).returncode == 0
    assert run_process("replay", str(record), "--policy", f"sglang=={env[2]}").returncode == 1


def test_e_a_config_the_copy_refuses_stops_before_any_routing_line(env, model, edited):
    """(e) The copy's check at defaults refuses HiSparse with FP8: the launch stops with its
    message, a ValueError as SGLang's own DSA-step refusals, and no backend line."""
    code, routing, ours, out = launch(env, model, [*HISPARSE, "--kv-cache-dtype", "fp8_e4m3"], HISPARSE_POLICY=edited)
    assert code == 1 and f"ValueError: {SITE_RULE}" in out, out[-3000:]
    assert routing == [] and len(ours) == 1 and "uvicorn" not in out


def test_f_a_policy_that_does_not_load_exits_2(env, model, shipped, tmp_path):
    bad = tmp_path / f"v{shipped.version}.yaml"
    bad.write_text(f"policy: {shipped.family}\nversion: {shipped.version}\ninputs: [\n", encoding="utf-8")
    code, routing, ours, out = launch(env, model, HISPARSE, HISPARSE_POLICY=str(bad))
    assert code == 2 and routing == [] and "Traceback" not in out, out[-3000:]
    assert len(ours) == 1 and re.match(rf"hisparse-router: HISPARSE_POLICY={re.escape(str(bad))}: "
                                       rf"{re.escape(str(bad))}:\d+:\d+: E10\d", ours[0]), ours


def test_a_target_the_release_lacks_stops_the_launch_naming_it(env, model):
    """The table names a function this release does not have: exit 1, one line naming the target
    and the release, nothing routed."""
    code = ("import runpy, sys; from engine.sglang import hook_targets as t; "
            "from engine.serving.sglang_plugin import installed_release; "
            "family = t.family_of(installed_release()); "
            "target = next(iter(family.replace)); family.replace = {target + '_moved': family.replace[target], "
            "**{k: v for k, v in family.replace.items() if k != target}}; "
            "sys.argv = ['sglang.launch_server', *sys.argv[1:]]; "
            "runpy.run_module('sglang.launch_server', run_name='__main__')")
    proc = _run(env, ["-c", code, "--model-path", model, *HISPARSE], HISPARSE_POLICY="installed")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and re.search(rf"hisparse-router: SGLang {re.escape(env[2])} has no \S+_moved", out), \
        out[-3000:]
    assert not [m for m in re.findall(r"^\[[^\]]*\] (.*)$", out, re.M) if ROUTING.match(m)]


def test_the_shipped_version_drives_the_launch_path_as_sglangs_own_code(env):
    """In-process, over a grid of over 1,000 configs (a stratified sample of the DSA domain and of
    the whole domain): the plugin on the shipped version agrees with the release's own code on
    acceptance, message, exception type, dtype, backends and every routing line, those logged
    before a refusal included. On 0.5.11, whose HiSparse check sits inside check_server_args, the
    driver runs SGLang's check (the plugin's is the next test's)."""
    out = _probe(env, "grid", "installed")
    assert out["release"] == env[2] and out["cases"] >= 1000
    assert out["accepted"] > 100 and out["refused"] > 100 and out["lines_before_refusal"] > 10
    assert out["hisparse_lines"] > 100
    assert out["differ"] == 0, json.dumps(out["first_differences"], indent=1)


LAUNCHES = {  # {dsa}: the release's spelling of the backend flags
    "bf16": ["--kv-cache-dtype", "bfloat16"],
    "hisparse-radix-cache": ["--kv-cache-dtype", "bfloat16", "--enable-hisparse"],
    "hisparse-bf16": ["--kv-cache-dtype", "bfloat16", *HISPARSE],
    "hisparse-fp8-prefill-sparse": ["--kv-cache-dtype", "fp8_e4m3", *HISPARSE, "--{dsa}-prefill-backend",
                                    "flashmla_sparse"],
    "hisparse-decode-fa3": ["--kv-cache-dtype", "bfloat16", *HISPARSE, "--{dsa}-decode-backend", "fa3"],
}


def test_sglangs_own_check_server_args_judges_by_the_policy(env, model, shipped, edited):
    """SGLang's own prepare_server_args + check_server_args (the GPU stand-in), where the release
    keeps its HiSparse check: with the shipped version they accept and refuse as SGLang does, with
    the same messages and exception types; (d) with the edited copy, HiSparse BF16 with decode fa3,
    which SGLang refuses in its HiSparse check, is accepted."""
    spelling = "nsa" if any(name.startswith("nsa_") for name in shipped.inputs) else "dsa"
    argvs = [["--model-path", model, *[f.replace("{dsa}", spelling) for f in flags]] for flags in LAUNCHES.values()]
    same = dict(zip(LAUNCHES, _probe(env, "full", "installed", json.dumps(argvs))))
    for name, pair in same.items():
        assert pair["plugin"] == pair["sglang"], (name, pair)
    assert [name for name, pair in same.items() if pair["sglang"]["ok"]] == ["bf16", "hisparse-bf16"], same
    assert same["hisparse-radix-cache"]["sglang"]["error"] == "AssertionError"
    assert same["hisparse-decode-fa3"]["sglang"]["error"] == "ValueError"
    copy = dict(zip(LAUNCHES, _probe(env, "full", edited, json.dumps(argvs))))
    assert {name: pair["sglang"] for name, pair in copy.items()} == {name: pair["sglang"] for name, pair in same.items()}
    assert copy["hisparse-decode-fa3"]["plugin"] == {"ok": True, "values": {
        **same["hisparse-bf16"]["sglang"]["values"], f"{spelling}_decode_backend": "fa3"}}, copy


# -- DeepSeek-V4 launches (0.5.12 on): the release's V4 hook family (engine/sglang/registry.py) -------
V4_ROUTING = re.compile(r"^(?!hisparse-router).* for DeepseekV4ForCausalLM[.,]")
V4_KV_EDIT = ("when: {kv_cache_dtype: auto}\n      set: {kv_cache_dtype: fp8_e4m3}",
              "when: {kv_cache_dtype: auto}\n      set: {kv_cache_dtype: bfloat16}")


@pytest.fixture(scope="module")
def v4(env, tmp_path_factory):
    """(the release's shipped DeepSeek-V4 version, a DeepSeek-V4 model folder, the release's V4
    hook family); skipped on a release that serves no V4 model (0.5.11)."""
    from engine.sglang.policy_sets import load_policy_set
    from engine.sglang.registry import release

    policy = load_policy_set(f"sglang=={env[2]}").for_class("dsv4")
    if policy is None:
        pytest.skip(f"SGLang {env[2]} serves no DeepSeek-V4 model")
    path = model_folder(env, tmp_path_factory, "DeepseekV4ForCausalLM")
    return policy, path, release(env[2]).class_hooks["dsv4"]


def v4_launch(env, v4, flags, **more):
    """(exit code, SGLang's DeepSeek-V4 routing lines, the plugin's lines, all output) of a real
    V4 launch on an SM90 GPU stand-in whose GPU-generation helpers answer too (V4 reads them)."""
    code, _, ours, out = launch(env, v4[1], flags, HISPARSE_TEST_ARCH_HELPERS="1", **more)
    messages = [m.group(1) for m in re.finditer(r"^\[[^\]]*\] (.*)$", out, re.M)]
    return code, [m for m in messages if V4_ROUTING.match(m)], [m for m in messages if "hisparse-router" in m], out


def _v4_line(v4, policy=None, shown_as: str = "") -> str:
    policy, hooks = policy or v4[0], v4[2]
    verb = "checked against" if hooks == "v4-checked" else "decided by"  # 0.5.12-0.5.14: nothing replaced
    return (f"hisparse-router: DeepSeek-V4 routing {verb} policy {policy.family}@{policy.version} "
            f"sha256={policy.sha256[:12]}" + (f" from {shown_as}" if shown_as else ""))


def test_v4_the_shipped_version_gives_sglangs_lines_and_names_itself(env, v4):
    """A DeepSeek-V4 HiSparse launch: SGLang's own V4 routing lines word for word with the
    release's shipped V4 version as without the plugin (the dsv4 backend, an FP8 KV cache), and
    one line naming the version; the launch goes on to the HTTP server either way."""
    code, native, ours, out = v4_launch(env, v4, HISPARSE)
    assert "Use dsv4 attention backend for DeepseekV4ForCausalLM, setting page_size to 256." in native, out[-3000:]
    assert "Setting KV cache dtype to fp8_e4m3 for DeepseekV4ForCausalLM." in native
    assert ours == [] and code == 1 and "No module named 'uvicorn'" in out
    code, routed, ours, out = v4_launch(env, v4, HISPARSE, HISPARSE_POLICY="installed")
    assert routed == native and ours == [_v4_line(v4)], out[-3000:]
    assert code == 1 and "No module named 'uvicorn'" in out


def test_v4_a_launch_sglang_refuses_is_refused_with_its_text(env, v4):
    """`--kv-cache-dtype fp8_e5m2`: SGLang's V4 KV-dtype check raises; with the plugin the launch
    stops with the same exception and text, which is the policy's first violation."""
    policy = v4[0]
    decision = policy.evaluate({"kv_cache_dtype": "fp8_e5m2"})
    assert not decision.ok
    text = f"{decision.violations[0].raises}: {decision.violations[0].message}"
    assert text == "AssertionError: fp8_e5m2 is not supported for DeepseekV4ForCausalLM"
    code, native, _, out = v4_launch(env, v4, ["--kv-cache-dtype", "fp8_e5m2"])
    assert code == 1 and text in out and "uvicorn" not in out, out[-3000:]
    code, routed, ours, out = v4_launch(env, v4, ["--kv-cache-dtype", "fp8_e5m2"], HISPARSE_POLICY="installed")
    assert code == 1 and text in out and "uvicorn" not in out and routed == native, out[-3000:]
    assert ours == [_v4_line(v4)]


def test_v4_an_edited_copy_routes_the_launch_or_stops_it(env, v4, tmp_path):
    """The copy sets an auto KV dtype to bfloat16. Where the release's V4 KV-dtype pass is the
    plugin's (0.5.15 on) the launch runs with it and records it; where the plugin replaces nothing
    of V4 (0.5.12-0.5.14) it cannot enforce the edit: the launch stops before routing, naming why."""
    policy, _, hooks = v4
    text = open(policy.file, encoding="utf-8").read()
    assert text.count(V4_KV_EDIT[0]) == 1
    path = tmp_path / policy.family / f"v{policy.version}.yaml"
    path.parent.mkdir()
    path.write_text(text.replace(*V4_KV_EDIT), encoding="utf-8")
    record = tmp_path / "decisions.jsonl"
    code, routed, ours, out = v4_launch(env, v4, [], HISPARSE_POLICY=str(path), HISPARSE_RECORD=str(record))
    if hooks == "v4-checked":
        assert code == 1 and routed == [] and "uvicorn" not in out, out[-3000:]
        assert (f"NotEnforceable: hisparse-router: {policy.family}@{policy.version} decides this DeepSeek-V4 "
                f"launch otherwise than SGLang {env[2]}'s own code where the plugin does not replace it") in out
        return
    assert "Setting KV cache dtype to bfloat16 for DeepseekV4ForCausalLM." in routed, out[-3000:]
    import engine

    assert ours == [_v4_line(v4, engine.load_policy(str(path)), str(path))] and code == 1 and "No module named 'uvicorn'" in out
    (entry,) = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    assert entry["decision"]["kv_cache_dtype"] == "bfloat16" and entry["decision"]["model_family"] == "deepseek_v4"
