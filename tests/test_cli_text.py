"""The command line reads well: help wrapped between values, a plain table that fits a terminal,
summaries on stdout, the explanation as data, and a did-you-mean that never offers the name typed."""
import json
import re

import pytest

import engine
from engine.cli.options import wrap_words
from engine.cli.reports import TEXT_WIDTH
from engine.files.shipped import DEFAULT_POLICY
from engine.files.catalog import list_families
from engine.suggest import did_you_mean
from tests.helpers import run_cli

SHIPPED = [f"{family}@{v}" for family, versions in list_families().items() for v in versions]


def test_wrap_breaks_between_words_and_values_only():
    text = "the KV cache dtype [one of auto|fp8_e5m2|fp8_e4m3|bf16|fp4_mx_block16; default auto]"
    lines = wrap_words(text, 24)
    assert all(len(line) <= 24 for line in lines)
    assert " ".join(lines).replace("| ", "|") == text  # nothing lost, breaks only after a `|` or a space
    assert wrap_words("short verylongwordthatdoesnotfit x", 10) == ["short", "verylongwordthatdoesnotfit", "x"]


@pytest.mark.parametrize("columns", ["60", "100"])
def test_help_never_breaks_inside_a_value(capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)
    policy = engine.load_policy(DEFAULT_POLICY)
    code, out, _ = run_cli(capsys, "evaluate", "--help")
    assert code == 0
    words = set(re.split(r"[\s|\[\];,]+", out))
    values = [str(v) for spec in policy.inputs.values() if spec.type == "enum" for v in spec.values]
    assert values and not [v for v in values if v not in words]  # each whole on one line
    assert "--kv-cache-dtype" in words and "--disable-radix-cache" in words


@pytest.mark.parametrize("ref", SHIPPED)
def test_the_plain_table_fits_100_columns_with_its_columns_aligned(capsys, ref):
    code, out, _ = run_cli(capsys, "table", "--policy", ref)
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= TEXT_WIDTH
    policy = engine.load_policy(ref)
    first, *others = [f"{ph}:" for ph in policy.phases]
    at = {line.index(others[0]) for line in lines if first in line and others and others[0] in line}
    assert len(at) <= 1 and (at or not others or all(others[0] not in line for line in lines if first in line))
    labels = {line.index(f"{ph}:") for ph in policy.phases for line in lines if f" {ph}:" in line}
    assert min(labels) == 11  # every phase's first column starts where the first's does


def test_the_table_says_inputs_equal_in_every_row_once(capsys):
    from engine.analysis.domain import parse_where
    from engine.analysis.table import routing_rows
    from engine.cli.reports import table_text

    policy = engine.load_policy(DEFAULT_POLICY)
    where = ["dsa_model=true", "enable_hisparse=true", "kv_cache_dtype=fp8_e4m3", "platform=cuda",
             "disable_radix_cache=true", "hisparse_device_buffer_size=unset"]
    result = routing_rows(policy, parse_where(policy, where))
    assert len(result["rows"]) > 1 and all(r["when"].get("sm_major") for r in result["rows"])
    for r in result["rows"]:  # one more input equal in every row
        r["when"]["hisparse_top_k"] = [2048]
    out = table_text(policy, result)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= TEXT_WIDTH  # the long title wrapped too
    common = [line for line in lines if line.startswith("in every row:")]
    assert common == ["in every row: hisparse_top_k=2048"]
    assert "hisparse_top_k" not in out.split(common[0])[1]
    assert "flashinfer_sparse_mla" in out


def test_a_long_backend_keeps_the_decision_columns_aligned(capsys):
    code, out, _ = run_cli(capsys, "evaluate", "--enable-hisparse", "--disable-radix-cache", "--kv-cache-dtype",
                           "fp8_e4m3", "--sm-major", "10", "--dsa-decode-backend", "flashinfer_sparse_mla")
    assert code == 0
    prefill, decode = out.splitlines()[1:3]
    assert "flashinfer_sparse_mla " in decode
    assert prefill.index("defaults rule") == decode.index("set by the user")


def test_explain_as_json(capsys):
    args = ["--enable-hisparse", "--disable-radix-cache", "--kv-cache-dtype", "fp8_e4m3"]
    code, out, _ = run_cli(capsys, "explain", *args, "--format", "json")
    assert code == 0
    r = json.loads(out)
    _, evaluated, _ = run_cli(capsys, "evaluate", *args, "--format", "json")
    assert r["decision"] == json.loads(evaluated)
    assert [s["stage"] for s in r["stages"]][:2] == ["resolve", "defaults"]
    defaults = next(s for s in r["stages"] if s["stage"] == "defaults")
    chosen = [rule["rule"] for rule in defaults["rules"] if rule["result"] == "chosen"]
    assert chosen == [r["decision"]["sources"]["decode"]] == ["hisparse-fp8"]
    assert all(re.fullmatch(r".+\.yaml:\d+", rule["location"]) for s in r["stages"] for rule in s["rules"])
    code, out, _ = run_cli(capsys, "explain", "--enable-hisparse", "--format", "json")
    r = json.loads(out)
    assert code == 1 and not r["decision"]["ok"]
    assert any(rule["result"] in ("violated", "stop") for s in r["stages"] for rule in s["rules"])


def test_did_you_mean_never_offers_the_name_typed(capsys):
    assert "did you mean 'dsa_model'" not in did_you_mean("dsa_model", ["dsa_model", "dsa_mode"])
    code, _, err = run_cli(capsys, "table", "--where", "dsa_model")
    assert code == 2
    assert "expected NAME=VALUE, e.g. dsa_model=" in err and "did you mean" not in err
    code, _, err = run_cli(capsys, "table", "--where", "dsa_modle=true")
    assert code == 2 and "did you mean 'dsa_model'?" in err


def test_check_prints_its_summary_on_stdout(capsys):
    code, out, err = run_cli(capsys, "check", "--no-deep")
    assert code == 0
    assert re.search(r"^checked \d+ policy file\(s\): 0 problem\(s\) in 0 file\(s\)$", out, re.M)
    assert "checked" not in err
