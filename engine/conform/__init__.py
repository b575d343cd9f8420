"""`hisparse conform`: run the installed SGLang's own start-up code on every config of a policy's
domain (or a stratified sample) and compare what it does with what the policy says.

The package never imports SGLang (or torch) at import time: a driver does, inside `hisparse conform`
and its worker processes only."""
from __future__ import annotations

import time

from . import sample as _sample
from .cases import case_of
from .report import compare


class SGLangUnavailable(Exception):
    """SGLang cannot be imported, or its release is one no driver knows (exit 2)."""


def conform(policy, where: dict | None = None, sample: int | None = None, seed: int = 0,
            workers: int | None = None, progress=None) -> dict:
    """Run SGLang on the configs and compare; the JSON form of the report (see report.compare)."""
    from .runner import driver_for, installed_sglang, run_cases

    version, reason = installed_sglang()
    if version is None:
        raise SGLangUnavailable(reason)
    driver = driver_for(version)  # raises SGLangUnavailable for an unknown release
    axes = _sample.axes(policy, where)
    total = _sample.size(axes)
    if sample is not None and sample < total:
        configs = _sample.stratified(axes, sample, seed)
    else:
        configs = list(_sample.whole(axes))
    cases = [case_of(policy, c) for c in configs]
    start = time.perf_counter()
    results = run_cases(driver, cases, workers=workers, progress=progress)
    seconds = time.perf_counter() - start
    result = compare(policy, configs, cases, results, sampled=len(configs) < total)
    up = policy.upstream
    warning = None
    if up is None:
        warning = f"{policy.ref} does not say which SGLang it models (no upstream: in the policy)"
    elif up.version != version:
        warning = f"{policy.ref} models {up.label()}; the installed SGLang is {version}"
    result.update({
        "policy": dict(policy.identity(), upstream=up.label() if up else None),
        "sglang": version,
        "warning": warning,
        "where": dict(where or {}),
        "domain_size": total,
        "sample": {"n": len(configs), "seed": seed} if len(configs) < total else None,
        "seconds": round(seconds, 1),
    })
    return result
