"""A large but legal policy (the default policy plus 4,000 rules: inside every file limit) is
bounded up front: a whole-domain operation does at most HISPARSE_MAX_WORK rule evaluations
(configs x rules); diff and table refuse past it (C506, naming the limit and how to raise it),
check's deep lint is skipped with a note. Bounded by counts, never by time."""
import pytest

import engine
from engine.analysis import domain, lint
from engine.files.shipped import DEFAULT_POLICY
from tests.helpers import run_cli, write_policy

EXTRA_RULES = 4000


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    base = engine.load_policy(DEFAULT_POLICY)
    with open(base.path, encoding="utf-8") as fh:
        text = fh.read()
    extra = "".join(f'    - {{name: extra{i}, require: {{sm_major: {{">=": 8}}}}, message: m}}\n'
                    for i in range(EXTRA_RULES))
    # the rules go at the end of the checks, before whatever top-level section follows them
    head, sep, tail = text.partition("\ncapabilities:")
    text = head.rstrip("\n") + "\n" + extra + (sep + tail if sep else "")
    folder = tmp_path_factory.mktemp("large")
    path = write_policy(folder, text, f"{base.family}/{base.path.rsplit('/', 1)[1]}")
    policy = engine.load_policy(path)
    assert len(policy.rule_meta) == len(base.rule_meta) + EXTRA_RULES
    assert domain.config_count(policy) * len(policy.rule_meta) > domain.MAX_WORK  # the case at hand
    return path


def test_check_skips_the_deep_lint_with_a_note(capsys, large, monkeypatch):
    def never(policy):
        raise AssertionError("the whole-domain lint ran")
    monkeypatch.setattr(lint, "_domain_lint", never)
    code, out, err = run_cli(capsys, "check", large)
    assert code == 0, out + err
    assert "rule evaluations; whole-domain lint (L401-L403) runs up to 200,000,000 (HISPARSE_MAX_WORK raises it)" in err


@pytest.mark.parametrize("argv", [["diff", "{}", DEFAULT_POLICY], ["table", "--policy", "{}"],
                                  ["diff", DEFAULT_POLICY, "{}", "--format", "json"]])
def test_diff_and_table_refuse_before_any_work(capsys, large, monkeypatch, argv):
    def never(*a, **k):
        raise AssertionError("a config was evaluated")
    monkeypatch.setattr(domain, "results", never)
    code, out, err = run_cli(capsys, *[a.format(large) for a in argv])
    assert code == 2 and out == "" and "C506" in err and "rule evaluations, more than the 200,000,000" in err
    assert "raise HISPARSE_MAX_WORK" in err and "--where" in err


def test_the_limit_can_be_raised_or_the_domain_narrowed(capsys, large, monkeypatch):
    where = ["--where", "platform=hip", "--where", "enable_hisparse=true", "--where", "kv_cache_dtype=fp8_e4m3"]
    code, out, err = run_cli(capsys, "table", "--policy", large, *where, "--format", "json")
    assert code == 0, err
    monkeypatch.setenv("HISPARSE_MAX_WORK", str(10 ** 12))
    assert domain.max_work() == 10 ** 12
    monkeypatch.setenv("HISPARSE_MAX_WORK", "1")  # lowered: even a shipped diff is refused
    code, _, err = run_cli(capsys, "diff", DEFAULT_POLICY, DEFAULT_POLICY)
    assert code == 2 and "more than the 1 a whole-domain operation does" in err
    for bad in ("", "0", "-5", "lots"):
        monkeypatch.setenv("HISPARSE_MAX_WORK", bad)
        assert domain.max_work() == domain.MAX_WORK
