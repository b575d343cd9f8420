"""Errors as data: every problem has a stable code, a message and, where it comes from a file, a
position. Exceptions carry lists of problems so that everything wrong is reported at once."""
from __future__ import annotations

from collections import namedtuple

from engine.values import one_line

# code -> (slug, what it means). The error-code table of docs/cli.md is generated from this mapping and
# a test keeps the two in step.
CODES: dict[str, tuple[str, str]] = {
    # reading a file
    "E101": ("unreadable-file", "the file cannot be read (missing, a directory, no permission)"),
    "E102": ("file-too-large", "the file is larger than the size limit"),
    "E103": ("not-utf8", "the file is not UTF-8 text"),
    "E104": ("yaml-syntax", "the YAML (or JSON) text does not parse"),
    "E105": ("duplicate-key", "a mapping repeats a key"),
    "E106": ("yaml-tag", "a YAML tag outside the plain data types (e.g. !!python/object)"),
    "E107": ("yaml-alias", "anchors and aliases are not allowed in policy and config files"),
    "E108": ("too-deep", "nesting deeper than the limit"),
    "E109": ("not-a-mapping", "the document is not a mapping"),
    "E110": ("multiple-documents", "the file holds more than one YAML document"),
    "E111": ("non-string-key", "a mapping key that is not a plain string (quote it)"),
    "E112": ("bad-number", "a number that is not finite or does not fit in 64 bits"),
    "E113": ("too-many-nodes", "the document holds more values than the limit"),
    # the schema of the policy language
    "E201": ("schema", "the policy does not follow the policy-language schema"),
    # names and values inside a policy
    "E301": ("unknown-input", "a rule names an input the policy does not declare"),
    "E302": ("unknown-value", "a value outside the declared domain of its input"),
    "E303": ("unknown-backend", "a backend the policy does not declare"),
    "E304": ("unknown-phase", "a phase the policy does not declare"),
    "E305": ("bad-default", "an input's default is outside its declared domain"),
    "E306": ("template-field", "a message or log template names an unknown field"),
    "E307": ("duplicate-name", "two rules, inputs, phases or backends share a name"),
    "E308": ("wrong-type", "a value of the wrong type for its input or operator"),
    "E309": ("reserved-name", "an input or phase uses a name the language reserves"),
    "E310": ("bad-table", "an allowed-backend table that does not cover its key or is misplaced"),
    "E311": ("bad-rule", "a rule whose parts do not fit its stage"),
    "E312": ("policy-identity", "family or version do not match the file's place (<family>/v<N>.yaml)"),
    "E313": ("duplicate-version", "two files of one family name the same version (v1.yaml and v001.yaml)"),
    # deep lint (whole-domain analysis)
    "L401": ("shadowed-default", "a default rule never chosen because earlier rules cover it"),
    "L402": ("dead-rule", "a rule whose condition holds for no config of the declared domain"),
    "L403": ("self-contradiction", "a default that the policy's own checks reject"),
    "L404": ("empty-allowed", "an allowed-backend set that is empty"),
    "L405": ("unused-input", "a declared input that no rule reads"),
    "L406": ("deprecated-notice", "a deprecated flag whose notice does not name it"),
    "L407": ("incapable-route", "a default or allow-list routes a config in scope to a backend whose declared capabilities do not cover it"),
    # configs (what evaluate is asked about)
    "C501": ("unknown-key", "a config key the policy does not declare"),
    "C502": ("unknown-value", "a config value outside the input's domain"),
    "C503": ("wrong-type", "a config value of the wrong type"),
    "C504": ("bad-config-file", "a config file that cannot be read or is not a mapping"),
    "C505": ("bad-batch-line", "a --batch line that is not a JSON object"),
    "C506": ("domain-too-large", "a whole-domain operation over more configs or rule evaluations than it does (use --where)"),
    # the policy store (safe reload)
    "S801": ("policy-removed", "a policy file the store served was removed; the newest remaining good version is served"),
    "S802": ("internal-load-error", "loading a file failed unexpectedly (a bug); the last good version is kept"),
    "S803": ("rewritten-in-place", "a policy file changed in place (not renamed into place); its last good content is kept"),
    # policy test files
    "T701": ("test-schema", "a policy test file that does not follow its schema"),
    "T702": ("test-unknown-name", "a test case names a rule, phase or input the policy does not have"),
    # references to policies
    "R601": ("unknown-policy", "no policy family or version by that name"),
    "R602": ("bad-policy-ref", "a policy reference that is not FAMILY, FAMILY@N, sglang==X, installed or a file"),
    "R603": ("ambiguous-release", "more than one policy version models the SGLang release named"),
    "R604": ("no-installed-release", "--policy installed, but SGLang is not installed"),
    "R605": ("retired-policy", "a retired policy reference; the message names what replaced it"),
    "R606": ("model-not-routed", "the model is of a class (DSA, DeepSeek-V4, MiniMax-M3, other) no policy the reference names routes"),
}


class Problem(namedtuple("Problem", "code message file line col hint", defaults=("", 0, 0, ""))):
    """One thing wrong. `line`/`col` are 1-based; 0 when the problem has no position. (A named
    tuple rather than a dataclass: every load imports this module, and the dataclasses module
    costs more to import than a cached load.)"""

    __slots__ = ()

    @property
    def slug(self) -> str:
        return CODES.get(self.code, ("", ""))[0]

    def where(self) -> str:
        if not self.file:
            return ""
        file = one_line(self.file)  # a file name may hold a line break: one problem, one line
        if self.line:
            return f"{file}:{self.line}:{self.col}"
        return file

    def __str__(self) -> str:
        text = f"{self.code}: {one_line(self.message)}"
        if self.hint:
            text += f" ({one_line(self.hint)})"
        where = self.where()
        return f"{where}: {text}" if where else text

    def to_dict(self) -> dict:
        out = {"code": self.code, "slug": self.slug, "message": self.message}
        if self.file:
            out.update(file=self.file, line=self.line, col=self.col)
        if self.hint:
            out["hint"] = self.hint
        return out


class EngineError(Exception):
    """Root of every exception class the engine defines, so `except EngineError` catches each of
    them (tests/test_error_hierarchy.py keeps it so). HisparseError and its subclasses carry
    problems; the rest carry a message and keep the builtin base callers catch them by
    (TemplateSyntaxError and UnknownVersion are ValueErrors, WorkerCrashed and DriverError
    RuntimeErrors). The CLI's exit code is chosen per class, not by this root. Two classes stay
    outside, so that SGLang's own `except Exception` lets them through when its code runs
    in-process: conform's startup.ParserError (a SystemExit, as argparse's own exit is) and
    runner._Alarm (an in-process case's timer)."""


class HisparseError(EngineError):
    """Base of the engine's documented errors: one or more problems."""

    def __init__(self, problems):
        self.problems: list[Problem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    def __reduce__(self):  # keeps the problems across pickling (multiprocessing)
        return (type(self), (self.problems,))


class PolicyError(HisparseError):
    """A policy file (or reference) is invalid. CLI exit code 2."""


class ConfigError(HisparseError, ValueError):
    """A config given to evaluate is invalid (unknown key or value, wrong type). CLI exit code 2."""


class MissingDependency(EngineError, ImportError):
    """A package a step needs is not installed (PyYAML to read a YAML file, jsonschema to check a
    policy the compiled cache does not hold): the message says what to install. CLI exit code 2."""


def import_required(module: str, package: str):
    """`import module`, or MissingDependency naming the pip package to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(f"{package} is not installed ({exc}); install it with: "
                                f"python -m pip install {package}") from None
