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

from .errors import ConfigError, HisparseError, Problem
from .paths import DEFAULT_POLICY, default_policy_ref
from .suggest import did_you_mean

OK, VIOLATION, ERROR = 0, 1, 2


class UsageError(Exception):
    """Bad command-line usage (exit 2)."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kw):
        kw.setdefault("allow_abbrev", False)  # a routing flag is never guessed from a prefix
        super().__init__(*args, **kw)

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")


# -- policy-driven options ----------------------------------------------------------------------
def _pre_policy(argv):
    pre = _Parser(add_help=False)
    pre.add_argument("--policy")
    pre.add_argument("--policy-dir")
    ns, _ = pre.parse_known_args(argv)
    from .loader import load_policy

    return load_policy(ns.policy or default_policy_ref(), ns.policy_dir)


def add_policy_options(parser, with_ref=True):
    if with_ref:
        parser.add_argument("--policy", metavar="REF",
                            help="FAMILY, FAMILY@N or a file (default: $HISPARSE_POLICY or "
                                 f"{DEFAULT_POLICY}, newest version)")
        parser.add_argument("--policy-dir", metavar="DIR",
                            help="folder of policy families (default: $HISPARSE_POLICY_DIR or the shipped policies)")


def add_input_flags(parser, policy):
    """One option per policy input, spelled as the policy declares (SGLang's flag names)."""
    group = parser.add_argument_group(f"config inputs of {policy.ref}")
    for name, spec in policy.inputs.items():
        help_text = spec.description or ""
        if spec.type == "bool":
            group.add_argument(*spec.flags, dest=name, action=argparse.BooleanOptionalAction, default=None,
                               help=f"{help_text} (default {str(spec.default).lower()})")
        else:
            kind = int if spec.type == "int" else str
            values = "|".join(str(v) for v in spec.values)
            metavar = "N" if spec.type == "int" else ("BACKEND" if spec.phase else "VALUE")
            domain = f"one of {values}" if spec.type == "enum" else f"integer, e.g. {values}"
            default = "unset" if spec.default is None else spec.default
            group.add_argument(*spec.flags, dest=name, type=kind, default=None, metavar=metavar,
                               help=f"{help_text} [{domain}; default {default}]")
        for i, flag in enumerate(spec.deprecated):  # kept apart: using one is logged
            if spec.type == "bool":
                group.add_argument(flag, dest=f"{name}__deprecated{i}", action="store_const", const=True,
                                   default=None, help=f"deprecated spelling of {spec.flag}")
            else:
                group.add_argument(flag, dest=f"{name}__deprecated{i}", type=int if spec.type == "int" else str,
                                   default=None, metavar=metavar, help=f"deprecated spelling of {spec.flag}")


def split_launch(argv):
    """(hisparse's own arguments, the SGLang launch command after `--` or None)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


def config_from_args(policy, ns, config_file=None, launch=None) -> dict:
    """The launch command after `--` (if any), then --config FILE (lenient: unrelated SGLang keys
    are ignored, with a note), then flags: later sources win. Keys keep the spelling they were
    given in (a deprecated flag is logged when the config is evaluated); each source is
    validated as it is read, so errors name the file, line or flag."""
    from .config import merge_config

    config: dict = {}
    if launch is not None:
        from .sglang import config_from_launch

        config, notes = config_from_launch(policy, launch)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    if config_file:
        from .config import load_config_file

        from_file, ignored = load_config_file(policy, config_file)
        config = merge_config(policy, config, from_file)
        if ignored:
            shown = ", ".join(ignored[:8]) + (" ..." if len(ignored) > 8 else "")
            print(f"note: {config_file}: ignored {len(ignored)} key(s) the policy does not read: {shown}",
                  file=sys.stderr)
    flags = {}
    for name, spec in policy.inputs.items():
        for i, flag in enumerate(spec.deprecated):
            value = getattr(ns, f"{name}__deprecated{i}", None)
            if value is not None:
                flags[flag[2:]] = value
        value = getattr(ns, name, None)
        if value is not None:
            flags[spec.flag[2:]] = value  # spelled as the flag, so errors name what was typed
    policy.normalize(flags)
    return merge_config(policy, config, flags)


# -- output --------------------------------------------------------------------------------------
def print_problems(problems, stream=None) -> None:
    stream = stream or sys.stderr
    for p in problems:
        print(str(p), file=stream)


def _emit_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")


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
    base = config_from_args(policy, ns, ns.config, launch)
    if ns.batch:
        return _batch(policy, base, ns.batch, ns.format or "json", ns.record)
    decision = policy.evaluate(base)
    if ns.record:
        from .records import append_records

        append_records(ns.record, [decision])
    if ns.format == "json":
        _emit_json(decision.to_dict())
    else:
        from .render import decision_text

        print(decision_text(decision))
    return OK if decision.ok else VIOLATION


def _batch(policy, base: dict, source: str, fmt: str, record: str | None = None) -> int:
    """Evaluate each line of a JSON Lines source. Lines are read as bytes and decoded one by one,
    at most HISPARSE_MAX_FILE_BYTES each, so a bad line (not UTF-8, too long, not JSON) gets its
    own error object and every other line is still evaluated, in order."""
    if source == "-":
        stream = getattr(sys.stdin, "buffer", sys.stdin)
    else:
        try:
            stream = open(source, "rb")
        except OSError as exc:
            raise ConfigError([Problem("C504", f"cannot read batch file: {exc.strerror or exc}", source)]) from None
    from .reading import max_file_bytes

    worst = OK
    try:
        for number, line in enumerate(_lines(stream, max_file_bytes()), 1):
            result, status, decision = _batch_line(policy, base, line, number)
            if record and decision is not None:
                from .records import append_records

                append_records(record, [decision])
            worst = max(worst, status)
            if fmt == "json":
                _emit_json(result)
            else:
                print(_batch_text(policy, result, number))
            if source == "-":  # a pipe: answer each line as it comes
                sys.stdout.flush()
    except OSError as exc:
        raise ConfigError([Problem("C504", f"cannot read batch input: {exc.strerror or exc}", source)]) from None
    finally:
        if source != "-":
            stream.close()
    return worst


def _lines(stream, limit: int):
    """The lines of `stream` (bytes, or str for a text stream), each at most `limit` bytes; a
    longer line is skipped without being held in memory and given as _TOO_LONG."""
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        newline = b"\n" if isinstance(line, bytes) else "\n"
        if len(line) > limit and not line.endswith(newline):
            while True:  # drop the rest of the line, a bounded chunk at a time
                more = stream.readline(1 << 16)
                if not more or more.endswith(newline):
                    break
            yield _TOO_LONG
        else:
            yield line


_TOO_LONG = object()


def _batch_line(policy, base, line, number: int):
    def bad(problems):
        first = problems[0]
        err = {"code": first.code, "message": first.message}
        if first.hint:
            err["hint"] = first.hint
        if len(problems) > 1:
            err["more"] = [p.to_dict() for p in problems[1:]]
        return {"ok": False, "line": number, "error": err}, ERROR, None

    if line is _TOO_LONG:
        from .reading import max_file_bytes

        return bad([Problem("C505", f"line longer than {max_file_bytes()} bytes (HISPARSE_MAX_FILE_BYTES)")])
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            return bad([Problem("C505", f"not UTF-8 text (byte 0x{line[exc.start]:02x} at column "
                                        f"{exc.start + 1})")])
    if not line.strip():
        return bad([Problem("C505", "empty line (one JSON object per line)")])
    from .yaml_reader import ReadError, parse_json

    try:  # the reader's limits: depth, size, NaN, 64-bit integers, duplicate keys
        obj = parse_json(line.rstrip("\r\n"), f"line {number}").data
    except ReadError as exc:
        p = exc.problems[0]
        message = p.message
        if message.startswith("JSON syntax: "):
            message = "not JSON: " + message[len("JSON syntax: "):]
        return bad([Problem("C505", message + (f" at column {p.col}" if p.col else ""))])
    if not isinstance(obj, dict):
        return bad([Problem("C505", f"a line holds one JSON object, got {type(obj).__name__}")])
    try:
        from .config import merge_config

        d = policy.evaluate(merge_config(policy, base, obj))
    except ConfigError as exc:
        return bad(exc.problems)
    out = d.to_dict()
    out["line"] = number
    return out, (OK if d.ok else VIOLATION), d


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
    config = config_from_args(policy, ns, ns.config, launch)
    decision, trace = policy.trace(config)
    from .render import explanation_text

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
    from .check import check_paths

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
    parser.add_argument("--max-patterns", type=int, default=4, metavar="N",
                        help="patterns shown per group in text and markdown (default 4; json has all)")
    ns = parser.parse_args(argv)
    from .diff import diff, diff_text
    from .loader import load_policy

    result = diff(load_policy(ns.a, ns.policy_dir), load_policy(ns.b, ns.policy_dir), where=ns.where)
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
    from .loader import load_policy
    from .table import parse_where, routing_rows, table_text

    policy = load_policy(ns.policy or default_policy_ref(), ns.policy_dir)
    result = routing_rows(policy, parse_where(policy, ns.where))
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
    from .policytest import report_json, report_text, run

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
    parser.add_argument("file", metavar="FILE", help="a record file written by --record")
    add_policy_options(parser)
    parser.add_argument("--format", choices=("text", "json"), default="text")
    ns = parser.parse_args(argv)
    from .loader import load_policy
    from .records import replay, replay_text

    result = replay(ns.file, load_policy(ns.policy or default_policy_ref(), ns.policy_dir))
    if ns.format == "json":
        _emit_json(result)
    else:
        print(replay_text(result))
    if result["problems"]:
        return ERROR
    return OK if result["equivalent"] else VIOLATION


def cmd_attend(argv) -> int:
    policy = _pre_policy(argv)
    parser = _Parser(prog="hisparse attend",
                     description="A synthetic DSA decode workload end to end: the policy picks the decode "
                                 "backend, then every step runs top-k -> hot buffer -> bridge -> kernel. "
                                 "HiSparse is on and the radix cache off unless the flags say otherwise.")
    add_policy_options(parser)
    w = parser.add_argument_group("workload")
    w.add_argument("--requests", type=int, default=4, help="requests decoded together (default 4)")
    w.add_argument("--context", type=int, default=4096, help="tokens of KV per request at the start (default 4096)")
    w.add_argument("--heads", type=int, default=128, help="query heads: 64 or 128 (default 128)")
    w.add_argument("--top-k", type=int, default=512, help="positions the indexer picks per step (default 512)")
    w.add_argument("--buffer-size", type=int, default=1024, help="hot-buffer slots per request (default 1024)")
    w.add_argument("--steps", type=int, default=8, help="decode steps (default 8)")
    w.add_argument("--locality", type=float, default=0.7,
                   help="share of the top-k kept from the previous step (default 0.7)")
    w.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    w.add_argument("--provider", choices=("auto", "reference", "flashmla"), default="auto")
    w.add_argument("--device", default="cpu", help="where the hot buffer and kernels run (default cpu)")
    w.add_argument("--threads", type=int, metavar="N",
                   help="torch CPU threads for the kernels (default: torch's choice, every core; on a "
                        "loaded machine 1 is often faster)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    add_input_flags(parser, policy)
    ns = parser.parse_args(argv)
    base = {name: True for name in ("enable_hisparse", "disable_radix_cache") if name in policy.inputs}
    from .config import merge_config

    config = merge_config(policy, base, config_from_args(policy, ns))
    decision = policy.evaluate(config)
    if not decision.ok:
        print(f"REJECTED by {policy.ref}: {decision.error}")
        return VIOLATION
    try:
        import torch  # the bridge needs it; say so plainly when it is missing
    except ImportError as exc:
        print(f"hisparse attend: the kernel bridge needs torch ({exc}); install it with "
              "`pip install torch==2.13.0` (CPU) or a CUDA build", file=sys.stderr)
        return ERROR
    if ns.threads is not None:
        if ns.threads < 1:
            raise UsageError(f"hisparse attend: --threads {ns.threads}: at least 1")
        torch.set_num_threads(ns.threads)
    from kernels_bridge.errors import BridgeError
    from kernels_bridge.hot_buffer import HotBufferError
    from kernels_bridge.workload import Workload, report_text, run, stderr_progress

    work = Workload(ns.requests, ns.context, ns.heads, ns.top_k, ns.buffer_size, ns.steps, ns.locality,
                    ns.seed, ns.provider, ns.device)
    try:
        report = run(decision, work, progress=stderr_progress)
    except (BridgeError, HotBufferError) as exc:
        print(f"hisparse attend: {exc}", file=sys.stderr)
        return ERROR
    if ns.format == "json":
        _emit_json(report)
    else:
        print(report_text(report))
    return OK


def cmd_doctor(argv) -> int:
    parser = _Parser(prog="hisparse doctor",
                     description="What the kernel bridge can run here: torch, CUDA, the device, flash_mla "
                                 "(and why not), and which provider each backend uses.")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    ns = parser.parse_args(argv)
    try:
        from kernels_bridge.doctor import doctor_report, render_doctor  # imports torch: only here
    except ImportError as exc:
        print(f"hisparse doctor: the kernel bridge needs torch ({exc}); install it with "
              "`pip install torch==2.13.0` (CPU) or a CUDA build", file=sys.stderr)
        return ERROR
    report = doctor_report()
    if ns.format == "json":
        _emit_json(report)
    else:
        print(render_doctor(report))
    return OK


COMMANDS = {
    "evaluate": (cmd_evaluate, "decide and check the backends for a server config"),
    "explain": (cmd_explain, "show why: every stage, rule and check, in words"),
    "check": (cmd_check, "check policy files (YAML, schema, names, values)"),
    "table": (cmd_table, "the routing table a policy implies"),
    "test": (cmd_test, "run policy test cases and report rule coverage"),
    "diff": (cmd_diff, "exact impact of changing one policy into another, over the whole domain"),
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return OK if argv else ERROR
    if argv[0] == "--version":
        from . import __version__

        print(f"hisparse {__version__}")
        return OK
    _tolerant_output()
    command = COMMANDS.get(argv[0])
    if command is None:
        hint = did_you_mean(argv[0], COMMANDS)
        print(f"hisparse: unknown command '{argv[0]}'; {hint}", file=sys.stderr)
        return ERROR
    try:
        return command[0](argv[1:])
    except HisparseError as exc:
        print_problems(exc.problems)
        return ERROR
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return ERROR
    except BrokenPipeError:  # e.g. piped into head: not an error of ours
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return OK
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug of ours: say so in one line, keep the traceback for debugging
        if os.environ.get("HISPARSE_DEBUG"):
            raise
        print(f"hisparse: internal error: {type(exc).__name__}: {exc} (set HISPARSE_DEBUG=1 for the "
              "traceback)", file=sys.stderr)
        return ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
