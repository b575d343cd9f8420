"""What the user gave -> the inputs of a policy: one path for hisparse's own flags, `--config`
files, `--batch` lines, SGLang launch commands, `apply()` and `replay`.

A source is read into a Layer: a mapping of keys, as the user spelled them, to values. A key is
- a policy input under any of its spellings (its name, its flags and deprecated flags, with
  dashes or underscores);
- an SGLang option the policy's inputs derive from: `model-path` (alias `model`) decides
  dsa_model and model_family (engine/sglang/models.py), `hisparse-config` (alias
  `hierarchical-sparse-attention-extra-config`, a JSON object) carries hisparse_top_k,
  hisparse_device_buffer_size, ... (OPTIONS);
- anything else: ignored with a note in an SGLang config file (lenient), an error elsewhere.
Two spellings of one input or option in one source with different values are C501, never a
silent choice. Layers stack (launch command, then --config, then flags, then a batch line): a
later layer replaces an input; an option is replaced whole, as SGLang's parser does. The model
path decides dsa_model and model_family unless some layer gives them.
"""
from __future__ import annotations

import unicodedata
from collections.abc import Mapping

from engine.errors import ConfigError, Problem
from engine.explain.words import words
from engine.values import clip, kind, shown
from engine.language.record import Record
from engine.suggest import did_you_mean, near_miss, unknown_key

MODEL_KEYS = ("model-path", "model")
# SGLang's JSON-valued options: primary spelling -> (aliases, {JSON key: the policy input it sets})
OPTIONS = {
    "hisparse-config": (("hierarchical-sparse-attention-extra-config",),
                        {"top_k": "hisparse_top_k", "device_buffer_size": "hisparse_device_buffer_size",
                         "swap_in_block_size": "hisparse_swap_in_block_size",
                         "host_to_device_ratio": "hisparse_host_to_device_ratio"}),
}
_OPTION_OF = {k: primary for primary, (aliases, _) in OPTIONS.items() for k in (primary,) + aliases}
# every key SGLang's options the inputs derive from are spelled by: the model path's and the JSON options'
SOURCE_KEYS = MODEL_KEYS + tuple(_OPTION_OF)
# every key SGLang 0.5.23 reads from the option (srt/mem_cache/sparsity/factory.py:_parse_sparse_config);
# it passes any other key on unread, so a misspelt one is worth a note
OPTION_KEYS = {
    "hisparse-config": ("top_k", "device_buffer_size", "host_to_device_ratio", "swap_in_block_size", "algorithm",
                        "backend", "min_sparse_prompt_len", "page_size"),
}
# inputs that describe the machine and the model rather than a flag: text output says what each
# decision assumed for them, and where that came from
ENVIRONMENT = ("platform", "sm_major", "sm_minor", "dsa_model", "model_family")

# characters a word processor or chat puts where a hyphen-minus belongs
DASHES = frozenset("\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe58\ufe63\uff0d")


def typographic_dash(text) -> str:
    """A hint when `text` holds a typographic dash (e.g. an em dash for `--`), else ''."""
    if not isinstance(text, str):
        return ""
    for ch in text:
        if ch in DASHES:
            name = unicodedata.name(ch, "a dash")
            return f"U+{ord(ch):04X} {name} is a typographic dash: type '-' (hyphen-minus) instead"
    return ""


def sglang_key(key: str) -> str:
    return key.replace("_", "-")


class Layer(Record):
    """One source, read: its inputs (input -> (key as spelled, value)), options (primary ->
    (key as spelled, JSON object)), the model path ((key, path) or None), keys ignored."""

    FIELDS = ("source", "inputs", "options", "model", "ignored")
    __slots__ = FIELDS

    def __init__(self, source: str = "", inputs: dict | None = None, options: dict | None = None,
                 model: tuple | None = None, ignored: list | None = None):
        self.source = source
        self.inputs = {} if inputs is None else inputs
        self.options = {} if options is None else options
        self.model = model
        self.ignored = [] if ignored is None else ignored


def read_layer(policy, data, source: str = "", *, file: str = "", doc=None, lenient: bool = False) -> Layer:
    """Read one source. Raises ConfigError listing every problem (with line:col from `doc`)."""
    layer = Layer(source)
    if not isinstance(data, Mapping):
        raise ConfigError([Problem("C504", f"a config is a mapping of input -> value, got "
                                   f"{kind(data)}", file)])
    problems: list[Problem] = []
    inputs: dict = {}  # given to the policy's own check (it reports twins, values, positions)
    seen: dict = {}  # option or model group -> the key that set it

    def at(problem: Problem, key) -> Problem:
        return problem if doc is None else doc.placed(problem, key)

    removed = getattr(policy, "removed_keys", {})
    for key, value in data.items():
        if policy.canonical_key(key) is not None or (isinstance(key, str) and key.replace("-", "_") in removed):
            inputs[key] = value  # the policy's own check names a removed spelling's replacement
            continue
        group = _group(key)
        if group is None:
            names = _names(policy)
            near = near_miss(key, names) if isinstance(key, str) else None
            hint = typographic_dash(key)
            if lenient and near is None and not hint:
                layer.ignored.append(clip(str(key), 40))
                continue
            problems.append(at(unknown_key(key, names, policy.input_names, file, hint), key))
            continue
        if group in seen and seen[group][1] != value:
            problems.append(at(Problem("C501", f"{shown(key)} and {shown(seen[group][0])} both set "
                                       f"{'the model path' if group == 'model' else repr(group)}, to "
                                       "different values", file), key))
            continue
        seen[group] = (key, value)
        if group == "model":
            if not isinstance(value, str) or not value:
                problems.append(at(Problem("C503", f"{key}: expected a model path or name, got {shown(value)}",
                                           file), key))
                continue
            layer.model = (key, value)
        else:
            obj, problem = _json_object(key, value, file)
            if problem:
                problems.append(at(problem, key))
                continue
            layer.options[group] = (key, obj)
    try:
        canonical = policy.normalize(inputs, file, doc)
    except ConfigError as exc:
        problems += exc.problems
        canonical = {}
    spelled = {policy.canonical_key(k): k for k in inputs}
    for name, value in canonical.items():
        layer.inputs[name] = (spelled[name], inputs[spelled[name]])
    for group, (key, obj) in layer.options.items():  # what an option carries, checked alike
        for json_key, name in OPTIONS[group][1].items():
            if json_key not in obj or name not in policy.inputs:
                continue
            try:
                policy.normalize({name: obj[json_key]})
            except ConfigError as exc:
                problems += [at(Problem(p.code, f"{key}: {json_key}: {p.message.split(': ', 1)[-1]}", file,
                                        hint=p.hint), key) for p in exc.problems]
                continue
            if name in layer.inputs and layer.inputs[name][1] != obj[json_key]:
                problems.append(at(Problem("C501", f"{shown(key)} ({json_key}) and {shown(layer.inputs[name][0])} "
                                           f"both set '{name}', to different values", file), key))
    if problems:
        raise ConfigError(sorted(problems, key=lambda p: (p.line, p.col)) if doc is not None else problems)
    if layer.model is not None and "dsa_model" not in policy.inputs and "model_family" not in policy.inputs:
        layer.ignored.append(layer.model[0])
    for group, (key, _) in layer.options.items():
        if not any(name in policy.inputs for name in OPTIONS[group][1].values()):
            layer.ignored.append(key)
    return layer


def _group(key) -> str | None:
    """The SGLang option a key names ("model" for the model path), or None."""
    if not isinstance(key, str):
        return None
    k = sglang_key(key)
    if k in MODEL_KEYS:
        return "model"
    return _OPTION_OF.get(k)


def _names(policy) -> list[str]:
    return sorted(set(policy.key_map) | set(MODEL_KEYS) | set(_OPTION_OF))


def _json_object(key, value, file):
    obj = value
    if isinstance(value, str):
        from engine.files.json_reader import parse_json
        from engine.files.reading import ReadError

        try:  # the reader's limits: 64-bit integers, finite floats, depth, size
            obj = parse_json(value, key).data
        except ReadError as exc:
            return None, Problem("C503", f"{key}: not a JSON object: {shown(value)} "
                                 f"({exc.problems[0].message})", file)
    if not isinstance(obj, dict):
        return None, Problem("C503", f"{key}: expected a JSON object, got {kind(obj)}", file)
    return obj, None


class Given(Record):
    """Layers combined: the config for the policy, the notes, what the user gave, and where each
    input of the config came from (input -> text, e.g. "given: the command line"; an input
    missing there takes the policy's default)."""

    FIELDS = ("config", "notes", "given", "origins")
    __slots__ = FIELDS

    def __init__(self, config: dict, notes: list, given: dict, origins: dict | None = None):
        self.config = config
        self.notes = notes
        self.given = given  # one mapping that reads back into the same config: what a record keeps
        self.origins = {} if origins is None else origins


def combine(policy, layers) -> Given:
    """The config the layers give, in order (later wins). Raises ConfigError when a model
    path's config.json cannot be read."""
    final: dict = {}  # input -> (key, value, origin): origin None (the input itself) or an option
    options: dict = {}  # option -> (key, object)
    model = None
    notes: list[str] = []
    origins: dict = {}
    for layer in layers:
        where = f" ({layer.source})" if layer.source else ""
        origin = f"given: {layer.source}" if layer.source else "given"
        for group, (key, obj) in layer.options.items():  # an option is replaced whole
            for name in OPTIONS[group][1].values():
                if name in final and final[name][2] == group:
                    del final[name]
            options[group] = (key, obj)
            for json_key, name in OPTIONS[group][1].items():
                if json_key in obj and name in policy.inputs:
                    final[name] = (name, obj[json_key], group)
                    origins[name] = f"{origin}, {key}"
            notes += _unread_keys(group, key, obj, where)
        for name, (key, value) in layer.inputs.items():
            final[name] = (key, value, None)
            origins[name] = origin
        if layer.model is not None:
            model = layer.model
        if layer.ignored:
            shown_keys = ", ".join(layer.ignored[:8]) + (" ..." if len(layer.ignored) > 8 else "")
            where = f"{layer.source}: " if layer.source else ""
            notes.append(f"{where}ignored {len(layer.ignored)} key(s) the policy does not read: {shown_keys}")
    config = {key: value for key, value, _ in final.values()}
    if model is not None:
        from engine.sglang.models import model_inputs

        decided, more = model_inputs(policy, model[1])
        notes += more
        how = model_source(model[1])
        for name, value in decided.items():
            if name not in final:  # given explicitly, an input beats what the model path says
                config[name] = value
                origins[name] = how
    given = {key: value for key, value, origin in final.values() if origin is None}
    for group, (key, obj) in options.items():
        beaten = {json_key for json_key, name in OPTIONS[group][1].items()
                  if name in final and final[name][2] is None}
        given[key] = {k: v for k, v in obj.items() if k not in beaten}
    if model is not None:
        given[model[0]] = model[1]
    return Given(config, notes, given, origins)


def _unread_keys(group: str, key: str, obj: dict, where: str) -> list[str]:
    """A note per key of an SGLang JSON option that SGLang does not read (it passes them on
    unread), with did-you-mean."""
    known = OPTION_KEYS.get(group)
    if known is None:
        return []
    out = []
    for k in obj:
        if k not in known:
            hint = did_you_mean(str(k), known, list_if_none=False)
            out.append(f"{key}{where}: SGLang does not read the key {shown(k)}" + (f"; {hint}" if hint else
                       f" (it reads {', '.join(known)})"))
    return out


def model_source(model_path: str) -> str:
    """Where the model's inputs were read from, in words."""
    from engine.sglang.models import identify

    try:
        model = identify(model_path)
    except ConfigError:
        return f"read from {model_path}"
    return f"read from {model.how}"


def assumptions(policy, decision, origins: dict) -> list[tuple[str, object, str]]:
    """(input, value, where it came from) for each input of ENVIRONMENT the policy declares: what
    the decision assumed about the machine and the model. An input the decision reports as not
    applicable says so."""
    config = decision.config
    out = []
    na = set(decision.not_applicable)
    for name in ENVIRONMENT:
        if name not in policy.inputs:
            continue
        if name in na:
            out.append((name, None, f"it applies only where {words(policy.applies[name])}"))
            continue
        origin = (origins or {}).get(name, "the policy's default")
        out.append((name, config[name], origin))
    return out


def config_of(policy, data, source: str = "") -> tuple[dict, list[str]]:
    """(config, notes) from one mapping of what a user gave (a batch line, a record's input)."""
    g = combine(policy, [read_layer(policy, data, source)])
    return g.config, g.notes
