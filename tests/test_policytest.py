"""`hisparse test`: policy test cases with rule coverage."""
import json

import engine

from tests.helpers import minimal_text, run_cli, write_policy

CASES = """
cases:
  - name: fp8 goes to flashmla_kv
    config: {kv_cache_dtype: fp8_e4m3}
    expect:
      backends: {decode: flashmla_kv}
      sources: {decode: fp8}
  - name: bf16 goes to flashmla_sparse
    config: {}
    expect:
      backends: {decode: flashmla_sparse}
"""


def test_shipped_policies_pass_with_full_coverage(capsys):
    code, out, err = run_cli(capsys, "test", "--min-coverage", "100")
    assert code == 0, out + err
    lines = out.strip().splitlines()
    assert len(lines) >= 2
    for line in lines:
        assert "cases passed; rule coverage" in line and "(100%)" in line
    code, out, _ = run_cli(capsys, "test", "--format", "json")
    report = json.loads(out)
    assert report["ok"] and all(f["coverage"]["percent"] == 100.0 for f in report["files"])
    # every shipped version of every family has its test file, and each was run
    assert {(f["policy"]["family"], f["policy"]["version"]) for f in report["files"]} == {
        (family, version) for family, versions in engine.list_families().items() for version in versions}


def _suite(tmp_path, cases=CASES):
    write_policy(tmp_path, minimal_text(), "mini/v1.yaml")
    return write_policy(tmp_path, cases, "mini/tests/v1.yaml")


def test_coverage_lists_what_no_case_exercises(capsys, tmp_path):
    path = _suite(tmp_path)
    code, out, _ = run_cli(capsys, "test", path)
    assert code == 0
    assert "2/2 cases passed; rule coverage 2/3 (67%)" in out
    assert "not covered: checks rule fp8-needs-kv" in out and "no case makes it be violated" in out
    code, out, _ = run_cli(capsys, "test", path, "--min-coverage", "90")
    assert code == 1 and "below the minimum 90%" in out


def test_failure_shows_expected_and_actual(capsys, tmp_path):
    path = _suite(tmp_path, CASES + """
  - name: a wrong expectation
    config: {kv_cache_dtype: bfloat16, decode_backend: flashmla_kv}
    expect:
      ok: true
""")
    code, out, _ = run_cli(capsys, "test", str(tmp_path))
    assert code == 1
    assert f"FAIL {path}:13: a wrong expectation" in out
    assert "ok: expected true" in out and "actual   false" in out
    # the failing case still counts for coverage: it violated the check
    assert "rule coverage 3/3 (100%)" in out


def test_bad_test_files_exit_2(capsys, tmp_path):
    path = _suite(tmp_path, CASES.replace("sources: {decode: fp8}", "sources: {decode: fp8}\n      rejected_by: fp8-neds-kv"))
    code, _, err = run_cli(capsys, "test", path)
    assert code == 2 and "T702: unknown rule 'fp8-neds-kv' (did you mean 'fp8-needs-kv'?)" in err
    path = _suite(tmp_path, CASES.replace("expect:\n      backends: {decode: flashmla_sparse}",
                                          "expect:\n      backend: {decode: flashmla_sparse}"))
    code, _, err = run_cli(capsys, "test", path)
    assert code == 2 and "T701: unknown key 'backend'" in err and "did you mean 'backends'?" in err
    code, _, err = run_cli(capsys, "test", str(tmp_path / "empty"))
    assert code == 2


def test_expected_config_error(capsys, tmp_path):
    path = _suite(tmp_path, CASES + """
  - name: unknown dtype
    config: {kv_cache_dtype: fp16}
    expect: {error: C502}
  - name: should have been an error
    config: {}
    expect: {error: C502}
""")
    code, out, _ = run_cli(capsys, "test", path)
    assert code == 1
    assert "FAIL" in out and "should have been an error" in out and "unknown dtype" not in out
