"""The documentation (README.md and docs/*.md) is true: its generated blocks are current, every
fenced block is an example a test checks, and its links, module names and paths exist.

- `$ COMMAND` lines show a command and its output; they run, in order, in a scratch folder holding
  copies of policies/ and examples/ (`...` stands for text that varies or was trimmed: inside a
  line any text, on a line of its own any number of lines; `(exit N)` is the exit code). A
  ```diff block between them is applied there as a patch.
- ```python blocks of a page run in order in one process; a ```text block right after one is its
  output.
- ```sh blocks show commands too slow, too big or too GPU-bound to run in a test: their programs,
  make targets, modules, options, files and variables must exist, and hisparse's own commands must
  parse.
- ```yaml blocks are excerpts of a shipped policy or policy test file; ```json, the decision of
  the command that prints it.
"""
import argparse
import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from unittest import mock

import pytest

from tests import doc_pages
from tests.doc_pages import Block, blocks
from tests.helpers import ROOT
from tools import doc_blocks as generator
from tools.doc_blocks import stale_blocks

PROGRESS = re.compile(r"^(step|diff: configs|table: configs) \d+/\d+$|^(conform|building KV): \d+/\d+ (launches|rows) "
                      r"|^conform: importing SGLang\.\.\. \d+")  # stderr, timing-dependent
PAGES = generator.pages(ROOT)


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
        return fh.read()


def read_all():
    return "\n".join(read(page) for page in PAGES)


def sglang_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang") is not None


# -- generated blocks --------------------------------------------------------------------------------

@pytest.mark.parametrize("page", generator.generated_pages(ROOT))
def test_generated_blocks_are_current(page):
    stale = stale_blocks(read(page))
    assert not stale, f"{page} blocks out of date: {stale}; run `python -m tools.doc_blocks`"
    assert not generator.unknown_blocks(read(page)), "a marked block no generator produces"


def test_the_generator_covers_every_page_with_a_block():
    """`python -m tools.doc_blocks` (no argument) rewrites every page holding a marker, README.md and
    docs/*.md alike, so no page's blocks are left to go stale; --check reports without writing."""
    marked = [p for p in PAGES if "<!-- BEGIN " in read(p)]
    assert "README.md" in marked and any(p.startswith("docs/") for p in marked)
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


def typed_figures(text: str) -> list[str]:
    """Measured figures (a number with a unit of time, size, rate or ratio) in a page's prose, outside
    its generated blocks and fenced examples."""
    text = doc_pages.prose(re.sub(r"<!-- BEGIN ([a-z-]+) -->.*?<!-- END \1 -->", "", text, flags=re.S))
    return re.findall(r"(?<![\w.])\d[\d,.]*\s?(?:ms|us|s|min|x|%|MB|GB|GB/s|GFLOP/s|TFLOPS)(?![\w/])", text)


def test_the_readme_types_no_figure():
    """The README's measured figures are generated from bench/results/ and docs/conformance/ (its
    blocks), never typed."""
    readme = read("README.md")
    assert {"headline", "versions"} <= {m for m in re.findall(r"<!-- BEGIN ([a-z-]+) -->", readme)}
    assert not typed_figures(readme), f"figures typed into the README: {typed_figures(readme)}"
    assert typed_figures("the diff takes 0.71 s, 1.78x its floor\n<!-- BEGIN x -->\n2 ms\n<!-- END x -->\n"
                         "```\n3 ms\n```\n") == ["0.71 s", "1.78x"]


# -- the quickstart ----------------------------------------------------------------------------------

def test_quickstart_targets_exist():
    makefile = read("Makefile")
    readme = read("README.md")
    for target in ("run", "test"):
        assert f"make {target}" in readme
        assert f"\n{target}:" in makefile
    assert "make test" in read(".ci/run")


def test_the_quickstart_comes_before_the_versions_table():
    readme = read("README.md")
    assert readme.index("## Quickstart") < readme.index("## Versions") < readme.index("## Edit a policy")
    assert "<!-- BEGIN install -->" in readme[readme.index("## Quickstart"):readme.index("## Versions")]


def make_dry_run(target: str, venv) -> str:
    proc = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_installs_only_the_main_jobs_needs_and_make_test_the_rest(tmp_path):
    venv = tmp_path / "venv"
    run = make_dry_run("run", venv)
    assert "torch==2.13.0" in run and "'.[bridge]'" in run and "examples/run.sh" in run
    assert "sglang==" not in run and "'.[dev]'" not in run and "-m pytest" not in run
    test = make_dry_run("test", venv)  # a fresh clone: everything, torch first
    assert test.index("torch==2.13.0") < test.index("sglang==0.5.23") < test.index("'.[dev]'") < test.index("-m pytest")
    venv.mkdir()
    (venv / ".installed-run").touch()  # `make run` was run: `make test` installs only the difference
    after_run = make_dry_run("test", venv)
    assert "torch==2.13.0" not in after_run and "sglang==0.5.23" in after_run and "'.[dev]'" in after_run
    # conform-env builds a release's own environment outside the checkout (0.5.23 by default)
    assert "tools/sglang-env.sh 0.5.23" in make_dry_run("conform-env", venv)
    assert "tools/sglang-env.sh 0.5.11" in subprocess.run(["make", "-n", "conform-env", "SGLANG=sglang==0.5.11"],
                                                          cwd=ROOT, capture_output=True, text=True).stdout


def make_run_block() -> Block:
    text = read("README.md")
    at = text.count("\n", 0, text.index("`make run` prints")) + 1
    return next(b for b in blocks(text) if b.line > at)


def test_make_run_prints_what_the_readme_shows():
    block = make_run_block().lines
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


# -- every block is checked --------------------------------------------------------------------------

def kind(page: str, block: Block, previous: Block | None) -> str:
    if any(line.startswith("$ ") for line in block.lines):
        return "session"
    if block.info in ("python", "sh", "yaml", "json", "diff"):
        return block.info
    if block.info == "text" and previous is not None and previous.info == "python":
        return "output"
    if block.info == "" and page == "docs/design.md":
        return "figure"  # the layer diagram; its paths are checked with the prose's
    return "unchecked"


def page_blocks(page):
    found = blocks(read(page))
    return [(b, kind(page, b, prev)) for prev, b in zip([None] + found, found)]


@pytest.mark.parametrize("page", PAGES)
def test_every_block_is_an_example_a_test_checks(page):
    unchecked = [f"{page}:{b.line} ```{b.info}" for b, k in page_blocks(page) if k == "unchecked"]
    assert not unchecked, f"fenced blocks no test checks: {unchecked}"


# -- `$` sessions --------------------------------------------------------------------------------------

def examples(lines):
    """(command, expected output lines, expected exit or None) of each `$ ...` in a block."""
    out, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
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
    text = "\n".join(lines).strip("\n")
    return text + "\n" if text else ""


def scratch(tmp_path) -> str:
    """A folder to run a page's examples in: copies of what they read, so an edit stays there."""
    for name in ("policies", "examples"):
        shutil.copytree(os.path.join(ROOT, name), tmp_path / name)
    return str(tmp_path)


def run_command(command: str, cwd: str):
    """(exit code, stdout and stderr together) of a `$` line: hisparse is this checkout's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_POLICY")}
    env["PYTHONPATH"] = ROOT
    argv = shlex.split(command)
    if argv[0] == "hisparse":
        argv = [sys.executable, "-m", "kernels_bridge.cli", *argv[1:]]
    else:
        argv = ["bash", "-c", command]
    proc = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                          env=env)
    return proc.returncode, proc.stdout


def apply_patch(diff: list[str], cwd: str) -> None:
    """Apply a unified diff shown on a page: each hunk's old lines must be at the line it names."""
    target, i = None, 0
    while i < len(diff):
        line = diff[i]
        if line.startswith("+++ "):
            target = os.path.join(cwd, line[4:].split("\t")[0].strip())
        m = re.match(r"@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", line)
        if m:
            old, new, i = [], [], i + 1
            while i < len(diff) and diff[i][:1] in (" ", "-", "+", ""):
                body = diff[i][1:]
                if diff[i][:1] in (" ", "-", ""):
                    old.append(body)
                if diff[i][:1] in (" ", "+", ""):
                    new.append(body)
                i += 1
            with open(target, encoding="utf-8") as fh:
                text = fh.read().split("\n")
            start = int(m.group(1)) - 1
            assert text[start:start + len(old)] == old, f"the patch does not apply at line {start + 1} of {target}"
            text[start:start + len(old)] = new
            with open(target, "w", encoding="utf-8") as fh:
                fh.write("\n".join(text))
            continue
        i += 1


def session_pages():
    return [p for p in PAGES if any(k in ("session", "diff") for _, k in page_blocks(p))]


@pytest.mark.parametrize("page", session_pages())
def test_the_examples_give_the_output_shown(page, tmp_path):
    cwd = scratch(tmp_path)
    skip = make_run_block().line if page == "README.md" else None  # checked whole through examples/run.sh
    ran, failures = 0, []
    for block, k in page_blocks(page):
        if k == "diff":
            apply_patch(block.lines, cwd)
        if k != "session" or block.line == skip:
            continue
        for command, expected, code in examples(block.lines):
            if command.startswith("hisparse conform") and not sglang_installed():
                continue  # its own tests skip there too (SGLang needs Python 3.11)
            got_code, got = run_command(command, cwd)
            ran += 1
            if (code is not None and got_code != code) or not re.fullmatch(pattern(expected), normalized(got)):
                failures.append(f"{page}:{block.line}: $ {command}\n(exit {got_code})\n{got}")
    assert ran
    assert not failures, "\n\n".join(failures)


def test_a_patch_that_does_not_apply_fails(tmp_path):
    (tmp_path / "f.txt").write_text("a\nb\nc\n")
    with pytest.raises(AssertionError, match="does not apply at line 2"):
        apply_patch(["--- f.txt", "+++ f.txt", "@@ -2,1 +2,1 @@", "-c", "+d"], str(tmp_path))
    apply_patch(["--- f.txt", "+++ f.txt", "@@ -2,2 +2,2 @@", " b", "-c", "+d"], str(tmp_path))
    assert (tmp_path / "f.txt").read_text() == "a\nb\nd\n"


# -- python blocks -----------------------------------------------------------------------------------

def python_examples(page):
    """(block, the text block shown as its output or None) of each python block of a page."""
    found = page_blocks(page)
    return [(b, found[i + 1][0] if i + 1 < len(found) and found[i + 1][1] == "output" else None)
            for i, (b, k) in enumerate(found) if k == "python"]


@pytest.mark.parametrize("page", [p for p in PAGES if python_examples(p)])
def test_the_python_examples_run_and_print_what_is_shown(page, tmp_path):
    shown = python_examples(page)
    if any("import sglang" in b.text or "conform import pipeline" in b.text for b, _ in shown) and not sglang_installed():
        pytest.skip("SGLang is not installed (it needs Python 3.11)")
    marker = "----- next example -----"
    script = f"\nprint({marker!r}, flush=True)\n".join(b.text for b, _ in shown)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_POLICY")}
    env["PYTHONPATH"] = ROOT
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=scratch(tmp_path),
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs = proc.stdout.split(marker + "\n")
    assert len(outputs) == len(shown)
    for (block, output), got in zip(shown, outputs):
        if output is not None:
            assert re.fullmatch(pattern(output.lines), normalized(got)), f"{page}:{block.line}\n{got}"


def test_python_api_example_values_are_real():
    """In the API example, a line `expr  # literal` claims that expr evaluates to literal (a set
    literal: to a mapping with those keys)."""
    block = next(b.lines for b in blocks(read("docs/api.md"))
                 if b.info == "python" and any(line.startswith("d = engine.evaluate(policy") for line in b.lines))
    first = next(i for i, line in enumerate(block) if line.startswith("d.ok"))
    setup = "\n".join(line.split("  #")[0] for line in block[:first])
    ns: dict = {}
    exec(setup, ns)  # noqa: S102 - the page's own example
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


# -- sh blocks ---------------------------------------------------------------------------------------

class _Parsed(BaseException):
    """Raised once hisparse's parser accepted the arguments: nothing else runs."""


def hisparse_parses(argv):
    """None when `hisparse ARGV` parses (its options and values), else the error; never runs it."""
    import kernels_bridge.cli  # noqa: F401 - adds attend and doctor to the command table, as `hisparse` does
    from engine.cli import commands
    from engine.cli.options import UsageError
    from engine.errors import HisparseError

    if not argv or argv[0] not in commands.COMMANDS:
        return f"no command {argv[:1]}"
    real = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        real(self, args, namespace)
        raise _Parsed

    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_only):
        try:
            commands.COMMANDS[argv[0]][0](list(argv[1:]))
        except _Parsed:
            return None
        except (UsageError, HisparseError) as exc:
            return str(exc)
    return "ran without parsing its arguments"


def test_the_readme_names_every_command():
    """The README's Commands section names each command `hisparse` has, the bridge's included."""
    import kernels_bridge.cli  # noqa: F401 - registers attend and doctor
    from engine.cli import commands

    readme = read("README.md")
    section = readme[readme.index("## Commands"):readme.index("## Figures")]
    named = set(re.findall(r"`(?:hisparse )?([a-z]+)`", section))
    assert set(commands.COMMANDS) <= named, sorted(set(commands.COMMANDS) - named)
    assert {"attend", "doctor", "evaluate"} <= set(commands.COMMANDS)


def test_the_parse_only_check_refuses_a_bad_command():
    assert hisparse_parses(["conform", "--policy", "dsa-backends@10", "--sample", "5000"]) is None
    assert "unrecognized" in hisparse_parses(["conform", "--smaple", "5000"])
    assert hisparse_parses(["evalute"]) is not None
    assert "R601" in hisparse_parses(["evaluate", "--policy", "no-such-family"])
    assert "did you mean '--kv-cache-dtype'" in hisparse_parses(["evaluate", "--kv-cache-dtpye", "fp8_e4m3"])


@pytest.mark.parametrize("page", PAGES)
def test_the_commands_shown_exist(page):
    pytest.importorskip("tomllib", reason="reads pyproject.toml with tomllib (Python 3.11)")
    bad = []
    for block, k in page_blocks(page):
        if k == "sh":
            for words in doc_pages.commands(block):
                bad += [f"{page}:{block.line}: {p}" for p in doc_pages.command_problems(words, hisparse_parses)]
    assert not bad, "\n".join(bad)


def test_the_command_check_can_fail():
    pytest.importorskip("tomllib", reason="reads pyproject.toml with tomllib (Python 3.11)")
    problems = doc_pages.command_problems
    assert problems(["make", "run"], hisparse_parses) == []
    assert problems(["make", "bench-fast"], hisparse_parses)
    assert problems(["pip", "install", "torch==2.4"], hisparse_parses)
    assert problems(["pip", "install", "-e", ".[gpu]"], hisparse_parses)
    assert problems(["python", "-m", "bench.gpu_check", "--outfile", "x"], hisparse_parses)
    assert problems(["HISPARSE_NO_SUCH_KNOB=1", "make", "test"], hisparse_parses)
    assert problems(["curl", "x"], hisparse_parses)


# -- yaml and json blocks ------------------------------------------------------------------------------

def _contained(part, whole) -> bool:
    """`part` is an excerpt of `whole`: mappings may leave keys out, a list of mappings may leave
    items out (each shown one is an excerpt of one of whole's), text is equal up to whitespace and
    a text ending in `...` stands for any text it begins."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and _contained(v, whole[k]) for k, v in part.items())
    if isinstance(part, list) and part and all(isinstance(x, dict) for x in part):
        return isinstance(whole, list) and all(any(_contained(x, y) for y in whole) for x in part)
    if isinstance(part, str) and isinstance(whole, str):
        if part.endswith("..."):
            return " ".join(whole.split()).startswith(" ".join(part[:-3].split()))
        return part.split() == whole.split()
    return part == whole and type(part) is type(whole)


def shipped_yaml():
    import yaml

    found = {}
    for base, _, files in os.walk(os.path.join(ROOT, "policies")):
        for name in files:
            if name.endswith(".yaml"):
                with open(os.path.join(base, name), encoding="utf-8") as fh:
                    found[os.path.relpath(os.path.join(base, name), ROOT)] = yaml.safe_load(fh)
    return found


@pytest.mark.parametrize("page", [p for p in PAGES if any(k == "yaml" for _, k in page_blocks(p))])
def test_yaml_snippets_are_excerpts_of_shipped_files(page):
    import yaml

    files = shipped_yaml()
    for block, k in page_blocks(page):
        if k == "yaml":
            snippet = yaml.safe_load(block.text)
            assert any(_contained(snippet, doc) for doc in files.values()), \
                f"{page}:{block.line}: not an excerpt of any file under policies/"


def test_language_snippets_of_v4_are_excerpts_of_it():
    """The YAML snippets of the policy language page that show the newer features are
    dsa-backends@10's own text, so they load and mean what the shipped policy means."""
    import yaml

    section = read("docs/policy-language.md")
    v4 = shipped_yaml()[os.path.join("policies", "dsa-backends", "v10.yaml")]
    snippets = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, re.S)]
    shown = [s for s in snippets if any(word in json.dumps(s) for word in ("upstream", "removed_flags", '"at"',
                                                                          "capabilities"))]
    assert len(shown) == 4
    for snippet in shown:
        assert _contained(snippet, v4), snippet
    assert not _contained({"phases": {"decode": {"backends": ["triton_sparse_mla"]}}}, v4)  # the check can fail


def test_the_removed_spelling_example_is_what_v4_says():
    import engine

    with pytest.raises(engine.ConfigError) as exc:
        engine.load_policy("dsa-backends@10").evaluate({"nsa-decode-backend": "fa3"})
    assert f"`{exc.value.problems[0]}`" in read("docs/policy-language.md")


def test_json_decision_example_is_real_output():
    json_blocks = [(page, b) for page in PAGES for b, k in page_blocks(page) if k == "json"]
    assert len(json_blocks) == 1  # the one below; another needs its own check
    block = json_blocks[0][1].lines
    shown = json.loads(re.sub(r'"([0-9a-f]+)…"', r'"\1"', "\n".join(block)))  # an abbreviated sha256
    code, out = run_command("hisparse evaluate --policy dsa-backends@2 --enable-hisparse --kv-cache-dtype "
                            "fp8_e4m3 --disable-radix-cache --nsa-decode-backend flashmla_sparse --format json", ROOT)
    real = json.loads(out)
    assert code == 1
    assert real["policy"].pop("sha256").startswith(shown["policy"].pop("sha256"))
    assert real == shown


# -- the design page ---------------------------------------------------------------------------------------

def layer_rows(text: str) -> list[tuple[str, ...]]:
    """The modules of each row of the "Layers" table of docs/design.md, lowest layer first."""
    section = text[text.index("## Layers"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if re.match(r"\| \d+ \|", line)]
    return [tuple(re.findall(r"`([\w.]+)`", cells[1])) for cells in rows]


def test_the_design_page_shows_the_layer_map_the_import_check_holds():
    from tests.test_layers import LAYERS

    assert layer_rows(read("docs/design.md")) == [names for names, _ in LAYERS]
    swapped = "## Layers\n| 1 | `engine.files` | x |\n| 2 | `engine.errors` | y |\n\n## Next\n"
    assert layer_rows(swapped) == [("engine.files",), ("engine.errors",)]  # what a reordered page reads as


# -- links, names and paths ------------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES)
def test_links_point_at_files_and_headings_that_exist(page):
    assert not doc_pages.broken_links(page)


def test_the_link_check_can_fail(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Its part: `x.y`\n", encoding="utf-8")
    (tmp_path / "README.md").write_text("[a](docs/a.md#its-part-xy) [b](docs/a.md#gone) [c](docs/b.md) "
                                        "[d](#a-page) [e](https://example.com/x)\n", encoding="utf-8")
    monkeypatch.setattr(doc_pages, "ROOT", str(tmp_path))
    assert doc_pages.broken_links("README.md") == ["docs/a.md#gone: no heading with that anchor",
                                                   "docs/b.md: no such file", "#a-page: no heading with that anchor"]


@pytest.mark.parametrize("page", PAGES)
def test_named_modules_and_files_exist(page):
    """A module, attribute or file a page names in code (`engine.sglang.routing.apply`,
    `engine/cli/commands.py`) exists under that name."""
    text = read(page)
    missing = sorted(n for n in doc_pages.dotted_names(text) if not doc_pages.resolves(n))
    missing += sorted(p for p in doc_pages.repo_paths(text)
                      if not os.path.exists(os.path.join(ROOT, p)) and not doc_pages.ignored(p))
    assert not missing, f"{page} names what does not exist: {missing}"


def test_a_stale_module_name_is_found():
    assert doc_pages.resolves("engine.sglang.routing.apply") and doc_pages.resolves("engine.files.cache.MAGIC")
    assert not doc_pages.resolves("engine.loader.load_policy") and not doc_pages.resolves("engine.cli.nothing")
    assert doc_pages.repo_paths("see `engine/cli.py` and `policies/<family>/v<N>.yaml`") == {"engine/cli.py"}
    assert doc_pages.ignored("bench/results-quick/") and not doc_pages.ignored("bench/results/")


@pytest.mark.parametrize("page", PAGES)
def test_no_page_names_a_path_of_the_machine_it_was_written_on(page):
    assert not re.search(r"(?<![\w.])/(?:work|home|root|tmp)/", read(page))

