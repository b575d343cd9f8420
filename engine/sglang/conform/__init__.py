"""`hisparse conform`: run the installed SGLang's own start-up code on every config of a policy's
domain (or a stratified sample) and compare what it does with what the policy says.

The package never imports SGLang (or torch) at import time: a driver does, inside `hisparse conform`
and its worker processes only."""
from __future__ import annotations

import os
import time

import engine.sglang.conform.sample as _sample
from engine.errors import EngineError
from engine.sglang.conform.cases import cases_of
from engine.sglang.conform.report import compare


class SGLangUnavailable(EngineError):
    """SGLang cannot be imported, or its release is one no driver knows (exit 2)."""


def conform(policy, where: dict | None = None, sample: int | None = None, seed: int = 0,
            workers: int | None = None, progress=None, case_timeout: float | None = None) -> dict:
    """Run SGLang on the configs and compare; the JSON form of the report (see report.compare).
    case_timeout: seconds one launch may take (default runner.CASE_TIMEOUT); a launch that takes
    longer stops the run with runner.CaseTimedOut."""
    from engine.sglang.conform.drivers import UnknownVersion, driver_for, installed_sglang, note
    from engine.sglang.conform.runner import CASE_TIMEOUT, run_cases

    if progress is None:
        version, reason = installed_sglang()
    else:  # importing SGLang takes tens of seconds on a CPU machine: say so while it does
        from engine.progress import Waiting

        with Waiting("conform: importing SGLang", stream=progress):
            version, reason = installed_sglang()
    if version is None:
        raise SGLangUnavailable(reason)
    try:
        driver = driver_for(version)
    except UnknownVersion as exc:
        raise SGLangUnavailable(str(exc)) from None
    configs, total = _sample.configs_of(policy, where, sample, seed)
    launches = [cases_of(policy, c) for c in configs]  # a non-DSA config: one per model kind
    start = time.perf_counter()
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    # configs that differ only in inputs SGLang never sees (the model family of a non-DSA model)
    # are the same launch: each distinct launch runs once
    unique = list(dict.fromkeys(case for group in launches for case in group))
    ran = dict(zip(unique, run_cases(driver, unique, workers=workers, progress=progress,
                                          case_timeout=case_timeout or CASE_TIMEOUT)))
    results = [tuple(ran[c] for c in group) for group in launches]
    seconds = time.perf_counter() - start
    result = compare(policy, configs, launches, results, sampled=len(configs) < total)
    up = policy.upstream
    warning = None
    if up is None:
        warning = f"{policy.ref} does not say which SGLang it models (no upstream: in the policy)"
    elif not up.models(version):
        warning = f"{policy.ref} models {up.label()}; the installed SGLang is {version}"
    driver_note = note(version)
    if driver_note:
        warning = f"{driver_note}; {warning}" if warning else driver_note
    result.update({
        "policy": dict(policy.identity(), upstream=up.label() if up else None),
        "sglang": version,
        "driver": driver.__name__,
        "warning": warning,
        "where": dict(where or {}),
        "domain_size": total,
        "sample": {"n": len(configs), "seed": seed} if len(configs) < total else None,
        "launches": len(unique),
        "workers": workers,
        "seconds": round(seconds, 1),
    })
    return result
