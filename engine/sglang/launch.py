"""SGLang launch commands parsed as SGLang's parser parses them.

`config_from_launch(policy, tokens)` parses `python -m sglang.launch_server ...` with argparse, as
SGLang does, on a parser built from the policy's inputs (engine/sglang/argv.py, hisparse's own
flags too; switches store_true), the SGLang options they derive from (--model-path,
--hisparse-config) and `--config FILE` (SGLang's YAML config file; the command line wins). SGLang's
flags the policy does not read (`--tp 8`, `--cuda-graph-bs 1 2 4`) are skipped with the words after
them. What SGLang's parser refuses is refused: argparse's own errors, a word no option takes, a flag
typed with typographic dashes, underscores or one dash. A flag that looks like a misspelt or
abbreviated routing flag is refused with did-you-mean, never guessed (SGLang resolves abbreviations
among its own flags, which differ by release). The values are read by engine/sglang/layers.py, the
one path every source goes through; the model path decides dsa_model (engine/sglang/models.py).
"""
from __future__ import annotations

import argparse
import os
import shlex

from engine.errors import ConfigError, Problem
from engine.sglang.argv import add_input_flags, flag_values
from engine.sglang.given import combine
from engine.sglang.layers import DASHES, read_layer, typographic_dash
from engine.suggest import near_miss
from engine.values import clip, shown

_LAUNCHERS = ("sglang.launch_server", "launch_server.py", "sglang.srt.server")
# argparse's time grows with the square of the options given (it looks for the next option from
# each one); a real launch command has some hundreds of words
MOST_WORDS = 10_000


def command_words(tokens: list[str]) -> list[str]:
    """The words of a launch command: a command given as one string (quoted whole) is split as a
    shell would split it, both where it is judged and where it is run."""
    if len(tokens) == 1 and " " in tokens[0].strip():
        try:
            return shlex.split(tokens[0])
        except ValueError as exc:  # an unbalanced quote
            raise ConfigError([Problem("C501", f"cannot split the launch command {shown(tokens[0])}: {exc}",
                                       hint="quote it as a shell would, or pass the arguments "
                                            "after -- as separate words")]) from None
    return tokens


def launch_args(tokens: list[str]) -> list[str]:
    """The server arguments of a launch command (everything after the launcher)."""
    tokens = command_words(tokens)
    for i, tok in enumerate(tokens):
        if tok == "serve" and i and os.path.basename(tokens[i - 1]) == "sglang":
            args = tokens[i + 1:]  # `sglang serve MODEL ...` reads MODEL as --model-path (as SGLang 0.5.16 on)
            return ["--model-path"] + args if args and not args[0].startswith("-") else args
        if tok.endswith(_LAUNCHERS):
            return tokens[i + 1:]
    if tokens and (tokens[0].startswith("--") or _dash_flag(tokens[0])):
        return tokens  # the arguments alone
    head = " ".join(tokens[:4]) + (" ..." if len(tokens) > 4 else "")
    raise ConfigError([Problem("C501", f"not an SGLang launch command: {shown(head)}",
                               hint="expected python -m sglang.launch_server ARGS, or the ARGS alone")])


def _dash_flag(tok: str) -> str:
    """A hint when `tok` is a flag written with typographic dashes (—kv-cache-dtype, –-tp,
    −−enable-hisparse, --kv—cache-dtype): SGLang's parser refuses it as an unrecognized
    argument, so it must never be skipped as a stray value."""
    body = tok.lstrip("-" + "".join(DASHES))
    if not body or not body[0].isalpha() or tok == body:
        return ""
    return typographic_dash(tok.split("=", 1)[0])


class _Reader(argparse.ArgumentParser):
    """The policy's flags as SGLang's parser has them; an error is raised, never an exit."""

    def __init__(self, policy):
        super().__init__(prog="sglang serve", add_help=False, allow_abbrev=False, exit_on_error=False)
        self.add_argument("--config", dest="sglang__config")
        add_input_flags(self, policy, switch="store_true")
        self.known = sorted(o for o in self._option_string_actions if o.startswith("--"))

    def error(self, message):
        raise argparse.ArgumentError(None, message)

    def is_option(self, word) -> bool:
        """Whether argparse reads `word` as an option (one this parser lacks included)."""
        return self._parse_optional(word) is not None


class _Word(str):
    """A word of the command, an object of its own: argparse hands back the words no option took
    as they are, so that each is known by its place, not its text."""


def launch_layers(policy, tokens: list[str]):
    """(layers, notes) of a launch command: its --config file (if any), then its command line.
    Raises ConfigError listing every problem."""
    words = [_Word(word) for word in launch_args(tokens)]
    if len(words) > MOST_WORDS:
        raise ConfigError([Problem("C501", f"a launch command of {len(words):,} words: at most {MOST_WORDS:,} are read")])
    reader = _Reader(policy)
    problems: list[Problem] = []
    try:
        ns, unread = reader.parse_known_args(words)
    except argparse.ArgumentError as exc:  # the first, where SGLang's parser stops too
        problems.append(Problem("C503", f"{clip(str(exc), 400)}: SGLang's parser refuses it"))
        ns, unread = None, []
    unread = {id(word) for word in unread}
    release = _ReleaseFlags(policy)
    option, owned = "", False  # the last option, and whether the words after it are its own
    for i, word in enumerate(words):
        flag = word.split("=", 1)[0]
        if id(word) not in unread:  # read by an option of the policy's, or its value
            if reader.is_option(word):
                option, owned = flag, False
                problems += release.refuses(flag, exact=True)
        elif word == "--":  # argparse reads every word after it as a positional: SGLang's parser has none
            problems.append(Problem("C501", f"unrecognized arguments {shown(' '.join(words[i:]))}: SGLang's "
                                    "parser refuses them"))
            break
        elif _dash_flag(word) or reader.is_option(word):  # a flag the policy does not read
            option, owned = flag, "=" not in word  # the words after it are its values, unless it has one
            hint = _near_routing_flag(flag, reader.known, policy)
            if hint and flag.startswith("--"):
                problems.append(Problem("C501", f"unknown flag {shown(flag)}", hint=hint))
            elif hint or not flag.startswith("--"):  # SGLang's only one-dash option is -h
                problems.append(Problem("C501", f"unrecognized argument {shown(word)}: SGLang's parser refuses "
                                        "it", hint=hint))
            else:
                problems += release.refuses(flag, exact=False)
        elif not owned:  # a word no option takes
            why = f" after {clip(option)}" if option else ""
            problems.append(Problem("C501", f"unrecognized argument {shown(word)}{why}: SGLang's parser refuses it"))
    from engine.sglang.config_files import config_layer

    layers = []
    if ns is not None and ns.sglang__config is not None:
        try:
            layers.append(config_layer(policy, ns.sglang__config))
        except ConfigError as exc:
            problems += exc.problems
    try:
        layers.append(read_layer(policy, flag_values(policy, ns) if ns else {}, "the launch command"))
    except ConfigError as exc:
        problems += exc.problems
    if problems:
        raise ConfigError(problems)
    notes = []
    if not any(layer.model for layer in layers) and "dsa_model" in policy.inputs:
        notes.append("no --model-path: whether the model uses DSA is left to the policy default "
                     f"({str(policy.inputs['dsa_model'].default).lower()})")
    return layers, notes


class _ReleaseFlags:
    """The server flags of the releases the policy models (engine/sglang/registry.py), where it
    names SGLang releases the registry lists; else none are known and no flag is refused here."""

    def __init__(self, policy):
        from engine.sglang.registry import release_flags

        upstream = policy.upstream  # None: a policy that models no upstream
        releases = list(upstream.releases) if upstream is not None and upstream.project == "sglang" else []
        tables = [release_flags(r) for r in releases]
        self.flags = frozenset().union(*tables) if tables and None not in tables else None
        self.label = f"SGLang {', '.join(releases)}"

    def refuses(self, flag: str, exact: bool) -> list[Problem]:
        """A problem when the releases' parser refuses `flag`: a flag it lacks (`exact`: the flag
        was read as typed; else an abbreviation of exactly one flag is what argparse accepts)."""
        if self.flags is None or not flag.startswith("--") or flag in self.flags:
            return []
        if not exact:
            matches = sorted(f for f in self.flags if f.startswith(flag))
            if len(matches) == 1:
                return []
            if matches:  # argparse's own words
                plain = flag if flag.isascii() and flag.isprintable() else shown(flag)
                return [Problem("C501", f"ambiguous option: {clip(plain)} could match "
                                f"{clip(', '.join(matches), 400)}: {self.label}'s parser refuses it")]
        from engine.sglang.registry import flag_releases

        having = flag_releases(flag)
        if having:
            hint = f"{flag} is a flag of SGLang {having[0]}" + (f" to {having[-1]}" if len(having) > 1 else "")
        elif exact:
            hint = f"{flag} is hisparse's own flag, not SGLang's: give it before --"
        else:
            hit = near_miss(flag, sorted(self.flags))
            hint = f"did you mean {hit}?" if hit else ""
        return [Problem("C501", f"unrecognized argument {shown(flag)}: {self.label}'s parser refuses it",
                        hint=hint)]


def config_from_launch(policy, tokens: list[str]) -> tuple[dict, list[str]]:
    """(config, notes) from a launch command. Raises ConfigError listing every problem."""
    layers, notes = launch_layers(policy, tokens)
    g = combine(policy, layers)
    return g.config, notes + g.notes


def _near_routing_flag(flag: str, known: list, policy) -> str:
    """A did-you-mean when `flag` is a misspelling, an abbreviation or the one-dash, underscore or
    typographic-dash spelling of a flag the reader knows (SGLang's parser knows only the dashed one)."""
    body = flag.lstrip("-" + "".join(DASHES))
    dashed = "--" + "".join("-" if c in DASHES or c == "_" else c for c in body)
    hint = typographic_dash(flag)
    if dashed != flag and (dashed in known or policy.canonical_key(body) is not None):
        return (hint or "SGLang's flags are spelled --with-dashes") + f"; did you mean {dashed}?"
    if hint:
        return hint
    prefixed = [f for f in known if f.startswith(flag) and f != flag]
    if prefixed and len(flag) > 4:
        return ("an abbreviation is not accepted here (SGLang's parser may resolve it differently): "
                "did you mean " + " or ".join(prefixed) + "?")
    hit = near_miss(dashed, known)
    return f"did you mean {hit}?" if hit else ""
