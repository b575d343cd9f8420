"""One way to render a value (engine.values): booleans read true/false in tables, explanations and
messages alike; a value from a file or config is quoted the policy language's way, clipped; its
type is named one way. The renderers of each module go through these, checked here end to end."""
import ast
import os
import re

import pytest

import engine
from engine.values import clip, kind, show, shown, typed
from tests.helpers import ROOT, python_files, run_cli


def test_show_words():
    assert [show(v) for v in (None, True, False, 64, "fa3")] == ["unset", "true", "false", "64", "fa3"]


@pytest.mark.parametrize("value, quoted, named", [
    (None, "null", "null"),
    (True, "true", "a boolean"),
    (False, "false", "a boolean"),
    (10, "10", "an integer"),
    (10.5, "10.5", "a number"),
    ("fa3", "'fa3'", "a string"),
    (["a"], "['a']", "a list"),
    ({"a": 1}, "{'a': 1}", "a mapping"),
    (b"x", "b'x'", "a bytes"),
])
def test_shown_kind_typed(value, quoted, named):
    assert shown(value) == quoted
    assert kind(value) == named
    assert typed(value) == ("null" if value is None else f"{named} {quoted}")


def test_shown_clips_and_never_raises():
    long = "x" * 500
    assert shown(long) == clip(repr(long)) and len(shown(long)) < 120 and "(502 characters)" in shown(long)
    assert shown(10 ** 5000) == f"<an integer of {(10 ** 5000).bit_length()} bits>"

    class Bad:
        def __repr__(self):
            raise RuntimeError("no")

    assert shown(Bad()) == "<a Bad>"
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert shown(deep) == "<a list>"


def test_booleans_read_alike_in_a_table_a_message_and_an_explanation(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "table", "--policy", "dsa-backends@2", "--where", "dsa_model=true",
                           "--where", "disable_radix_cache=true")
    assert code == 0
    assert "(dsa_model=true, disable_radix_cache=true)" in out  # as --where spells it
    cells = set(re.findall(r"\benable_hisparse=(\S+)", out))
    assert {"true", "false"} <= cells and not {"yes", "no"} & cells
    with pytest.raises(engine.ConfigError, match="expected an integer, got a boolean true$"):
        engine.evaluate("dsa-backends@2", {"sm_major": True})
    code, out, _ = run_cli(capsys, "explain", "--policy", "dsa-backends@2", "--enable-hisparse")
    assert "enable_hisparse=true" in out


def test_no_module_keeps_a_private_renderer():
    """The helpers this module replaced do not come back: no function of the engine named like a
    value renderer besides engine.values' own (kernels_bridge has its own, errors.shown)."""
    names = {"_show", "_shown", "shown", "show", "_type_name", "type_name", "_kind", "kind", "typed",
             "clip"}
    found = []
    for path in python_files("engine", "kernels_bridge"):
        rel = os.path.relpath(path, ROOT)
        for node in ast.parse(open(path, encoding="utf-8").read()).body:  # module level: a method
            if isinstance(node, ast.FunctionDef) and node.name in names:   # named kind is no renderer
                found.append(f"{rel}:{node.name}")
    assert sorted(found) == sorted(["engine/values.py:show", "engine/values.py:shown", "engine/values.py:kind",
                                    "engine/values.py:typed", "engine/values.py:clip",
                                    "kernels_bridge/errors.py:shown"])
