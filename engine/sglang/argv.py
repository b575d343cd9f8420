"""The policy's inputs as argparse options, and the values a parse of them gave back."""
from __future__ import annotations

import argparse

from engine.errors import HisparseError, Problem
from engine.values import INT_MAX, INT_MIN, parse_int, shown


def int_arg(text: str) -> int:
    """argparse type of an integer option: 64-bit, refused unread when longer (int() of a
    5000-digit text raises past Python's digit limit)."""
    value = parse_int(text)
    if value is None or not INT_MIN <= value <= INT_MAX:
        raise argparse.ArgumentTypeError(f"invalid int value: {shown(text)} (a 64-bit integer)")
    return value


def add_input_flags(parser, policy, defaults: dict | None = None, switch=argparse.BooleanOptionalAction):
    """One option per policy input flag, spelled as the policy declares (SGLang's flag names),
    and SGLang's options the inputs derive from (--model-path, --hisparse-config). Every spelling
    keeps its own destination, so two spellings of one input with different values are an error
    (C501), not a silent last-one-wins. `defaults` overrides the default the help shows, for a
    command that sets an input itself; `switch` is the action of a bool input's flags (hisparse's
    --x/--no-x, or SGLang's "store_true"). A flag that collides with one of the command's own
    options is a policy error (E309), never an argparse crash."""
    defaults = defaults or {}
    group = parser.add_argument_group(f"config inputs of {policy.ref}")
    try:
        _add_input_flags(parser, group, policy, defaults, switch)
    except argparse.ArgumentError as exc:
        raise HisparseError([Problem("E309", f"{policy.ref}: an input flag collides with an option of "
                                     f"{parser.prog}: {exc}", policy.file)]) from None


class _Deprecated(argparse.Action):
    """A deprecated spelling: stores its value (const for a switch) and the order in which the
    deprecated spellings were typed, the order their notices are logged in (SGLang's parser logs
    each as it reads it)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        typed = [d for d in getattr(namespace, TYPED, None) or () if d != self.dest]
        setattr(namespace, TYPED, typed + [self.dest])


TYPED = "deprecated__typed"  # the namespace attribute _Deprecated keeps its order in


def _add_input_flags(parser, group, policy, defaults: dict, switch) -> None:
    for name, spec in policy.inputs.items():
        help_text = spec.description or ""
        shown_default = defaults.get(name, spec.default)
        kind = int_arg if spec.type == "int" else str
        metavar = "N" if spec.type == "int" else ("BACKEND" if spec.phase else "VALUE")
        for i, flag in enumerate(spec.flags):
            other = f"another spelling of {spec.flag}" if i else ""
            if spec.type == "bool":
                group.add_argument(flag, dest=f"{name}__flag{i}", action=switch,
                                   default=None, help=other or f"{help_text} (default {str(shown_default).lower()})")
            else:
                values = "|".join(str(v) for v in spec.values)
                domain = f"one of {values}" if spec.type == "enum" else f"integer, e.g. {values}"
                default = "unset" if shown_default is None else shown_default
                group.add_argument(flag, dest=f"{name}__flag{i}", type=kind, default=None, metavar=metavar,
                                   help=other or f"{help_text} [{domain}; default {default}]")
        for i, flag in enumerate(spec.deprecated):  # kept apart: using one is logged
            if spec.type == "bool":
                group.add_argument(flag, dest=f"{name}__deprecated{i}", action=_Deprecated, nargs=0, const=True,
                                   default=None, help=f"deprecated spelling of {spec.flag}")
            else:
                group.add_argument(flag, dest=f"{name}__deprecated{i}", action=_Deprecated, type=kind,
                                   default=None, metavar=metavar, help=f"deprecated spelling of {spec.flag}")
        for i, flag in enumerate(spec.removed):  # parsed only to be refused (C501) naming the replacement
            group.add_argument(flag, dest=f"{name}__removed{i}", nargs="?", const=True, default=None,
                               help=argparse.SUPPRESS)
    from engine.sglang.layers import MODEL_KEYS, OPTIONS

    sglang = parser.add_argument_group("SGLang options the inputs are read from")
    for i, key in enumerate(MODEL_KEYS):
        sglang.add_argument("--" + key, dest=f"sglang__{key}", metavar="PATH",
                            help=("the model (a local folder: its config.json; a hub name: the name table) "
                                  "decides dsa_model and model_family") if not i else f"as --{MODEL_KEYS[0]}")
    for primary, (aliases, targets) in OPTIONS.items():
        for key in (primary,) + aliases:
            sglang.add_argument("--" + key, dest=f"sglang__{key}", metavar="JSON",
                                help=f"SGLang's JSON option ({', '.join(targets)})" if key == primary
                                else f"as --{primary}")


def flag_values(policy, ns) -> dict:
    """What the command line gave, keyed by the spelling typed (a deprecated flag is logged when
    the config is evaluated; errors name what was typed)."""
    from engine.sglang.layers import SOURCE_KEYS

    given = {}
    deprecated = {}  # dest -> the flag, put in the order typed after the loop
    for name, spec in policy.inputs.items():
        for i, flag in enumerate(spec.flags):
            value = getattr(ns, f"{name}__flag{i}", None)
            if value is not None:
                given[flag[2:]] = value
        for i, flag in enumerate(spec.deprecated):
            deprecated[f"{name}__deprecated{i}"] = flag
        for i, flag in enumerate(spec.removed):
            value = getattr(ns, f"{name}__removed{i}", None)
            if value is not None:
                given[flag[2:]] = value
    for dest in getattr(ns, TYPED, None) or ():
        if dest in deprecated and getattr(ns, dest, None) is not None:
            given[deprecated[dest][2:]] = getattr(ns, dest)
    for key in SOURCE_KEYS:
        value = getattr(ns, f"sglang__{key}", None)
        if value is not None:
            given[key] = value
    return given
