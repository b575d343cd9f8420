"""Backend capabilities as data: the `capabilities` block (schema, names, positions), L407 in
`hisparse check` over the whole domain (defaults and allow-lists, known gaps as notes), every
shipped version declaring them, and `hisparse attend` refusing a backend the bridge does not run."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import engine
from engine.analysis.capability import can_run, known_gap
from engine.analysis.lint import lint
from engine.files.shipped import DEFAULT_POLICY, shipped_policy_dir
from tests.helpers import ROOT, minimal_text, run_cli, write_policy
from engine.analysis import domain

POLICY = engine.load_policy(DEFAULT_POLICY)
TEXT = open(os.path.join(ROOT, POLICY.path), encoding="utf-8").read()
HISPARSE_DEFAULT = "      when: {enable_hisparse: true}\n      set: {prefill: flashmla_sparse, decode: flashmla_sparse}"
BF16_ROW = "          bfloat16: [flashmla_sparse]\n"


def copy(tmp_path, text: str) -> str:
    return write_policy(tmp_path, text, f"{POLICY.family}/v{POLICY.version}.yaml")


def edited(old: str, new: str, text: str = TEXT) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def line_of(text: str, fragment: str) -> int:
    return text[:text.index(fragment)].count("\n") + 1


# -- the shipped versions ------------------------------------------------------------------------
def shipped_files():
    root = shipped_policy_dir()
    for family in sorted(os.listdir(root)):
        folder = os.path.join(root, family)
        if os.path.isdir(folder) and family != "schema":
            for name in sorted(os.listdir(folder)):
                if name.endswith(".yaml"):
                    yield os.path.join(folder, name)


@pytest.mark.parametrize("path", list(shipped_files()), ids=os.path.basename)
def test_every_shipped_version_declares_every_routed_backend_and_passes_l406(path):
    policy = engine.load_policy(path)
    if "dsa" not in policy.models:  # the capabilities are the DSA backends' FlashMLA kernels
        assert not policy.capabilities
        return
    routed = {b for r in policy.stages["defaults"].rules for b in r.set.values()}
    assert routed and routed <= set(policy.capabilities), routed - set(policy.capabilities)
    assert all(cap.source for cap in policy.capabilities.values())
    problems, _ = lint(policy)
    assert [p for p in problems if p.code == "L407"] == []


def test_the_fp8_kernel_reads_fp8_rows_only_and_flashmla_sparse_decodes_bf16_only():
    caps = POLICY.capabilities
    fp8 = POLICY.complete({"kv_cache_dtype": "fp8_e4m3"})
    bf16 = POLICY.complete({"kv_cache_dtype": "bfloat16"})
    assert can_run(caps["flashmla_kv"], "decode", fp8) and not can_run(caps["flashmla_kv"], "decode", bf16)
    assert can_run(caps["flashmla_sparse"], "decode", bf16) and not can_run(caps["flashmla_sparse"], "decode", fp8)
    assert can_run(caps["flashmla_sparse"], "prefill", fp8)  # FP8 rows are dequantised for prefill
    assert not can_run(caps["trtllm"], "decode", POLICY.complete({"sm_major": 9}))
    assert can_run(caps["trtllm"], "decode", POLICY.complete({"sm_major": 10}))
    assert not can_run(caps["triton"], "decode", bf16) and can_run(caps["triton"], "decode", dict(bf16, platform="hip"))
    assert not can_run(caps["flashmla_auto"], "decode", bf16) and can_run(caps["flashmla_auto"], "prefill", bf16)
    tile_fp8 = dict(fp8, sm_major=8)
    assert not can_run(caps["tilelang"], "decode", tile_fp8)
    assert can_run(caps["tilelang"], "decode", dict(tile_fp8, sm_minor=9))
    assert not any(can_run(caps["intel_xpu"], ph, bf16) for ph in POLICY.phases)


def test_every_default_route_of_the_newest_version_is_one_its_backends_run():
    """The capabilities do not refuse what SGLang routes: every accepted DSA config's default
    backends run it, except the known gaps."""
    for k, config in enumerate(domain.configs(POLICY, {"dsa_prefill_backend": [None], "dsa_decode_backend": [None]})):
        d = POLICY.evaluate(config)
        if not d.ok or not d.in_scope:
            continue
        for phase, backend in d.backends.items():
            cap = POLICY.capabilities[backend]
            assert can_run(cap, phase, d.config) or known_gap(cap, phase, d.config), (phase, backend, config)


# -- check refuses an incapable route -------------------------------------------------------------
def newcomer() -> str:
    """HiSparse with a BF16 cache edited to decode on flashmla_kv, which reads FP8 rows only: the
    default and the allow-list row that lets it pass the policy's own checks."""
    text = edited(HISPARSE_DEFAULT, HISPARSE_DEFAULT.replace("decode: flashmla_sparse", "decode: flashmla_kv"))
    return edited(BF16_ROW, "          bfloat16: [flashmla_kv, flashmla_sparse]\n", text)


def test_check_refuses_hisparse_bf16_decoding_on_the_fp8_kernel(tmp_path, capsys):
    text = newcomer()
    path = copy(tmp_path, text)
    code, out, err = run_cli(capsys, "check", path)
    problems = [line for line in out.splitlines() if ": L407: " in line]
    lines = [line for line in out.splitlines() if not line.startswith("checked ")]  # less the summary
    assert code == 2 and len(problems) == 3 and len(lines) == 3, out + err  # nothing but L407
    cap_line = line_of(text, "  flashmla_kv:\n    source")
    by_head = dict(line.split(": L407: ") for line in problems[:1])
    head, message = problems[0].split(": L407: ")
    assert head == f"{path}:{line_of(text, '    - name: hisparse' + chr(10))}:7", by_head
    assert message.startswith("defaults rule 'hisparse' routes the decode phase to flashmla_kv, which cannot run "
                              "it, e.g. for ")
    assert "enable_hisparse=true kv_cache_dtype=auto" in message and "dsa_decode_backend=unset" in message
    assert message.endswith("flashmla_kv runs decode only where (kv_cache_dtype == fp8_e4m3) (capabilities of "
                            f"flashmla_kv, line {cap_line})")
    row = line_of(text, "          bfloat16: [flashmla_kv")
    for line, phase in zip(problems[1:], ("decode", "prefill")):
        head, message = line.split(": L407: ")
        assert head == f"{path}:{row}:21"
        assert message.startswith(f"check 'hisparse-backend' admits flashmla_kv for the {phase} phase by its "
                                  "allow-list, which cannot run it")
        assert "kv_cache_dtype=bfloat16" in message
    # it evaluates, tests and compares as any policy does: only the capabilities see it
    policy = engine.load_policy(path)
    d = policy.evaluate({"enable_hisparse": True, "disable_radix_cache": True})
    assert d.ok and d.backends["decode"] == "flashmla_kv"
    code, out, _ = run_cli(capsys, "check", path, "--format", "json")
    assert code == 2 and {p["code"] for p in json.loads(out)["files"][0]["problems"]} == {"L407"}


def test_the_default_alone_is_refused_by_the_policys_own_checks(tmp_path, capsys):
    text = edited(HISPARSE_DEFAULT, HISPARSE_DEFAULT.replace("decode: flashmla_sparse", "decode: flashmla_kv"))
    code, out, _ = run_cli(capsys, "check", copy(tmp_path, text))
    assert code == 2 and ": L403: default rule 'hisparse'" in out and "L407" not in out


def test_an_allow_list_row_alone_is_refused_where_users_pick_it(tmp_path, capsys):
    text = edited(BF16_ROW, "          bfloat16: [flashinfer_sparse_mla, flashmla_sparse]\n")
    code, out, _ = run_cli(capsys, "check", copy(tmp_path, text), "--format", "json")
    problems = json.loads(out)["files"][0]["problems"]
    assert code == 2 and {p["code"] for p in problems} == {"L407"} and len(problems) == 2  # prefill and decode
    row = line_of(text, "          bfloat16: [flashinfer")
    for p in problems:
        assert (p["line"], p["col"]) == (row, 21)
        assert p["message"].startswith("check 'hisparse-backend' admits flashinfer_sparse_mla for the ")
        assert "kv_cache_dtype=bfloat16" in p["message"] and "platform=cuda" in p["message"]


def test_a_known_gap_is_a_note_and_without_it_check_refuses(tmp_path, capsys):
    code, _, err = run_cli(capsys, "check", POLICY.path)
    notes = [line for line in err.splitlines() if "known gap" in line]
    assert code == 0 and notes == [f"note: {POLICY.path}: known gap, routes to a backend that cannot run them "
                                   "(flashinfer_sparse_mla decode 48, flashinfer_sparse_mla prefill 48): SGLang "
                                   "0.5.23's HiSparse allow-list admits flashinfer_sparse_mla for any CUDA FP8 "
                                   "config at start-up; its backend init then refuses it off GLM-5 FP8 on "
                                   "SM120/SM121."]
    start = TEXT.index("    known_gaps:")
    end = TEXT.index("  triton_sparse_mla:\n", start)
    path = copy(tmp_path, TEXT[:start] + TEXT[end:])
    code, out, _ = run_cli(capsys, "check", path)
    assert code == 2 and out.count(": L407: check 'hisparse-backend' admits flashinfer_sparse_mla") == 2
    assert f":{line_of(TEXT, '          fp8_e4m3: [flashinfer_sparse_mla, flashmla_kv]')}:21: L407" in out


def test_a_default_on_the_wrong_platform_or_gpu_is_refused(tmp_path, capsys):
    text = edited("      when: {platform: hip}\n      set: {prefill: triton, decode: triton}",
                  "      when: {platform: hip}\n      set: {prefill: trtllm, decode: trtllm}")
    code, out, _ = run_cli(capsys, "check", copy(tmp_path, text))
    assert code == 2 and "defaults rule 'hip-triton' routes the decode phase to trtllm" in out
    assert "trtllm runs decode only where (platform == cuda and sm_major >= 10)" in out


def test_a_user_choice_no_allow_list_vouches_for_is_not_refused():
    """Outside HiSparse no allow-list applies: the user's flashmla_kv on a BF16 cache is upstream's
    business (SGLang quantises the cache per call), not a route of the policy."""
    d = POLICY.evaluate({"kv_cache_dtype": "bfloat16", "dsa_decode_backend": "flashmla_kv"})
    assert d.ok and not can_run(POLICY.capabilities["flashmla_kv"], "decode", d.config)
    assert [p for p in lint(POLICY)[0] if p.code == "L407"] == []


# -- the language ---------------------------------------------------------------------------------
def minimal_with(extra: str) -> str:
    return minimal_text().rstrip("\n") + "\n" + extra


def test_a_policy_without_capabilities_loads_and_is_not_checked_for_them(tmp_path):
    policy = engine.load_policy(write_policy(tmp_path, minimal_text()))
    assert policy.capabilities == {}
    assert [p for p in lint(policy)[0] if p.code == "L407"] == []


def test_a_minimal_policy_declares_and_is_checked(tmp_path, capsys):
    caps = ("capabilities:\n  flashmla_kv:\n    source: FP8 rows\n    runs: [{when: {kv_cache_dtype: fp8_e4m3}}]\n"
            "  flashmla_sparse:\n    source: BF16 rows\n    runs: [{phases: [decode], when: {sm_major: 9}}]\n")
    path = write_policy(tmp_path, minimal_with(caps))
    code, out, _ = run_cli(capsys, "check", path)
    text = minimal_with(caps)
    assert code == 2 and out.splitlines()[:-1] == [
        f"{path}:{line_of(text, '    - name: bf16')}:7: L407: defaults rule 'bf16' routes the decode phase to "
        "flashmla_sparse, which cannot run it, e.g. for kv_cache_dtype=bfloat16 sm_major=10 decode_backend=unset: "
        f"flashmla_sparse runs decode only where (sm_major == 9) (capabilities of flashmla_sparse, line "
        f"{line_of(text, '  flashmla_sparse:' + chr(10) + '    source')})",
        f"{path}:{line_of(text, '          bfloat16: [flashmla_sparse]')}:21: L407: check 'fp8-needs-kv' admits "
        "flashmla_sparse for the decode phase by its allow-list, which cannot run it, e.g. for "
        "kv_cache_dtype=bfloat16 sm_major=10 decode_backend=flashmla_sparse: flashmla_sparse runs decode only "
        f"where (sm_major == 9) (capabilities of flashmla_sparse, line "
        f"{line_of(text, '  flashmla_sparse:' + chr(10) + '    source')})"]
    fixed = path.replace("policy.yaml", "fixed.yaml")
    write_policy(tmp_path, text.replace("when: {sm_major: 9}", "when: {sm_major: {in: [9, 10]}}"), "fixed.yaml")
    code, out, _ = run_cli(capsys, "check", fixed)
    assert code == 0 and out == "checked 1 policy file(s): 0 problem(s) in 0 file(s)\n"


@pytest.mark.parametrize("bad, code, fragment", [
    ("    runs: [{phases: [walk]}]\n", "E304", "unknown phase 'walk'"),
    ("    runs: [{when: {sm_majr: 9}}]\n", "E301", "unknown input 'sm_majr'"),
    ("    runs: [{when: {kv_cache_dtype: fp9}}]\n", "E302", "fp9"),
    ("    runs: [{phase: [decode]}]\n", "E201", "phase"),
])
def test_capability_errors_name_the_place(tmp_path, bad, code, fragment):
    text = minimal_with("capabilities:\n  flashmla_kv:\n    source: x\n" + bad)
    with pytest.raises(engine.PolicyError) as exc:
        engine.load_policy(write_policy(tmp_path, text))
    line = text.count("\n")
    hits = [p for p in exc.value.problems if fragment in p.message]
    assert hits and all(p.line == line and p.code == code for p in hits), [str(p) for p in exc.value.problems]


def test_a_capability_needs_runs_and_a_source(tmp_path):
    text = minimal_with("capabilities:\n  flashmla_kv:\n    run: []\n")
    with pytest.raises(engine.PolicyError) as exc:
        engine.load_policy(write_policy(tmp_path, text))
    got = {(p.code, p.message, p.hint) for p in exc.value.problems}
    assert ("E201", "unknown key 'run' in capabilities.flashmla_kv", "did you mean 'runs'?") in got
    assert any("missing the required key" in m for _, m, _ in got)
    text = minimal_with("capabilities:\n  flashmla_kv:\n    runs: []\n")
    with pytest.raises(engine.PolicyError) as exc:
        engine.load_policy(write_policy(tmp_path, text, "other.yaml"))
    assert [(p.code, p.message) for p in exc.value.problems] == [
        ("E201", "capabilities.flashmla_kv is missing the required key 'source'")]


def test_capabilities_of_an_unknown_backend_get_did_you_mean(tmp_path):
    text = minimal_with("capabilities:\n  flashmla_kvv:\n    source: x\n    runs: []\n")
    with pytest.raises(engine.PolicyError) as exc:
        engine.load_policy(write_policy(tmp_path, text))
    (p,) = exc.value.problems
    assert p.code == "E303" and p.hint == "did you mean 'flashmla_kv'?" and p.line == text.count("\n") - 2


# -- attend --------------------------------------------------------------------------------------
def attend_in_a_fresh_process(*argv):
    """(exit code, stderr, whether torch was imported) of `hisparse attend ARGV`."""
    code = ("import sys; from kernels_bridge.cli import main; rc = main(sys.argv[1:]); "
            "print('torch' in sys.modules); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, "attend", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    return proc.returncode, proc.stderr, proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, backend, how", [
    (("--no-enable-hisparse",), "fa3", "rule bf16"),
    (("--no-enable-hisparse", "--sm-major", "10"), "trtllm", "rule fp8-blackwell"),
    (("--platform", "hip"), "tilelang", "rule hisparse-hip"),
    (("--kv-cache-dtype", "fp8_e4m3", "--dsa-decode-backend", "flashinfer_sparse_mla"), "flashinfer_sparse_mla",
     "set by the user"),
])
def test_attend_says_when_the_bridge_does_not_run_the_routed_backend(argv, backend, how):
    code, err, torch_loaded = attend_in_a_fresh_process(*argv)
    assert code == 2 and torch_loaded == "False"
    assert err.strip() == (f"hisparse attend: {POLICY.ref} routes decode to {backend} ({how}); the bridge runs "
                           "only flashmla_sparse, flashmla_kv (FlashMLA, or its CPU reference kernels)")


def test_attend_refuses_a_route_the_policy_capabilities_rule_out(tmp_path):
    code, err, torch_loaded = attend_in_a_fresh_process("--policy", copy(tmp_path, newcomer()), "--kv-cache-dtype",
                                                        "bfloat16")
    assert code == 2 and torch_loaded == "False"
    assert "routes decode to flashmla_kv (rule hisparse) with kv_cache_dtype=bfloat16, which its declared " \
           "capabilities say flashmla_kv cannot run: flashmla_kv runs decode only where (kv_cache_dtype == " \
           "fp8_e4m3)" in err
