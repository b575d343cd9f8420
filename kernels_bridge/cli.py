"""`hisparse attend` and `hisparse doctor`: the kernel bridge's commands, in the bridge because the
engine never imports it. Importing this module adds them to the engine's command table, and the
`hisparse` console script starts here (pyproject.toml), so they are listed and run as the engine's
own; `python -m engine.cli` is the engine's commands alone. Nothing heavy is imported here: torch
and the bridge's modules load when attend or doctor runs, so `hisparse evaluate` pays only for
this module."""
from __future__ import annotations

import sys

from engine.cli.commands import main as engine_main, register
from engine.errors import HisparseError, Problem
from engine.cli.options import (CPUS_WHY, ERROR, OK, VIOLATION, Parser, UsageError, add_policy_options,
                                bounded_int, combined, emit_json, layers_from_args, policy_from_argv, usable_cpus)
from engine.sglang.argv import add_input_flags, int_arg
from engine.progress import Progress
from engine.values import clip, shown

# attend's workload knobs are SGLang's --hisparse-config fields, spelled as the policy's inputs
# (v3 declares them); for a policy without them attend adds the same flags itself.
WORKLOAD_INPUTS = {"hisparse_top_k": "--hisparse-top-k", "hisparse_device_buffer_size": "--hisparse-device-buffer-size"}
ATTEND_ON = ("enable_hisparse", "disable_radix_cache")  # what attend turns on unless told otherwise
COMPARED = ("fp8_e4m3", "bfloat16")  # attend --compare: the KV cache dtypes of HiSparse's two paths
BRIDGE_HINT = ("the kernel bridge needs torch and numpy: `pip install torch==2.13.0 numpy` (the CPU build), "
               "or `pip install 'hisparse-router[bridge]'` once the torch build you want is installed")


def cmd_attend(argv) -> int:
    policy, model = policy_from_argv(argv)
    parser, own = _attend_parser(policy)
    collisions = colliding_inputs(policy, own)
    if collisions:
        raise HisparseError(collisions)
    add_input_flags(parser, policy, defaults={name: True for name in ATTEND_ON})
    ns = parser.parse_args(argv)
    base = {name: True for name in ATTEND_ON if name in policy.inputs}
    config = combined(policy, layers_from_args(policy, ns, base=base), model=model).config
    if ns.trace is not None:
        return _attend_trace(policy, config, ns)
    from kernels_bridge.workload_spec import DEFAULT_TOP_K, Workload

    top_k = _workload_value(policy, config, "hisparse_top_k", getattr(ns, "hisparse_top_k", None))
    top_k = DEFAULT_TOP_K if top_k is None else top_k
    buffer_size = _workload_value(policy, config, "hisparse_device_buffer_size",
                                  getattr(ns, "hisparse_device_buffer_size", None))
    config = _with_sizes(policy, config, top_k, 2 * top_k if buffer_size is None else buffer_size)
    if ns.compare and any(policy.canonical_key(k) == "kv_cache_dtype" for k in config):
        raise UsageError("hisparse attend: --compare runs the workload on both fp8_e4m3 and bfloat16: "
                         "leave out --kv-cache-dtype")
    if ns.compare and ns.no_kernel:
        raise UsageError("hisparse attend: --compare compares the kernels' accuracy: leave out --no-kernel")
    decisions = _decisions(policy, config, COMPARED if ns.compare else (None,))
    if isinstance(decisions, int):
        return decisions
    # every argument is checked before torch is imported: a mistake is answered at once
    work = Workload(ns.requests, ns.context, ns.heads, top_k, buffer_size, ns.steps, ns.locality, ns.seed,
                    ns.provider, ns.device, admission=ns.admission, release=ns.kernel_release,
                    kernel=not ns.no_kernel, draft_tokens=ns.draft_tokens)
    return _attend_run(ns, work, decisions)


def _attend_parser(policy):
    """attend's parser and the option strings of its own (workload) options."""
    parser = Parser(prog="hisparse attend",
                    description="A DSA decode workload end to end: the policy picks the decode backend, then every "
                                "step runs top-k -> hot buffer -> bridge -> kernel. HiSparse is on and the radix cache "
                                "off unless the flags say otherwise; top-k and hot-buffer size are SGLang's "
                                "--hisparse-config fields (defaults 2048 and 2 x top-k), checked by the policy with "
                                "the rest of the config. The hot buffer does what SGLang's does, and its figures are "
                                "SGLang's: hits, rows copied host -> device, new tokens written on the device.")
    add_policy_options(parser)
    from kernels_bridge.workload_spec import MAX_STEPS

    w = _Recorded(parser.add_argument_group("workload"))
    w.add_argument("--requests", type=int_arg, default=2, help="requests decoded together (default 2)")
    w.add_argument("--context", type=int_arg, default=4096,
                   help="tokens of KV per request at the start (default 4096); shorter than top-k: every "
                        "token is picked, as in SGLang")
    w.add_argument("--heads", type=int_arg, default=128, help="query heads: 64 or 128 (default 128)")
    for name, flag in WORKLOAD_INPUTS.items():
        if name not in policy.inputs:  # the policy does not declare it: attend's own option
            what = ("positions the indexer picks per step (default 2048; with --trace, the trace's)"
                    if name == "hisparse_top_k" else "hot-buffer slots per request, a multiple of 64 (default 2 x top-k)")
            w.add_argument(flag, dest=name, type=int_arg, default=None, help=what)
    w.add_argument("--steps", type=int_arg, default=8, help=f"decode steps (default 8, at most {MAX_STEPS:,})")
    w.add_argument("--locality", type=float, default=0.7,
                   help="share of the top-k kept from the previous step (default 0.7)")
    w.add_argument("--seed", type=int_arg, default=0, help="random seed, 0 to 2**63-1 (default 0)")
    w.add_argument("--provider", choices=("auto", "reference", "flashmla"), default="auto")
    w.add_argument("--device", default="cpu", help="where the hot buffer and kernels run: cpu, cuda or "
                                                   "cuda:N (default cpu)")
    w.add_argument("--max-memory", metavar="SIZE",
                   help="refuse a workload needing more (bytes, or 512M, 8G ...); default: half of the "
                        "memory this process can still take ($HISPARSE_MEMORY_LIMIT)")
    w.add_argument("--threads", type=bounded_int(1, usable_cpus(), CPUS_WHY), metavar="N",
                   help="torch CPU threads for the kernels, at most the CPUs this process may use (default: "
                        "torch's choice, every core; on a loaded machine 1 is often faster)")
    w.add_argument("--compare", action="store_true",
                   help="run the workload on an FP8 (fp8_e4m3) and a BF16 KV cache and report both side by "
                        "side: latency, memory, accuracy against dense float64")
    _hot_buffer_options(w)
    parser.add_argument("--format", choices=("text", "json"), default="text")
    return parser, w.options


def _hot_buffer_options(w) -> None:
    from kernels_bridge.layout import ADMISSIONS, KERNEL_RELEASES as RELEASES

    w.add_argument("--admission", choices=ADMISSIONS, default="normal",
                   help="how SGLang admits a request: normal (after its own prefill: the buffer starts with its "
                        "first tokens, warm; the default) or disaggregated (a decode node's: long requests start "
                        "cold, short ones preloaded from the host)")
    w.add_argument("--kernel-release", choices=RELEASES, default=RELEASES[0],
                   help="SGLang's swap-in kernel: 0.5.23 (0.5.21 and later; the default) or 0.5.12 (up to 0.5.20, "
                        "which counts and copies top-k - hits - newest rows)")
    w.add_argument("--draft-tokens", type=int_arg, default=0, metavar="N",
                   help="speculative decoding (MTP / EAGLE) with N = 2..4 draft tokens: every step verifies N "
                        "drafts through SGLang 0.5.23's CLOCK kernel (hisparse_spec.cuh), each with its own top-k "
                        "(at least 1024; N x top-k at most 8192); books only (--no-kernel or --trace)")
    w.add_argument("--no-kernel", action="store_true",
                   help="the hot buffer's books alone: no KV built, no kernel, no accuracy (fast at any size)")
    w.add_argument("--trace", metavar="FILE",
                   help="replay a decode trace (JSON Lines, one step a line: each request's id, seq_len and top-k; "
                        "docs/bridge.md) through the hot buffer: SGLang's hit rate and copies per step and in "
                        "total; no kernel runs (the trace carries no KV)")


def _with_sizes(policy, config: dict, top_k: int, buffer_size: int) -> dict:
    """The config with the workload's top-k and buffer size, where the policy reads them (it checks
    the workload it runs, not its defaults)."""
    for name, value in (("hisparse_top_k", top_k), ("hisparse_device_buffer_size", buffer_size)):
        if name in policy.inputs:
            config = _with(policy, config, name, value)
    return config


def _decisions(policy, config: dict, dtypes):
    """The decode decision for each KV cache dtype (None: the config's own), or an exit code when
    the policy rejects the config or chose a backend the bridge cannot run."""
    from kernels_bridge.backends import unsupported

    decisions = {}
    for dtype in dtypes:
        decision = policy.evaluate(config if dtype is None else _with(policy, config, "kv_cache_dtype", dtype))
        if not decision.ok:
            print(f"REJECTED by {policy.ref}" + (f" with --kv-cache-dtype={dtype}" if dtype else "")
                  + f": {decision.error}")
            return VIOLATION
        why = unsupported(decision)  # before torch is imported or anything is built
        if why is not None:
            print(f"hisparse attend: {why}", file=sys.stderr)
            return ERROR
        decisions[dtype or decision.config.get("kv_cache_dtype")] = decision
    return decisions


def _limit(ns, problems: list):
    """(max_bytes or None, where the limit comes from) from --max-memory."""
    from kernels_bridge.resources import parse_size

    if ns.max_memory is None:
        return None, "--max-memory"
    max_bytes = parse_size(ns.max_memory)
    if max_bytes is None:
        problems.append(f"--max-memory {shown(ns.max_memory)}: expected a size such as 1073741824, 512M or 8G")
    return max_bytes, "--max-memory"


def _attend_run(ns, work, decisions) -> int:
    """Check the workload (before torch), run it on each decision, print the reports."""
    from kernels_bridge.errors import BridgeError
    from kernels_bridge.resources import memory_budget

    problems = work.problems([d.backends.get("decode") for d in decisions.values()])
    if ns.threads is not None and ns.threads < 1:
        problems.append(f"--threads {ns.threads}: at least 1")
    max_bytes, limit = _limit(ns, problems)
    if problems:
        raise UsageError("hisparse attend: " + "; ".join(problems))
    try:
        if max_bytes is None and not ns.device.startswith("cuda"):  # a GPU's budget needs torch
            max_bytes, limit = memory_budget(None)
        if max_bytes is not None:
            work.check(max_bytes=max_bytes, limit=limit)
    except BridgeError as exc:
        print(f"hisparse attend: {exc}", file=sys.stderr)
        return ERROR
    torch = _torch(ns)
    if torch is None:
        return ERROR
    reports = {}
    for dtype, decision in decisions.items():
        report = _run_one(ns, work, decision, max_bytes, limit)
        if isinstance(report, int):
            return report
        reports[dtype] = report
    from kernels_bridge.workload_text import compare_text, report_text

    if ns.format == "json":
        emit_json({"compare": reports} if ns.compare else reports[next(iter(reports))])
    else:
        print(compare_text(reports) if ns.compare else report_text(reports[next(iter(reports))]))
    return OK


def _torch(ns):
    """torch, with --threads applied; None (after saying what to install) when it is missing."""
    try:
        import torch  # the bridge needs it; say so plainly when it is missing
    except ImportError as exc:
        print(f"hisparse attend: {BRIDGE_HINT} ({exc})", file=sys.stderr)
        return None
    if ns.threads is not None:
        torch.set_num_threads(ns.threads)
    return torch


def _run_one(ns, work, decision, max_bytes, limit):
    """One run's report, or an exit code after saying why it could not run."""
    from kernels_bridge.errors import BridgeError
    from kernels_bridge.workload import run

    building = Progress("building KV", 0, unit="rows", tenths=True)
    try:
        return run(decision, work, progress=Progress("step", ns.steps, delay=0.0), max_bytes=max_bytes,
                   limit=limit, build_progress=building)
    except BridgeError as exc:
        print(f"hisparse attend: {exc}", file=sys.stderr)
    except MemoryError:
        print("hisparse attend: out of memory while building the workload; make it smaller or lower "
              "--max-memory", file=sys.stderr)
    except RuntimeError as exc:  # torch's allocator (DefaultCPUAllocator, CUDA out of memory)
        text = str(exc)
        if "alloc" not in text.lower() and "out of memory" not in text.lower():
            raise
        print(f"hisparse attend: the device could not allocate the workload ({clip(text.splitlines()[0], 160)}); "
              "make it smaller or lower --max-memory", file=sys.stderr)
    finally:
        building.close()
    return ERROR


def _attend_trace(policy, config: dict, ns) -> int:
    """--trace: check the file, size the books from it, let the policy judge the config, replay."""
    from kernels_bridge.errors import BridgeError

    if ns.compare:
        raise UsageError("hisparse attend: --trace replays one trace; leave out --compare")
    if ns.draft_tokens not in (0, 2, 3, 4):
        raise UsageError(f"hisparse attend: --draft-tokens {ns.draft_tokens}: 2, 3 or 4 (SGLang's speculative hot buffer)")
    own_top_k = _given(policy, config, "hisparse_top_k", getattr(ns, "hisparse_top_k", None))
    buffer_size = _given(policy, config, "hisparse_device_buffer_size",
                         getattr(ns, "hisparse_device_buffer_size", None))
    problems = []
    max_bytes, limit = _limit(ns, problems)
    if problems:
        raise UsageError("hisparse attend: " + "; ".join(problems))
    if _torch(ns) is None:
        return ERROR
    from kernels_bridge.trace import scan
    from kernels_bridge.trace_replay import replay

    try:
        info = scan(ns.trace, own_top_k, draft_tokens=ns.draft_tokens)
        buffer_size = 2 * info.top_k if buffer_size is None else buffer_size
        if buffer_size < info.top_k or buffer_size % 64:
            raise UsageError(f"hisparse attend: --hisparse-device-buffer-size {buffer_size}: a multiple of 64 "
                             f"and at least the trace's top-k ({info.top_k})")
        decisions = _decisions(policy, _with_sizes(policy, config, info.top_k, buffer_size), (None,))
        if isinstance(decisions, int):
            return decisions
        progress = Progress("step", info.steps, delay=0.0)
        report = replay(next(iter(decisions.values())), info, buffer_size, admission=ns.admission,
                        release=ns.kernel_release, device=ns.device, max_bytes=max_bytes, progress=progress,
                        draft_tokens=ns.draft_tokens)
    except BridgeError as exc:
        print(f"hisparse attend: {exc}", file=sys.stderr)
        return ERROR
    from kernels_bridge.workload_text import trace_text

    if ns.format == "json":
        emit_json(report)
    else:
        print(trace_text(report))
    return OK


class _Recorded:
    """An argument group that remembers the option strings added to it (argparse keeps them in
    private attributes only)."""

    def __init__(self, group):
        self.group, self.options = group, set()

    def add_argument(self, *args, **kwargs):
        action = self.group.add_argument(*args, **kwargs)
        self.options.update(action.option_strings)
        return action


def colliding_inputs(policy, own: set) -> list:
    """E309 at the input's file:line:col for each flag of a policy input that is one of attend's
    own options (the workload knobs above). The policy language leaves these names free, since
    only this command uses them: a policy may take --steps as an SGLang flag and still serve
    every engine command, but attend cannot parse it, so attend refuses it, naming the input."""
    doc = getattr(policy, "doc", None)
    problems = []
    for name, spec in policy.inputs.items():
        spellings = [(flag, ("flags", i), False) for i, flag in enumerate(spec.flags)]
        spellings += [(flag, (field, flag), True) for field, flags in (("deprecated_flags", spec.deprecated),
                                                                       ("removed_flags", spec.removed))
                      for flag in flags]
        for flag, where, key in spellings:
            clash = [f for f in (flag, "--no-" + flag[2:]) if f in own and (f == flag or spec.type == "bool")]
            if not clash:
                continue
            message = (f"input '{name}' takes the flag {clash[0]}, an option of hisparse attend's own; "
                       "attend cannot run this policy (rename the flag; other commands are unaffected)")
            path = spec.path + where if spec.phase is None else spec.path
            problems.append(doc.problem("E309", message, path, key=key) if doc is not None
                            else Problem("E309", message, policy.file))
    return problems


def _with(policy, config: dict, name: str, value) -> dict:
    """The config with input `name` set to `value`, whatever spelling gave it before."""
    out = {k: v for k, v in config.items() if policy.canonical_key(k) != name}
    out[name] = value
    return out


def _given(policy, config: dict, name: str, own):
    """A workload knob's value when it was typed (attend's own flag, or the policy input's flag),
    else None."""
    if own is not None or name not in policy.inputs:
        return own
    return next((v for k, v in config.items() if policy.canonical_key(k) == name), None)


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
    parser = Parser(prog="hisparse doctor",
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
        emit_json(report)
    else:
        print(render_doctor(report))
    return OK if report["bridge"]["usable"] else ERROR  # torch is missing: the install is incomplete


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


register("attend", cmd_attend, "run a synthetic HiSparse decode workload through the policy's backend")
register("doctor", cmd_doctor, "what the kernel bridge can run here, and why")


def main(argv=None) -> int:
    """`hisparse`: the engine's commands and the bridge's."""
    return engine_main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
