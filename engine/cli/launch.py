"""`hisparse launch [--policy REF] [--policy-dir DIR] [--record FILE] -- <SGLang launch command>`:
the policy judges the launch command first; a refusal prints the decision and exits 1 without
starting SGLang (which takes seconds to import). Otherwise the command replaces this process
(exec) with the SGLang plugin active: HISPARSE_POLICY names the policy just used (its file, or
FAMILY@N), HISPARSE_POLICY_DIR the folder it came from, HISPARSE_RECORD the record file. Signals
go straight to SGLang and its exit code is the command's.

What the command line cannot say (the GPU: --platform, --sm-major) comes from the policy's
input flags, as for `hisparse evaluate`, else from the policy's defaults; inside SGLang the
plugin reads them from the machine."""
from __future__ import annotations

import os
import sys

from engine.cli.options import (ERROR, VIOLATION, Parser, UsageError, add_policy_options, combined,
                                layers_from_args, policy_from_argv, split_launch)
from engine.sglang.argv import add_input_flags


def cmd_launch(argv) -> int:
    argv, command = split_launch(argv)
    policy, model = policy_from_argv(argv, command)
    parser = Parser(prog="hisparse launch",
                    usage="hisparse launch [--policy REF] [--policy-dir DIR] [--record FILE] [--allow-incapable] [input flags] "
                          "-- python -m sglang.launch_server ARGS... (or: sglang serve ARGS...)",
                    description="Check an SGLang launch command with the policy, then run it with the policy "
                                "deciding SGLang's DSA routing (its SGLang plugin). A refused launch prints the "
                                "decision and exits 1 without starting SGLang; otherwise the exit code is SGLang's.")
    add_policy_options(parser)
    parser.add_argument("--record", metavar="FILE",
                        help="append the decision to FILE (--record format): SGLang's, or this refusal")
    parser.add_argument("--allow-incapable", action="store_true",
                        help="start SGLang even where the decision routes a phase to a backend whose declared "
                             "capabilities exclude the config (refused otherwise, exit 1)")
    add_input_flags(parser, policy)
    ns = parser.parse_args(argv)
    if not command:
        raise UsageError("hisparse launch: no command: give the SGLang launch command after --, e.g. "
                         "hisparse launch -- python -m sglang.launch_server --model-path MODEL")
    from engine.sglang.launch import command_words

    command = command_words(command)  # one quoted string: the words judged are the words run
    g = combined(policy, layers_from_args(policy, ns, None, command), model=model)
    _check_records(ns.record)
    decision = policy.evaluate(g.config)
    refusal = _refusal(decision, ns.allow_incapable)
    if refusal:
        from engine.cli.decision_text import decision_text

        if ns.record:
            from engine.serving.records import append_records

            append_records(ns.record, [decision], [g.given])
        print(decision_text(decision))
        sys.stdout.flush()  # the decision first, also where both streams go to one pipe
        print(f"hisparse launch: {refusal}; SGLang was not started", file=sys.stderr)
        return VIOLATION
    env = dict(os.environ, HISPARSE_POLICY=_ref_for_plugin(policy, ns.policy))
    if ns.policy_dir is not None:
        env["HISPARSE_POLICY_DIR"] = os.path.abspath(ns.policy_dir)
    if ns.record:
        env["HISPARSE_RECORD"] = os.path.abspath(ns.record)
    backends = ", ".join(f"{ph}={b}" for ph, b in decision.backends.items())
    print(f"hisparse launch: {policy.ref} accepts this launch ({backends}); starting it with "
          f"HISPARSE_POLICY={env['HISPARSE_POLICY']}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"hisparse launch: cannot run {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return ERROR
    return ERROR  # pragma: no cover - exec does not return


def _refusal(decision, allow_incapable: bool) -> str:
    """Why the launch is not started ("": it is): the policy refuses it, or routes a phase to a
    backend whose declared capabilities exclude the config (unless --allow-incapable)."""
    if not decision.ok:
        return "the policy refuses this launch"
    from engine.analysis.capability import incapable

    routes = incapable(decision)
    if not routes or allow_incapable:
        return ""
    shown = ", ".join(f"{r.phase} on {r.backend}" for r in routes)
    return (f"the decision routes {shown}, which cannot run this config by the policy's declared capabilities "
            "(--allow-incapable starts it anyway)")


def _check_records(option: str | None) -> None:
    """The record file, from --record or else HISPARSE_RECORD (which SGLang's plugin would find only
    at its first decision), refused before SGLang starts when it cannot be appended to."""
    from engine.files.streams import check_record_target

    path = option if option is not None else os.environ.get("HISPARSE_RECORD")
    if path is None:
        return
    if not path.strip():
        raise UsageError("hisparse launch: " + ("--record" if option is not None else "HISPARSE_RECORD") +
                         " is empty: it must name a file (leave it out for no records)")
    check_record_target(path)


def _ref_for_plugin(policy, given: str | None) -> str:
    """The policy that was judged, for the plugin: its file when named by a path, else FAMILY@N
    (the version now newest, so both sides use the same one)."""
    from engine.files.shipped import policy_ref
    from engine.files.catalog import looks_like_path

    if looks_like_path(policy_ref(given)):
        return os.path.abspath(policy.file)
    return f"{policy.family}@{policy.version}"
