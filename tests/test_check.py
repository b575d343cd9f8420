"""`hisparse check`: the shipped policies are clean; each defect is reported once with the
file:line:col of the offending node, a stable code and exit 2."""
import json
import os

import pytest

import engine

from tests.helpers import FIXTURES, MINIMAL, minimal_text, run_cli, write_policy

BAD = os.path.join(FIXTURES, "policies")


def problem_lines(out: str) -> list[str]:
    """The problem lines of check's output: all but its closing summary (`checked N policy file(s)...`)."""
    lines = out.strip().splitlines()
    assert lines and lines[-1].startswith("checked "), out
    return lines[:-1]


def test_shipped_policies_pass(capsys):
    code, out, err = run_cli(capsys, "check")
    assert code == 0, out + err
    assert out.startswith("checked ") and out.rstrip().endswith("0 problem(s) in 0 file(s)")  # the summary alone
    # only notes on stderr: the known gaps a version declares (routes SGLang takes that its
    # backends cannot run), never a problem
    assert all(line.startswith("note: ") and "known gap" in line for line in err.splitlines())
    code, out, err = run_cli(capsys, "check", "policies/")
    assert code == 0 and out.startswith("checked ") and len(out.splitlines()) == 1


def test_minimal_fixture_is_valid(capsys):
    assert run_cli(capsys, "check", MINIMAL)[0] == 0


@pytest.mark.parametrize("fixture, expected", [
    ("bad-duplicate-key.yaml", "bad-duplicate-key.yaml:9:3: E105: duplicate key 'kv_cache_dtype' (first at line 5)"),
    ("bad-unknown-key.yaml", "bad-unknown-key.yaml:13:5: E201: unknown key 'defualt_note' in inputs.sm_major "
                             "(did you mean 'default'?)"),
    ("bad-default-backend.yaml", "bad-default-backend.yaml:27:21: E303: unknown backend 'flashmla_sprase' "
                                 "(did you mean 'flashmla_sparse'?)"),
    ("bad-when-value.yaml", "bad-when-value.yaml:24:30: E302: 'fp8_e5m2' is not a value of 'kv_cache_dtype' "
                            "(did you mean 'fp8_e4m3'?)"),
])
def test_each_defect_points_at_its_line(capsys, fixture, expected):
    path = os.path.join(BAD, fixture)
    code, out, _ = run_cli(capsys, "check", path)
    assert code == 2
    lines = problem_lines(out)
    assert lines == [os.path.join(BAD, expected)]
    # the line named really holds the offending text
    line_no = int(expected.split(":")[1])
    with open(path, encoding="utf-8") as fh:
        offending = fh.read().splitlines()[line_no - 1]
    token = expected.split("'")[1]
    assert token in offending


def test_folder_reports_every_file(capsys, tmp_path):
    good = write_policy(tmp_path, minimal_text(), "mini/v1.yaml")
    bad = write_policy(tmp_path, minimal_text().replace("version: 1", "version: 1\nversion: 2"), "mini/v2.yaml")
    code, out, err = run_cli(capsys, "check", str(tmp_path))
    assert code == 2
    assert out.startswith(f"{bad}:3:1: E105")
    assert good not in out
    assert out.rstrip().endswith("checked 2 policy file(s): 1 problem(s) in 1 file(s)")  # the summary: stdout


def test_all_problems_at_once(capsys, tmp_path):
    text = (minimal_text()
            .replace("when: {kv_cache_dtype: fp8_e4m3}", "when: {kv_cache_dtyp: fp8_e4m3}")
            .replace("set: {decode: flashmla_sparse}", "set: {decode: fa3}")
            .replace("{phase} needs", "{phse} needs"))
    path = write_policy(tmp_path, text)
    code, out, _ = run_cli(capsys, "check", path)
    assert code == 2
    codes = [line.split(": ")[1] for line in problem_lines(out)]
    assert codes == ["E301", "E303", "E306"]


def test_json_format(capsys):
    code, out, _ = run_cli(capsys, "check", "--format", "json", os.path.join(BAD, "bad-when-value.yaml"))
    assert code == 2
    report = json.loads(out)
    assert report["ok"] is False
    problem = report["files"][0]["problems"][0]
    assert problem["code"] == "E302" and problem["slug"] == "unknown-value"
    assert (problem["line"], problem["col"]) == (24, 30)


def test_missing_path(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "check", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert "E101" in out


@pytest.mark.parametrize("old, new, code, where", [
    ("when: {kv_cache_dtype: fp8_e4m3}", "when: {sm_major: {gte: 10}}", "E201", (24, 25)),
    ("version: 1", "version: two", "E201", (2, 10)),
    ("      for_each: phase", "      for_each: phase\n      require: {backend: flashmla_kv}", "E201", (30, 7)),
    ("resolve:\n  rules: []", "resolve:\n  rules:\n    - name: only-name", "E201", (21, 7)),
    ("    default: 9\n", "    default: 11\n    minimum: 9\n    maximum: 10\n", "E305", (12, 14)),
    ("  decode:\n    input: decode_backend", "  decode:\n    input: sm_major", "E307", (18, 12)),
    ("  kv_cache_dtype:\n", "  backend:\n", "E309", (5, 3)),
    ("set: {decode: flashmla_kv}", "set: {prefill: flashmla_kv}", "E304", (25, 13)),
    ("      message: \"{phase}", "      message: \"{allowed:json} {phase}", "E306", (38, 16)),
    ("    - name: bf16\n", "    - name: fp8\n", "E307", (26, 13)),
    ("          fp8_e4m3: [flashmla_kv]\n", "", "E310", (34, 9)),
    ("when: {kv_cache_dtype: fp8_e4m3}", "when: {kv_cache_dtype: {'>=': 3}}", "E308", (24, 31)),
    ("policy: mini", "policy: Mini", "E201", (1, 9)),
    # integers are ints: a whole float is refused wherever the language wants an integer
    ("version: 1", "version: 1.0", "E201", (2, 10)),
    ("    default: 9\n", "    default: 9.0\n", "E201", (12, 14)),
    ("    default: 9\n", "    default: 9\n    minimum: 9.0\n", "E201", (13, 14)),
])
def test_schema_and_name_errors(capsys, tmp_path, old, new, code, where):
    text = minimal_text()
    assert old in text
    path = write_policy(tmp_path, text.replace(old, new, 1))
    rc, out, _ = run_cli(capsys, "check", path)
    assert rc == 2
    prefix = f"{path}:{where[0]}:{where[1]}: {code}:"
    assert any(line.startswith(prefix) for line in out.strip().splitlines()), out


def test_a_float_version_says_how_to_write_it(capsys, tmp_path):
    path = write_policy(tmp_path, minimal_text().replace("version: 1", "version: 1.0", 1))
    rc, out, _ = run_cli(capsys, "check", path)
    assert rc == 2 and "version: 1.0 is not of type 'integer' (write 1: " in out
    with pytest.raises(engine.PolicyError):
        engine.load_policy(path)


def test_file_placement_must_match_identity(capsys, tmp_path):
    path = write_policy(tmp_path, minimal_text(), "other/v3.yaml")
    code, out, _ = run_cli(capsys, "check", path)
    assert code == 2
    assert "E312: version 1 in a file named v3.yaml" in out
    assert "E312: family 'mini' in a folder named 'other'" in out


@pytest.mark.parametrize("code", ["L401", "L402", "L403", "L404", "L405", "L406", "L407"])
def test_each_lint_code_has_a_fixture_that_triggers_only_it(capsys, code):
    (fixture,) = [f for f in os.listdir(BAD) if f.startswith(f"lint-{code}-")]
    path = os.path.join(BAD, fixture)
    rc, out, _ = run_cli(capsys, "check", path)
    assert rc == 2
    lines = problem_lines(out)
    assert [line.split(": ")[1] for line in lines] == [code]
    # the position names the rule, table row or input that is wrong
    line_no = int(lines[0].split(":")[1])
    with open(path, encoding="utf-8") as fh:
        text = fh.read().splitlines()[line_no - 1]
    assert text.strip().startswith(("- name:", "mxfp8:", "radix_cache:", "--old-decode-backend:")), text
    # --no-deep skips the whole-domain lint
    assert run_cli(capsys, "check", "--no-deep", path)[0] == 0


def test_self_contradiction_names_a_counterexample(capsys):
    path = os.path.join(BAD, "lint-L403-self-contradiction.yaml")
    _, out, _ = run_cli(capsys, "check", path)
    assert "e.g. for kv_cache_dtype=bfloat16" in out and "got flashmla_kv" in out


def test_an_accepted_finding_is_not_reported_and_only_that_code(capsys, tmp_path):
    with open(os.path.join(BAD, "lint-L403-self-contradiction.yaml"), encoding="utf-8") as fh:
        text = fh.read()
    rule = "    - name: bf16\n"
    assert text.count(rule) == 1
    accepted = text.replace(rule, rule + "      accepts: {L403: upstream refuses its own default}\n")
    rc, out, _ = run_cli(capsys, "check", write_policy(tmp_path, accepted))
    assert rc == 0 and "L403" not in out and "0 problem(s)" in out
    other = text.replace(rule, rule + "      accepts: {L401: not this finding}\n")
    rc, out, _ = run_cli(capsys, "check", write_policy(tmp_path, other, "other.yaml"))
    assert rc == 2 and ": L403: default rule 'bf16'" in out
    bad = text.replace(rule, rule + "      accepts: {L405: not rule-anchored}\n")
    rc, out, _ = run_cli(capsys, "check", write_policy(tmp_path, bad, "bad.yaml"))
    assert rc == 2 and ": E201: defaults.rules.1.accepts: 'L405' is not one of" in out
    assert ": L403:" not in out  # the file is refused before any lint
