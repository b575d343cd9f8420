"""A loaded policy: its declarations, the config checks, and evaluate()."""
from __future__ import annotations

from collections.abc import Mapping

from engine.errors import ConfigError, Problem
from engine.language.decision import Decision
from engine.language.interpreter import WHOLE, run
from engine.suggest import did_you_mean, unknown_key
from engine.values import INT_MAX, INT_MIN, kind, shown, typed


class Policy:
    """One version of one policy family: its declarations and rules, checked at load.

    `evaluate(config)` decides with the interpreter; `trace(config)` also returns its trace
    events, every rule tried (explain, coverage); `probe()` is the bulk evaluator for whole domains
    (engine/analysis/domain.py enumerates them).
    """

    def __init__(self, parts, file: str, sha256: str, path: str = "", doc=None):
        for key in parts.FIELDS:  # scope: ((leaves_out index, condition), ...): see Decision.in_scope
            setattr(self, key, getattr(parts, key))
        self.file = file  # as shown in messages
        self.path = path or file  # where it was read from
        self.sha256 = sha256
        self.doc = doc  # the parsed file, for positions of anything a later analysis reports
        self.rule_list = [r for st in ("resolve", "defaults", "checks") for r in self.stages[st].rules]
        self.rule_index = {id(r): i for i, r in enumerate(self.rule_list)}  # rule -> its index in rule_list
        # what decisions name; a check placed `at: defaults` is raised where the defaults stage runs
        self.rule_meta = tuple((r.name, r.line, "defaults" if r.at == "defaults" else r.stage, r.raises, r.part)
                               for r in self.rule_list)
        checks = self.stages["checks"].rules
        self.check_order = ([r for r in checks if r.at == "defaults"], [r for r in checks if r.at != "defaults"])
        # inputs (other than phases) some rule rewrites; the others always keep the value given
        self.written = tuple(n for n in self.inputs if self.inputs[n].phase is None
                             and any(n in r.set for r in self.rule_list))
        self.input_names = tuple(self.inputs)
        self.phase_names = tuple(self.phases)
        self.phase_slots = tuple((ph, self.input_names.index(spec.input)) for ph, spec in self.phases.items())
        # every accepted spelling of a config key -> its input (flags without --, dashes or
        # underscores); deprecated spelling -> the log line its use emits; removed spelling -> (its
        # flag, the note naming the replacement): refused, as upstream's parser does
        self.key_map = {key: name for name in self.inputs for key in (name, name.replace("_", "-"))}
        self.deprecated_keys: dict[str, str] = {}
        self.removed_keys: dict[str, tuple[str, str]] = {}
        for name, spec in self.inputs.items():
            for flag in (*spec.flags, *spec.deprecated, *spec.removed):
                for key in (flag[2:], flag[2:].replace("-", "_")):
                    if flag in spec.removed:
                        self.removed_keys[key] = (flag, spec.removed[flag])
                        continue
                    self.key_map[key] = name
                    if flag in spec.deprecated:
                        self.deprecated_keys[key] = spec.deprecated[flag]
        self.phase_key_aliases = {  # the phases' other spellings, each given the backend in to_dict
            ph: tuple(sorted({f[2:].replace("-", "_") for f in (*self.inputs[spec.input].flags,
                                                                 *self.inputs[spec.input].deprecated)} - {spec.input}))
            for ph, spec in self.phases.items()}
        self._probes: dict = {}  # the bulk evaluators (probe()), generated on first use

    @classmethod
    def from_document(cls, doc, path: str = "", schema: bool = True) -> "Policy":
        """A policy from a parsed file, checked (see language/parts.checked_parts). Raises
        PolicyError."""
        from engine.language.parts import checked_parts

        return cls(checked_parts(doc, schema), doc.file, doc.sha256, path or doc.file, doc)

    def probe(self, count: bool = True):
        """The bulk evaluator: probe(configs, sink, held, chosen) calls sink(...) for each config
        of `configs` (tuples of valid canonical values in input order; see compiler.py). With
        `count` it also counts into the lists `held` (per rule of rule_list: its condition held;
        for defaults: held when the defaults stage ran, chosen or not) and `chosen` (per rule: the
        default chosen)."""
        if count not in self._probes:
            from engine.language.compiler import compile_probe

            source, namespace = compile_probe(self, count)
            exec(compile(source, f"<probe {self.family}@{self.version}>", "exec"), namespace)
            self._probes[count] = namespace["_probe"]
        return self._probes[count]

    # -- identity ----------------------------------------------------------------------------
    ref = property(lambda self: f"{self.family}@{self.version}")

    def identity(self) -> dict:
        return {"family": self.family, "version": self.version, "sha256": self.sha256}

    def location(self, rule) -> str:
        return f"{self.file}:{rule.line}"

    def rule(self, name: str):
        for r in self.rule_list:
            if r.name == name:
                return r
        raise KeyError(name)

    def __repr__(self) -> str:
        return f"<Policy {self.ref} {self.file} sha256={self.sha256[:12]}>"

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, config: Mapping, part=None, tracer=None) -> Decision:
        """Decide backends for `config` (missing inputs take their defaults). Raises ConfigError
        for unknown keys or values. `part` (interpreter.Part): evaluate those stages and checks
        only, as one upstream function does when called by itself. `tracer`: called with each
        trace event (interpreter.Event) in order."""
        canonical, prelude = self.normalize_with_log(config)
        return run(self, self.complete(canonical), config, tracer, prelude, part or WHOLE)

    def trace(self, config: Mapping):
        """(decision, events): evaluate, keeping every trace event (interpreter.Event) in a list;
        engine.explain.trace.Trace(events) groups them into steps and words them."""
        events: list = []
        return self.evaluate(config, tracer=events.append), events

    # -- configs -----------------------------------------------------------------------------
    def canonical_key(self, key) -> str | None:
        return (self.key_map.get(key) or self.key_map.get(key.replace("-", "_"))) if isinstance(key, str) else None

    def normalize(self, config, file: str = "", doc=None) -> dict:
        """Canonical keys and validated values (only the keys given). Keys may be spelled as
        inputs or as their flags (dashes or underscores). Raises ConfigError listing every
        problem."""
        return self.normalize_with_log(config, file, doc)[0]

    def complete(self, canonical: dict) -> dict:
        return {name: canonical.get(name, spec.default) for name, spec in self.inputs.items()}

    def normalize_with_log(self, config, file: str = "", doc=None) -> tuple[dict, list]:
        """As normalize, and the log lines that deprecated spellings among the keys emit, in the
        order the keys are given (upstream's parser logs each notice as it reads the flag), which
        evaluation puts before every other line. `doc` (a parsed config file) gives each problem
        the line and column of its key. (SGLang config files, which carry unrelated keys, are
        read leniently by engine.sglang.given.)"""
        if not isinstance(config, Mapping):
            raise ConfigError([Problem("C504", f"a config is a mapping of input -> value, got {kind(config)}", file)])
        problems: list[Problem] = []
        out: dict = {}
        spelled: dict = {}
        prelude: list = []
        for key, value in config.items():
            name = self.canonical_key(key)
            removed = self.removed_keys.get(key.replace("-", "_")) if name is None and isinstance(key, str) else None
            if removed:
                where = self.upstream.label() if self.upstream else self.ref
                problem = Problem("C501", f"{shown(key)}: {removed[0]} was removed ({where} no longer accepts it)",
                                  file, hint=removed[1])
            elif name is None:
                problem = unknown_key(key, sorted(self.key_map), self.input_names, file)
            elif name in out and out[name] != value:
                problem = Problem("C501", f"{shown(key)} and {shown(spelled[name])} both set '{name}', "
                                  "to different values", file)
            else:
                spelled[name] = key
                if key in self.deprecated_keys:
                    prelude.append(self.deprecated_keys[key])
                if value.__class__ not in _PLAIN:
                    value = _exact(value)
                problem = None if self.inputs[name].accepts(value) else \
                    self.value_problem(self.inputs[name], key, value, file)
                if problem is None:
                    out[name] = value
                    continue
            problems.append(problem if doc is None else doc.placed(problem, key))
        if problems:
            raise ConfigError(problems)
        return out, prelude

    def value_problem(self, spec, key, value, file) -> Problem:
        if spec.type == "enum" and isinstance(value, str):
            return Problem("C502", f"{key}: {shown(value)} is not a valid value; {spec.describe_domain()}",
                           file, hint=did_you_mean(value, spec.values, list_if_none=False))
        if spec.type == "int" and type(value) is int:
            domain = spec.describe_domain() if INT_MIN <= value <= INT_MAX else "integers are 64-bit"
            return Problem("C502", f"{key}: {shown(value)} is outside the domain: {domain}", file)
        note = ""  # (a str input takes none)
        if spec.type == "bool" and isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            note = " (strings are not booleans: write true or false without quotes)"
        if spec.type == "int" and isinstance(value, str) and value.strip().lstrip("-").isdigit():
            note = " (strings are not integers: write the number without quotes)"
        return Problem("C503", f"{key}: expected {spec.describe_domain()}, got {typed(value)}{note}", file)


_PLAIN = frozenset({str, int, bool, type(None)})


def _exact(value):
    """A str or int subclass (an enum member standing for a value) as its plain str or int, so
    that it is compared, hashed and rendered as the value it stands for; bool stays bool."""
    cls = value.__class__
    if cls is not str and isinstance(value, str):
        return str.__str__(value)
    if cls is not int and cls is not bool and isinstance(value, int):
        return int.__int__(value)
    return value
