"""From a policy file to the policy's parts: parsed, checked against the schema, then every name
and value against the declarations. All problems are collected; each carries the file:line:col
of the offending node."""
from __future__ import annotations

from engine.language.conditions import (COMBINATORS, All, Any, InputRef, Not, Product, Quotient, Test, TrueCond,
                                        UserSet, conj, operand_inputs)
from engine.errors import PolicyError, Problem
from engine.language.record import Record
from engine.language.rules import Capability, CapabilityEntry, InputSpec, PhaseSpec, Rule, Stage, Table, Upstream
from engine.suggest import did_you_mean
from engine.language.templates import SET_FORMATS, TemplateSyntaxError, parse_template
from engine.files.document import Document
from engine.files.catalog import misplaced
from engine.files.schema import schema_problems
from engine.values import CANONICAL_INT, int_meant, kind, shown, typed

# names a policy may not give to an input or phase: condition keywords, the names bound in
# per-phase checks, and the keys of a decision's JSON form
RESERVED = frozenset(COMBINATORS) | {
    "backend", "phase", "allowed", "ok", "violations", "log", "sources", "policy", "config",
    "error", "line", "input", "backends", "in_scope", "out_of_scope", "not_applicable",
}
STAGES = ("resolve", "defaults", "checks")
_UNKNOWN = {"backend": "E303", "phase": "E304", "input": "E301"}  # the code of an undeclared name
# options of the engine's `hisparse` commands (a test checks every command's parser against this
# list), and the SGLang options its inputs are read from, which no input may take as its flag;
# the bridge's commands guard their own options (kernels_bridge/cli.py colliding_inputs)
RESERVED_FLAGS = frozenset({"--policy", "--policy-dir", "--config", "--format", "--batch", "--record",
                            "--help", "--version", "--explain", "--model-path", "--model", "--hisparse-config",
                            "--hierarchical-sparse-attention-extra-config", "--where", "--max-patterns",
                            "--min-coverage", "--max-records", "--deep", "--seed", "--sample", "--workers",
                            "--case-timeout", "--allow-incapable"})


def checked_parts(doc: Document, schema: bool = True) -> "Parts":
    """The parts of a parsed policy file, after the schema (`schema` False: bytes that passed it
    before) and every name and value check. Raises PolicyError listing every problem."""
    if not isinstance(doc.data, dict):
        what = "empty" if doc.data is None else kind(doc.data)
        raise PolicyError([doc.problem("E109", f"a policy file is a mapping at the top level, this one is {what}", ())])
    problems = schema_problems(doc) if schema else []
    if problems:
        raise PolicyError(_sorted(problems))
    builder = Builder(doc)
    parts = builder.build()
    if builder.problems:
        raise PolicyError(_sorted(builder.problems))
    return parts


def _sorted(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (p.line, p.col, p.code, p.message))


class Parts(Record):
    """What the builder produces, for `Policy`. inputs: the declared inputs, then the phase inputs;
    scope: (leaves_out index, condition) of the entries that say which configs reach them;
    applies: input -> where it means something (inputs[].applies)."""

    FIELDS = ("family", "version", "description", "source", "upstream", "inputs", "backends", "phases", "tables",
              "stages", "scope", "applies", "capabilities", "models", "domain_parts")
    __slots__ = FIELDS
    DEFAULTS = {"upstream": None, "inputs": dict, "backends": dict, "phases": dict, "tables": dict, "stages": dict,
                "scope": list, "applies": dict, "capabilities": dict, "models": ("dsa", "other"), "domain_parts": ()}


class Builder:
    def __init__(self, doc: Document):
        self.doc = doc
        self.problems: list[Problem] = []
        d = doc.data
        self.parts = Parts(d["policy"], d["version"], d["description"].strip(), d.get("source", "").strip())

    # -- helpers -----------------------------------------------------------------------------
    def problem(self, code, message, path, key=False, hint=""):
        self.problems.append(self.doc.problem(code, message, path, key=key, hint=hint))

    def known(self, name, what: str, path: tuple, key: bool = False, table=None) -> bool:
        """Whether `name` is a declared backend, phase or input (`what`; an input of `table` when
        given); else E303 / E304 / E301 at `path`."""
        table = table if table is not None else getattr(self.parts, what + "s")
        if name not in table:
            self.problem(_UNKNOWN[what], f"unknown {what} '{name}'", path, key=key, hint=did_you_mean(name, table))
        return name in table

    def build(self) -> Parts:
        d = self.doc.data
        p = self.parts
        for message, key in misplaced(self.doc.file, p.family, p.version):
            self.problem("E312", message, (key,))
        if "upstream" in d:
            u = d["upstream"]
            p.upstream = Upstream(u["project"], tuple(u.get("releases") or ()), u.get("commit"), u.get("pr"),
                                  " ".join(u["note"].split()),
                                  tuple((x["where"], " ".join(x["why"].split()), "when" in x)
                                        for x in u.get("leaves_out") or ()))
        if "models" in d:
            p.models = tuple(d["models"])
        p.backends = {k: (v or "").strip() for k, v in d["backends"].items()}
        for section, what in (("inputs", "an input"), ("phases", "a phase")):
            for name in RESERVED.intersection(d[section]):
                self.problem("E309", f"'{name}' is a reserved name and cannot name {what}", (section, name), key=True)
        self._inputs(d["inputs"])
        self._phases(d["phases"])
        self._flags()
        tables = {name: self._table(raw, ("tables", name), True) for name, raw in (d.get("tables") or {}).items()}
        p.tables = {name: table for name, table in tables.items() if table is not None}
        seen: dict[str, tuple] = {}
        for stage in STAGES:
            p.stages[stage] = self._stage(stage, d[stage], seen)
        self._scope_conditions(d)
        if "domain" in d:
            self._domain(d["domain"]["parts"])
        for name, raw in (d.get("capabilities") or {}).items():
            self._capability(name, raw, ("capabilities", name))
        return p

    # -- what a decision covers, what a backend runs -----------------------------------------
    def _scope_conditions(self, d: dict):
        """leaves_out[].when and inputs[].applies: conditions on the config as given."""
        for i, entry in enumerate((d.get("upstream") or {}).get("leaves_out") or ()):
            if "when" in entry:
                self.parts.scope.append((i, self.cond(entry["when"], ("upstream", "leaves_out", i, "when"))))
        for name, spec in d["inputs"].items():
            if "applies" in spec:
                self.parts.applies[name] = self.cond(spec["applies"], ("inputs", name, "applies"))

    def _domain(self, raw: list):
        """domain.parts: (name, {input: values}) each, values in the input's domain order ('all':
        its whole domain); every input is checked, every value is one its input takes."""
        parts = []
        names = set()
        for i, part in enumerate(raw):
            path = ("domain", "parts", i)
            if part["name"] in names:
                self.problem("E307", f"domain part '{part['name']}' is named twice", path + ("name",))
            names.add(part["name"])
            chosen = {}
            for name, values in part["inputs"].items():
                if not self.known(name, "input", path + ("inputs", name), key=True):
                    continue
                spec = self.parts.inputs[name]
                chosen[name] = tuple(spec.domain()) if values == "all" else tuple(dict.fromkeys(
                    v for j, v in enumerate(values) if self._value(spec, v, path + ("inputs", name, j))))
            parts.append((part["name"], chosen))
        self.parts.domain_parts = tuple(parts)

    def _capability(self, backend: str, raw: dict, path: tuple):
        if backend not in self.parts.backends:
            self.problem("E303", f"capabilities of unknown backend '{backend}'", path, key=True,
                         hint=did_you_mean(backend, self.parts.backends))
            return

        def entries(key):
            out = []
            for i, item in enumerate(raw.get(key) or ()):
                ipath = path + (key, i)
                phases = tuple(item.get("phases") or self.parts.phases)
                for j, ph in enumerate(item.get("phases") or ()):
                    self.known(ph, "phase", ipath + ("phases", j))
                out.append(CapabilityEntry(phases, self.cond(item.get("when"), ipath + ("when",)),
                                           " ".join((item.get("why") or item.get("note") or "").split()), ipath))
            return tuple(out)

        self.parts.capabilities[backend] = Capability(backend, entries("runs"), entries("known_gaps"),
                                                      " ".join(raw["source"].split()), path)

    # -- declarations ------------------------------------------------------------------------
    def _inputs(self, raw: dict):
        for name, spec in raw.items():
            path = ("inputs", name)
            kind = spec["type"]
            values = (False, True) if kind == "bool" else tuple(spec["values"])
            inp = InputSpec(name, kind, values, spec["default"], bool(spec.get("nullable")), spec.get("minimum"),
                            spec.get("maximum"), (spec.get("description") or "").strip(),
                            tuple(spec.get("flags") or ("--" + name.replace("_", "-"),)), None, path,
                            self._deprecated(spec, path), dict(spec.get("removed_flags") or {}), spec.get("env"))
            if kind in ("int", "str"):
                for i, v in enumerate(values):
                    if not inp.accepts(v):
                        self.problem("E302", f"representative value {v} of '{name}' is outside "
                                     f"{inp.describe_domain()}", path + ("values", i))
            if not inp.accepts(inp.default):
                hint = did_you_mean(inp.default, values) if kind == "enum" and isinstance(inp.default, str) else ""
                self.problem("E305", f"default {shown(inp.default)} of '{name}' is outside its domain: "
                             f"{inp.describe_domain()}", path + ("default",), hint=hint)
            self.parts.inputs[name] = inp

    def _phases(self, raw: dict):
        p = self.parts
        backends = tuple(p.backends)
        for name, spec in raw.items():
            path = ("phases", name)
            if name in p.inputs:
                self.problem("E307", f"phase '{name}' has the name of an input (templates could not "
                             "tell them apart)", path, key=True)
            key = spec["input"]
            if key in p.inputs or key in RESERVED:
                self.problem("E307", f"phase '{name}' stores its backend in '{key}', which is already "
                             "an input or a reserved name", path + ("input",))
                continue
            flags = tuple(spec.get("flags") or ("--" + key.replace("_", "-"),))
            accepted = backends
            if "backends" in spec:
                accepted = tuple(b for b in backends if b in spec["backends"])  # declaration order
                for i, b in enumerate(spec["backends"]):
                    self.known(b, "backend", path + ("backends", i))
            p.phases[name] = PhaseSpec(name, key, flags, (spec.get("description") or "").strip(), path, accepted)
            p.inputs[key] = InputSpec(key, "enum", accepted, None, True, None, None,
                                      f"{name} backend (unset: chosen by the defaults stage)",
                                      flags, name, path, self._deprecated(spec, path),
                                      dict(spec.get("removed_flags") or {}))

    def _deprecated(self, spec: dict, path: tuple) -> dict:
        """Deprecated flag -> its notice (plain text: the parser logs it before any value is
        resolved, so it names no field)."""
        out = {}
        for flag, entry in (spec.get("deprecated_flags") or {}).items():
            tpl = self.template(entry["log"], path + ("deprecated_flags", flag, "log"), {})
            if tpl is not None and not tpl.fields:  # a field was reported (E306): nothing to render
                out[flag] = tpl.render({})
        return out

    def _flags(self):
        seen: dict[str, str] = {}
        for inp in self.parts.inputs.values():
            for flag in inp.deprecated:
                if flag in inp.flags:
                    self.problem("E307", f"flag {flag} is listed both as a flag and as deprecated",
                                 inp.path + ("deprecated_flags", flag), key=True)
            for flag in inp.removed:  # the input's own name is always accepted as a config key
                if flag in inp.flags or flag in inp.deprecated or flag[2:].replace("-", "_") == inp.name:
                    self.problem("E307", f"flag {flag} is listed as removed and as accepted",
                                 inp.path + ("removed_flags", flag), key=True)
            for i, flag in enumerate(tuple(inp.flags) + tuple(inp.deprecated) + tuple(inp.removed)):
                where = inp.path + ("flags", i) if inp.phase is None else inp.path
                if flag in RESERVED_FLAGS or flag.startswith("--no-"):
                    self.problem("E309", f"flag {flag} is reserved by the hisparse command line "
                                 "(--no-X is generated for boolean inputs)", where)
                key = flag[2:].replace("-", "_")
                if key in seen and seen[key] != inp.name:
                    self.problem("E307", f"flag {flag} names both '{seen[key]}' and '{inp.name}'", where)
                seen[key] = inp.name
        for name in self.parts.inputs:
            if "--" + name.replace("_", "-") in RESERVED_FLAGS:
                self.problem("E309", f"input '{name}' has the name of an option of the hisparse command line",
                             self.parts.inputs[name].path, key=True)
            if name in seen and seen[name] != name:
                self.problem("E307", f"input '{name}' is also a flag spelling of '{seen[name]}'",
                             self.parts.inputs[name].path, key=True)

    # -- tables ------------------------------------------------------------------------------
    def _scope(self, in_phase: bool) -> dict:
        scope = dict(self.parts.inputs)
        if in_phase:
            scope["backend"] = InputSpec("backend", "enum", tuple(self.parts.backends), None, True)
            scope["phase"] = InputSpec("phase", "enum", tuple(self.parts.phases), None, False)
        return scope

    def _table(self, raw: dict, path: tuple, in_phase: bool) -> Table | None:
        scope = self._scope(in_phase)
        key = raw["key"]
        spec = scope.get(key)
        if spec is None:
            self.problem("E301", f"table key '{key}' is not a declared input", path + ("key",),
                         hint=did_you_mean(key, scope))
            return None
        rows: dict = {}
        keyed: dict = {}  # value -> the row key text that gave it
        ok = True
        for text, row in raw["rows"].items():
            rpath = path + ("rows", text)
            value = _typed_key(text, spec)
            if value is _BAD:
                ok = False
                hint = did_you_mean(text, spec.values) if spec.type == "enum" else ""
                alike = int_meant(text) if spec.type == "int" else None
                if alike is not None:  # '010', ' 10', '1_0', fullwidth or Arabic-Indic digits
                    twin = f", the same as row '{keyed[alike]}'" if alike in keyed else ""
                    self.problem("E302", f"row '{text}' is not an integer written in ASCII digits "
                                 f"without sign, blanks, underscores or leading zeros{twin}", rpath, key=True,
                                 hint=f"write {alike}")
                else:
                    self.problem("E302", f"row '{text}' is not a value of '{key}' "
                                 f"({spec.describe_domain()})", rpath, key=True, hint=hint)
                continue
            keyed[value] = text
            rows[value] = self._row(row, rpath, in_phase)
        otherwise = None
        if "otherwise" in raw:
            otherwise = self._row(raw["otherwise"], path + ("otherwise",), in_phase)
        elif spec.type == "int" or spec.nullable or set(spec.values) - set(rows):
            missing = [shown(v) for v in spec.domain() if v not in rows] if spec.type != "int" else []
            what = "values " + ", ".join(missing) if missing else "every integer"
            self.problem("E310", f"table on '{key}' has no row for {what} and no 'otherwise'", path)
        if not ok:
            return None
        return Table(key, rows, otherwise, path)

    def _row(self, row, path, in_phase):
        if isinstance(row, dict):
            return self._table(row, path, in_phase)
        for i, name in enumerate(row):
            self.known(name, "backend", path + (i,))
        return frozenset(row)

    # -- conditions --------------------------------------------------------------------------
    def cond(self, raw: dict | None, path: tuple, in_phase: bool = False):
        if raw is None:
            return TrueCond()
        scope = self._scope(in_phase)
        items = []
        for key, value in raw.items():
            kpath = path + (key,)
            if key == "any" or key == "all":
                subs = tuple(self.cond(v, kpath + (i,), in_phase) for i, v in enumerate(value))
                items.append((Any if key == "any" else All)(subs, kpath))
            elif key == "not":
                items.append(Not(self.cond(value, kpath, in_phase), kpath))
            elif key == "user_set":
                for phase, expected in value.items():
                    self.known(phase, "phase", kpath + (phase,), key=True)
                    items.append(UserSet(phase, expected, kpath + (phase,)))
            else:
                items.extend(self._tests(key, value, kpath, scope, in_phase))
        return conj(*items)

    def _tests(self, name, value, path, scope, in_phase) -> list:
        spec = scope.get(name)
        if spec is None:
            hint = did_you_mean(name, scope)
            if name in ("backend", "phase") and not in_phase:
                hint = "backend and phase exist only in checks with for_each: phase"
            self.problem("E301", f"unknown input '{name}'", path, key=True, hint=hint)
            return []
        if not isinstance(value, dict):
            self._value(spec, value, path)
            return [Test(name, "==", value, path)]
        tests = []
        for op, operand in value.items():
            opath = path + (op,)
            if op in ("in", "not_in", "lower_in"):
                if op == "lower_in" and spec.type != "str":
                    self.problem("E308", f"lower_in compares strings but '{name}' is {spec.type}", opath, key=True)
                for i, v in enumerate(operand):
                    if op != "lower_in":
                        self._value(spec, v, opath + (i,))
                    elif v != v.lower():
                        self.problem("E308", f"{shown(v)} is not lower case, so lower_in never matches it",
                                     opath + (i,))
                tests.append(Test(name, op, frozenset(operand), opath))
            elif op == "set":
                if not spec.nullable:
                    self.problem("E308", f"'{name}' is never unset (it is not nullable), so "
                                 f"{{set: {str(operand).lower()}}} is constant", opath, key=True)
                tests.append(Test(name, "set", operand, opath))
            else:
                if op in (">=", ">", "<=", "<", "multiple_of") and spec.type != "int":
                    self.problem("E308", f"'{op}' compares numbers but '{name}' is {spec.type}", opath, key=True)
                if isinstance(operand, dict) and ("product" in operand or "quotient" in operand):
                    operand = self._arith(operand, scope, opath)
                elif isinstance(operand, dict):
                    operand = self._ref(operand["input"], spec, name, scope, opath + ("input",))
                elif op == "multiple_of":
                    if type(operand) is not int:
                        self.problem("E308", f"multiple_of takes an integer, got {typed(operand)}", opath)
                else:
                    self._value(spec, operand, opath)
                tests.append(Test(name, op, operand, opath))
        return tests

    def _ref(self, ref: str, spec, name: str, scope: dict, path: tuple) -> InputRef:
        other = scope.get(ref)
        if self.known(ref, "input", path, table=scope) and spec is not None and other.type != spec.type:
            self.problem("E308", f"'{name}' ({spec.type}) compared with '{ref}' ({other.type})", path)
        return InputRef(ref)

    def _arith(self, operand: dict, scope: dict, path: tuple) -> Product:
        """{product: [...]} or {quotient: [...]}, its factors checked."""
        op, cls = ("product", Product) if "product" in operand else ("quotient", Quotient)
        return cls(tuple(self._factor(f, scope, path + (op, i)) for i, f in enumerate(operand[op])))

    def _factor(self, factor, scope: dict, path: tuple):
        """A factor of a product: an integer, or an int input's current value."""
        if isinstance(factor, dict):
            ref = self._ref(factor["input"], None, "", scope, path + ("input",))
            other = scope.get(factor["input"])
            if other is not None and other.type != "int":
                self.problem("E308", f"a product multiplies integers, but '{factor['input']}' is {other.type}",
                             path + ("input",))
            return ref
        return factor

    def _value(self, spec: InputSpec, value, path) -> bool:
        if spec.accepts(value):
            return True
        if spec.type == "enum" and isinstance(value, str):
            self.problem("E302", f"{shown(value)} is not a value of '{spec.name}'", path,
                         hint=did_you_mean(value, spec.values))
        elif spec.type == "int" and type(value) is int:
            self.problem("E302", f"{value} is outside the domain of '{spec.name}' ({spec.describe_domain()})", path)
        elif value is None:
            self.problem("E308", f"'{spec.name}' is never unset (not nullable), null cannot match it", path)
        else:
            self.problem("E308", f"{typed(value)} does not fit '{spec.name}', "
                         f"which is {spec.describe_domain()}", path)
        return False

    # -- templates ---------------------------------------------------------------------------
    def template(self, text: str | None, path: tuple, fields: dict):
        """Parse a template; `fields` maps each allowed field to 'value' or 'set'."""
        if text is None:
            return None
        try:
            tpl = parse_template(text)
        except TemplateSyntaxError as exc:
            self.problem("E306", str(exc), path)
            return None
        for f in tpl.fields:
            kind = fields.get(f.name)
            if kind is None:
                self.problem("E306", f"template field '{{{f.name}}}' is not known here", path,
                             hint=did_you_mean(f.name, fields))
            elif kind == "set" and f.spec not in SET_FORMATS:
                self.problem("E306", f"'{{{f.name}:{f.spec}}}': unknown format; use one of "
                             + ", ".join(s for s in SET_FORMATS if s), path)
            elif kind == "value" and f.spec:
                self.problem("E306", f"'{{{f.name}:{f.spec}}}': only backend sets take a format", path)
        return tpl

    def _fields(self, in_phase=False, allowed=False) -> dict:
        names = (*self.parts.inputs, *self.parts.phases, *(("phase", "backend") if in_phase else ()))
        return dict(dict.fromkeys(names, "value"), **({"allowed": "set"} if allowed else {}))

    # -- stages ------------------------------------------------------------------------------
    def _stage(self, stage: str, raw: dict, seen: dict) -> Stage:
        rules = []
        for i, r in enumerate(raw["rules"]):
            path = (stage, "rules", i)
            name = r["name"]
            if name in seen:
                self.problem("E307", f"rule name '{name}' is used twice (first at line {seen[name][0]})",
                             path + ("name",))
            else:
                seen[name] = self.doc.pos(path + ("name",))
            when = self.cond(r.get("when"), path + ("when",), stage == "checks" and r.get("for_each") == "phase")
            rule = Rule(stage, i, name, when, description=(r.get("description") or "").strip(), path=path,
                        line=self.doc.pos(path)[0], accepts=dict(r.get("accepts") or {}), part=r.get("part"))
            getattr(self, f"_{stage}_rule")(rule, r, path)
            rules.append(rule)
        return Stage(stage, self.cond(raw.get("when"), (stage, "when")), rules, (raw.get("description") or "").strip(),
                     (stage,))

    def _resolve_rule(self, rule: Rule, r: dict, path: tuple):
        for key, value in (r.get("set") or {}).items():
            spec = self.parts.inputs.get(key)
            if spec is None:
                self.problem("E301", f"cannot set unknown input '{key}'", path + ("set", key), key=True,
                             hint=did_you_mean(key, self.parts.inputs))
                continue
            if isinstance(value, dict):  # a computed value: another input's, a product, a quotient
                computed = self._computed(spec, value, path + ("set", key))
                clash = sorted(operand_inputs(computed) & (set(r["set"]) - {key})) if computed is not None else ()
                if clash:  # the order of one rule's writes would matter: there is none (itself: its old value)
                    self.problem("E308", f"'{key}' is computed from {', '.join(clash)}, which this rule "
                                 "also sets; set it in a rule of its own", path + ("set", key))
                elif computed is not None:
                    rule.set[key] = computed
            elif self._value(spec, value, path + ("set", key)):
                rule.set[key] = value
        rule.log = self.template(r.get("log"), path + ("log",), self._fields())
        if "require" in r:
            rule.require = self.cond(r["require"], path + ("require",))
            rule.message = self.template(r.get("message"), path + ("message",), self._fields())
            rule.raises = r.get("raises", rule.raises)

    def _computed(self, spec: InputSpec, value: dict, path: tuple):
        """A `set` value computed from the inputs' current values: {input: NAME} of the same type,
        or an integer {product: [...]} / {quotient: [...]} for an int input that may be unset when
        its result can be (a factor nullable, or a divisor that can be 0)."""
        scope = self.parts.inputs
        if "input" in value:
            return self._ref(value["input"], spec, spec.name, scope, path + ("input",))
        if spec.type != "int":
            self.problem("E308", f"'{spec.name}' is {spec.type}, but a product or quotient is an integer", path)
            return None
        operand = self._arith(value, scope, path)
        refs = [scope[n] for n in operand.inputs() if n in scope]
        divisors = operand.factors[1:] if isinstance(operand, Quotient) else ()
        may_be_unset = any(r.nullable for r in refs) or any(
            f == 0 if not isinstance(f, InputRef) else
            f.name in scope and (scope[f.name].minimum is None or scope[f.name].minimum < 1) for f in divisors)
        if may_be_unset and not spec.nullable:
            self.problem("E308", f"'{spec.name}' is never unset (not nullable), but {operand.words()} "
                         "can be (an input it reads is nullable, or a divisor can be 0)", path)
            return None
        return operand

    def _defaults_rule(self, rule: Rule, r: dict, path: tuple):
        for phase, backend in r["set"].items():
            if not (self.known(phase, "phase", path + ("set", phase), key=True)
                    and self.known(backend, "backend", path + ("set", phase))):
                continue
            accepted = self.parts.phases[phase].backends
            if backend not in accepted:
                self.problem("E302", f"phase '{phase}' does not accept backend '{backend}'",
                             path + ("set", phase), hint=f"it accepts {', '.join(accepted)}")
                continue
            rule.set[phase] = backend
        missing = [ph for ph in self.parts.phases if ph not in r["set"]]
        if missing:
            self.problem("E311", f"default rule '{rule.name}' does not set phase(s) "
                         + ", ".join(missing) + "; a default rule fills every phase", path + ("set",))
        rule.log = self.template(r.get("log"), path + ("log",), self._fields())

    def _checks_rule(self, rule: Rule, r: dict, path: tuple):
        rule.for_each_phase = r.get("for_each") == "phase"
        rule.at = r.get("at", "checks")
        rule.raises = r.get("raises", rule.raises)
        if "require" in r:
            rule.require = self.cond(r["require"], path + ("require",), rule.for_each_phase)
        else:
            raw = r["allowed"]
            if not rule.for_each_phase:
                self.problem("E310", "'allowed' tests a phase's backend: use it with for_each: phase",
                             path + ("allowed",), key=True)
            if isinstance(raw, str):
                rule.allowed = self.parts.tables.get(raw)
                if rule.allowed is None and raw not in (self.doc.data.get("tables") or {}):
                    self.problem("E310", f"unknown table '{raw}'", path + ("allowed",),
                                 hint=did_you_mean(raw, self.parts.tables))
            else:
                rule.allowed = self._table(raw, path + ("allowed",), in_phase=True)
        rule.message = self.template(r["message"], path + ("message",),
                                     self._fields(rule.for_each_phase, "allowed" in r))


_BAD = object()


def _typed_key(text: str, spec: InputSpec):
    """A table row's key (always text in YAML) as a value of the keyed input."""
    value = {"true": True, "false": False}.get(text) if spec.type == "bool" else text
    if spec.type == "int":  # one spelling per integer: keys never alias
        value = int(text) if CANONICAL_INT.fullmatch(text) else None
    return value if value is not None and spec.accepts(value) else _BAD

