"""`hisparse`: the engine's commands, and the table other layers add theirs to (`register`; the
kernel bridge adds attend and doctor, see kernels_bridge/cli.py).

Exit codes: 0 ok; 1 the config violates the policy (or a diff/test found differences or failures);
2 invalid policy, bad input or usage. Errors print as `FILE:LINE:COL: CODE: message`, never as a
traceback.
"""
from __future__ import annotations

import os
import sys

from engine.errors import HisparseError, MissingDependency
from engine.cli.options import (CPUS_WHY, ERROR, MAX_PATTERNS, OK, VIOLATION, Parser, UsageError, add_policy_options,
                                bounded_int, combined, emit_json, layers_from_args, percent_arg, policy_from_argv,
                                print_problems, split_launch, usable_cpus)
from engine.sglang.argv import add_input_flags
from engine.values import INT_MAX
from engine.cli.output import OutputError, SafeStream, silence
from engine.cli.policies import cmd_policies
from engine.progress import Progress
from engine.files.shipped import policy_ref
from engine.suggest import did_you_mean
from engine.values import clip, one_line, shown


# -- commands ------------------------------------------------------------------------------------
def cmd_evaluate(argv) -> int:
    argv, launch = split_launch(argv)
    policy, model = policy_from_argv(argv, launch)
    parser = Parser(prog="hisparse evaluate",
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
    g = combined(policy, layers, model=model)
    if ns.record:
        from engine.files.streams import check_record_target

        check_record_target(ns.record)
    if ns.batch:
        from engine.cli.batch import run_batch

        return run_batch(policy, layers, g.notes, ns.batch, ns.format or "json", ns.record, model)
    decision = policy.evaluate(g.config)
    if ns.record:
        from engine.serving.records import append_records

        append_records(ns.record, [decision], [g.given])
    if ns.format == "json":
        from engine.analysis.capability import decision_json

        emit_json(decision_json(decision))
    else:
        from engine.cli.decision_text import decision_text

        print(decision_text(decision, g.origins))
    return OK if decision.ok else VIOLATION



def cmd_explain(argv) -> int:
    argv, launch = split_launch(argv)
    policy, model = policy_from_argv(argv, launch)
    parser = Parser(prog="hisparse explain",
                    usage="hisparse explain [options] [-- python -m sglang.launch_server ARGS...]",
                    description="Show every stage, rule and check the policy tried for a config, and why.")
    add_policy_options(parser)
    parser.add_argument("--config", metavar="FILE", help="SGLang-style YAML or JSON config file")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="json: the stages, rules and results as data, and the decision")
    add_input_flags(parser, policy)
    ns = parser.parse_args(argv)
    g = combined(policy, layers_from_args(policy, ns, ns.config, launch), model=model)
    decision, events = policy.trace(g.config)
    from engine.cli.decision_text import explanation_json, explanation_text

    if ns.format == "json":
        emit_json(explanation_json(decision, events))
    else:
        print(explanation_text(decision, events, g.origins))
    return OK if decision.ok else VIOLATION


def cmd_check(argv) -> int:
    parser = Parser(prog="hisparse check",
                    description="Check policy files: YAML, schema, names and values, then lint over the "
                                "whole declared domain. One line per problem: FILE:LINE:COL: CODE: message.")
    parser.add_argument("paths", nargs="*", metavar="PATH", help="policy files or folders (default: the shipped policies)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--no-deep", dest="deep", action="store_false",
                        help="skip the deep lint (L401-L407)")
    ns = parser.parse_args(argv)
    from engine.analysis.check import check_paths

    notes: list = []
    results = check_paths(ns.paths, ns.deep, notes)
    for note in notes:
        print(f"note: {one_line(note)}", file=sys.stderr)
    problems = [p for _, probs in results for p in probs]
    if ns.format == "json":
        emit_json({"ok": not problems, "files": [
            {"file": f, "ok": not probs, "problems": [p.to_dict() for p in probs]} for f, probs in results]})
    else:
        for p in problems:
            print(str(p))
        bad = sum(1 for _, probs in results if probs)
        print(f"checked {len(results)} policy file(s): {len(problems)} problem(s) in {bad} file(s)")
    return ERROR if problems or not results else OK


def cmd_diff(argv) -> int:
    parser = Parser(prog="hisparse diff",
                    description="Evaluate two policies over the whole declared input domain and show every "
                                "config whose outcome changes, grouped into patterns.")
    parser.add_argument("a", metavar="A", help="the policy now (FAMILY@N or a file)")
    parser.add_argument("b", metavar="B", help="the policy to compare with")
    add_policy_options(parser, with_ref=False)
    parser.add_argument("--policy-dir", metavar="DIR", help="folder of policy families")
    parser.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    parser.add_argument("--where", action="append", metavar="NAME=VALUE",
                        help="compare only configs with this input value (repeatable, one value per input)")
    parser.add_argument("--max-patterns", type=bounded_int(1, MAX_PATTERNS), default=4, metavar="N",
                        help=f"patterns shown per group in text and markdown (default 4, at most {MAX_PATTERNS:,}; "
                             "json has all)")
    ns = parser.parse_args(argv)
    from engine.analysis.diff import diff
    from engine.cli.reports import diff_text
    from engine.policy.loader import load_policy

    from engine.cli.versions import side_labels

    a, b = load_policy(ns.a, ns.policy_dir), load_policy(ns.b, ns.policy_dir)
    result = diff(a, b, where=ns.where, progress=Progress("diff: configs", 0))
    for side, label in zip("ab", side_labels(ns.a, ns.b, a, b)):
        if label:  # a side named by release, or two sides of one version
            result[side]["label"] = label
    if ns.format == "json":
        emit_json(result)
    else:
        print(diff_text(result, markdown=ns.format == "markdown", max_patterns=ns.max_patterns))
    return OK if result["equivalent"] else VIOLATION


def cmd_table(argv) -> int:
    parser = Parser(prog="hisparse table",
                    description="The routing table a policy implies: default and allowed backends of each "
                                "phase for every combination of the other inputs.")
    add_policy_options(parser)
    parser.add_argument("--where", action="append", metavar="NAME=VALUE",
                        help="fix an input (repeatable, one value per input), e.g. --where dsa_model=true")
    parser.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    ns = parser.parse_args(argv)
    from engine.policy.loader import load_policy
    from engine.analysis.domain import parse_where
    from engine.analysis.table import routing_rows
    from engine.cli.reports import table_text

    policy = load_policy(policy_ref(ns.policy), ns.policy_dir)
    result = routing_rows(policy, parse_where(policy, ns.where), progress=Progress("table: configs", 0))
    if ns.format == "json":
        emit_json(result)
    else:
        print(table_text(policy, result, markdown=ns.format == "markdown"))
    return OK


def cmd_test(argv) -> int:
    parser = Parser(prog="hisparse test",
                    description="Run policy test cases (<family>/tests/v<N>.yaml) and report rule coverage.")
    parser.add_argument("paths", nargs="*", metavar="PATH", help="test files or folders (default: the shipped policies)")
    parser.add_argument("--policy-dir", metavar="DIR", help="folder of policy families")
    parser.add_argument("--min-coverage", type=percent_arg, metavar="PCT",
                        help="fail when a policy's rule coverage is below PCT (0 to 100)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    ns = parser.parse_args(argv)
    from engine.analysis.policytest import report_json, run
    from engine.cli.reports import policy_test_text

    results, problems = run(ns.paths, ns.policy_dir)
    if problems:
        print_problems(problems)
        return ERROR
    text, ok = policy_test_text(results, ns.min_coverage)
    if ns.format == "json":
        emit_json(report_json(results))
    else:
        print(text)
    return OK if ok else VIOLATION


def cmd_replay(argv) -> int:
    parser = Parser(prog="hisparse replay",
                    description="Re-evaluate the inputs of recorded decisions (--record) against a policy and "
                                "show what would change.")
    parser.add_argument("file", metavar="FILE", help="a record file written by --record (or a pipe)")
    add_policy_options(parser)
    parser.add_argument("--format", choices=("text", "json"), default="text")
    from engine.serving.records import MAX_RECORDS

    most = 100 * MAX_RECORDS  # a replay's time grows with them
    parser.add_argument("--max-records", type=bounded_int(1, most), default=MAX_RECORDS, metavar="N",
                        help=f"stop with an error after N records (default {MAX_RECORDS:,}, at most {most:,}); "
                             "each line is at most HISPARSE_MAX_FILE_BYTES")
    ns = parser.parse_args(argv)
    from engine.policy.loader import load_policy
    from engine.serving.records import replay
    from engine.cli.reports import replay_text

    result = replay(ns.file, load_policy(policy_ref(ns.policy), ns.policy_dir),
                    max_records=ns.max_records)
    if ns.format == "json":
        emit_json(result)
    else:
        print(replay_text(result))
    if result["problems"]:
        return ERROR
    return OK if result["equivalent"] else VIOLATION


def _conform_policies(ns) -> list:
    """The policies conform runs: those the reference names (--policy, else $HISPARSE_POLICY: a
    release or a folder names one version per family), else the versions that model the
    installed SGLang, said on stderr; the default policy when SGLang is missing or no version
    models its release (also said)."""
    from engine.errors import PolicyError
    from engine.files.releases import INSTALLED, installed_release
    from engine.files.shipped import default_policy_ref
    from engine.policy.loader import load_policy
    from engine.sglang.policy_sets import load_policy_set

    if ns.policy is not None or os.environ.get("HISPARSE_POLICY") is not None:
        return load_policy_set(policy_ref(ns.policy), ns.policy_dir).policies
    try:
        release = installed_release()
    except PolicyError:
        return [load_policy(default_policy_ref(), ns.policy_dir)]  # conform then says SGLang is missing
    try:
        policies = load_policy_set(INSTALLED, ns.policy_dir).policies
    except PolicyError as exc:
        if not any(p.code == "R601" for p in exc.problems):
            raise
        policy = load_policy(default_policy_ref(), ns.policy_dir)
        print(f"hisparse conform: no --policy, and no policy version models the installed SGLang "
              f"{release}: running {policy.ref}", file=sys.stderr)
        return [policy]
    print(f"hisparse conform: no --policy: {', '.join(p.ref for p in policies)}, the "
          f"version{'s' if len(policies) > 1 else ''} that model{'' if len(policies) > 1 else 's'} the "
          f"installed SGLang {release}", file=sys.stderr)
    return policies


def cmd_versions(argv) -> int:
    from engine.cli.versions import cmd_versions as run

    return run(argv)


def cmd_conform(argv) -> int:
    parser = Parser(prog="hisparse conform",
                    description="Run the installed SGLang's own start-up code (parser, ServerArgs, resolution, "
                                "check_server_args, --hisparse-config) on every config of the policy's domain, or "
                                "a stratified sample, and compare with the policy: acceptance, message, exception "
                                "type, resolved KV dtype, backends and routing log lines. Without --policy: the version that models the "
                                "installed SGLang. Exit 0 conformant, 1 different, 2 "
                                "SGLang unavailable.")
    add_policy_options(parser)
    parser.add_argument("--where", action="append", metavar="NAME=VALUE",
                        help="run only configs with this input value (repeatable)")
    from engine.analysis.domain import MAX_CONFIGS

    parser.add_argument("--sample", type=bounded_int(1, MAX_CONFIGS, "a whole-domain operation's limit"),
                        metavar="N", help="a stratified sample of N configs (every value of every input appears)")
    parser.add_argument("--seed", type=bounded_int(0, INT_MAX), default=0, metavar="S",
                        help="the sample's seed, 0 to 2**63-1 (default 0)")
    parser.add_argument("--workers", type=bounded_int(1, usable_cpus(), CPUS_WHY), metavar="N",
                        help="worker processes (default and most: the CPUs this process may use)")
    parser.add_argument("--case-timeout", type=float, metavar="SECONDS",
                        help="stop the run when SGLang takes longer than this on one launch (default 120, "
                             "at most 86400)")
    parser.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    parser.add_argument("--max-patterns", type=bounded_int(1, MAX_PATTERNS), default=4, metavar="N",
                        help=f"patterns shown per group in text and markdown (default 4, at most {MAX_PATTERNS:,}; "
                             "json has all)")
    ns = parser.parse_args(argv)
    from engine.sglang.conform import SGLangUnavailable, conform
    from engine.sglang.conform.sample import axes
    from engine.analysis.domain import parse_where

    policies = _conform_policies(ns)
    runs = []  # (policy, its --where); with several policies, those that have every NAME
    names = {w.split("=", 1)[0].strip() for w in ns.where or ()}
    for policy in policies:
        if len(policies) > 1 and not names <= set(policy.inputs):
            continue
        runs.append((policy, parse_where(policy, ns.where)))
    if not runs:
        raise UsageError(f"hisparse conform: --where: no policy of {', '.join(p.ref for p in policies)} has "
                         f"every input named ({', '.join(sorted(names))})")
    for policy, fixed in runs:
        widest = max(len(values) for _, values in axes(policy, fixed))
        if ns.sample is not None and ns.sample < widest:
            raise UsageError(f"hisparse conform: --sample {ns.sample}: a stratified sample holds every value of "
                             f"every input, so it needs at least {widest} configs ({policy.ref})")
    if ns.case_timeout is not None and not 0 < ns.case_timeout <= 86400:
        raise UsageError(f"hisparse conform: --case-timeout {ns.case_timeout:g}: from above 0 to 86400 seconds")
    from engine.sglang.conform.runner import CaseTimedOut, DriverError, WorkerCrashed
    from engine.cli.reports import conform_text

    results = []
    for policy, fixed in runs:
        try:
            result = conform(policy, fixed, ns.sample, ns.seed, ns.workers, progress=sys.stderr,
                             case_timeout=ns.case_timeout)
        except (SGLangUnavailable, WorkerCrashed, DriverError, CaseTimedOut) as exc:
            # SGLang could not run, or failed on a launch: no report to give, the reason is the output
            print(f"hisparse conform: {exc}", file=sys.stderr)
            return ERROR
        if result["warning"] and ns.format != "text":
            print(f"hisparse conform: warning: {result['warning']}", file=sys.stderr)
        results.append(result)
    if ns.format == "json":  # one policy: its report; several (one per family): every report
        emit_json(results[0] if len(results) == 1 else
                  {"conformant": all(r["conformant"] for r in results), "reports": results})
    else:
        print("\n\n".join(conform_text(r, markdown=ns.format == "markdown", max_patterns=ns.max_patterns)
                          for r in results))
    return OK if all(r["conformant"] for r in results) else VIOLATION


def _launch(argv) -> int:
    from engine.cli.launch import cmd_launch  # its own module: it execs SGLang

    return cmd_launch(argv)


COMMANDS = {
    "evaluate": (cmd_evaluate, "decide and check the backends for a server config"),
    "explain": (cmd_explain, "show why: every stage, rule and check, in words"),
    "check": (cmd_check, "check policy files (YAML, schema, names, values)"),
    "table": (cmd_table, "the routing table a policy implies"),
    "test": (cmd_test, "run policy test cases and report rule coverage"),
    "diff": (cmd_diff, "exact impact of changing one policy into another, over the whole domain"),
    "conform": (cmd_conform, "compare a policy with the installed SGLang's own code, config by config"),
    "versions": (cmd_versions, "every SGLang release, the policy version that models it, its conformance"),
    "replay": (cmd_replay, "re-evaluate recorded decisions against another policy"),
    "launch": (_launch, "check an SGLang launch command, then run it with the policy deciding its routing"),
    "policies": (cmd_policies, "export the shipped policies and their test cases to a folder to edit"),
}


def register(name: str, run, help_line: str) -> None:
    """Add a command to `hisparse`: `run(argv)` returns the exit code, `help_line` is its line in
    `hisparse --help`. The kernel bridge adds attend and doctor this way (kernels_bridge/cli.py):
    the engine never imports the bridge. A name registered again replaces its entry."""
    COMMANDS[name] = (run, help_line)


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
        try:
            code = _dispatch(argv)
        except SystemExit as exc:  # argparse after printing --help (its output is flushed below)
            code = exc.code if isinstance(exc.code, int) else (OK if exc.code is None else ERROR)
        sys.stdout.flush()  # the last of the output: a full disk here is still an error
        return code
    except OutputError as exc:
        print(f"hisparse: {exc}", file=sys.stderr)
        silence(raw_out)
        return ERROR
    finally:
        sys.stdout, sys.stderr = raw_out, raw_err


def _dispatch(argv) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return OK if argv else ERROR
    if argv[0] == "--version":
        from engine.version import __version__

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
    except MissingDependency as exc:
        print(f"hisparse: {exc}", file=sys.stderr)
        return ERROR
    except OutputError:
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
