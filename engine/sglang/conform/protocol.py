"""What passes between the policy side of `conform` and a driver that runs one SGLang release.

A driver turns a `Case` (what an operator would type, on which machine, for which model) into a
`Result` (what that SGLang release did with it). Drivers differ by SGLang generation; the policy
side never looks inside them."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    """One launch, as an operator would run it."""

    argv: tuple[str, ...]  # server arguments as typed, without --model-path (the driver adds it)
    architecture: str  # the model's HF architecture, e.g. "DeepseekV32ForCausalLM"
    platform: str  # "cuda" | "hip" | "npu" (the driver passes --device npu)
    capability: tuple[int, int]  # GPU compute capability, e.g. (9, 0)
    model_extra: tuple[tuple[str, object], ...] = ()  # extra config.json fields (sorted pairs)
    env: tuple[tuple[str, str], ...] = ()  # environment variables set for the launch (sorted pairs)
    reads: tuple[str, ...] = ()  # ServerArgs fields read back into Result.values, as resolved
    routing: str = "dsa"  # the model class whose routing log lines are kept (registry.ROUTING)


@dataclass(frozen=True)
class Result:
    """What SGLang did with a Case."""

    ok: bool  # start-up ran to its end without an error
    message: str | None  # str() of the exception (argparse: its error text), None when ok
    kv_cache_dtype: str | None  # resolved as SGLang resolves it (None where it never resolved)
    backends: tuple[str | None, str | None]  # resolved (prefill, decode)
    log: tuple[str, ...]  # SGLang's routing log lines, in order
    stage: str  # where it stopped: parser | resolve | check | hisparse_config | done
    where: str | None = None  # innermost SGLang frame of the raise: "srt/arg_groups/x.py:107 func"
    error_type: str | None = None  # the exception's class name (SystemExit for parser errors)
    values: tuple[tuple[str, object], ...] = ()  # the Case's `reads`, resolved: (field, value) pairs
    extra: dict = field(default_factory=dict, compare=False)  # driver notes (not compared)


def is_routing_record(record, functions, deprecated=("--nsa-",)) -> bool:
    """Whether a log record is a routing log line: a WARNING from one of `functions`, and, for
    argparse_actions' deprecation notice, one about a flag that routing reads (`deprecated`: parts
    of the flags' names; SGLang prints that notice for every deprecated flag given, most of them
    not routing's)."""
    import logging

    if record.levelno != logging.WARNING or record.funcName not in functions:
        return False
    return record.funcName != "print_deprecated_warning" or any(d in record.getMessage() for d in deprecated)
