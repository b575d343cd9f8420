"""What the user gave -> the inputs of a policy: the layers of a config (read one way by
engine/sglang/layers.py, whatever their source) stacked into the config a policy evaluates, with
where each input came from.

Layers stack (launch command, then --config, then flags, then a batch line): a later layer
replaces an input; an option is replaced whole, as SGLang's parser does. The model path the
layers give (the last wins) is read once, by engine/sglang/models.py, and decides dsa_model and
model_family unless some layer gives them.
"""
from __future__ import annotations

from engine.explain.words import words
from engine.language.record import Record
from engine.sglang.layers import OPTIONS, read_layer

# inputs that describe the machine and the model rather than a flag: text output says what each
# decision assumed for them, and where that came from
ENVIRONMENT = ("platform", "sm_major", "sm_minor", "dsa_model", "model_family")


class Given(Record):
    """Layers combined: the config for the policy, the notes, what the user gave (one mapping that
    reads back into the same config: what a record keeps), and where each input of the config
    came from (input -> text, e.g. "given: the command line"; an input missing there takes the
    policy's default)."""

    FIELDS = ("config", "notes", "given", "origins")
    DEFAULTS = {"origins": dict}
    __slots__ = FIELDS


def combine(policy, layers, known=None) -> Given:
    """The config the layers give, in order (later wins), and what the model path they give
    decides where no layer gives it. known: (path, Model) already read for that path (the
    policy's choice read it), which is not read again. Raises ConfigError when a model path's
    config.json cannot be read."""
    final: dict = {}  # input -> (key, value, origin): origin None (the input itself) or an option
    options: dict = {}  # option -> (key, object)
    model = None
    notes: list[str] = []
    origins: dict = {}
    for layer in layers:
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
        notes += layer.notes
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
    given = {key: value for key, value, origin in final.values() if origin is None}
    for group, (key, obj) in options.items():
        beaten = {json_key for json_key, name in OPTIONS[group][1].items()
                  if name in final and final[name][2] is None}
        given[key] = {k: v for k, v in obj.items() if k not in beaten}
    if model is not None:
        from engine.sglang.models import read_model

        given[model[0]] = model[1]
        read = read_model(policy, model[1], known[1] if known and known[0] == model[1] else None)
        notes += read.notes
        for name, value in read.inputs.items():
            if name not in final:  # given explicitly, an input beats what the model path says
                config[name] = value
                origins[name] = read.source
    return Given(config, notes, given, origins)


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
