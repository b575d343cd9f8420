"""Table row keys have one spelling per value: an integer key is ASCII digits without sign,
blanks, underscores or leading zeros, so two keys can never alias one value (int() reads '010',
' 10', '1_0', '+10' and '１０' all as 10, and the last row would silently win). Every other
spelling is E302 at the key's line:col, naming the row it duplicates."""
import pytest

import engine
from engine.errors import PolicyError
from tests.helpers import minimal_text, run_cli, write_policy

TABLE = """
    - name: sm-table
      for_each: phase
      allowed:
        key: sm_major
        rows:
          {first}: [flashmla_sparse, flashmla_kv]
          {second}: [flashmla_kv]
        otherwise: [flashmla_sparse]
      message: "no"
"""


def policy_text(first: str, second: str) -> str:
    return minimal_text() + TABLE.format(first=first, second=second)


@pytest.mark.parametrize("alias", ["'１０'", "'٠١٠'", "'010'", "' 10'", "'1_0'", "'+10'", "'10 '", "'०९'"])
def test_keys_that_int_reads_alike_are_refused_with_their_position(tmp_path, capsys, alias):
    path = write_policy(tmp_path, policy_text("'9'", alias), "mini/v1.yaml")
    with pytest.raises(PolicyError) as info:
        engine.load_policy(path)
    (problem,) = info.value.problems
    assert problem.code == "E302" and "not an integer written in ASCII digits" in problem.message
    lines = policy_text("'9'", alias).splitlines()
    assert lines[problem.line - 1].strip().startswith(alias) and problem.col == 11
    code, out, _ = run_cli(capsys, "check", path)
    assert code == 2 and f"{path}:{problem.line}:11: E302" in out


def test_an_alias_of_an_existing_row_names_it(tmp_path):
    path = write_policy(tmp_path, policy_text("'10'", "'１０'"), "mini/v1.yaml")
    with pytest.raises(PolicyError) as info:
        engine.load_policy(path)
    (problem,) = info.value.problems
    assert "the same as row '10'" in problem.message and problem.hint == "write 10"


def test_canonical_keys_still_load_and_negative_numbers_too(tmp_path):
    policy = engine.load_policy(write_policy(tmp_path, policy_text("'9'", "'10'"), "mini/v1.yaml"))
    assert policy.evaluate({"sm_major": 10, "kv_cache_dtype": "fp8_e4m3"}).ok
    refused = policy.evaluate({"sm_major": 10, "decode_backend": "flashmla_sparse"})
    assert [v.check for v in refused.violations] == ["sm-table"]  # row '10' was read as 10
    with pytest.raises(PolicyError) as info:  # '-0' is 0 spelt another way; -9 is no value of sm_major
        engine.load_policy(write_policy(tmp_path / "other", policy_text("'9'", "'-0'"), "mini/v1.yaml"))
    assert "not an integer written in ASCII digits" in info.value.problems[0].message
