"""The parts every `hisparse` command is built from: its parser (usage errors exit 2, never guess
a flag), the policy options, one option per input of the policy, and the config sources a command
line names (flags, --config, a launch command after `--`), read as every other source is."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

from engine.errors import EngineError
from engine.files.shipped import DEFAULT_POLICY, policy_ref
from engine.sglang.argv import flag_values, int_arg
from engine.suggest import did_you_mean
from engine.values import clip, escape_json, one_line, shown

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
        from engine.sglang.layers import typographic_dash

        options = [o for o in self._option_string_actions if o.startswith("--")]
        for word in words:
            flag = word.partition("=")[0]
            hint = typographic_dash(word) or (did_you_mean(flag, options, list_if_none=False)
                                              if flag.startswith("--") else "")
            yield f"{clip(word)} ({hint})" if hint else clip(word)


def bounded_int(low: int, high: int, why: str = ""):
    """argparse type of an integer option from `low` to `high` (every numeric option has both
    bounds: a count that could start a million workers or threads, or run for days, is refused
    with its range before anything runs). `why`: what the range is, said with it."""
    def parse(text: str) -> int:
        value = int_arg(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"invalid value: {shown(text)} (from {low:,} to {high:,}"
                                             + (f": {why})" if why else ")"))
        return value

    parse.__name__ = "integer"
    return parse


def usable_cpus() -> int:
    """The CPUs this process may run on: the bound of worker and thread counts."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


CPUS_WHY = "the CPUs this process may use"
MAX_PATTERNS = 10_000  # patterns shown per group; json lists all of them anyway


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
def policy_from_argv(argv, launch=None):
    """The policy the command line names (--policy, --policy-dir) for the model it names, read
    before the command's own parser is built: the policy's inputs are options of that parser. A
    reference that covers every family (none, sglang==X, installed, a folder) gives the version of
    the family that routes the model's class (engine/sglang/policy_sets.py). Returns (policy, the
    model read to choose it: (path, Model), or None), the model handed on to be read no more."""
    pre = Parser(add_help=False)
    pre.add_argument("--policy")
    pre.add_argument("--policy-dir")
    pre.add_argument("--config")
    for key in ("--model-path", "--model"):
        pre.add_argument(key, dest=key[2:].replace("-", "_"))
    ns, _ = pre.parse_known_args(argv)
    from engine.sglang.policy_sets import load_policy_set

    return load_policy_set(ns.policy, ns.policy_dir).choose(model_path_of(ns, launch))


def model_path_of(ns, launch) -> str | None:
    """The model path a command names, where the config's layers would take it from (the last
    source that gives one wins: a launch command and its --config file, --config, the flags).
    A source that cannot be read gives none here (reading it for the config reports why)."""
    found = None
    if launch is not None:
        found = _launch_model(launch) or found
    if ns.config is not None:
        found = _file_model(ns.config) or found
    return ns.model_path or ns.model or found


def _file_model(path: str) -> str | None:
    from engine.errors import HisparseError
    from engine.sglang.config_files import read_config_file
    from engine.sglang.layers import MODEL_KEYS

    try:
        data = read_config_file(path).data
    except (HisparseError, OSError):
        return None
    for key in MODEL_KEYS:
        for spelled in (key, key.replace("-", "_")):
            if isinstance(data.get(spelled), str):
                return data[spelled]
    return None


def _launch_model(launch) -> str | None:
    from engine.errors import HisparseError
    from engine.sglang.launch import launch_args

    try:
        words = launch_args(list(launch))
    except HisparseError:
        return None
    model = config = None
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if not eq:
            value = words[i + 1] if i + 1 < len(words) else None
        if flag in ("--model-path", "--model"):
            model = value
        elif flag == "--config":
            config = value
    return model or (_file_model(config) if config else None)


def add_policy_options(parser, with_ref=True):
    if with_ref:
        parser.add_argument("--policy", metavar="REF",
                            help="FAMILY, FAMILY@N or a file (default: $HISPARSE_POLICY or "
                                 f"{DEFAULT_POLICY}, newest version)")
        parser.add_argument("--policy-dir", metavar="DIR",
                            help="folder of policy families (default: $HISPARSE_POLICY_DIR or the shipped policies)")


def split_launch(argv):
    """(hisparse's own arguments, the SGLang launch command after `--` or None)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


def layers_from_args(policy, ns, config_file=None, launch=None, base=None) -> list:
    """The sources of a config, lowest first: the command's own base (attend), the launch command
    after `--` (its --config file, then its flags), --config FILE (lenient: unrelated SGLang keys
    are ignored, with a note), then hisparse's flags. Each is read by engine/sglang/layers.py, the one
    path for every source, and validated as it is read, so errors name the file, line or flag."""
    from engine.sglang.layers import read_layer

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


def combined(policy, layers, said=(), model=None):
    """The layers combined (engine.sglang.given.Given); notes not already said go to stderr.
    model: the model policy_from_argv read, (path, Model)."""
    from engine.sglang.given import combine

    g = combine(policy, layers, model)
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
