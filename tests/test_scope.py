"""What a decision covers (issue: scope and assumptions): `in_scope` from the version's
`upstream.leaves_out[].when`, `not_applicable` from `inputs[].applies`, through evaluate, explain,
the JSON decision, records and replay, table, diff, apply and conform; and the text lines that say
which platform, SM and model a decision assumed and where each came from."""
from __future__ import annotations

import json
import os
import re
import types

import pytest

import engine
from engine.files.shipped import DEFAULT_POLICY
from engine.sglang.given import config_of
from tests.helpers import bulk_decisions, run_cli, write_policy
from engine.analysis import domain

POLICY = engine.load_policy(DEFAULT_POLICY)  # the newest shipped version
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), POLICY.path)


def decide(**given):
    given = {k.replace("_", "-"): v for k, v in given.items()}
    return POLICY.evaluate(config_of(POLICY, given)[0])


def without_scope(text: str) -> str:
    """The shipped file with every leaves_out `when` removed (the data before scope was declared)."""
    head, rest = text.split("\ninputs:", 1)
    return re.sub(r"\n      when: \{[^\n]*\}", "", head) + "\ninputs:" + rest


def family_copy(tmp_path, text: str) -> str:
    return write_policy(tmp_path, text, f"{POLICY.family}/v{POLICY.version}.yaml")


# -- the decision --------------------------------------------------------------------------------
@pytest.mark.parametrize("given, where", [
    ({"model_path": LLAMA, "kv_cache_dtype": "mxfp8"}, "handle_mxfp8_kv_cache_compatibility"),
    ({"model_path": LLAMA, "kv_cache_dtype": "nvfp4", "sm_major": 8}, "handle_kv4_compatibility"),
    ({"model_path": "Qwen/Qwen3-8B", "kv_cache_dtype": "fp4_mx_block16", "platform": "hip"},
     "handle_kv4_compatibility"),
    ({"model_path": LLAMA, "sm_major": 10}, "_mla_kv_cache_dtype_checks"),
    ({"model_path": "mistralai/Mixtral-8x7B"}, "handle_attention_backend_compatibility"),
    ({"dsa_model": False, "kv_cache_dtype": "bfloat16"}, "handle_attention_backend_compatibility"),
])
def test_a_non_dsa_model_is_out_of_scope_with_the_reason(given, where):
    d = decide(**given)
    assert d.ok and not d.in_scope
    assert d.out_of_scope["where"].endswith(where) and "non-DSA" in d.out_of_scope["why"]
    data = d.to_dict()
    assert data["in_scope"] is False and data["out_of_scope"] == d.out_of_scope
    # the DSA family means nothing for a model that is not DSA: never reported as deepseek_v32
    assert data["model_family"] is None and data["not_applicable"] == ["model_family"]
    assert d.config["model_family"] == POLICY.inputs["model_family"].default  # evaluation is unchanged


@pytest.mark.parametrize("given, family", [
    ({"model_path": "deepseek-ai/DeepSeek-V3.2", "enable_hisparse": True, "disable_radix_cache": True},
     "deepseek_v32"),
    ({"model_path": "zai-org/GLM-5", "kv_cache_dtype": "fp8_e4m3", "sm_major": 12}, "glm5"),
    ({"kv_cache_dtype": "bfloat16"}, "deepseek_v32"),
    ({"model_path": "deepseek-ai/DeepSeek-V3.2", "kv_cache_dtype": "mxfp8"}, "deepseek_v32"),  # rejected, in scope
])
def test_a_dsa_model_is_in_scope(given, family):
    d = decide(**given)
    data = d.to_dict()
    assert d.in_scope and data["in_scope"] is True and "out_of_scope" not in data
    assert data["model_family"] == family and "not_applicable" not in data


@pytest.mark.parametrize("every", [pytest.param(7, marks=pytest.mark.whole), None])
def test_bulk_and_single_decisions_agree_on_scope_over_the_domain(every):
    """Every 7th config of the domain (make test-whole), or a stratified sample of it (make test)."""
    from engine.sglang.conform.sample import axes, stratified

    seen = set()
    configs = ([config for k, config in enumerate(domain.configs(POLICY)) if not k % every] if every
               else stratified(axes(POLICY), 3000, 1))
    for config, bulk in zip(configs, bulk_decisions(POLICY, configs)):
        d, traced = POLICY.evaluate(config), POLICY.trace(config)[0]
        assert (bulk.in_scope, bulk.out_of_scope) == (d.in_scope, d.out_of_scope), config
        assert (traced.in_scope, traced.not_applicable) == (d.in_scope, d.not_applicable), config
        assert d.in_scope == config["dsa_model"], config  # today: exactly the non-DSA models
        seen.add(d.in_scope)
    assert seen == {True, False}


def test_a_when_names_only_declared_inputs_and_values(tmp_path):
    text = open(SOURCE, encoding="utf-8").read()
    bad = text.replace("when: {dsa_model: false, kv_cache_dtype: mxfp8}", "when: {dsa_modl: false, kv_cache_dtype: mxfp9}")
    assert bad != text
    with pytest.raises(engine.PolicyError) as exc:
        engine.load_policy(family_copy(tmp_path, bad))
    got = {(p.code, p.message) for p in exc.value.problems}
    assert ("E301", "unknown input 'dsa_modl'") in got
    assert any(c == "E302" and "mxfp9" in m for c, m in got)
    line = text[:text.index("when: {dsa_model: false, kv_cache_dtype: mxfp8}")].count("\n") + 1
    assert all(p.line == line and p.col > 1 for p in exc.value.problems)


def test_a_policy_without_when_loads_and_keeps_everything_in_scope(tmp_path):
    policy = engine.load_policy(family_copy(tmp_path, without_scope(open(SOURCE, encoding="utf-8").read())))
    d = policy.evaluate({"dsa_model": False, "kv_cache_dtype": "mxfp8"})
    assert d.ok and d.in_scope and d.to_dict()["in_scope"] is True


# -- the command line ----------------------------------------------------------------------------
def test_evaluate_says_out_of_scope_in_text_and_json(capsys):
    launch = ["--", "python", "-m", "sglang.launch_server", "--model-path", LLAMA, "--kv-cache-dtype", "mxfp8"]
    code, out, _ = run_cli(capsys, "evaluate", *launch)
    lines = out.splitlines()
    assert code == 0
    assert lines[0] == f"ACCEPTED by {POLICY.ref} (OUT OF SCOPE: {POLICY.ref} does not model the verdict of " \
                       f"{POLICY.upstream.label()} here)"
    assert lines[1].startswith("  out of scope: generic KV-dtype gate") and "handle_mxfp8" in lines[1]
    code, out, _ = run_cli(capsys, "evaluate", "--format", "json", *launch)
    data = json.loads(out)
    assert code == 0 and data["in_scope"] is False and data["out_of_scope"]["where"].endswith(
        "handle_mxfp8_kv_cache_compatibility") and data["model_family"] is None
    code, out, _ = run_cli(capsys, "evaluate", "--model-path", "deepseek-ai/DeepSeek-V3.2")
    assert code == 0 and out.splitlines()[0] == f"ACCEPTED by {POLICY.ref}" and "out of scope" not in out


def test_a_rejected_config_out_of_scope_says_both(capsys):
    code, out, _ = run_cli(capsys, "evaluate", "--model-path", LLAMA, "--enable-hisparse", "--disable-radix-cache")
    first = out.splitlines()[0]
    assert code == 1 and first.startswith(f"REJECTED by {POLICY.ref}: --enable-hisparse is only supported")
    assert first.endswith(f"does not model the verdict of {POLICY.upstream.label()} here)")


def test_explain_says_out_of_scope(capsys):
    code, out, _ = run_cli(capsys, "explain", "--no-dsa-model", "--kv-cache-dtype", "nvfp4", "--sm-major", "8")
    assert code == 0 and "  out of scope: generic KV4 (nvfp4) gates" in out
    assert "OUT OF SCOPE" in out and "model_family=not applicable (it applies only where dsa_model == true)" in out


def test_batch_lines_carry_scope(tmp_path, capsys):
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"model-path": "%s", "kv-cache-dtype": "mxfp8"}\n{"kv-cache-dtype": "bfloat16"}\n' % LLAMA)
    code, out, _ = run_cli(capsys, "evaluate", "--batch", str(batch))
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["in_scope"] for r in rows] == [False, True]


def test_records_keep_scope_and_replay_shows_it(tmp_path, capsys):
    record = str(tmp_path / "r.jsonl")
    run_cli(capsys, "evaluate", "--record", record, "--model-path", LLAMA, "--kv-cache-dtype", "mxfp8")
    run_cli(capsys, "evaluate", "--record", record, "--kv-cache-dtype", "fp8_e4m3")
    recs = [json.loads(line) for line in open(record, encoding="utf-8")]
    assert [r["decision"]["in_scope"] for r in recs] == [False, True]
    assert recs[0]["decision"]["out_of_scope"]["why"].startswith("generic KV-dtype gate")
    code, out, _ = run_cli(capsys, "replay", record)
    assert code == 0 and f"out of scope: 1 of the 2 decisions, re-evaluated, lie outside what {POLICY.ref} models" in out
    # against a version that does not say which configs it leaves out, the scope changes
    other = family_copy(tmp_path / "old", without_scope(open(SOURCE, encoding="utf-8").read()))
    code, out, _ = run_cli(capsys, "replay", record, "--policy", other, "--format", "json")
    data = json.loads(out)
    assert code == 1 and data["counts"]["scope_changed"] == 1 and data["groups"][0]["lines"] == [1]
    assert data["groups"][0]["change"].startswith("now in scope (was out: generic KV-dtype gate")
    # a record from before decisions carried a scope is not a change
    old = tmp_path / "old.jsonl"
    rec = recs[0]
    for key in ("in_scope", "out_of_scope", "not_applicable"):
        rec["decision"].pop(key)
    rec["decision"]["model_family"] = POLICY.inputs["model_family"].default  # as it was reported then
    old.write_text(json.dumps(rec) + "\n")
    code, out, _ = run_cli(capsys, "replay", str(old))
    assert code == 0 and "stay the same" in out


def test_a_tampered_scope_in_a_record_is_a_problem_of_its_line(tmp_path, capsys):
    record = str(tmp_path / "r.jsonl")
    run_cli(capsys, "evaluate", "--record", record, "--no-dsa-model")
    rec = json.loads(open(record, encoding="utf-8").read())
    for bad in ({"where": 1}, "text", [1]):
        rec["decision"]["out_of_scope"] = bad
        (tmp_path / "t.jsonl").write_text(json.dumps(rec) + "\n")
        code, out, _ = run_cli(capsys, "replay", str(tmp_path / "t.jsonl"))
        assert code == 2 and "C505: decision.out_of_scope" in out


def test_table_marks_rows_out_of_scope(capsys):
    code, out, _ = run_cli(capsys, "table", "--where", "kv_cache_dtype=mxfp8", "--where", "platform=cuda",
                           "--where", "sm_major=9", "--format", "json")
    rows = json.loads(out)["rows"]
    assert code == 0 and rows
    for row in rows:
        assert row["in_scope"] == (row["when"].get("dsa_model") == [True])
        assert row["in_scope"] or row["out_of_scope"].startswith("generic KV-dtype gate")
    code, out, _ = run_cli(capsys, "table", "--where", "kv_cache_dtype=mxfp8", "--where", "sm_major=9")
    assert code == 0 and "  out of scope (1)" in out.splitlines()  # the row's own mark
    assert "out (1): not modelled here, upstream's verdict may differ: generic KV-dtype gate" in out
    code, out, _ = run_cli(capsys, "table", "--where", "dsa_model=true")
    assert code == 0 and "out of scope" not in out
    code, out, _ = run_cli(capsys, "table", "--format", "json")
    entries = json.loads(out)["upstream"]["leaves_out"]
    assert entries[0]["when"] == "dsa_model == false and kv_cache_dtype == mxfp8"
    assert "when" not in entries[-1]  # decode context parallelism: no input says it


def test_diff_counts_configs_whose_scope_changes(tmp_path, capsys):
    other = family_copy(tmp_path, without_scope(open(SOURCE, encoding="utf-8").read()))
    code, out, _ = run_cli(capsys, "diff", other, POLICY.path, "--format", "json", "--where", "sm_major=9",
                           "--where", "platform=cuda")
    data = json.loads(out)
    non_dsa = sum(1 for c in domain.configs(POLICY, {"sm_major": [9], "platform": ["cuda"]}) if not c["dsa_model"])
    assert code == 1 and data["counts"]["scope_changed"] == non_dsa
    assert sum(data["counts"].values()) == non_dsa  # nothing else changes
    assert all(g["class"] == "scope_changed" and g["change"].startswith("now out of scope: ") for g in data["groups"])
    assert all(g["example"]["b"]["out_of_scope"] for g in data["groups"])
    code, out, _ = run_cli(capsys, "diff", other, POLICY.path, "--where", "sm_major=9", "--where", "platform=cuda")
    assert code == 1 and "scope_changed" in out and "(out of scope)" in out
    code, _, _ = run_cli(capsys, "diff", POLICY.path, POLICY.path)
    assert code == 0


def test_apply_returns_the_scope():
    from engine.sglang import apply

    args = types.SimpleNamespace(model_path=LLAMA, kv_cache_dtype="mxfp8", dsa_prefill_backend=None,
                                 dsa_decode_backend=None, enable_hisparse=False, disable_radix_cache=False)
    d = apply(args, POLICY.path, platform="cuda", sm_major=9)
    assert d.ok and not d.in_scope and d.to_dict()["in_scope"] is False
    args = types.SimpleNamespace(model_path="deepseek-ai/DeepSeek-V3.2", kv_cache_dtype="auto",
                                 dsa_prefill_backend=None, dsa_decode_backend=None, enable_hisparse=False,
                                 disable_radix_cache=False)
    d = apply(args, POLICY.path, platform="cuda", sm_major=9)
    assert d.ok and d.in_scope and args.kv_cache_dtype == "bfloat16"


# -- conform uses the same data ------------------------------------------------------------------
def _compare(configs, results):
    from engine.sglang.conform import cases, report

    return report.compare(POLICY, configs, [cases.case_of(POLICY, c) for c in configs], results, sampled=False)


def test_conform_and_evaluate_never_disagree_on_scope():
    from engine.sglang.conform.protocol import Result

    place = "srt/arg_groups/attention_hook.py:226 handle_attention_backend_compatibility"
    configs = [c for k, c in enumerate(domain.configs(POLICY)) if not k % 97]
    results = []
    for c in configs:  # SGLang refuses every config at a left-out place; the policy says what it covers
        d = POLICY.evaluate(c)
        results.append(Result(False, "refused", None, (None, None), (), "check", place, "ValueError")
                       if d.ok else Result(False, d.error, None, (None, None), tuple(d.log), "check", None,
                                           d.violations[0].raises))
    got = _compare(configs, results)
    out_of_scope = sum(1 for c in configs if not POLICY.evaluate(c).in_scope and POLICY.evaluate(c).ok)
    assert out_of_scope and got["counts"]["out_of_scope"] == out_of_scope
    # the accepted configs in scope refused there are differences: the scope data would have missed them
    in_scope_ok = sum(1 for c in configs if POLICY.evaluate(c).in_scope and POLICY.evaluate(c).ok)
    assert in_scope_ok and got["counts"]["differ"] == in_scope_ok and not got["conformant"]
    for g in got["out_of_scope"]:
        assert not POLICY.evaluate(g["example"]["config"]).in_scope


def test_conform_refusal_in_scope_at_a_left_out_place_is_a_difference():
    from engine.sglang.conform.protocol import Result

    c = POLICY.complete({"kv_cache_dtype": "mxfp8"})  # a DSA model: in scope, rejected by the policy
    d = POLICY.evaluate(c)
    assert d.in_scope and not d.ok
    r = Result(False, "--kv-cache-dtype mxfp8 requires an SM100+ (Blackwell) GPU", None, (None, None), (),
               "resolve", "srt/arg_groups/kv_cache_hook.py:107 handle_mxfp8_kv_cache_compatibility", "ValueError")
    got = _compare([c], [r])
    assert not got["conformant"] and got["counts"] == {"agree": 0, "differ": 1, "out_of_scope": 0}


# -- assumptions ---------------------------------------------------------------------------------
def assumed(out: str) -> dict:
    """input -> where its assumed value came from, from the `assumed:` line."""
    (line,) = re.findall(r"^  assumed: (.*)$", out, re.M)
    got = {}
    for items, origin in re.findall(r"(.*?) \(([^()]*)\)(?:; |$)", line):
        for item in items.split(", "):
            got[item.split("=")[0]] = origin
    return got


def test_text_says_what_was_assumed_and_from_where(capsys):
    code, out, _ = run_cli(capsys, "evaluate")
    got = assumed(out)
    assert code == 0 and got == {name: "the policy's default" for name in
                                 ("platform", "sm_major", "sm_minor", "dsa_model", "model_family")}
    code, out, _ = run_cli(capsys, "evaluate", "--sm-major", "10", "--model-path", "deepseek-ai/DeepSeek-V3.2")
    got = assumed(out)
    assert got["sm_major"] == "given: the command line" and got["platform"] == "the policy's default"
    assert got["dsa_model"] == got["model_family"] == "read from the name DeepSeek-V3.2"
    assert "  assumed: platform=cuda, sm_minor=0 (the policy's default); sm_major=10 (given: the command line); " \
           "dsa_model=true, model_family=deepseek_v32 (read from the name DeepSeek-V3.2)" in out


def test_without_a_kv_dtype_sm9_and_sm10_differ_and_the_text_says_which(capsys):
    _, nine, _ = run_cli(capsys, "evaluate", "--sm-major", "9")
    _, ten, _ = run_cli(capsys, "evaluate", "--sm-major", "10")
    assert "kv_cache_dtype: auto resolved to bfloat16" in nine and "kv_cache_dtype: auto resolved to fp8_e4m3" in ten
    assert "sm_major=9 (given: the command line)" in nine and "sm_major=10 (given: the command line)" in ten


def test_a_launch_command_and_a_config_file_are_named(tmp_path, capsys):
    conf = tmp_path / "server.yaml"
    conf.write_text("platform: hip\n")
    code, out, _ = run_cli(capsys, "evaluate", "--config", str(conf), "--", "python", "-m", "sglang.launch_server",
                           "--model-path", "zai-org/GLM-5")
    got = assumed(out)
    assert code == 0 and got["platform"] == f"given: {conf}" and got["model_family"] == "read from the name GLM-5"


def test_a_model_folder_is_named(tmp_path, capsys):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["GlmMoeDsaForCausalLM"], "index_topk": 2048}')
    code, out, _ = run_cli(capsys, "explain", "--model-path", str(folder))
    got = assumed(out)
    assert code == 0 and got["model_family"] == f"read from GlmMoeDsaForCausalLM in {folder / 'config.json'}"
    assert "dsa_model=true, model_family=glm5 (read from GlmMoeDsaForCausalLM in" in out


@pytest.mark.parametrize("path", ["./models/DeepSeek-V3.2", "../DeepSeek-V3.2", "/nonexistent/DeepSeek-V3.2",
                                  "~/DeepSeek-V3.2", "models/deepseek-ai/DeepSeek-V3.2"])
def test_a_missing_local_model_path_gets_a_note(path, capsys):
    code, out, err = run_cli(capsys, "evaluate", "--model-path", path)
    assert code == 0 and f"note: {path}: no such file or folder; it looks like a local path" in err
    assert "dsa_model=true, model_family=deepseek_v32 (read from the name DeepSeek-V3.2)" in out


@pytest.mark.parametrize("path", ["deepseek-ai/DeepSeek-V3.2", "DeepSeek-V3.2"])
def test_a_hub_name_gets_no_note(path, capsys):
    code, _, err = run_cli(capsys, "evaluate", "--model-path", path)
    assert code == 0 and "no such file" not in err


def test_an_existing_local_folder_gets_no_missing_note(tmp_path, capsys):
    folder = tmp_path / "DeepSeek-V3.2"
    folder.mkdir()  # no config.json: read by its name, but it exists
    code, _, err = run_cli(capsys, "evaluate", "--model-path", str(folder))
    assert code == 0 and "no such file" not in err


@pytest.mark.parametrize("config, hint", [
    ('{"topk": 1024}', "did you mean 'top_k'?"),
    ('{"device_bufer_size": 4096}', "did you mean 'device_buffer_size'?"),
    ('{"top_k": 1024, "swap_in_blocksize": 64}', "did you mean 'swap_in_block_size'?"),
    ('{"zzz": 1}', "(it reads top_k, device_buffer_size"),
])
def test_unread_hisparse_config_keys_get_a_note(config, hint, capsys):
    code, _, err = run_cli(capsys, "evaluate", "--hisparse-config", config)
    notes = [line for line in err.splitlines() if "SGLang does not read the key" in line]
    assert code == 0 and len(notes) == 1 and hint in notes[0]
    assert notes[0].startswith("note: hisparse-config (the command line): SGLang does not read the key")


def test_keys_sglang_reads_get_no_note(capsys):
    code, _, err = run_cli(capsys, "evaluate", "--hisparse-config",
                           '{"top_k": 1024, "algorithm": "x", "page_size": 64, "host_to_device_ratio": 2}')
    assert code == 0 and "does not read" not in err


def test_unread_keys_in_a_launch_command_get_a_note(capsys):
    code, _, err = run_cli(capsys, "evaluate", "--", "python", "-m", "sglang.launch_server",
                           "--hisparse-config", '{"top-k": 8}')
    assert code == 0 and "SGLang does not read the key 'top-k'; did you mean 'top_k'?" in err


# -- every version: the gates only non-DSA models reach are declared with `when` ------------------
VERSIONS = [f"{DEFAULT_POLICY}@{v}" for v in engine.list_families()[DEFAULT_POLICY]]


@pytest.mark.parametrize("ref", VERSIONS)
def test_every_version_declares_the_non_dsa_gates_with_when(ref):
    """A non-DSA model reaches SGLang's generic KV-dtype and attention-backend gates in every
    release; each version names them, each with the configs that reach it, so that a decision
    for such a config says it is out of scope (issue 18's rule, in every version)."""
    policy = engine.load_policy(ref)
    gates = [(where, has_when) for where, why, has_when in policy.upstream.leaves_out if "non-DSA" in why]
    assert gates and all(has_when for _, has_when in gates), gates
    functions = {where.rsplit(":", 1)[1].lstrip("_") for where, _ in gates}
    assert "handle_attention_backend_compatibility" in functions
    from engine.sglang.conform import sample

    for config in sample.stratified(sample.axes(policy, {"dsa_model": False}), 300, 1):
        assert not policy.evaluate(config).in_scope, config


@pytest.mark.parametrize("ref, given, where", [
    # SGLang 0.5.14 refuses a KV4 cache on ROCm for any model its DSA gate does not stop first
    ("dsa-backends@4", {"kv_cache_dtype": "fp4_e2m1", "platform": "hip"}, "_handle_kv4_compatibility"),
    # SGLang 0.5.20: mxfp8 needs SM100 (the MLA and MHA gates alike)
    ("dsa-backends@8", {"kv_cache_dtype": "mxfp8", "sm_major": 9}, "handle_mxfp8_kv_cache_compatibility"),
    ("dsa-backends@8", {"kv_cache_dtype": "nvfp4", "platform": "hip"}, "handle_kv4_compatibility")])
def test_an_mha_model_refused_by_a_generic_gate_is_out_of_scope(ref, given, where):
    policy = engine.load_policy(ref)
    d = policy.evaluate(config_of(policy, dict({k.replace("_", "-"): v for k, v in given.items()},
                                               **{"model-path": LLAMA}))[0])
    assert d.ok and not d.in_scope and d.out_of_scope["where"].endswith(":" + where)
