"""The README's generated blocks are current, its quickstart commands exist, and every example
command it shows gives the output shown (`...` stands for text that varies or was trimmed: inside
a line any text, on a line of its own any number of lines), and its policy-language snippets are
the shipped policy's text."""
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tools import readme as generator
from tools.readme import stale_blocks
from tests.helpers import ROOT

PROGRESS = re.compile(r"^(step|diff: configs|table: configs) \d+/\d+$")  # stderr, timing-dependent


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
        return fh.read()


PAGES = generator.pages(ROOT)


def read_all():
    return "\n".join(read(page) for page in PAGES)


@pytest.mark.parametrize("page", generator.generated_pages(ROOT))
def test_generated_blocks_are_current(page):
    stale = stale_blocks(read(page))
    assert not stale, f"{page} blocks out of date: {stale}; run `python -m tools.readme`"
    assert not generator.unknown_blocks(read(page)), "a marked block no generator produces"


def test_the_generator_covers_every_page_with_a_block():
    """`python -m tools.readme` (no argument) rewrites every page holding a marker, README.md and
    docs/*.md alike, so no page's blocks are left to go stale; --check reports without writing."""
    marked = [p for p in PAGES if "<!-- BEGIN " in read(p)]
    assert any(p.startswith("docs/") for p in marked)
    assert generator.generated_pages(ROOT) == marked


def test_the_generator_rewrites_a_stale_block_and_check_reports_it(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- BEGIN error-codes -->\nSTALE TEXT\n<!-- END error-codes -->\nmore\n", encoding="utf-8")
    assert generator.main(["--check", str(page)]) == 1
    assert "error-codes" in capsys.readouterr().err and "STALE TEXT" in page.read_text(encoding="utf-8")
    assert generator.main([str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert "| E101 | unreadable-file |" in text and "STALE TEXT" not in text and text.endswith("more\n")
    assert generator.main(["--check", str(page)]) == 0


def test_quickstart_targets_exist():
    makefile = read("Makefile")
    readme = read("README.md")
    for target in ("run", "test"):
        assert f"make {target}" in readme
        assert f"\n{target}:" in makefile
    assert "make test" in read(".ci/run")


def code_blocks(text):
    """(info string, lines) of every fenced block."""
    return [(m.group(1), m.group(2).split("\n")) for m in re.finditer(r"^```(\w*)\n(.*?)\n```$", text, re.S | re.M)]


def examples(lines):
    """(command, expected output lines, expected exit or None) of each `$ hisparse ...` in a block."""
    out, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("$ hisparse "):
            i += 1
            continue
        command = lines[i][2:]
        while command.endswith("\\"):
            i += 1
            command = command[:-1] + " " + lines[i].strip()
        i += 1
        expected = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i])
            i += 1
        while expected and not expected[-1].strip():
            expected.pop()
        code = None
        if expected and re.fullmatch(r"\(exit \d\)", expected[-1]):
            code = int(expected.pop()[6])
        out.append((command, expected, code))
    return out


def pattern(expected) -> str:
    parts = []
    for line in expected:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append("[^\n]*".join(re.escape(p) for p in line.rstrip().split("...")) + r"\n")
    return "".join(parts)


def normalized(text: str) -> str:
    lines = [line.rstrip() for line in text.split("\n") if not PROGRESS.match(line)]
    return "\n".join(lines).strip("\n") + "\n"


def run_hisparse(command: str):
    argv = shlex.split(command)
    assert argv[0] == "hisparse"
    proc = subprocess.run([sys.executable, "-m", "engine.cli", *argv[1:]], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    return proc.returncode, proc.stdout


def readme_examples():
    text = read("README.md")
    make_run = text.index("`make run` prints")
    found = []
    for info, lines in code_blocks(read_all()):
        for command, expected, code in examples(lines):
            found.append((command, expected, code))
    # the make run block is checked whole through examples/run.sh (test_make_run_prints_what_the_readme_shows)
    first = code_blocks(text[make_run:])[0][1]
    shown_by_make_run = {c for c, _, _ in examples(first)}
    return [e for e in found if e[0] not in shown_by_make_run]


@pytest.mark.parametrize("command, expected, code", readme_examples(), ids=lambda v: v[:60] if isinstance(v, str) else "")
def test_example_output_is_what_the_readme_shows(command, expected, code):
    got_code, got = run_hisparse(command)
    if code is not None:
        assert got_code == code
    assert re.fullmatch(pattern(expected), normalized(got)), f"$ {command}\n{got}"


def test_make_run_prints_what_the_readme_shows():
    text = read("README.md")
    block = code_blocks(text[text.index("`make run` prints"):])[0][1]
    bin_dir = os.path.dirname(sys.executable)
    if not os.path.exists(os.path.join(bin_dir, "hisparse")):
        pytest.skip("the hisparse entry point is not installed next to this Python")
    proc = subprocess.run(["bash", "examples/run.sh", bin_dir], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.fullmatch(pattern(block), normalized(proc.stdout)), proc.stdout


def test_make_run_fails_when_a_step_fails(tmp_path):
    fake = tmp_path / "hisparse"
    fake.write_text("#!/bin/sh\necho pretending\nexit 0\n")  # every step exits 0, so step 2 is wrong
    fake.chmod(0o755)
    proc = subprocess.run(["bash", "examples/run.sh", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert "this step should exit 1" in proc.stderr


def test_launch_command_example_runs():
    text = read_all()
    commands = [" ".join(line.rstrip("\\").strip() for line in lines) for info, lines in code_blocks(text)
                if info == "sh" and lines[0].startswith("hisparse evaluate -- ")]
    assert commands
    for command in commands:
        code, out = run_hisparse(command)
        assert code == 0 and out.startswith("ACCEPTED by nsa-backends@"), out


def test_json_decision_example_is_real_output():
    text = read_all()
    block = next(lines for info, lines in code_blocks(text) if info == "json" and lines[0].startswith('{"ok"'))
    shown = json.loads(re.sub(r'"([0-9a-f]+)…"', r'"\1"', "\n".join(block)))  # an abbreviated sha256
    code, out = run_hisparse("hisparse evaluate --policy nsa-backends@2 --enable-hisparse --kv-cache-dtype "
                             "fp8_e4m3 --disable-radix-cache --nsa-decode-backend flashmla_sparse --format json")
    real = json.loads(out)
    assert code == 1
    assert real["policy"].pop("sha256").startswith(shown["policy"].pop("sha256"))
    assert real == shown


def test_a_quick_bench_never_writes_the_committed_results(tmp_path, monkeypatch):
    """`make bench-quick` (python -m bench --quick) writes bench/results-quick/, which git ignores;
    the README's figures come from bench/results/, which only a full run replaces."""
    from bench import common

    committed, quick = tmp_path / "results", tmp_path / "results-quick"
    monkeypatch.setattr(common, "_output", common._output)  # put back after the test
    monkeypatch.setattr(common, "RESULTS", str(committed))
    monkeypatch.setattr(common, "QUICK_RESULTS", str(quick))
    common.use_output(True)
    try:
        path = common.write_result("engine", {"x": 1}, {}, quick=True)
        assert path == str(quick / "engine.json") and not committed.exists()
        assert common.output_dir() == str(quick)
    finally:
        common.use_output(False)
    assert common.write_result("engine", {"x": 1}, {}, quick=True).startswith(str(quick))
    assert "bench/results-quick/" in read(".gitignore").split()
    assert "bench --quick" in read("Makefile")


def test_python_api_example_values_are_real():
    """In the API example, a line `expr  # literal` claims that expr evaluates to literal (a set
    literal: to a mapping with those keys)."""
    import ast

    text = read_all()
    block = next(lines for info, lines in code_blocks(text)
                 if info == "python" and any(line.startswith("d = engine.evaluate(policy") for line in lines))
    first = next(i for i, line in enumerate(block) if line.startswith("d.ok"))
    setup = "\n".join(line.split("  #")[0] for line in block[:first])
    ns: dict = {}
    exec(setup, ns)  # noqa: S102 - the README's own example
    checked = 0
    for line in block[first:]:
        expr, sep, comment = line.partition("#")
        try:
            want = ast.literal_eval(comment.strip())
        except (ValueError, SyntaxError):
            continue  # a description, not a value
        got = eval(expr.strip(), ns)  # noqa: S307
        assert (set(got) if isinstance(want, set) else got) == want, line  # a set names the keys
        checked += 1
    assert checked >= 3


def _contained(part, whole) -> bool:
    """`part` is an excerpt of `whole`: mappings may leave keys out, a list of mappings may leave
    items out (each shown one is an excerpt of one of whole's), text is equal up to whitespace."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and _contained(v, whole[k]) for k, v in part.items())
    if isinstance(part, list) and part and all(isinstance(x, dict) for x in part):
        return isinstance(whole, list) and all(any(_contained(x, y) for y in whole) for x in part)
    if isinstance(part, str) and isinstance(whole, str):
        return part.split() == whole.split()
    return part == whole and type(part) is type(whole)


def test_language_snippets_of_v4_are_excerpts_of_it():
    """The YAML snippets of "The policy language" that show the newer features are nsa-backends@4's
    own text, so they load and mean what the shipped policy means."""
    import yaml

    section = read("docs/policy-language.md")
    with open(os.path.join(ROOT, "policies", "nsa-backends", "v4.yaml"), encoding="utf-8") as fh:
        v4 = yaml.safe_load(fh)
    snippets = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, re.S)]
    shown = [s for s in snippets if any(word in json.dumps(s) for word in ("upstream", "removed_flags", '"at"'))]
    assert len(shown) == 3
    for snippet in shown:
        assert _contained(snippet, v4), snippet
    assert not _contained({"phases": {"decode": {"backends": ["triton_sparse_mla"]}}}, v4)  # the check can fail


def test_the_removed_spelling_example_is_what_v4_says():
    import engine

    with pytest.raises(engine.ConfigError) as exc:
        engine.load_policy("nsa-backends@4").evaluate({"nsa-decode-backend": "fa3"})
    assert f"`{exc.value.problems[0]}`" in read("docs/policy-language.md")
