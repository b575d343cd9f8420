"""The parts every `hisparse` command is built from: its parser (usage errors exit 2, never guess
a flag), the policy options, one option per input of the policy, and the config sources a command
line names (flags, --config, a launch command after `--`), read as every other source is."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

from engine.errors import EngineError, HisparseError, Problem
from engine.files.shipped import DEFAULT_POLICY, policy_ref
from engine.suggest import did_you_mean
from engine.values import INT_MAX, INT_MIN, clip, escape_json, one_line, parse_int, shown

OK, VIOLATION, ERROR = 0, 1, 2


class UsageError(EngineError):
    """Bad command-line usage (exit 2)."""


def wrap_words(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` (a longer word alone on its line), broken only between
    words and after the `|` of a value list (auto|fp8_e4m3|...): never inside a value or a flag."""
    lines, line = [], ""
    for word in text.split():
        for i, part in enumerate(re.findall(r"[^|]+\|?|\|", word)):
            sep = " " if i == 0 and line else ""
            if line and len(line) + len(sep) + len(part) > width:
                lines.append(line)
                line = part
            else:
                line += sep + part
    return lines + [line] if line else lines


def terminal_columns() -> int:
    """shutil.get_terminal_size().columns without importing shutil (argparse imports it for every
    parser it builds, which `hisparse evaluate`'s start-up would pay): $COLUMNS, the terminal's, or 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 80
    return columns


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, wrapped by wrap_words (argparse's own wrapping breaks inside long words)."""

    def __init__(self, prog, indent_increment=2, max_help_position=24, width=None):
        super().__init__(prog, indent_increment, max_help_position,
                         terminal_columns() - 2 if width is None else width)

    def _split_lines(self, text, width):
        return wrap_words(text, width)

    def _fill_text(self, text, width, indent):
        return "\n".join(indent + line for line in wrap_words(text, width - len(indent)))


# argparse's actions that a repeat adds to (or that end parsing): named, their classes are private
_REPEATABLE = frozenset({"_AppendAction", "_AppendConstAction", "_ExtendAction", "_CountAction", "_HelpAction",
                         "_VersionAction"})


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kw):
        kw.setdefault("allow_abbrev", False)  # a routing flag is never guessed from a prefix
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kw)

    def parse_args(self, args=None, namespace=None):
        self._refuse_repeats(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def _refuse_repeats(self, args) -> None:
        """An option given twice with different values is an error, never a silent last-wins
        (`--policy A --policy B`, `--dsa-model --no-dsa-model`, `--format json --format text`);
        repeatable options (`--where`) say for themselves what a repeat means."""
        seen: dict = {}
        args = list(args)
        for i, word in enumerate(args):
            if word == "--":
                break
            flag, eq, attached = word.partition("=")
            action = self._option_string_actions.get(flag)
            if action is None or not flag.startswith("-") or type(action).__name__ in _REPEATABLE:
                continue
            if eq:
                value = attached
            elif action.nargs == 0:
                value = flag  # a switch: --dsa-model and --no-dsa-model are two values of one option
            else:
                value = args[i + 1] if i + 1 < len(args) else None
            earlier = seen.setdefault(action.dest, (flag, value))
            if earlier[1] != value:
                given = f"{earlier[0]} {clip(str(earlier[1]))}" if action.nargs != 0 else earlier[0]
                again = f"{flag} {clip(str(value))}" if action.nargs != 0 else flag
                raise UsageError(f"{self.prog}: {one_line(given)} and {one_line(again)}: the same option twice "
                                 "with different values (give it once)")

    def error(self, message):
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):  # the same did-you-mean as after `--`
            message = prefix + "; ".join(self._unrecognized(message[len(prefix):].split()))
        raise UsageError(f"{self.prog}: {clip(message, 400)}")

    def _unrecognized(self, words):
        from engine.sglang.given import typographic_dash

        options = [o for o in self._option_string_actions if o.startswith("--")]
        for word in words:
            flag = word.partition("=")[0]
            hint = typographic_dash(word) or (did_you_mean(flag, options, list_if_none=False)
                                              if flag.startswith("--") else "")
            yield f"{clip(word)} ({hint})" if hint else clip(word)


def int_arg(text: str) -> int:
    """argparse type of an integer option: 64-bit, refused unread when longer (int() of a
    5000-digit text raises past Python's digit limit)."""
    value = parse_int(text)
    if value is None or not INT_MIN <= value <= INT_MAX:
        raise argparse.ArgumentTypeError(f"invalid int value: {shown(text)} (a 64-bit integer)")
    return value


def count_arg(text: str) -> int:
    """argparse type of a count that must be at least 1 (patterns shown, records read)."""
    value = int_arg(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid count: {shown(text)} (at least 1)")
    return value


def percent_arg(text: str) -> float:
    """argparse type of a percentage: a number from 0 to 100 (NaN would switch a gate off)."""
    try:
        value = float(text) if len(text) <= 64 else float("nan")
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 100:  # false for NaN
        raise argparse.ArgumentTypeError(f"invalid percentage: {shown(text)} (a number from 0 to 100)")
    return value


# -- policy-driven options ----------------------------------------------------------------------
def policy_from_argv(argv):
    """The policy the command line names (--policy, --policy-dir), read before the command's own
    parser is built: the policy's inputs are options of that parser."""
    pre = Parser(add_help=False)
    pre.add_argument("--policy")
    pre.add_argument("--policy-dir")
    ns, _ = pre.parse_known_args(argv)
    from engine.policy.loader import load_policy

    return load_policy(policy_ref(ns.policy), ns.policy_dir)


def add_policy_options(parser, with_ref=True):
    if with_ref:
        parser.add_argument("--policy", metavar="REF",
                            help="FAMILY, FAMILY@N or a file (default: $HISPARSE_POLICY or "
                                 f"{DEFAULT_POLICY}, newest version)")
        parser.add_argument("--policy-dir", metavar="DIR",
                            help="folder of policy families (default: $HISPARSE_POLICY_DIR or the shipped policies)")


def add_input_flags(parser, policy, defaults: dict | None = None):
    """One option per policy input flag, spelled as the policy declares (SGLang's flag names),
    and SGLang's options the inputs derive from (--model-path, --hisparse-config). Every spelling
    keeps its own destination, so two spellings of one input with different values are an error
    (C501), not a silent last-one-wins. `defaults` overrides the default the help shows, for a
    command that sets an input itself. A flag that collides with one of the command's own options
    is a policy error (E309), never an argparse crash."""
    defaults = defaults or {}
    group = parser.add_argument_group(f"config inputs of {policy.ref}")
    try:
        _add_input_flags(parser, group, policy, defaults)
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


def _add_input_flags(parser, group, policy, defaults: dict) -> None:
    for name, spec in policy.inputs.items():
        help_text = spec.description or ""
        shown_default = defaults.get(name, spec.default)
        kind = int_arg if spec.type == "int" else str
        metavar = "N" if spec.type == "int" else ("BACKEND" if spec.phase else "VALUE")
        for i, flag in enumerate(spec.flags):
            other = f"another spelling of {spec.flag}" if i else ""
            if spec.type == "bool":
                group.add_argument(flag, dest=f"{name}__flag{i}", action=argparse.BooleanOptionalAction,
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
    from engine.sglang.given import MODEL_KEYS, OPTIONS

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
    from engine.sglang.given import SOURCE_KEYS

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


def split_launch(argv):
    """(hisparse's own arguments, the SGLang launch command after `--` or None)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


def layers_from_args(policy, ns, config_file=None, launch=None, base=None) -> list:
    """The sources of a config, lowest first: the command's own base (attend), the launch command
    after `--` (its --config file, then its flags), --config FILE (lenient: unrelated SGLang keys
    are ignored, with a note), then hisparse's flags. Each is read by engine/sglang/given.py, the one
    path for every source, and validated as it is read, so errors name the file, line or flag."""
    from engine.sglang.given import read_layer

    layers = []
    if base:
        layers.append(read_layer(policy, base, "the command's defaults"))
    if launch is not None:
        from engine.sglang.launch import launch_layers

        more, notes = launch_layers(policy, launch)
        for note in notes:
            print(f"note: {one_line(note)}", file=sys.stderr)
        layers += more
    if config_file is not None:
        from engine.sglang.config_files import config_layer

        layers.append(config_layer(policy, config_file))
    layers.append(read_layer(policy, flag_values(policy, ns), "the command line"))
    return layers


def combined(policy, layers, said=()):
    """The layers combined (engine.sglang.given.Given); notes not already said go to stderr."""
    from engine.sglang.given import combine

    g = combine(policy, layers)
    for note in g.notes:
        if note not in said:
            print(f"note: {one_line(note)}", file=sys.stderr)
    return g


# -- output --------------------------------------------------------------------------------------
def print_problems(problems, stream=None) -> None:
    stream = stream or sys.stderr
    for p in problems:
        print(str(p), file=stream)


def emit_json(obj) -> None:
    sys.stdout.write(escape_json(json.dumps(obj, ensure_ascii=False)) + "\n")
