"""SGLang launch commands read as SGLang's parser reads them.

`config_from_launch(policy, tokens)` parses `python -m sglang.launch_server ...` the way SGLang's
argument parser would for the routing flags: `--flag value` and `--flag=value`, store-true
booleans, `--config FILE` (SGLang's YAML config file; command-line flags win), the policy's flag
aliases (e.g. deprecated `--nsa-*` spellings). Unrelated flags (`--tp 8`, `--trust-remote-code`)
are skipped. A flag that looks like a misspelt or abbreviated routing flag is an error with
did-you-mean, never a guess; what SGLang's parser refuses (a flag typed with typographic dashes,
`--kv_cache_dtype`, a bare word after a routing flag's value) is refused too. Whether the model
uses DeepSeek Sparse Attention is read from the model path (engine/sglang/models.py); `--dsa-model` /
`--no-dsa-model` given to hisparse override. The values are read by engine/sglang/given.py, the one path
every source goes through.
"""
from __future__ import annotations

import os
import shlex

from engine.errors import ConfigError, Problem
from engine.sglang.given import DASHES, SOURCE_KEYS, combine, read_layer, typographic_dash
from engine.suggest import near_miss
from engine.values import parse_int, shown

_LAUNCHERS = ("sglang.launch_server", "launch_server.py", "sglang.srt.server")
# SGLang options the launch reader reads besides the policy's flags (their values are read by
# engine/sglang/given.py as from any other source)
_OPTION_FLAGS = tuple("--" + k for k in SOURCE_KEYS)


def launch_args(tokens: list[str]) -> list[str]:
    """The server arguments of a launch command (everything after the launcher)."""
    if len(tokens) == 1 and " " in tokens[0].strip():
        try:
            tokens = shlex.split(tokens[0])
        except ValueError as exc:  # an unbalanced quote
            raise ConfigError([Problem("C501", f"cannot split the launch command {shown(tokens[0])}: {exc}",
                                       hint="quote it as a shell would, or pass the arguments "
                                            "after -- as separate words")]) from None
    for i, tok in enumerate(tokens):
        if tok.endswith(_LAUNCHERS) or (tok == "serve" and i and os.path.basename(tokens[i - 1]) == "sglang"):
            return tokens[i + 1:]
    if tokens and (tokens[0].startswith("--") or _dash_flag(tokens[0])):
        return tokens  # the arguments alone
    head = " ".join(tokens[:4]) + (" ..." if len(tokens) > 4 else "")
    raise ConfigError([Problem("C501", f"not an SGLang launch command: {shown(head)}",
                               hint="expected python -m sglang.launch_server ARGS, or the ARGS alone")])


def _flag_table(policy) -> dict:
    """--flag -> input name, for every spelling the policy declares (SGLang spells flags with
    dashes only: `--kv_cache_dtype` is not a flag of its parser)."""
    return {flag: name for name, spec in policy.inputs.items()
            for flag in tuple(spec.flags) + tuple(spec.deprecated)}


def _dash_flag(tok: str) -> str:
    """A hint when `tok` is a flag written with typographic dashes (—kv-cache-dtype, –-tp,
    −−enable-hisparse, --kv—cache-dtype): SGLang's parser refuses it as an unrecognized
    argument, so it must never be skipped as a stray value."""
    body = tok.lstrip("-" + "".join(DASHES))
    if not body or not body[0].isalpha() or tok == body:
        return ""
    return typographic_dash(tok.split("=", 1)[0])


def _flagish(tok: str) -> bool:
    """Whether argparse would take `tok` for an option, not a value: --x, -x, or a flag typed
    with typographic dashes."""
    return tok.startswith("--") or (tok.startswith("-") and tok[1:2].isalpha()) or bool(_dash_flag(tok))


def launch_layers(policy, tokens: list[str]):
    """(layers, notes) of a launch command: its --config file (if any), then its command line.
    Raises ConfigError listing every problem."""
    args = launch_args(tokens)
    flags = _flag_table(policy)
    known = sorted(set(flags) | set(_OPTION_FLAGS))
    problems: list[Problem] = []
    notes: list[str] = []
    given: dict = {}
    config_file = None
    after = None  # the routing flag whose arguments just ended: a bare token after it is refused
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        previous, after = after, None
        hint = _dash_flag(tok)
        if hint:
            fixed = "--" + tok.split("=", 1)[0].lstrip("-" + "".join(DASHES))
            fixed = "".join("-" if c in DASHES else c for c in fixed)
            more = f"; did you mean {fixed}?" if fixed in known else ""
            problems.append(Problem("C501", f"unrecognized argument {shown(tok)}: SGLang's parser refuses it",
                                    hint=hint + more))
            if "=" not in tok and i < len(args) and not _flagish(args[i]):
                i += 1  # its value, so that it is not reported again as a stray argument
            continue
        if not tok.startswith("--") or tok == "--":
            if _flagish(tok) or previous:
                near = near_miss("-" + tok, known) if _flagish(tok) else None
                why = f" after {previous}" if previous and not _flagish(tok) else ""
                problems.append(Problem("C501", f"unrecognized argument {shown(tok)}{why}: SGLang's parser refuses it",
                                        hint=f"did you mean {near}?" if near else ""))
            else:
                notes.append(f"ignored the stray argument {shown(tok)}")
            continue
        flag, eq, inline = tok.partition("=")

        def value():
            nonlocal i
            if eq:
                return inline
            if i < len(args) and not _flagish(args[i]):
                i += 1
                return args[i - 1]
            problems.append(Problem("C503", f"{flag} expects a value"))
            return None

        if flag == "--config":
            config_file = value()
            continue
        if flag in _OPTION_FLAGS:
            raw = value()
            if raw is not None:
                given[flag[2:]] = raw
            after = flag
            continue
        name = flags.get(flag)
        if name is None and flag[2:].replace("-", "_") in getattr(policy, "removed_keys", {}):
            raw = value()  # a spelling upstream removed: the policy's check names its replacement
            if raw is not None:
                given[flag[2:]] = raw
            continue
        if name is None:
            near = _near_routing_flag(flag, known, policy)
            if near:
                problems.append(Problem("C501", f"unknown flag {flag}", hint=near))
                if not eq and i < len(args) and not _flagish(args[i]):
                    i += 1
                continue
            # an unrelated SGLang flag: take a following non-flag token as its value
            if not eq and i < len(args) and not _flagish(args[i]):
                i += 1
            continue
        spec = policy.inputs[name]
        after = flag
        if spec.type == "bool":
            if eq:
                problems.append(Problem("C503", f"{flag} is a switch and takes no value (got {shown(inline)})"))
                continue
            given[flag[2:]] = True
            continue
        raw = value()
        if raw is None:
            continue
        if spec.type == "int":
            number = parse_int(raw)  # None past 20 digits: int() of 5000 digits raises
            if number is None:
                problems.append(Problem("C503", f"{flag}: expected a 64-bit integer, got {shown(raw)}"))
                continue
            raw = number
        given[flag[2:]] = raw  # the spelling typed: a deprecated one is logged when evaluated
    from engine.sglang.config_files import config_layer

    layers = []
    if config_file is not None:
        try:
            layers.append(config_layer(policy, config_file))
        except ConfigError as exc:
            problems += exc.problems
    try:
        layers.append(read_layer(policy, given, "the launch command"))
    except ConfigError as exc:
        problems += exc.problems
    if problems:
        raise ConfigError(problems)
    if not any(layer.model for layer in layers) and "dsa_model" in policy.inputs:
        notes.append("no --model-path: whether the model uses DSA is left to the policy default "
                     f"({str(policy.inputs['dsa_model'].default).lower()})")
    return layers, notes


def config_from_launch(policy, tokens: list[str]) -> tuple[dict, list[str]]:
    """(config, notes) from a launch command. Raises ConfigError listing every problem."""
    layers, notes = launch_layers(policy, tokens)
    g = combine(policy, layers)
    return g.config, notes + g.notes


def _near_routing_flag(flag: str, known: list, policy) -> str:
    """A did-you-mean when `flag` is a misspelling or an abbreviation of a routing flag, or the
    underscore spelling of one (SGLang's parser knows only the dashed one)."""
    dashed = "--" + flag[2:].replace("_", "-")
    if dashed != flag and (dashed in known or policy.canonical_key(flag[2:]) is not None):
        return f"SGLang's flags are spelled with dashes: did you mean {dashed}?"
    hint = typographic_dash(flag)
    if hint:
        return hint
    prefixed = [f for f in known if f.startswith(flag) and f != flag]
    if prefixed and len(flag) > 4:
        return ("an abbreviation is not accepted here (SGLang's parser may resolve it differently): "
                "did you mean " + " or ".join(prefixed) + "?")
    hit = near_miss(flag, known)
    return f"did you mean {hit}?" if hit else ""
