"""Reading the documentation pages (README.md, docs/*.md) for their tests: fenced blocks, links and
anchors, the names of modules and files they mention, and the shell commands they show."""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shlex
from dataclasses import dataclass

from tests.helpers import ROOT


@dataclass
class Block:
    info: str          # the fence's info string: python, sh, yaml, ... or ""
    lines: list        # the text between the fences
    line: int          # the line of the opening fence, 1-based

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


_FENCE = re.compile(r"^```(\w*)\n(.*?)\n```$", re.S | re.M)


def blocks(text: str) -> list[Block]:
    return [Block(m.group(1), m.group(2).split("\n"), text.count("\n", 0, m.start()) + 1)
            for m in _FENCE.finditer(text)]


def prose(text: str) -> str:
    """The page without its fenced blocks (links and names are read from the prose only)."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


# -- anchors and links ------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} (.+?)\s*$", prose(text), re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


_LINK = re.compile(r"\[(?:[^\]\n]|\n(?!\n))+?\]\(([^)\s]+)\)")


def links(text: str) -> list[str]:
    """Targets of the page's inline links that point inside the repository (not a URL)."""
    return [t for t in _LINK.findall(prose(text)) if not re.match(r"[a-z]+:", t)]


def broken_links(page: str) -> list[str]:
    """Each relative link of `page` whose file, or whose anchor in that file, does not exist."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as fh:
        text = fh.read()
    bad = []
    for target in links(text):
        path, _, anchor = target.partition("#")
        where = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else os.path.join(ROOT, page)
        if not where.startswith(ROOT + os.sep) or not os.path.exists(where):
            bad.append(f"{target}: no such file")
            continue
        if anchor:
            if not where.endswith(".md"):
                bad.append(f"{target}: an anchor into a file that is not a page")
                continue
            with open(where, encoding="utf-8") as fh:
                if anchor not in anchors(fh.read()):
                    bad.append(f"{target}: no heading with that anchor")
    return bad


# -- names of modules and files -------------------------------------------------------------------

TOP = ("engine", "kernels_bridge", "bench", "tools", "tests")


def code_spans(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"`([^`\n]+(?:\n[^`\n]+)?)`", prose(text))]


def dotted_names(text: str) -> set[str]:
    """`engine.x.y`, `kernels_bridge.X`, ... named in code spans: a module, or an attribute of one."""
    out = set()
    for span in code_spans(text):
        for m in re.finditer(r"(?<![\w./])((?:%s)(?:\.\w+)+)" % "|".join(TOP), span):
            out.add(m.group(1))
    return out


def resolves(name: str) -> bool:
    """The longest importable module prefix of `name`, then attributes for the rest."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(module) is None:
                continue
        except (ImportError, ValueError):
            continue
        obj = importlib.import_module(module)
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                try:
                    obj = importlib.import_module(f"{obj.__name__}.{attr}")
                    continue
                except (ImportError, AttributeError):
                    return False
            obj = getattr(obj, attr)
        return True
    return False


def ignored(path: str) -> bool:
    """A path git ignores (made by a command, never committed), as .gitignore names it."""
    with open(os.path.join(ROOT, ".gitignore"), encoding="utf-8") as fh:
        patterns = [line.strip() for line in fh if line.strip() and not line.startswith("#")]
    head = path.split("/")
    return any(re.fullmatch(re.escape(p.rstrip("/")).replace(r"\*", "[^/]*"), "/".join(head[:i]))
               for p in patterns for i in range(1, len(head) + 1))


def repo_paths(text: str) -> set[str]:
    """Paths into the repository named in code spans (`engine/cli/commands.py`, `docs/`), without
    the ones that stand for many (`<family>`, `*`)."""
    top = TOP + ("policies", "docs", "examples")
    out = set()
    for span in code_spans(text):
        for word in re.split(r"[\s(),;:`]+", span):
            word = word.rstrip(".")
            if re.match(r"(?:%s)/" % "|".join(top), word) and not re.search(r"[<>*{}]|\.\.\.", word):
                out.add(word)
    return out


# -- shell commands ----------------------------------------------------------------------------------

def commands(block: Block) -> list[list[str]]:
    """The commands of a sh block, each as words: comments dropped, continuation lines and quotes
    spanning lines joined."""
    out, pending = [], ""
    for line in block.lines:
        pending = f"{pending}\n{line}" if pending else line
        if pending.rstrip().endswith("\\"):
            pending = pending.rstrip()[:-1]
            continue
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # a quotation still open: the next line continues it
            continue
        pending = ""
        if words:
            out.append(words)
    assert not pending, f"unterminated command in the block at line {block.line}: {pending!r}"
    return out


def _source_text() -> str:
    """Every source file a documented environment variable or option could be read in."""
    out = []
    mine = {os.path.abspath(__file__), os.path.join(ROOT, "tests", "test_readme.py")}  # they name made-up ones
    for top in TOP + ("examples",):
        for base, _, files in os.walk(os.path.join(ROOT, top)):
            out += [os.path.join(base, f) for f in files if f.endswith((".py", ".sh"))
                    and os.path.join(base, f) not in mine]
    out += [os.path.join(ROOT, "Makefile")]
    text = []
    for path in out:
        with open(path, encoding="utf-8") as fh:
            text.append(fh.read())
    return "\n".join(text)


def _pyproject() -> dict:
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        return tomllib.load(fh)


def _requirement_names() -> set[str]:
    project = _pyproject()["project"]
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {re.split(r"[<>=!~\[ ]", r)[0].lower() for r in reqs}


def _make_targets() -> set[str]:
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as fh:
        return set(re.findall(r"^([\w-]+):", fh.read(), re.M))


def _pip_problems(args: list[str]) -> list[str]:
    bad = []
    extras = _pyproject()["project"]["optional-dependencies"]
    for arg in args:
        if arg in ("-e", "-q", "--no-deps", "-U", "--upgrade"):
            continue
        m = re.fullmatch(r"\.(?:\[([\w,]+)\])?", arg)
        if m:
            bad += [f"pip: no extra {e!r} in pyproject.toml" for e in (m.group(1) or "").split(",") if e and e not in extras]
        elif "==" in arg:
            name, version = arg.split("==")
            if name == "torch" and version != "2.13.0":
                bad.append(f"pip: torch=={version} (the pinned torch is 2.13.0)")
        elif arg.lower() not in _requirement_names():
            bad.append(f"pip: {arg!r} is neither pinned nor a requirement of pyproject.toml")
    return bad


def _python_problems(args: list[str]) -> list[str]:
    if args[:1] == ["-c"]:
        code = args[1]
        compile(code, "<-c>", "exec")
        names = re.findall(r"^\s*(?:from|import) ((?:%s)[\w.]*)" % "|".join(TOP), code, re.M)
        return [f"python -c: {n} does not import" for n in names if not resolves(n)]
    if args[:1] != ["-m"]:
        return [f"python {' '.join(args)}: not a documented form"]
    module, rest = args[1], args[2:]
    if module == "pip":
        return _pip_problems(rest[1:]) if rest[:1] == ["install"] else [f"pip {rest[:1]}: not a documented form"]
    if module == "pytest":
        bad = [f"pytest: no file {a}" for a in rest if a.startswith("tests/") and not os.path.exists(os.path.join(ROOT, a))]
        markers = [m.split(":")[0] for m in _pyproject()["tool"]["pytest"]["ini_options"].get("markers", [])]
        bad += [f"pytest: no marker {rest[i + 1]!r}" for i, a in enumerate(rest[:-1]) if a == "-m" and rest[i + 1] not in markers]
        return bad
    spec = importlib.util.find_spec(module)
    if spec is None:
        return [f"python -m {module}: no such module"]
    origin = spec.origin if not spec.submodule_search_locations else \
        os.path.join(spec.submodule_search_locations[0], "__main__.py")
    with open(origin, encoding="utf-8") as fh:
        source = fh.read()
    return [f"python -m {module}: no option {a}" for a in rest if a.startswith("--") and f'"{a.split("=")[0]}"' not in source]


def _sglang_launch_problems(words: list[str]) -> list[str]:
    """An SGLang launch command (`sglang serve ARGS`, `python -m sglang.launch_server ARGS`), read
    as hisparse reads one: a misspelt or unknown routing flag, a missing value, a routing value
    outside the shipped policy's domain is a problem."""
    import engine
    from engine.files.shipped import DEFAULT_POLICY
    from engine.sglang import config_from_launch

    if words[0] == "sglang" and words[1:2] != ["serve"]:
        return [f"sglang {words[1:2]}: not a documented form"]
    try:
        config_from_launch(engine.load_policy(DEFAULT_POLICY), words)
    except engine.HisparseError as exc:
        return [f"{' '.join(words[:3])}: {p}" for p in exc.problems]
    return []


def command_problems(words: list[str], hisparse_parses) -> list[str]:
    """What is wrong with a command a page shows but a test does not run (it takes minutes, installs
    or needs a GPU): its program, make target, module, options, files and variables must exist.
    `hisparse_parses(argv)` -> an error text or None, for hisparse's own commands."""
    words = list(words)
    bad = []
    source = None
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        name = words.pop(0).split("=")[0]
        source = source or _source_text()
        if name not in source:
            bad.append(f"{name}: no code reads this variable")
    program, args = os.path.basename(words[0]), words[1:]
    if program == "export":  # export NAME=VALUE: a variable the code reads
        source = source or _source_text()
        return bad + [f"export {a}: no code reads this variable" for a in args if a.split("=")[0] not in source]
    if program == "sglang" or args[:2] == ["-m", "sglang.launch_server"]:
        return bad + _sglang_launch_problems(words)
    if program == "make":
        targets = _make_targets()
        with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as fh:
            makefile = fh.read()
        for a in args:
            var, eq, _ = a.partition("=")
            if eq:
                bad += [] if f"$({var})" in makefile else [f"make: {var} is not a Makefile variable"]
            elif a not in targets:
                bad.append(f"make: no target {a!r}")
    elif program == "hisparse":
        error = hisparse_parses(args)
        bad += [f"hisparse {' '.join(args)}: {error}"] if error else []
    elif program in ("python", "python3"):
        bad += _python_problems(args)
    elif program == "pip":
        bad += _pip_problems(args[1:]) if args[:1] == ["install"] else [f"pip {args[:1]}: not a documented form"]
    elif words[0].endswith(".sh"):
        script = words[0] if "/" in words[0] else None
        bad += [] if script and os.path.exists(os.path.join(ROOT, script)) else [f"{words[0]}: no such script"]
    elif program == "bash" and args and args[0].endswith(".sh"):
        bad += [] if os.path.exists(os.path.join(ROOT, args[0])) else [f"bash {args[0]}: no such script"]
    else:
        bad.append(f"{words[0]}: no check for this program (add one to tests/doc_pages.py)")
    return bad
