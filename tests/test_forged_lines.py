"""No field of text output can print a line of its own: a line break of any kind (\\n, \\r, \\v,
\\f, \\x1c-\\x1e, \\x85, U+2028, U+2029) in a model path, a config key or value, a policy message,
a policy's description, a file path, a test case's name or a record is shown as an escape
(engine.values.one_line), so nothing reads like a verdict line that the command did not give."""
import json

import pytest

from engine.errors import Problem
from engine.values import one_line, show
from tests.helpers import minimal_text, run_cli, write_policy

BREAKS = ["\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r\n"]
YAML_ESCAPE = {"\n": "\\n", "\r": "\\r", "\v": "\\v", "\f": "\\f", "\x1c": "\\x1c", "\x1d": "\\x1d",
               "\x1e": "\\x1e", "\x85": "\\x85", "\u2028": "\\u2028", "\u2029": "\\u2029", "\r\n": "\\r\\n"}


def no_forged_line(*texts):
    for text in texts:
        for line in text.splitlines():  # str.splitlines breaks at every character above
            assert not line.startswith("FORGED"), text


def test_one_line_escapes_every_break_and_keeps_the_rest():
    for br in BREAKS:
        text = one_line(f"a{br}FORGED")
        assert text.splitlines() == [text] and "FORGED" in text and text.startswith("a\\")
    assert one_line("plain text, tabs\tkept") == "plain text, tabs\tkept"
    assert show("x\ny") == "x\\ny" and show(None) == "unset"
    assert str(Problem("C501", "m\nFORGED", "f\u2028FORGED", 1, 2, "h\rFORGED")).splitlines() == \
        ["f\\u2028FORGED:1:2: C501: m\\nFORGED (h\\x0dFORGED)"]


@pytest.mark.parametrize("br", BREAKS)
def test_command_line_and_config_fields(capsys, tmp_path, br):
    code, out, err = run_cli(capsys, "evaluate", "--model-path", f"m{br}FORGED", "--enable-hisparse")
    assert code == 1 and "m\\" in err
    no_forged_line(out, err)
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"tp": 1, f"k{br}FORGED": 1}))
    code, out, err = run_cli(capsys, "evaluate", "--config", str(config))
    assert code == 0 and "ignored" in err
    no_forged_line(out, err)
    code, out, err = run_cli(capsys, "evaluate", "--kv-cache-dtype", f"fp8{br}FORGED")
    assert code == 2
    no_forged_line(out, err)
    code, out, err = run_cli(capsys, "table", "--where", f"platform=cuda{br}FORGED")
    assert code == 2
    no_forged_line(out, err)
    batch = tmp_path / "b.jsonl"
    batch.write_text(json.dumps({"kv_cache_dtype": f"x{br}FORGED"}) + "\n" + json.dumps({f"k{br}FORGED": 1}) + "\n")
    for fmt in ("text", "json"):
        code, out, err = run_cli(capsys, "evaluate", "--batch", str(batch), "--format", fmt)
        assert code == 2 and len(out.splitlines()) == 2
        no_forged_line(out, err)


@pytest.mark.parametrize("br", BREAKS)
def test_policy_fields_and_file_paths(capsys, tmp_path, br):
    text = minimal_text().replace('message: "{phase} needs', f'message: "x{YAML_ESCAPE[br]}FORGED {{phase}} needs')
    text = text.replace("description: A small valid policy the bad fixtures are derived from.",
                        f'description: "d{YAML_ESCAPE[br]}FORGED"')
    folder = tmp_path / f"dir{br}FORGED"
    path = write_policy(folder, text, "policy.yaml")
    bad_config = ["--policy", path, "--decode-backend", "flashmla_kv"]
    for argv in (["evaluate", *bad_config], ["explain", *bad_config], ["table", "--policy", path],
                 ["evaluate", "--policy", path]):
        code, out, err = run_cli(capsys, *argv)
        assert code in (0, 1), (argv, err)
        no_forged_line(out, err)
    code, out, err = run_cli(capsys, "evaluate", *bad_config)
    assert "REJECTED by mini@1: x\\" in out
    broken = write_policy(folder, "policy: mini\nversion: [\n", "broken.yaml")
    for argv in (["check", broken], ["evaluate", "--policy", broken]):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and "dir\\" in out + err
        no_forged_line(out, err)


@pytest.mark.parametrize("br", ["\n", "\u2028", "\x85"])
def test_test_case_names_and_records(capsys, tmp_path, br):
    write_policy(tmp_path, minimal_text(), "mini/v1.yaml")
    tests = write_policy(tmp_path, f'cases:\n  - name: "c{YAML_ESCAPE[br]}FORGED"\n    config: {{}}\n'
                                   '    expect: {ok: false}\n', "mini/tests/v1.yaml")
    code, out, err = run_cli(capsys, "test", tests)
    assert code == 1 and "FAIL" in out
    no_forged_line(out, err)
    records = tmp_path / f"r{br}FORGED.jsonl"
    code, _, _ = run_cli(capsys, "evaluate", "--record", str(records), "--model-path", f"m{br}FORGED")
    with open(records, "a", encoding="utf-8") as fh:
        fh.write('{"time": "x\\nFORGED"}\n')
    code, out, err = run_cli(capsys, "replay", str(records))
    assert code == 2
    no_forged_line(out, err)
