"""Four extensions of the policy language, on small policies written here: checks placed
`at: defaults`, `upstream:`, `removed_flags` and a phase's `backends`. For each: what it does
(the bulk evaluator and evaluate agree on every config of each fixture's domain), the
errors a policy gets with file:line:col, and what explain, table, test, lint and conform make of it."""
import json

import pytest

import engine
from engine.analysis import policytest
from engine.analysis.lint import lint
from engine.language.rules import Upstream
from tests.helpers import assert_bulk_equals_evaluate, assert_probe_counts_like_traces, bulk_decisions, load_text, run_cli, write_policy
from engine.analysis import domain


def at(text: str, marker: str, token: str | None = None) -> tuple[int, int]:
    """(line, col), 1-based, of `token` (default: `marker`) on the one line of `text` holding `marker`."""
    hits = [(n, line) for n, line in enumerate(text.splitlines(), 1) if marker in line]
    assert len(hits) == 1, (marker, hits)
    n, line = hits[0]
    return n, line.index(token or marker, line.index(marker)) + 1


def problems_of(tmp_path, text: str) -> list:
    with pytest.raises(engine.PolicyError) as exc:
        load_text(tmp_path, text)
    return exc.value.problems


def assert_evaluators_agree(policy) -> int:
    """Bulk and single decisions are the same on every config of the domain: acceptance,
    resolved values, backends, sources, log lines, violations (check, phase, message, location)."""
    n = assert_bulk_equals_evaluate(policy)
    assert n == domain.config_count(policy)
    return n


# -- 1. checks at defaults --------------------------------------------------------------------------
AT_DEFAULTS = """
policy: atdef
version: 1
description: Checks placed at defaults, next to ordinary checks.
inputs:
  mode: {type: enum, values: [a, b], default: a}
  size: {type: int, values: [1, 2, 3], default: 1}
  lenient: {type: bool, default: false}
backends: {k1: one, k2: two, k3: three}
phases:
  first: {input: first_backend}
  second: {input: second_backend}
resolve:
  rules:
    - {name: say-size, when: {size: 3}, log: "size {size}"}
defaults:
  when: {size: {"<": 3}}
  rules:
    - {name: by-mode-b, when: {mode: b}, set: {first: k2, second: k2}, log: "defaults for b: {first}/{second}"}
    - {name: fallback, set: {first: k1, second: k3}, log: "defaults: {first}/{second}"}
checks:
  when: {lenient: false}
  rules:
    - name: late-second
      require: {second_backend: {"!=": k2}}
      message: "second is {second}"
    - name: no-k2-first
      at: defaults
      when: {size: {">=": 2}}
      require: {first_backend: {"!=": k2}}
      message: "first {first} refused at size {size}"
    - name: k3-small
      at: defaults
      for_each: phase
      when: {backend: k3}
      require: {size: 1}
      message: "{phase}={backend} needs size 1, got {size}"
    - name: late-explicit
      at: checks
      when: {mode: a}
      require: {size: {"<=": 2}}
      message: "a needs size <= 2"
"""


@pytest.fixture(scope="module")
def atdef(tmp_path_factory):
    return load_text(tmp_path_factory.mktemp("atdef"), AT_DEFAULTS)


def test_at_defaults_compiled_equals_interpreter_on_the_whole_domain(atdef):
    assert assert_evaluators_agree(atdef) == 2 * 3 * 2 * 4 * 4
    assert_probe_counts_like_traces(atdef)


def test_at_is_read_from_the_file(atdef):
    assert {r.name: r.at for r in atdef.stages["checks"].rules} == {
        "late-second": "checks", "no-k2-first": "defaults", "k3-small": "defaults", "late-explicit": "checks"}


@pytest.mark.parametrize("config, violations, log, sources", [
    # a check at defaults fails: evaluation stops, the default's log line is never emitted, and the
    # ordinary check that would fail too (second is k2) does not run
    ({"mode": "b", "size": 2}, [("no-k2-first", None, "first k2 refused at size 2")], [],
     {"first": "by-mode-b", "second": "by-mode-b"}),
    # an ordinary check fails: the log line stays
    ({"mode": "b", "size": 1}, [("late-second", None, "second is k2")], ["defaults for b: k2/k2"],
     {"first": "by-mode-b", "second": "by-mode-b"}),
    # a per-phase check at defaults
    ({"mode": "a", "size": 2}, [("k3-small", "second", "second=k3 needs size 1, got 2")], [],
     {"first": "fallback", "second": "fallback"}),
    # every check at defaults runs (in file order) before evaluation stops
    ({"mode": "a", "size": 2, "first_backend": "k2"},
     [("no-k2-first", None, "first k2 refused at size 2"), ("k3-small", "second", "second=k3 needs size 1, got 2")],
     [], {"first": "user", "second": "fallback"}),
    # they run even when the defaults stage's condition does not hold; the resolve log line stays,
    # and the ordinary checks that would fail (late-second, late-explicit) do not run
    ({"mode": "a", "size": 3, "first_backend": "k2", "second_backend": "k2"},
     [("no-k2-first", None, "first k2 refused at size 3")], ["size 3"], {"first": "user", "second": "user"}),
    ({"mode": "a", "size": 3}, [("late-explicit", None, "a needs size <= 2")], ["size 3"],
     {"first": None, "second": None}),
    # the checks stage's condition governs both kinds
    ({"mode": "b", "size": 2, "lenient": True}, [], ["defaults for b: k2/k2"],
     {"first": "by-mode-b", "second": "by-mode-b"}),
])
def test_a_failed_check_at_defaults_stops_before_the_default_log_line(atdef, config, violations, log, sources):
    for d in (atdef.evaluate(config), atdef.trace(config)[0], bulk_decisions(atdef, [config])[0]):
        assert [(v.check, v.phase, v.message) for v in d.violations] == violations
        assert d.ok == (not violations)
        assert d.log == log
        assert d.sources == sources
        for v in d.violations:
            assert v.location == f"{atdef.file}:{at(AT_DEFAULTS, '- name: ' + v.check)[0]}"
            # a check at defaults is raised where the defaults stage runs (the plugin's backend pass)
            assert v.stage == ("defaults" if atdef.rule(v.check).at == "defaults" else "checks")
            assert v.to_dict().get("stage", "checks") == v.stage


def test_explain_shows_the_stop_at_defaults(atdef, capsys):
    code, out, err = run_cli(capsys, "explain", "--policy", atdef.file, "--mode", "b", "--size", "2")
    assert code == 1, err
    line = at(AT_DEFAULTS, "- name: no-k2-first")[0]
    assert "   checks at defaults: a failed one stops evaluation before the default's log line" in out
    assert (f"   - no-k2-first (line {line}): VIOLATED: size >= 2 (yes); first_backend != k2 (no)") in out
    assert ("       first = k2; second = k2; log: defaults for b: k2/k2 (not emitted: a check at defaults "
            "failed)") in out
    assert "Evaluation stopped at no-k2-first: later stages did not run." in out
    assert "3. checks" not in out and "late-second" not in out  # the ordinary checks never ran
    result = out[out.index("Result:"):]
    assert "REJECTED by atdef@1: first k2 refused at size 2" in result and "log:" not in result
    assert out.index("2. defaults") < out.index("checks at defaults") < out.index("Evaluation stopped")

    code, out, _ = run_cli(capsys, "explain", "--policy", atdef.file, "--mode", "b", "--size", "1")
    assert code == 1
    assert "(not emitted" not in out and "Evaluation stopped" not in out
    assert out.index("checks at defaults") < out.index("3. checks: every failed check is a violation")
    assert f"   - late-second (line {at(AT_DEFAULTS, '- name: late-second')[0]}): VIOLATED" in out
    assert "  log: defaults for b: k2/k2" in out[out.index("Result:"):]


def test_coverage_counts_checks_at_defaults(atdef, tmp_path):
    def run(cases: str):
        path = write_policy(tmp_path, f"policy: {atdef.file}\ncases:\n{cases}", "atdef-tests.yaml")
        result = policytest.run_file(path)
        assert not result.failed, [c.mismatches for c in result.failed]
        return {r.name for r in policytest.coverage(result)[2]}

    only_late = ("  - name: an ordinary check fails\n    config: {mode: b, size: 1}\n"
                 "    expect: {rejected_by: late-second, log: ['defaults for b: k2/k2']}\n")
    assert {"no-k2-first", "k3-small"} <= run(only_late)
    stops = ("  - name: stopped at defaults\n    config: {mode: b, size: 2}\n"
             "    expect: {rejected_by: no-k2-first, log: []}\n"
             "  - name: per phase at defaults\n    config: {mode: a, size: 2}\n"
             "    expect: {rejected_by: k3-small, message: 'second=k3 needs size 1, got 2'}\n")
    missing = run(only_late + stops)
    assert "no-k2-first" not in missing and "k3-small" not in missing
    assert "by-mode-b" not in missing  # chosen, though its log line was not emitted


@pytest.mark.parametrize("value", ["early", "resolve", True])
def test_at_outside_its_enum_is_a_schema_error(tmp_path, value):
    text = AT_DEFAULTS.replace("      at: checks\n", f"      at: {json.dumps(value)}\n")
    (p,) = problems_of(tmp_path, text)
    assert p.code == "E201" and "checks.rules.3.at" in p.message and "['defaults', 'checks']" in p.message
    assert (p.line, p.col) == at(text, f"at: {json.dumps(value)}", json.dumps(value))


def test_at_belongs_to_checks_only(tmp_path):
    text = AT_DEFAULTS.replace('log: "size {size}"}', 'log: "size {size}", at: defaults}')
    (p,) = problems_of(tmp_path, text)
    assert p.code == "E201" and "unknown key 'at'" in p.message
    assert (p.line, p.col) == at(text, "at: defaults}", "at")


def test_at_defaults_checks_in_the_shipped_v4():
    """SGLang 0.5.23 raises inside its backend step (_check_dsa_backend_constraints) before it logs
    "Set DSA backends ..."; its HiSparse checks run after, with the line logged."""
    v4 = engine.load_policy("dsa-backends@10")
    assert [r.name for r in v4.stages["checks"].rules if r.at == "defaults"] == [
        "tilelang-fp8-hisparse", "triton-on-cuda", "tilelang-fp8-both", "tilelang-fp8-sm89"]
    for d in (v4.evaluate({"kv_cache_dtype": "bfloat16", "dsa_decode_backend": "triton"}),
              v4.trace({"kv_cache_dtype": "bfloat16", "dsa_decode_backend": "triton"})[0]):
        assert d.violations[0].check == "triton-on-cuda" and d.log == []
    d = v4.evaluate({"enable_hisparse": True, "kv_cache_dtype": "bfloat16"})
    assert d.violations[0].check == "hisparse-radix-cache"
    assert d.log == ["HiSparse enabled (bfloat16): using DSA backends prefill=flashmla_sparse, decode=flashmla_sparse."]
    assert_probe_counts_like_traces(v4, every=397)


# -- 2. upstream ------------------------------------------------------------------------------------
UPSTREAM = """
policy: up
version: 1
description: What a version models.
upstream:
  project: sglang
  releases: [1.2.3, 1.2.3.post1]
  note: >-
    Two   lines
    of note.
  leaves_out:
    - where: srt/arg_groups/kv_cache_hook.py:handle_mxfp8
      why: a generic gate
    - where: srt/other.py
      why: all of it
    - where: groups/x.py:f
      why: x
inputs:
  size: {type: int, values: [1, 2], default: 1}
backends: {a: A, b: B}
phases:
  main: {input: main_backend}
resolve: {rules: []}
defaults:
  rules:
    - {name: small, when: {size: 1}, set: {main: a}}
    - {name: big, set: {main: b}}
checks: {rules: []}
"""
NO_UPSTREAM = UPSTREAM[:UPSTREAM.index("upstream:")] + UPSTREAM[UPSTREAM.index("inputs:"):]


def test_upstream_is_read(tmp_path):
    policy = load_text(tmp_path, UPSTREAM)
    assert policy.upstream == Upstream("sglang", ("1.2.3", "1.2.3.post1"), None, None, "Two lines of note.", (
        ("srt/arg_groups/kv_cache_hook.py:handle_mxfp8", "a generic gate", False), ("srt/other.py", "all of it", False),
        ("groups/x.py:f", "x", False)))
    assert policy.upstream.label() == "sglang 1.2.3, 1.2.3.post1"
    # exact release strings: a .post release is modelled only when listed
    assert policy.upstream.models("1.2.3.post1") and not policy.upstream.models("1.2")
    assert not policy.upstream.models("1.2.3.post2")
    assert load_text(tmp_path, NO_UPSTREAM, "other.yaml").upstream is None
    assert engine.load_policy("dsa-backends@10").upstream.label() == "sglang 0.5.22, 0.5.23"


@pytest.mark.parametrize("fields, label", [
    ({"releases": ("0.5.23",)}, "sglang 0.5.23"),
    ({"releases": ("0.5.22", "0.5.23")}, "sglang 0.5.22, 0.5.23"),
    ({"commit": "0123456789abcdef0123"}, "sglang 0123456789ab"),
    ({"pr": 23013, "commit": "1f2e3d4"}, "sglang PR #23013 (1f2e3d4)"),
    ({"releases": ("0.5.23",), "commit": "abcdef0"}, "sglang 0.5.23 (abcdef0)"),
    ({"pr": 7}, "sglang PR #7"),
])
def test_upstream_label(fields, label):
    assert Upstream("sglang", **fields).label() == label


@pytest.mark.parametrize("where, why", [
    ("srt/arg_groups/kv_cache_hook.py:107 handle_mxfp8", "a generic gate"),
    ("sglang/srt/arg_groups/kv_cache_hook.py:107 handle_mxfp8", "a generic gate"),  # a longer path: a suffix
    ("srt/arg_groups/kv_cache_hook.py:107 handle_kv4", None),  # another function
    ("srt/arg_groups/kv_cache_hook.py:107", None),  # no function named: not that function
    ("srt/arg_groups/my_kv_cache_hook.py:107 handle_mxfp8", None),
    ("srt/groups/x.py:1 f", "x"),
    ("groups/x.py:1 f", "x"),
    ("srt/arg_groups/x.py:1 f", None),  # "groups/x.py" ends the text, but not at a path boundary
    ("srt/other.py:5 anything", "all of it"),  # a place without a function: every function of the file
    ("srt/other.py:5", "all of it"),
    ("srt/other.pyc:5 f", None),
    (None, None),
    ("", None),
])
def test_left_out_matches_a_path_suffix_and_an_optional_function(tmp_path, where, why):
    from engine.sglang.conform.report import left_out_entry

    entry = left_out_entry(load_text(tmp_path, UPSTREAM).upstream, where)
    assert (entry[1] if entry else None) == why


def test_conform_counts_a_left_out_place_as_out_of_scope():
    from engine.sglang.conform import cases, report
    from engine.sglang.conform.protocol import Result

    v4 = engine.load_policy("dsa-backends@10")
    c = v4.complete({"dsa_model": False, "kv_cache_dtype": "mxfp8"})
    assert v4.evaluate(c).ok

    def compare(where):
        r = Result(False, "refused", None, (None, None), (), "resolve", where, "ValueError")
        return report.compare(v4, [c], [cases.case_of(v4, c)], [r], sampled=False)

    got = compare("sglang/srt/arg_groups/kv_cache_hook.py:107 handle_mxfp8_kv_cache_compatibility")
    assert got["conformant"] and got["counts"]["out_of_scope"] == 1
    for elsewhere in ("srt/arg_groups/kv_cache_hook.py:107 other_function",
                      "mysrt/arg_groups/kv_cache_hook.py:107 handle_mxfp8_kv_cache_compatibility"):
        got = compare(elsewhere)
        assert not got["conformant"] and got["counts"]["out_of_scope"] == 0


def test_table_names_what_the_policy_models(tmp_path, capsys):
    path = write_policy(tmp_path, UPSTREAM)
    code, out, _ = run_cli(capsys, "table", "--policy", path)
    assert code == 0 and out.splitlines()[0] == "Routing table of up@1, which models sglang 1.2.3, 1.2.3.post1"
    code, out, _ = run_cli(capsys, "table", "--policy", path, "--format", "markdown")
    assert code == 0 and out.splitlines()[0] == "Routing table of up@1, which models sglang 1.2.3, 1.2.3.post1:"
    code, out, _ = run_cli(capsys, "table", "--policy", path, "--format", "json")
    assert code == 0 and json.loads(out)["upstream"] == {
        "project": "sglang", "releases": ["1.2.3", "1.2.3.post1"], "note": "Two lines of note.",
        "leaves_out": [{"where": "srt/arg_groups/kv_cache_hook.py:handle_mxfp8", "why": "a generic gate"},
                       {"where": "srt/other.py", "why": "all of it"}, {"where": "groups/x.py:f", "why": "x"}]}
    other = write_policy(tmp_path, NO_UPSTREAM, "other.yaml")
    code, out, _ = run_cli(capsys, "table", "--policy", other)
    assert code == 0 and out.splitlines()[0] == "Routing table of up@1"
    code, out, _ = run_cli(capsys, "table", "--policy", other, "--format", "json")
    assert json.loads(out)["upstream"] is None


def test_explain_names_what_the_policy_models_first(tmp_path, capsys):
    policy = load_text(tmp_path, UPSTREAM)
    code, out, _ = run_cli(capsys, "explain", "--policy", policy.file)
    assert code == 0
    assert out.splitlines()[0] == f"Policy up@1 ({policy.file}, sha256:{policy.sha256[:12]}), models sglang 1.2.3, 1.2.3.post1"
    other = load_text(tmp_path, NO_UPSTREAM, "other.yaml")
    code, out, _ = run_cli(capsys, "explain", "--policy", other.file)
    assert out.splitlines()[0] == f"Policy up@1 ({other.file}, sha256:{other.sha256[:12]})"


def test_upstream_needs_releases_commit_or_pr(tmp_path):
    text = UPSTREAM.replace("  releases: [1.2.3, 1.2.3.post1]\n", "")
    (p,) = problems_of(tmp_path, text)
    assert p.code == "E201" and p.message == "upstream needs one of releases, commit or pr: what it models"
    assert (p.line, p.col) == at(text, "upstream:")
    for replacement in ("  commit: 1f2e3d4\n", "  pr: 23013\n"):
        assert load_text(tmp_path, UPSTREAM.replace("  releases: [1.2.3, 1.2.3.post1]\n", replacement)).upstream.label()


@pytest.mark.parametrize("line, bad, what", [
    ("    - where: srt/other.py\n", "    - where: srt/other.py:f:g\n", "leaves_out.1.where"),
    ("    - where: srt/other.py\n", "    - where: srt/other file.py\n", "leaves_out.1.where"),
    ("    - where: srt/other.py\n", "    - where: srt/other.py:1f\n", "leaves_out.1.where"),
    ("  releases: [1.2.3, 1.2.3.post1]\n", "  releases: [latest]\n", "upstream.releases.0"),
    ("  releases: [1.2.3, 1.2.3.post1]\n", "  releases: [0.5.15+]\n", "upstream.releases.0"),
    ("  releases: [1.2.3, 1.2.3.post1]\n", "  releases: [1.2.3, 1.2.3]\n", "upstream.releases"),
    ("  releases: [1.2.3, 1.2.3.post1]\n", "  releases: []\n", "upstream.releases"),
    ("  releases: [1.2.3, 1.2.3.post1]\n", "  commit: 1F2E3D4\n", "upstream.commit"),
    ("  releases: [1.2.3, 1.2.3.post1]\n", "  pr: 0\n", "upstream.pr"),
    ("      why: all of it\n", "      why: ''\n", "leaves_out.1.why"),
])
def test_bad_upstream_fields_are_schema_errors_at_their_place(tmp_path, line, bad, what):
    text = UPSTREAM.replace(line, bad)
    (p,) = problems_of(tmp_path, text)
    value = bad.split(":", 1)[1].strip()
    if what.endswith(".0"):  # an item of a list: the item itself is pointed at
        value = value.strip("[]").split(",")[0]
    assert p.code == "E201" and what in p.message
    assert (p.line, p.col) == at(text, bad.rstrip("\n"), value)


def test_a_leaves_out_entry_needs_where_and_why(tmp_path):
    text = UPSTREAM.replace("      why: all of it\n", "")
    (p,) = problems_of(tmp_path, text)
    assert p.code == "E201" and "missing the required key 'why'" in p.message
    assert p.line == at(text, "- where: srt/other.py")[0]


# -- 3. removed spellings ---------------------------------------------------------------------------
REMOVED = """
policy: gone
version: 1
description: Spellings the upstream parser no longer accepts.
upstream: {project: sglang, releases: [1.2.3], note: n}
inputs:
  size: {type: int, values: [1, 2], default: 1, flags: [--size], removed_flags: {--old-size: use --size}}
backends: {a: A, b: B}
phases:
  main:
    input: main_backend
    flags: [--main-backend]
    removed_flags: {--legacy-backend: use --main-backend}
resolve: {rules: []}
defaults:
  rules:
    - {name: pick, set: {main: a}, log: "main={main}"}
checks: {rules: []}
"""


@pytest.fixture(scope="module")
def gone(tmp_path_factory):
    return load_text(tmp_path_factory.mktemp("gone"), REMOVED)


def test_removed_spellings_are_kept_apart(gone):
    assert gone.removed_keys == {
        "old-size": ("--old-size", "use --size"), "old_size": ("--old-size", "use --size"),
        "legacy-backend": ("--legacy-backend", "use --main-backend"),
        "legacy_backend": ("--legacy-backend", "use --main-backend")}
    assert gone.canonical_key("old-size") is None and gone.canonical_key("size") == "size"
    assert_evaluators_agree(gone)


@pytest.mark.parametrize("config, flag, note", [
    ({"old-size": 2}, "--old-size", "use --size"),
    ({"old_size": 1}, "--old-size", "use --size"),
    ({"legacy-backend": "b"}, "--legacy-backend", "use --main-backend"),
    ({"legacy_backend": "b", "main_backend": "b"}, "--legacy-backend", "use --main-backend"),  # even beside the new one
])
def test_a_removed_spelling_is_c501_naming_its_replacement(gone, config, flag, note):
    for evaluate in (gone.evaluate, gone.trace):
        with pytest.raises(engine.ConfigError) as exc:
            evaluate(config)
        (p,) = exc.value.problems
        key = next(k for k in config if "old" in k or "legacy" in k)
        assert p.code == "C501" and p.hint == note
        assert p.message == f"'{key}': {flag} was removed (sglang 1.2.3 no longer accepts it)"


def test_without_upstream_the_message_names_the_policy(tmp_path):
    text = REMOVED.replace("upstream: {project: sglang, releases: [1.2.3], note: n}\n", "")
    with pytest.raises(engine.ConfigError, match=r"--old-size was removed \(gone@1 no longer accepts it\)"):
        load_text(tmp_path, text).evaluate({"old-size": 1})


@pytest.mark.parametrize("argv, hint", [
    (["--old-size", "2"], "use --size"),
    (["--old-size=2"], "use --size"),
    (["--legacy-backend", "b"], "use --main-backend"),
    (["--legacy-backend"], "use --main-backend"),  # no value: still the removed spelling, not a usage error
    (["--size", "1", "--legacy-backend=a"], "use --main-backend"),
])
def test_a_removed_flag_on_the_command_line_is_c501(gone, capsys, argv, hint):
    for command in ("evaluate", "explain"):
        code, out, err = run_cli(capsys, command, "--policy", gone.file, *argv)
        assert code == 2 and out == "", err
        assert "C501" in err and "was removed (sglang 1.2.3 no longer accepts it)" in err and hint in err, err
        assert "unrecognized arguments" not in err


def test_a_removed_flag_in_a_launch_command_config_file_or_batch_line_is_c501(gone, capsys, tmp_path):
    code, _, err = run_cli(capsys, "evaluate", "--policy", gone.file, "--", "python", "-m", "sglang.launch_server",
                           "--model-path", "some/model", "--legacy-backend", "b")
    assert code == 2 and "C501" in err and "--legacy-backend was removed" in err and "use --main-backend" in err, err
    path = tmp_path / "server.yaml"
    path.write_text("size: 1\nold-size: 2\n")
    code, _, err = run_cli(capsys, "evaluate", "--policy", gone.file, "--config", str(path))
    assert code == 2 and f"{path}:2:1: C501" in err and "use --size" in err, err
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"size": 2}\n{"old_size": 2}\n')
    code, out, _ = run_cli(capsys, "evaluate", "--policy", gone.file, "--batch", str(batch))
    first, second = (json.loads(line) for line in out.splitlines())
    assert code == 2 and first["ok"] is True and first["backends"] == {"main": "a"}
    assert second["ok"] is False and second["error"]["code"] == "C501" and second["error"]["hint"] == "use --size"


@pytest.mark.parametrize("old, new, flag", [
    ("flags: [--size], removed_flags: {--old-size:", "flags: [--size, --old-size], removed_flags: {--old-size:",
     "--old-size"),
    ("flags: [--size], removed_flags: {--old-size:",
     "flags: [--size], deprecated_flags: {--old-size: {log: old}}, removed_flags: {--old-size:", "--old-size"),
    ("removed_flags: {--old-size:", "removed_flags: {--size:", "--size"),  # a flag of the input
    ("flags: [--size], removed_flags: {--old-size:", "flags: [--sz], removed_flags: {--size:", "--size"),  # its name
    ("removed_flags: {--legacy-backend:", "removed_flags: {--main-backend:", "--main-backend"),
])
def test_a_removed_flag_that_is_also_accepted_is_e307(tmp_path, old, new, flag):
    text = REMOVED.replace(old, new)
    errors = [p for p in problems_of(tmp_path, text) if "removed" in p.message]
    assert [(p.code, p.message) for p in errors] == [("E307", f"flag {flag} is listed as removed and as accepted")]
    line, col = at(text, "removed_flags: {" + flag + ":")
    assert (errors[0].line, errors[0].col) == (line, col + len("removed_flags: {"))


def test_a_removed_flag_of_another_input_is_e307(tmp_path):
    text = REMOVED.replace("removed_flags: {--legacy-backend:", "removed_flags: {--size:")
    assert any(p.code == "E307" and "names both" in p.message for p in problems_of(tmp_path, text))


# -- 4. a phase's backends ---------------------------------------------------------------------------
SUBSET = """
policy: subset
version: 1
description: A phase that accepts some of the backends; checks at defaults the lint must read.
inputs:
  big: {type: bool, default: false}
backends: {k1: one, k2: two, k3: three}
phases:
  first: {input: first_backend}
  second: {input: second_backend, backends: [k2, k1]}
resolve: {rules: []}
defaults:
  rules:
    - {name: big, when: {big: true}, set: {first: k2, second: k2}}
    - {name: small, set: {first: k1, second: k1}}
tables:
  by_size:
    key: big
    rows: {"true": [k2, k3], "false": [k1, k3]}
checks:
  rules:
    - name: no-double-k2
      at: defaults
      require: {not: {first_backend: k2, second_backend: k2}}
      message: k2 twice
    - name: no-k3-with-k1
      at: defaults
      when: {first_backend: k3}
      require: {second_backend: {"!=": k1}}
      message: k3 with k1
    - name: sized
      for_each: phase
      when: {backend: {set: true}}
      allowed: by_size
      message: "{phase}={backend} not in {allowed}"
"""


@pytest.fixture(scope="module")
def subset(tmp_path_factory):
    return load_text(tmp_path_factory.mktemp("subset"), SUBSET)


def test_a_phase_accepts_its_backends_in_declared_order(subset):
    assert subset.phases["second"].backends == ("k1", "k2")
    assert subset.inputs["second_backend"].values == ("k1", "k2")  # the backends' order, not the list's
    assert subset.phases["first"].backends == subset.inputs["first_backend"].values == ("k1", "k2", "k3")
    assert domain.config_count(subset) == 2 * 4 * 3
    assert {c["second_backend"] for c in domain.configs(subset)} == {"k1", "k2", None}
    assert_evaluators_agree(subset)
    assert_probe_counts_like_traces(subset)


def test_another_backend_for_that_phase_is_c502(subset, capsys):
    for evaluate in (subset.evaluate, subset.trace):
        with pytest.raises(engine.ConfigError) as exc:
            evaluate({"second_backend": "k3"})
        (p,) = exc.value.problems
        assert p.code == "C502" and "one of k1, k2" in p.message
    assert subset.evaluate({"big": True, "first_backend": "k3", "second_backend": "k2"}).ok
    code, _, err = run_cli(capsys, "evaluate", "--policy", subset.file, "--second-backend", "k3")
    assert code == 2 and "C502" in err and "one of k1, k2" in err


def test_an_unknown_backend_in_a_phase_is_e303(tmp_path):
    text = SUBSET.replace("backends: [k2, k1]", "backends: [k2, k4]")
    errors = problems_of(tmp_path, text)
    assert [(p.code, p.message) for p in errors if p.code == "E303"] == [("E303", "unknown backend 'k4'")]
    p = next(p for p in errors if p.code == "E303")
    assert (p.line, p.col) == at(text, "backends: [k2, k4]", "k4") and "k1, k2, k3" in p.hint


@pytest.mark.parametrize("old, new, token", [
    ("{name: small, set: {first: k1, second: k1}}", "{name: small, set: {first: k1, second: k3}}", "k3}}"),
    ("when: {first_backend: k3}", "when: {second_backend: k3}", "k3}"),
])
def test_naming_a_backend_the_phase_does_not_accept_is_e302(tmp_path, old, new, token):
    text = SUBSET.replace(old, new)
    (p,) = problems_of(tmp_path, text)
    assert p.code == "E302" and "k3" in p.message
    assert (p.line, p.col) == at(text, new, token)


def test_a_default_outside_the_phase_names_what_it_accepts(tmp_path):
    text = SUBSET.replace("set: {first: k1, second: k1}", "set: {first: k1, second: k3}")
    (p,) = problems_of(tmp_path, text)
    assert p.message == "phase 'second' does not accept backend 'k3'" and p.hint == "it accepts k1, k2"


def test_a_per_phase_check_may_name_any_backend(tmp_path):
    """`backend` in a for_each check ranges over every declared backend: the check runs in every phase."""
    text = SUBSET.replace("when: {backend: {set: true}}", "when: {backend: {in: [k1, k3]}}")
    policy = load_text(tmp_path, text)
    assert [v.check for v in policy.evaluate({"big": True, "first_backend": "k1"}).violations] == ["sized"]


def test_table_tries_only_the_backends_a_phase_accepts(subset, capsys):
    code, out, _ = run_cli(capsys, "table", "--policy", subset.file, "--format", "json")
    assert code == 0
    rows = json.loads(out)["rows"]
    # each backend set alone, the other phase left to the defaults; second never tries k3
    assert {r["when"]["big"][0]: r["allowed"] for r in rows} == {
        True: {"first": ["k3"], "second": []},
        False: {"first": ["k1"], "second": ["k1"]}}
    code, out, _ = run_cli(capsys, "table", "--policy", subset.file)
    assert code == 0 and "k2 twice" in out


def test_lint_reads_checks_at_defaults_and_phase_subsets(subset):
    """L403: the default `big` fills both phases with k2, which the whole-config check at defaults
    no-double-k2 rejects. no-k3-with-k1 fails only with a user's k3 beside the default's k1: not the
    default's fault. The phase subset gives no L404 or L405."""
    problems, notes = lint(subset)
    assert notes == []
    assert [(p.code, p.line) for p in problems] == [("L403", at(SUBSET, "{name: big,")[0])]
    assert "default rule 'big' sets a backend that check 'no-double-k2' rejects, e.g. for big=true" in problems[0].message
    assert problems[0].message.endswith(": k2 twice")


def test_lint_blames_a_default_for_a_per_phase_check_at_defaults(tmp_path):
    text = SUBSET.replace("      require: {not: {first_backend: k2, second_backend: k2}}",
                          "      for_each: phase\n      when: {backend: k2, big: true}\n      require: {phase: first}")
    problems, _ = lint(load_text(tmp_path, text))
    assert [(p.code, p.line) for p in problems] == [("L403", at(text, "{name: big,")[0])]
    assert "check 'no-double-k2' rejects" in problems[0].message


def test_lint_is_clean_where_nothing_contradicts(tmp_path):
    text = SUBSET.replace("set: {first: k2, second: k2}", "set: {first: k2, second: k1}").replace(
        "rows: {\"true\": [k2, k3], \"false\": [k1, k3]}", "rows: {\"true\": [k1, k2, k3], \"false\": [k1, k3]}")
    assert lint(load_text(tmp_path, text)) == ([], [])


def test_the_shipped_v4_phase_subset():
    v4 = engine.load_policy("dsa-backends@10")
    assert "triton_sparse_mla" in v4.inputs["dsa_prefill_backend"].values
    assert "triton_sparse_mla" not in v4.inputs["dsa_decode_backend"].values
    assert set(v4.inputs["dsa_decode_backend"].values) == set(v4.backends) - {"triton_sparse_mla"}


def test_table_size_counts_the_backends_each_phase_accepts(subset, capsys, monkeypatch):
    import engine.analysis.domain as d

    monkeypatch.setattr(d, "MAX_CONFIGS", 11)  # 2 rows x (1 + 3 first + 2 second backends) = 12
    code, _, err = run_cli(capsys, "table", "--policy", subset.file)
    assert code == 2 and "C506" in err and "has 12 configs" in err
    monkeypatch.setattr(d, "MAX_CONFIGS", 12)
    assert run_cli(capsys, "table", "--policy", subset.file)[0] == 0
