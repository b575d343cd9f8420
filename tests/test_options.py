"""No silent last-wins and no out-of-range option: an option given twice with different values
is a usage error (exit 2) on every command, `--where` repeats an input only with the same value,
percentages are 0..100 (NaN would switch the coverage gate off), counts are at least 1, and a
policy folder that does not exist is said to be missing."""
import pytest

import engine
from engine.errors import ConfigError, PolicyError
from engine.analysis.domain import parse_where
from engine.files.shipped import DEFAULT_POLICY
from tests.helpers import run_cli


@pytest.mark.parametrize("argv", [
    ["table", "--where", "platform=cuda", "--where", "platform=hip"],
    ["diff", DEFAULT_POLICY, DEFAULT_POLICY, "--where", "sm_major=9", "--where", "sm_major=10"],
    ["conform", "--where", "platform=cuda", "--where", "platform=hip", "--sample", "1000"],
    ["table", "--where", "kv_cache_dtype=fp8_e4m3", "--where", "kv-cache-dtype=bfloat16"],
])
def test_where_repeating_an_input_with_another_value_is_an_error(capsys, argv):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and "C501" in err and "is given twice" in err and out == ""


def test_where_repeating_the_same_value_is_the_same_slice(capsys):
    once = run_cli(capsys, "table", "--where", "platform=hip", "--format", "json")
    twice = run_cli(capsys, "table", "--where", "platform=hip", "--where", "platform=hip", "--format", "json")
    assert once == twice and once[0] == 0
    policy = engine.load_policy(DEFAULT_POLICY)
    assert parse_where(policy, ["platform=hip", "platform=hip"]) == {"platform": "hip"}
    with pytest.raises(ConfigError):
        parse_where(policy, ["platform=hip", "platform=cuda"])


@pytest.mark.parametrize("argv", [
    ["evaluate", "--policy", f"{DEFAULT_POLICY}@1", "--policy", f"{DEFAULT_POLICY}@2"],
    ["evaluate", "--kv-cache-dtype", "fp8_e4m3", "--kv-cache-dtype=bfloat16"],
    ["evaluate", "--dsa-model", "--no-dsa-model"],
    ["evaluate", "--format", "json", "--format", "text"],
    ["evaluate", "--config", "a.yaml", "--config", "b.yaml"],
    ["explain", "--sm-major", "9", "--sm-major", "10"],
    ["table", "--format", "json", "--format=markdown"],
    ["diff", DEFAULT_POLICY, DEFAULT_POLICY, "--max-patterns", "2", "--max-patterns", "3"],
    ["test", "--min-coverage", "10", "--min-coverage", "90"],
    ["check", "--format", "json", "--format", "text"],
    ["replay", "r.jsonl", "--max-records", "1", "--max-records", "2"],
    ["attend", "--steps", "1", "--steps", "2"],
    ["doctor", "--format", "json", "--format", "text"],
])
def test_an_option_given_twice_with_different_values_is_refused(capsys, argv):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and "the same option twice with different values" in err and out == "", err


def test_an_option_repeated_with_the_same_value_is_fine(capsys):
    once = run_cli(capsys, "evaluate", "--kv-cache-dtype", "fp8_e4m3", "--format", "json")
    twice = run_cli(capsys, "evaluate", "--kv-cache-dtype", "fp8_e4m3", "--kv-cache-dtype=fp8_e4m3",
                    "--format", "json", "--format", "json")
    assert once == twice and once[0] == 0


@pytest.mark.parametrize("argv, text", [
    (["test", "--min-coverage", "nan"], "invalid percentage: 'nan'"),
    (["test", "--min-coverage", "150"], "invalid percentage: '150'"),
    (["test", "--min-coverage", "-1"], "invalid percentage"),
    (["test", "--min-coverage", "inf"], "invalid percentage"),
    (["test", "--min-coverage", "1e999"], "invalid percentage"),
    (["diff", DEFAULT_POLICY, DEFAULT_POLICY, "--max-patterns", "0"], "invalid value: '0' (from 1 to 10,000)"),
    (["replay", "r.jsonl", "--max-records", "-1"], "invalid value: '-1' (from 1 to"),
    (["conform", "--workers", "0"], "invalid value: '0' (from 1 to"),
    (["conform", "--case-timeout", "nan", "--sample", "1000"], "--case-timeout nan"),
    (["attend", "--locality", "nan"], "--locality nan"),
])
def test_out_of_range_values_are_refused(capsys, argv, text):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and text in err and out == "", err


def test_the_coverage_gate_holds_at_its_bounds(capsys):
    assert run_cli(capsys, "test", "--min-coverage", "100")[0] == 0
    assert run_cli(capsys, "test", "--min-coverage", "0")[0] == 0


@pytest.mark.parametrize("argv", [["table"], ["evaluate"], ["test"], ["diff", DEFAULT_POLICY, DEFAULT_POLICY],
                                  ["replay", "r.jsonl"]])
def test_a_missing_policy_folder_is_said_to_be_missing(capsys, tmp_path, monkeypatch, argv):
    missing = str(tmp_path / "nope")
    code, _, err = run_cli(capsys, *argv, "--policy-dir", missing)
    assert code == 2 and f"{missing}: R601: the policy folder does not exist" in err, err
    monkeypatch.setenv("HISPARSE_POLICY_DIR", missing)
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and "the policy folder does not exist ($HISPARSE_POLICY_DIR" in err, err
    monkeypatch.delenv("HISPARSE_POLICY_DIR")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    code, _, err = run_cli(capsys, *argv, "--policy-dir", str(a_file))
    assert code == 2 and "is a file, not a folder" in err
    with pytest.raises(PolicyError, match="does not exist"):
        engine.load_policy(DEFAULT_POLICY, missing)
    with pytest.raises(PolicyError, match="does not exist"):
        engine.PolicyStore(missing)
