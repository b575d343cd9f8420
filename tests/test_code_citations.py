"""Every error or lint code cited in the docs, the policy files (their comments and the schemas'
descriptions) and the code is one the engine defines (engine.errors.CODES); and in the prose (docs,
policy comments, schema descriptions) each is cited for what it means: a sentence that shares no
word with the cited code's slug and meaning but several with another code's reads as that other
code (`hisparse check` (L406) on a capability route cited the deprecated-notice lint; the
capability lint is L407)."""
import glob
import os
import re

from engine.errors import CODES
from tests.helpers import ROOT, python_files

CODE = re.compile(r"(?<![\w-])([ECLRSTB])([1-9]\d{2})(?![\w-])")
# the prefixes and hundreds the engine numbers its codes by: a cited code of that shape is meant as one
FAMILIES = {code[:2] for code in CODES}
STOP = set("""a an the of to in on or and is are be by for from with that this which what whose its it
not no any one two its their there than then when where does do as at into only other own same each
file files code codes value values""".split())


def _words(text: str) -> set:
    out = set()
    for w in re.findall(r"[a-z][a-z0-9]+", text.lower().replace("-", " ")):
        if len(w) > 3 and w not in STOP:
            out.add(w[:6])  # a stem: "routes"/"route", "capabilities"/"capability"
    return out


VOCAB = {code: _words(slug + " " + what) for code, (slug, what) in CODES.items()}


def _prose():
    """The docs, the policy files and their schemas."""
    paths = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    paths += sorted(glob.glob(os.path.join(ROOT, "policies", "**", "*.yaml"), recursive=True))
    return paths + sorted(glob.glob(os.path.join(ROOT, "policies", "schema", "*.json")))


def _sources(prose_only=False):
    """(path, text) of the prose, and unless prose_only the Python of the packages, tools and bench."""
    paths = _prose() + ([] if prose_only else list(python_files("engine", "kernels_bridge", "tools", "bench")))
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            yield os.path.relpath(path, ROOT), fh.read()


def _sentence(text: str, start: int, end: int) -> str:
    """The sentence around text[start:end], comment markers and line breaks removed."""
    left = max(text.rfind(". ", 0, start), text.rfind("\n\n", 0, start), text.rfind("|", 0, start))
    right = [i for i in (text.find(". ", end), text.find("\n\n", end), text.find("|", end)) if i >= 0]
    return re.sub(r"\s*\n\s*#?\s*", " ", text[left + 1:min(right) if right else len(text)])


def citations(prose_only=False):
    for path, text in _sources(prose_only):
        for m in CODE.finditer(text):
            code = m.group(0)
            if code[:2] in FAMILIES:
                yield path, text.count("\n", 0, m.start()) + 1, code, _sentence(text, m.start(), m.end())


def test_every_cited_code_is_defined():
    unknown = [f"{path}:{line}: {code}" for path, line, code, _ in citations() if code not in CODES]
    assert not unknown, unknown


def test_every_cited_code_is_cited_for_its_meaning():
    wrong = []
    for path, line, code, sentence in citations(prose_only=True):
        if code not in CODES or re.search(rf"{code}:", sentence):  # a key (accepts: {{L403: why}}) or output
            continue
        words = _words(sentence)
        if VOCAB[code] & words:
            continue
        cited = {m.group(0) for m in CODE.finditer(sentence)}
        closer = sorted(c for c in CODES if c[0] == code[0] and c not in cited and len(VOCAB[c] & words) >= 2)
        if closer:
            wrong.append(f"{path}:{line}: {code} ({CODES[code][0]}) in {sentence.strip()[:160]!r}; "
                         f"it reads as {', '.join(f'{c} ({CODES[c][0]})' for c in closer)}")
    assert not wrong, "\n".join(wrong)


def test_the_check_finds_a_miscited_code():
    sentence = "`hisparse check` (L406) refuses a default or allow-list that routes a config to a backend that cannot run it."
    words = _words(sentence)
    assert not VOCAB["L406"] & words and len(VOCAB["L407"] & words) >= 2
