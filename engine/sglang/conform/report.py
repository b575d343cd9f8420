"""Comparing a policy's decisions with what SGLang did, and the report of `hisparse conform`.

Per config, the policy side and the SGLang side agree when they agree on acceptance; for an
accepted config, on the resolved KV dtype and both backends; for a rejected one, on the first
violation's message against the exception's text, and on its rule's `raises` against the
exception's type; and, either way, on the routing log lines in
order (for a rejected config, the lines logged before the raise). A config SGLang rejects at a
place the policy declares it leaves out (`upstream.leaves_out`), and that the decision itself says
is out of scope (Decision.in_scope, from the same entries' `when`), is out of scope, counted apart.
Differences are grouped by what differs, and each group is reduced to a few patterns over the
inputs, as `diff` does."""
from __future__ import annotations

import itertools

from engine.analysis.outcomes import cube_json, cube_text, factor, minimize, minimize_known
from engine.values import show

FIELDS = ("acceptance", "message", "exception", "kv_cache_dtype", "backends", "values", "log")


def sides(policy, decision, result) -> tuple[dict, dict]:
    """The comparable fields of each side: acceptance, the first refusal, the KV dtype, the
    prefill and decode backends, the other fields the policy decides (`values`: those the driver
    read back, Case.reads) and the log."""
    b = decision.backends
    # SGLang's prefill and decode backends: a DSA policy's are SGLang's DSA fields (Result.backends);
    # a family whose prefill and decode phases are other fields (MiniMax-M3: prefill_attention_backend,
    # decode_attention_backend) is compared on those, read back with the rest (Case.reads); a family
    # with neither (DeepSeek-V4) compares its phases among the values
    own = "dsa" in policy.models or any(ph in policy.phases for ph in ("prefill", "decode"))
    compared = {"kv_cache_dtype"} | {policy.phases[ph].input for ph in ("prefill", "decode") if ph in policy.phases}
    # an input the decision leaves unset is SGLang's own default there (chunked_prefill_size: the
    # GPU's), which the policy does not model: not compared
    theirs_values = tuple((f, v) for f, v in result.values
                          if f not in compared and decision.config.get(f) is not None)
    read = dict(result.values)
    their_backends = tuple(
        read[policy.phases[ph].input] if ph in policy.phases and policy.phases[ph].input in read else found
        for ph, found in zip(("prefill", "decode"), result.backends)) if own else ()
    ours = {"ok": decision.ok, "message": decision.error, "kv_cache_dtype": decision.config.get("kv_cache_dtype"),
            "backends": (b.get("prefill"), b.get("decode")) if own else (), "log": tuple(decision.log),
            "values": tuple((f, decision.config.get(f)) for f, _ in theirs_values)}
    if not decision.ok:
        first = decision.violations[0]
        ours["check"], ours["exception"] = first.check, first.raises
    theirs = {"ok": result.ok, "message": result.message, "kv_cache_dtype": result.kv_cache_dtype,
              "backends": their_backends, "log": tuple(result.log), "where": result.where,
              "stage": result.stage, "exception": result.error_type, "values": theirs_values}
    return ours, theirs


def differing(ours: dict, theirs: dict) -> list[str]:
    """The fields on which the two sides differ (empty: they agree)."""
    if ours["ok"] != theirs["ok"]:
        out = ["acceptance"]
    elif ours["ok"]:
        out = [f for f in ("kv_cache_dtype", "backends", "values") if ours[f] != theirs[f]]
    else:
        out = [f for f in ("message", "exception") if ours[f] != theirs[f]]
    if ours["log"] != theirs["log"]:
        out.append("log")
    return out


def _out_of_scope(policy, decision, result) -> str | None:
    """Why a config on which the two sides differ is out of scope, or None (a difference). SGLang
    must have refused it at a place the version leaves out, and the decision must say it is out of
    scope: the same `leaves_out` data decides both, so conform and evaluate never disagree. (An
    entry without `when` names a place only: a refusal there counts as out of scope, as no
    decision can say which configs reach it.)"""
    entry = left_out_entry(policy.upstream, result.where) if policy.upstream and not result.ok else None
    if entry is None:
        return None
    if not decision.in_scope:
        return entry[1]
    return None if entry[2] else entry[1]


def left_out_entry(upstream, where: str | None) -> tuple | None:
    """The entry of upstream.leaves_out, (where, why, has a when), whose place `where`
    ("path/file.py:LINE function", where SGLang refused a config) lies in, or None."""
    if not where:
        return None
    path, _, rest = where.partition(":")
    func = rest.split(" ", 1)[1] if " " in rest else ""
    for entry in upstream.leaves_out:
        p_path, _, p_func = entry[0].partition(":")
        # a suffix at a path boundary: "hook.py" is not "kv_cache_hook.py"
        if (path == p_path or path.endswith("/" + p_path)) and (not p_func or p_func == func):
            return entry
    return None


def _function(where: str | None) -> str:
    """"srt/arg_groups/x.py:107 func" -> "x.py:func" (line numbers would split alike groups)."""
    if not where:
        return "?"
    path, _, rest = where.partition(":")
    return path.rsplit("/", 1)[-1] + ":" + (rest.split(" ", 1)[1] if " " in rest else rest)


def group_key(fields: list[str], ours: dict, theirs: dict) -> tuple:
    """What alike differences share: the fields, and for each the rule or values involved."""
    parts = []
    for f in fields:
        if f == "acceptance":
            parts.append(("acceptance", ours.get("check") or "accepted",
                          "accepted" if theirs["ok"] else _function(theirs["where"])))
        elif f == "message":
            parts.append(("message", ours.get("check"), _function(theirs["where"])))
        elif f == "exception":
            parts.append(("exception", ours["exception"], theirs["exception"]))
        elif f == "backends":
            parts += [(ph, a, b) for ph, a, b in zip(("prefill", "decode"), ours["backends"], theirs["backends"])
                      if a != b]
        elif f == "kv_cache_dtype":
            parts.append(("kv_cache_dtype", ours[f], theirs[f]))
        elif f == "values":
            parts += [(name, a, b) for (name, a), (_, b) in zip(ours["values"], theirs["values"]) if a != b]
        else:  # log: which side has more lines, and the rule that decided the policy's outcome
            parts.append(("log", ours.get("check") or ("accepted" if ours["ok"] else ""),
                          (len(ours["log"]) > len(theirs["log"])) - (len(ours["log"]) < len(theirs["log"]))))
    return tuple(parts)


def _field(part: str) -> str:
    """The compared field a part of a group key is about: its own name, or backends for a phase
    (prefill, decode), or values for another field the policy decides (page_size, ...)."""
    if part in FIELDS:
        return part
    return "backends" if part in ("prefill", "decode") else "values"


def describe(key: tuple) -> str:
    words = []
    for part in key:
        if part[0] == "acceptance":
            words.append(f"policy {'accepts' if part[1] == 'accepted' else 'rejects (' + part[1] + ')'}, "
                         f"SGLang {'accepts' if part[2] == 'accepted' else 'rejects (' + part[2] + ')'}")
        elif part[0] == "message":
            words.append(f"both reject, other message (policy {part[1]}, SGLang {part[2]})")
        elif part[0] == "log":
            more = {1: "the policy logs more lines", -1: "SGLang logs more lines", 0: "other log lines"}[part[2]]
            words.append(f"log lines differ ({more})")
        else:
            words.append(f"{part[0]} {show(part[1])} (policy) vs {show(part[2])} (SGLang)")
    return "; ".join(words)


def _example(names, combo, case, ours, theirs) -> dict:
    def side(s):
        out = {"ok": s["ok"]}
        if s["ok"]:
            out["kv_cache_dtype"] = s["kv_cache_dtype"]
            if s["backends"]:  # a DSA policy's (another class's phases are among the values)
                out["backends"] = {"prefill": s["backends"][0], "decode": s["backends"][1]}
            if s["values"]:
                out["values"] = dict(s["values"])
        else:
            out["message"], out["exception"] = s["message"], s["exception"]
        out["log"] = list(s["log"])
        if "check" in s:
            out["check"] = s["check"]
        if s.get("where"):
            out["where"] = s["where"]
        return out

    out = {"config": dict(zip(names, combo)), "argv": list(case.argv), "architecture": case.architecture,
           "platform": case.platform, "capability": list(case.capability),
           "policy": side(ours), "sglang": side(theirs)}
    if case.env:
        out["env"] = dict(case.env)
    return out


def _verdict(policy, decision, cases, results):
    """(key, case, ours, theirs, differing fields) of a config run as one or more launches (a
    non-DSA config: one per model kind), or None when every launch agrees. A launch that differs
    in scope decides; else one out of scope does."""
    found = None
    for case, result in zip(cases, results):
        ours, theirs = sides(policy, decision, result)
        diff = differing(ours, theirs)
        if not diff:
            continue
        why = _out_of_scope(policy, decision, result)
        if why is None:
            return ("differ",) + group_key(diff, ours, theirs), case, ours, theirs, diff
        if found is None:
            found = ("out_of_scope", _function(result.where), why), case, ours, theirs, diff
    return found


def compare(policy, configs: list[dict], cases: list, results: list, sampled: bool) -> dict:
    """The JSON form of the comparison (a contract): counts, groups, examples. cases[i] and
    results[i]: the launch of configs[i] and what SGLang did, or tuples of them (one per model)."""
    names = list(policy.input_names)
    domains = [spec.domain() for spec in policy.inputs.values()]
    counts = {"agree": 0, "differ": 0, "out_of_scope": 0}
    fields = dict.fromkeys(FIELDS, 0)
    grouped: dict = {}
    known = set()
    for config, case, result in zip(configs, cases, results):
        combo = tuple(config[n] for n in names)
        known.add(combo)
        several = isinstance(case, tuple)
        found = _verdict(policy, policy.evaluate(config), case if several else (case,),
                         result if several else (result,))
        if found is None:
            counts["agree"] += 1
            continue
        key, case, ours, theirs, diff = found
        counts[key[0]] += 1
        if key[0] == "differ":
            for f in diff:
                fields[f] += 1
        entry = grouped.setdefault(key, {"points": [], "example": None})
        entry["points"].append(combo)
        if entry["example"] is None:
            entry["example"] = _example(names, combo, case, ours, theirs)
    groups, out_of_scope = [], []
    for key, entry in sorted(grouped.items(), key=lambda kv: -len(kv[1]["points"])):
        cubes = (minimize_known(entry["points"], known, domains) if sampled or policy.domain_parts
                 else minimize(entry["points"], domains))
        common, rests = factor(cubes, domains)
        many = len(cubes) > 1
        group = {"count": len(entry["points"]),
                 "patterns": [cube_json(c, names, domains) for c in cubes],
                 "where": cube_text(common, names, domains, empty="") if many else "",
                 "text": [cube_text(c, names, domains) for c in (rests if many else cubes)],
                 "example": entry["example"]}
        if key[0] == "out_of_scope":
            out_of_scope.append(dict(group, at=key[1], why=key[2]))
        else:
            groups.append(dict(group, change=describe(key[1:]), fields=[_field(p[0]) for p in key[1:]]))
    return {"total": len(configs), "counts": counts, "fields": fields, "conformant": counts["differ"] == 0,
            "groups": groups, "out_of_scope": out_of_scope}

