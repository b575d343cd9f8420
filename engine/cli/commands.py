"""`hisparse`: one command for routing policies and the kernel bridge.

Exit codes: 0 ok; 1 the config violates the policy (or a diff/test found differences or failures);
2 invalid policy, bad input or usage. Errors print as `FILE:LINE:COL: CODE: message`, never as a
traceback. The bridge verbs (attend, doctor) import torch only when they run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from engine.errors import ConfigError, EngineError, HisparseError, Problem
from engine.language.inputs import INT_MAX, INT_MIN
from engine.cli.output import OutputError, Progress, SafeStream, silence
from engine.policy.shipped import DEFAULT_POLICY, policy_ref
from engine.suggest import did_you_mean
from engine.values import clip, escape_json, kind, parse_int, shown

OK, VIOLATION, ERROR = 0, 1, 2


class UsageError(EngineError):
    """Bad command-line usage (exit 2)."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kw):
        kw.setdefault("allow_abbrev", False)  # a routing flag is never guessed from a prefix
        super().__init__(*args, **kw)

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


# -- policy-driven options ----------------------------------------------------------------------
def _pre_policy(argv):
    pre = _Parser(add_help=False)
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
                group.add_argument(flag, dest=f"{name}__deprecated{i}", action="store_const", const=True,
                                   default=None, help=f"deprecated spelling of {spec.flag}")
            else:
                group.add_argument(flag, dest=f"{name}__deprecated{i}", type=kind,
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
    from engine.sglang.given import MODEL_KEYS, OPTIONS

    given = {}
    for name, spec in policy.inputs.items():
        for i, flag in enumerate(spec.flags):
            value = getattr(ns, f"{name}__flag{i}", None)
            if value is not None:
                given[flag[2:]] = value
        for i, flag in enumerate(spec.deprecated):
            value = getattr(ns, f"{name}__deprecated{i}", None)
            if value is not None:
                given[flag[2:]] = value
        for i, flag in enumerate(spec.removed):
            value = getattr(ns, f"{name}__removed{i}", None)
            if value is not None:
                given[flag[2:]] = value
    for key in MODEL_KEYS + tuple(k for p, (aliases, _) in OPTIONS.items() for k in (p,) + aliases):
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
        from engine.sglang.adapter import launch_layers

        more, notes = launch_layers(policy, launch)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
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
            print(f"note: {note}", file=sys.stderr)
    return g


# -- output --------------------------------------------------------------------------------------
def print_problems(problems, stream=None) -> None:
    stream = stream or sys.stderr
    for p in problems:
        print(str(p), file=stream)


def _emit_json(obj) -> None:
    sys.stdout.write(escape_json(json.dumps(obj, ensure_ascii=False)) + "\n")


# -- commands ------------------------------------------------------------------------------------
def cmd_evaluate(argv) -> int:
    argv, launch = split_launch(argv)
    policy = _pre_policy(argv)
    parser = _Parser(prog="hisparse evaluate",
                     usage="hisparse evaluate [options] [-- python -m sglang.launch_server ARGS...]",
                     description="Decide the attention backends for a server config and check it. The config "
                                 "comes from flags, --config FILE, --batch, or an SGLang launch command after --.")
    add_policy_options(parser)
    parser.add_argument("--config", metavar="FILE", help="SGLang-style YAML or JSON config file")
    parser.add_argument("--batch", metavar="FILE", help="JSON Lines of configs ('-' = stdin); one JSON "
                        "decision per line, in order; flags and --config form each line's base")
    parser.add_argument("--format", choices=("text", "json"),
                        help="output format (default: text; json with --batch)")
    parser.add_argument("--record", metavar="FILE",
                        help="append one JSON line per decision (time, policy identity, input, decision)")
    add_input_flags(parser, policy)
    ns = parser.parse_args(argv)
    layers = layers_from_args(policy, ns, ns.config, launch)
    g = combined(policy, layers)
    if ns.record:
        from engine.files.streams import check_record_target

        check_record_target(ns.record)
    if ns.batch:
        return _batch(policy, layers, g.notes, ns.batch, ns.format or "json", ns.record)
    decision = policy.evaluate(g.config)
    if ns.record:
        from engine.serving.records import append_records

        append_records(ns.record, [decision], [g.given])
    if ns.format == "json":
        _emit_json(decision.to_dict())
    else:
        from engine.cli.render import decision_text

        print(decision_text(decision))
    return OK if decision.ok else VIOLATION


def _batch(policy, base: list, said: list, source: str, fmt: str, record: str | None = None) -> int:
    """Evaluate each line of a JSON Lines source. Lines are read as bytes and decoded one by one,
    at most HISPARSE_MAX_FILE_BYTES each, so a bad line (not UTF-8, too long, not JSON) gets its
    own error object and every other line is still evaluated, in order. The source is a regular
    file or a pipe (stdin, a FIFO, `<(...)`): a device such as /dev/zero never ends and is refused,
    and a line running on for MAX_LINE_FACTOR times the limit without a newline stops the batch."""
    from engine.files.streams import RUNAWAY, MAX_LINE_FACTOR, lines_of, open_stream
    from engine.files.reading import max_file_bytes

    stream = open_stream("batch input" if source == "-" else "batch file", source)

    worst = OK
    lines = lines_of(stream, max_file_bytes())
    number = 0
    try:
        while True:
            try:  # only reading is guarded here: a failed write is the output's error, not the input's
                line = next(lines, None)
            except OSError as exc:
                raise ConfigError([Problem("C504", f"cannot read batch input: {exc.strerror or exc}",
                                           source)]) from None
            if line is None:
                break
            number += 1
            if line is RUNAWAY:
                raise ConfigError([Problem("C505", f"line {number}: more than {MAX_LINE_FACTOR * max_file_bytes()} "
                                           "bytes without a newline; stopped reading", source,
                                           hint="one JSON object per line")])
            result, status, decision, given = _batch_line(policy, base, said, line, number)
            if record and decision is not None:
                from engine.serving.records import append_records

                append_records(record, [decision], [given])
            worst = max(worst, status)
            if fmt == "json":
                _emit_json(result)
            else:
                print(_batch_text(policy, result, number))
            if source == "-":  # a pipe: answer each line as it comes
                sys.stdout.flush()
    finally:
        if source != "-":
            stream.close()
    return worst


def _batch_line(policy, base, said, line, number: int):
    def bad(problems):
        first = problems[0]
        err = {"code": first.code, "message": first.message}
        if first.hint:
            err["hint"] = first.hint
        if len(problems) > 1:
            err["more"] = [p.to_dict() for p in problems[1:]]
        return {"ok": False, "line": number, "error": err}, ERROR, None, None

    from engine.files.streams import TOO_LONG

    if line is TOO_LONG:
        from engine.files.reading import max_file_bytes

        return bad([Problem("C505", f"line longer than {max_file_bytes()} bytes (HISPARSE_MAX_FILE_BYTES)")])
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            return bad([Problem("C505", f"not UTF-8 text (byte 0x{line[exc.start]:02x} at column "
                                        f"{exc.start + 1})")])
    if not line.strip():
        return bad([Problem("C505", "empty line (one JSON object per line)")])
    from engine.files.yaml_reader import ReadError, parse_json

    try:  # the reader's limits: depth, size, NaN, 64-bit integers, duplicate keys
        obj = parse_json(line.rstrip("\r\n"), f"line {number}").data
    except ReadError as exc:
        p = exc.problems[0]
        message = p.message
        if message.startswith("JSON syntax: "):
            message = "not JSON: " + message[len("JSON syntax: "):]
        return bad([Problem("C505", message + (f" at column {p.col}" if p.col else ""))])
    if not isinstance(obj, dict):
        return bad([Problem("C505", f"a line holds one JSON object, got {kind(obj)}")])
    try:  # the line is one more source, read as every other source is
        from engine.sglang.given import combine, read_layer

        g = combine(policy, base + [read_layer(policy, obj, f"line {number}")])
        d = policy.evaluate(g.config)
    except ConfigError as exc:
        return bad(exc.problems)
    for note in g.notes:
        if note not in said:
            print(f"note: line {number}: {note}", file=sys.stderr)
    out = d.to_dict()
    out["line"] = number
    return out, (OK if d.ok else VIOLATION), d, g.given


def _batch_text(policy, result: dict, number: int) -> str:
    if "error" in result:
        return f"line {number}: ERROR {result['error']['code']}: {result['error']['message']}"
    if result["ok"]:
        chosen = " ".join(f"{ph}={result[spec.input]}" for ph, spec in policy.phases.items())
        return f"line {number}: ok {chosen}"
    return f"line {number}: REJECTED {result['violations'][0]['message']}"


def cmd_explain(argv) -> int:
    argv, launch = split_launch(argv)
    policy = _pre_policy(argv)
    parser = _Parser(prog="hisparse explain",
                     usage="hisparse explain [options] [-- python -m sglang.launch_server ARGS...]",
                     description="Show every stage, rule and check the policy tried for a config, and why.")
    add_policy_options(parser)
    parser.add_argument("--config", metavar="FILE", help="SGLang-style YAML or JSON config file")
    add_input_flags(parser, policy)
    ns = parser.parse_args(argv)
    config = combined(policy, layers_from_args(policy, ns, ns.config, launch)).config
    decision, trace = policy.trace(config)
    from engine.cli.render import explanation_text

    print(explanation_text(decision, trace))
    return OK if decision.ok else VIOLATION


def cmd_check(argv) -> int:
    parser = _Parser(prog="hisparse check",
                     description="Check policy files: YAML, schema, names and values, then lint over the "
                                 "whole declared domain. One line per problem: FILE:LINE:COL: CODE: message.")
    parser.add_argument("paths", nargs="*", metavar="PATH", help="policy files or folders (default: the shipped policies)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--no-deep", dest="deep", action="store_false",
                        help="skip the whole-domain lint (L401-L405)")
    ns = parser.parse_args(argv)
    from engine.analysis.check import check_paths

    notes: list = []
    results = check_paths(ns.paths, ns.deep, notes)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    problems = [p for _, probs in results for p in probs]
    if ns.format == "json":
        _emit_json({"ok": not problems, "files": [
            {"file": f, "ok": not probs, "problems": [p.to_dict() for p in probs]} for f, probs in results]})
    else:
        for p in problems:
            print(str(p))
        bad = sum(1 for _, probs in results if probs)
        print(f"checked {len(results)} policy file(s): {len(problems)} problem(s) in {bad} file(s)",
              file=sys.stderr)
    return ERROR if problems or not results else OK


def cmd_diff(argv) -> int:
    parser = _Parser(prog="hisparse diff",
                     description="Evaluate two policies over the whole declared input domain and show every "
                                 "config whose outcome changes, grouped into patterns.")
    parser.add_argument("a", metavar="A", help="the policy now (FAMILY@N or a file)")
    parser.add_argument("b", metavar="B", help="the policy to compare with")
    add_policy_options(parser, with_ref=False)
    parser.add_argument("--policy-dir", metavar="DIR", help="folder of policy families")
    parser.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    parser.add_argument("--where", action="append", metavar="NAME=VALUE",
                        help="compare only configs with this input value (repeatable)")
    parser.add_argument("--max-patterns", type=int_arg, default=4, metavar="N",
                        help="patterns shown per group in text and markdown (default 4; json has all)")
    ns = parser.parse_args(argv)
    from engine.analysis.diff import diff, diff_text
    from engine.policy.loader import load_policy

    result = diff(load_policy(ns.a, ns.policy_dir), load_policy(ns.b, ns.policy_dir), where=ns.where,
                  progress=Progress("diff: configs", 0))
    if ns.format == "json":
        _emit_json(result)
    else:
        print(diff_text(result, markdown=ns.format == "markdown", max_patterns=max(ns.max_patterns, 1)))
    return OK if result["equivalent"] else VIOLATION


def cmd_table(argv) -> int:
    parser = _Parser(prog="hisparse table",
                     description="The routing table a policy implies: default and allowed backends of each "
                                 "phase for every combination of the other inputs.")
    add_policy_options(parser)
    parser.add_argument("--where", action="append", metavar="NAME=VALUE",
                        help="fix an input (repeatable), e.g. --where dsa_model=true")
    parser.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    ns = parser.parse_args(argv)
    from engine.policy.loader import load_policy
    from engine.analysis.table import parse_where, routing_rows, table_text

    policy = load_policy(policy_ref(ns.policy), ns.policy_dir)
    result = routing_rows(policy, parse_where(policy, ns.where), progress=Progress("table: configs", 0))
    if ns.format == "json":
        _emit_json(result)
    else:
        print(table_text(policy, result, markdown=ns.format == "markdown"))
    return OK


def cmd_test(argv) -> int:
    parser = _Parser(prog="hisparse test",
                     description="Run policy test cases (<family>/tests/v<N>.yaml) and report rule coverage.")
    parser.add_argument("paths", nargs="*", metavar="PATH", help="test files or folders (default: the shipped policies)")
    parser.add_argument("--policy-dir", metavar="DIR", help="folder of policy families")
    parser.add_argument("--min-coverage", type=float, metavar="PCT", help="fail when a policy's rule coverage is below PCT")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    ns = parser.parse_args(argv)
    from engine.analysis.policytest import report_json, report_text, run

    results, problems = run(ns.paths, ns.policy_dir)
    if problems:
        print_problems(problems)
        return ERROR
    text, ok = report_text(results, ns.min_coverage)
    if ns.format == "json":
        _emit_json(report_json(results))
    else:
        print(text)
    return OK if ok else VIOLATION


def cmd_replay(argv) -> int:
    parser = _Parser(prog="hisparse replay",
                     description="Re-evaluate the inputs of recorded decisions (--record) against a policy and "
                                 "show what would change.")
    parser.add_argument("file", metavar="FILE", help="a record file written by --record (or a pipe)")
    add_policy_options(parser)
    parser.add_argument("--format", choices=("text", "json"), default="text")
    from engine.serving.records import MAX_RECORDS

    parser.add_argument("--max-records", type=int_arg, default=MAX_RECORDS, metavar="N",
                        help=f"stop with an error after N records (default {MAX_RECORDS:,}); each line is "
                             "at most HISPARSE_MAX_FILE_BYTES")
    ns = parser.parse_args(argv)
    from engine.policy.loader import load_policy
    from engine.serving.records import replay, replay_text

    result = replay(ns.file, load_policy(policy_ref(ns.policy), ns.policy_dir),
                    max_records=max(ns.max_records, 0))
    if ns.format == "json":
        _emit_json(result)
    else:
        print(replay_text(result))
    if result["problems"]:
        return ERROR
    return OK if result["equivalent"] else VIOLATION


# attend's workload knobs are SGLang's --hisparse-config fields, spelled as the policy's inputs
# (v3 declares them); for a policy without them attend adds the same flags itself.
WORKLOAD_INPUTS = {"hisparse_top_k": "--hisparse-top-k", "hisparse_device_buffer_size": "--hisparse-device-buffer-size"}
ATTEND_ON = ("enable_hisparse", "disable_radix_cache")  # what attend turns on unless told otherwise
BRIDGE_HINT = ("the kernel bridge needs torch and numpy: `pip install torch==2.13.0 numpy` (CPU), "
               "or `pip install -e '.[bridge]'` after a CUDA build of torch")


def cmd_attend(argv) -> int:
    policy = _pre_policy(argv)
    parser = _Parser(prog="hisparse attend",
                     description="A synthetic DSA decode workload end to end: the policy picks the decode "
                                 "backend, then every step runs top-k -> hot buffer -> bridge -> kernel. "
                                 "HiSparse is on and the radix cache off unless the flags say otherwise; "
                                 "top-k and hot-buffer size are SGLang's --hisparse-config fields (defaults "
                                 "2048 and 2 x top-k), checked by the policy with the rest of the config.")
    add_policy_options(parser)
    w = parser.add_argument_group("workload")
    w.add_argument("--requests", type=int_arg, default=4, help="requests decoded together (default 4)")
    w.add_argument("--context", type=int_arg, default=4096, help="tokens of KV per request at the start (default 4096)")
    w.add_argument("--heads", type=int_arg, default=128, help="query heads: 64 or 128 (default 128)")
    for name, flag in WORKLOAD_INPUTS.items():
        if name not in policy.inputs:  # the policy does not declare it: attend's own option
            what = ("positions the indexer picks per step (default 2048)" if name == "hisparse_top_k"
                    else "hot-buffer slots per request, a multiple of 64 (default 2 x top-k)")
            w.add_argument(flag, dest=name, type=int_arg, default=None, help=what)
    w.add_argument("--steps", type=int_arg, default=8, help="decode steps (default 8)")
    w.add_argument("--locality", type=float, default=0.7,
                   help="share of the top-k kept from the previous step (default 0.7)")
    w.add_argument("--seed", type=int_arg, default=0, help="random seed, 0 to 2**63-1 (default 0)")
    w.add_argument("--provider", choices=("auto", "reference", "flashmla"), default="auto")
    w.add_argument("--device", default="cpu", help="where the hot buffer and kernels run: cpu, cuda or "
                                                   "cuda:N (default cpu)")
    w.add_argument("--max-memory", metavar="SIZE",
                   help="refuse a workload needing more (bytes, or 512M, 8G ...); default: half of the "
                        "memory this process can still take ($HISPARSE_MEMORY_LIMIT)")
    w.add_argument("--threads", type=int_arg, metavar="N",
                   help="torch CPU threads for the kernels (default: torch's choice, every core; on a "
                        "loaded machine 1 is often faster)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    add_input_flags(parser, policy, defaults={name: True for name in ATTEND_ON})
    ns = parser.parse_args(argv)
    base = {name: True for name in ATTEND_ON if name in policy.inputs}
    config = combined(policy, layers_from_args(policy, ns, base=base)).config
    top_k = _workload_value(policy, config, "hisparse_top_k", getattr(ns, "hisparse_top_k", None))
    top_k = 2048 if top_k is None else top_k
    buffer_size = _workload_value(policy, config, "hisparse_device_buffer_size",
                                  getattr(ns, "hisparse_device_buffer_size", None))
    buffer_size = 2 * top_k if buffer_size is None else buffer_size
    for name, value in (("hisparse_top_k", top_k), ("hisparse_device_buffer_size", buffer_size)):
        if name in policy.inputs:  # the policy checks the workload it runs, not its defaults
            config = {k: v for k, v in config.items() if policy.canonical_key(k) != name}
            config[name] = value
    decision = policy.evaluate(config)
    if not decision.ok:
        print(f"REJECTED by {policy.ref}: {decision.error}")
        return VIOLATION
    try:
        import torch  # the bridge needs it; say so plainly when it is missing
    except ImportError as exc:
        print(f"hisparse attend: {BRIDGE_HINT} ({exc})", file=sys.stderr)
        return ERROR
    if ns.threads is not None:
        if ns.threads < 1:
            raise UsageError(f"hisparse attend: --threads {ns.threads}: at least 1")
        torch.set_num_threads(ns.threads)
    from kernels_bridge.errors import BridgeError
    from kernels_bridge.resources import parse_size
    from kernels_bridge.workload import Workload, report_text, run

    max_bytes = None
    if ns.max_memory is not None:
        max_bytes = parse_size(ns.max_memory)
        if max_bytes is None:
            raise UsageError(f"hisparse attend: --max-memory {shown(ns.max_memory)}: expected a size such as "
                             "1073741824, 512M or 8G")
    work = Workload(ns.requests, ns.context, ns.heads, top_k, buffer_size, ns.steps, ns.locality,
                    ns.seed, ns.provider, ns.device)
    try:
        report = run(decision, work, progress=Progress("step", ns.steps, delay=0.0), max_bytes=max_bytes)
    except BridgeError as exc:
        print(f"hisparse attend: {exc}", file=sys.stderr)
        return ERROR
    except MemoryError:
        print("hisparse attend: out of memory while building the workload; make it smaller or lower "
              "--max-memory", file=sys.stderr)
        return ERROR
    if ns.format == "json":
        _emit_json(report)
    else:
        print(report_text(report))
    return OK


def _workload_value(policy, config: dict, name: str, own):
    """The value a workload knob takes: attend's own flag, else the config's (a policy input
    given as a flag), else the policy's default."""
    if own is not None or name not in policy.inputs:
        return own
    for key, value in config.items():
        if policy.canonical_key(key) == name:
            return value
    return policy.inputs[name].default


def cmd_doctor(argv) -> int:
    parser = _Parser(prog="hisparse doctor",
                     description="What the kernel bridge can run here: torch, CUDA, the device, flash_mla "
                                 "(and why not), and which provider each backend uses.")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    ns = parser.parse_args(argv)
    try:
        from kernels_bridge.doctor import doctor_report, render_doctor  # imports torch: only here
    except ImportError as exc:  # a report all the same: what is missing, and what to install
        report = _doctor_without_torch(exc)
        render_doctor = _render_without_torch
    else:
        report = doctor_report()
    if ns.format == "json":
        _emit_json(report)
    else:
        print(render_doctor(report))
    return OK if report["bridge"]["usable"] else VIOLATION


def _doctor_without_torch(exc: ImportError) -> dict:
    import platform

    try:
        import numpy

        numpy_facts = {"version": numpy.__version__, "error": None}
    except ImportError as np_exc:
        numpy_facts = {"version": None, "error": f"{type(np_exc).__name__}: {np_exc}"}
    return {"python": platform.python_version(), "platform": platform.platform(),
            "bridge": {"usable": False, "reason": f"torch does not import ({type(exc).__name__}: {exc})",
                       "hint": BRIDGE_HINT},
            "torch": {"version": None, "error": f"{type(exc).__name__}: {exc}"}, "numpy": numpy_facts,
            "device": None, "flash_mla": None, "backends": {}}


def _render_without_torch(report: dict) -> str:
    np_facts = report["numpy"]
    return "\n".join([
        "kernel bridge doctor",
        f"  python     {report['python']} ({report['platform']})",
        f"  torch      does not import: {report['torch']['error']}",
        f"  numpy      {np_facts['version'] or 'does not import: ' + np_facts['error']}",
        f"  bridge     not usable: {report['bridge']['hint']}",
    ])


def cmd_conform(argv) -> int:
    parser = _Parser(prog="hisparse conform",
                     description="Run the installed SGLang's own start-up code (parser, ServerArgs, resolution, "
                                 "check_server_args, --hisparse-config) on every config of the policy's domain, or "
                                 "a stratified sample, and compare with the policy: acceptance, message, resolved "
                                 "KV dtype, backends and routing log lines. Exit 0 conformant, 1 different, 2 "
                                 "SGLang unavailable.")
    add_policy_options(parser)
    parser.add_argument("--where", action="append", metavar="NAME=VALUE",
                        help="run only configs with this input value (repeatable)")
    parser.add_argument("--sample", type=int, metavar="N",
                        help="a stratified sample of N configs (every value of every input appears)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="the sample's seed (default 0)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="worker processes (default: the CPUs this process may use)")
    parser.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    parser.add_argument("--max-patterns", type=int, default=4, metavar="N",
                        help="patterns shown per group in text and markdown (default 4; json has all)")
    ns = parser.parse_args(argv)
    from engine.sglang.conform import SGLangUnavailable, conform
    from engine.sglang.conform.sample import axes
    from engine.policy.loader import load_policy
    from engine.analysis.table import parse_where

    policy = load_policy(policy_ref(ns.policy), ns.policy_dir)
    fixed = parse_where(policy, ns.where)
    widest = max(len(values) for _, values in axes(policy, fixed))
    if ns.sample is not None and ns.sample < widest:
        raise UsageError(f"hisparse conform: --sample {ns.sample}: a stratified sample holds every value of "
                         f"every input, so it needs at least {widest} configs")
    if ns.workers is not None and ns.workers < 1:
        raise UsageError("hisparse conform: --workers must be at least 1")
    try:
        result = conform(policy, fixed, ns.sample, ns.seed, ns.workers, progress=sys.stderr)
    except SGLangUnavailable as exc:
        print(f"hisparse conform: {exc}", file=sys.stderr)
        return ERROR
    from engine.sglang.conform.report import report_text

    if result["warning"] and ns.format != "text":
        print(f"hisparse conform: warning: {result['warning']}", file=sys.stderr)
    if ns.format == "json":
        _emit_json(result)
    else:
        print(report_text(result, markdown=ns.format == "markdown", max_patterns=max(ns.max_patterns, 1)))
    return OK if result["conformant"] else VIOLATION


COMMANDS = {
    "evaluate": (cmd_evaluate, "decide and check the backends for a server config"),
    "explain": (cmd_explain, "show why: every stage, rule and check, in words"),
    "check": (cmd_check, "check policy files (YAML, schema, names, values)"),
    "table": (cmd_table, "the routing table a policy implies"),
    "test": (cmd_test, "run policy test cases and report rule coverage"),
    "diff": (cmd_diff, "exact impact of changing one policy into another, over the whole domain"),
    "conform": (cmd_conform, "compare a policy with the installed SGLang's own code, config by config"),
    "replay": (cmd_replay, "re-evaluate recorded decisions against another policy"),
    "attend": (cmd_attend, "run a synthetic HiSparse decode workload through the policy's backend"),
    "doctor": (cmd_doctor, "what the kernel bridge can run here, and why"),
}


def _usage() -> str:
    width = max(len(c) for c in COMMANDS)
    lines = ["usage: hisparse COMMAND [options]   (hisparse COMMAND --help for its options)", "",
             "DSA/NSA attention-backend routing policies for HiSparse, and the FlashMLA kernel bridge.", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "exit codes: 0 ok; 1 config rejected / differences / failures; 2 invalid policy, bad input or usage"]
    return "\n".join(lines)


def _tolerant_output() -> None:
    """Characters the terminal's encoding cannot show are escaped, not fatal: a message may quote
    a key or value from a hostile file."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass


def main(argv=None) -> int:
    """Run one command; every text output goes through engine.cli.output.SafeStream (terminal
    controls escaped, write failures reported once) and nothing escapes as a traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _tolerant_output()
    raw_out, raw_err = sys.stdout, sys.stderr
    sys.stdout = SafeStream(raw_out, "stdout", strict=True)
    sys.stderr = SafeStream(raw_err, "stderr", strict=False)
    try:
        code = _dispatch(argv)
        sys.stdout.flush()
        return code
    except OutputError as exc:
        print(f"hisparse: {exc}", file=sys.stderr)
        silence(raw_out)
        return ERROR
    except BrokenPipeError:  # e.g. piped into head: the reader left, not an error of ours
        silence(raw_out)
        return OK
    finally:
        sys.stdout, sys.stderr = raw_out, raw_err


def _dispatch(argv) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return OK if argv else ERROR
    if argv[0] == "--version":
        from engine import __version__

        print(f"hisparse {__version__}")
        return OK
    command = COMMANDS.get(argv[0])
    if command is None:
        hint = did_you_mean(argv[0], COMMANDS)
        print(f"hisparse: unknown command {shown(argv[0])}; {hint}", file=sys.stderr)
        return ERROR
    try:
        return command[0](argv[1:])
    except HisparseError as exc:
        print_problems(exc.problems)
        return ERROR
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return ERROR
    except (OutputError, BrokenPipeError):
        raise
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug of ours: say so in one line, keep the traceback for debugging
        if os.environ.get("HISPARSE_DEBUG"):
            raise
        print(f"hisparse: internal error: {type(exc).__name__}: {clip(str(exc), 400)} (set HISPARSE_DEBUG=1 "
              "for the traceback)", file=sys.stderr)
        return ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
