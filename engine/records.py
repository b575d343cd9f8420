"""Decision records (`--record FILE`) and their replay against another policy.

A record is one JSON line: UTC time, the policy's identity (family, version, sha256 of the file),
the input config (canonical keys), and the decision. Appends are atomic: each record is written
with one write() on a file opened for appending, under an exclusive lock, so concurrent writers
(threads or processes) never interleave or truncate lines.
"""
from __future__ import annotations

import datetime as _dt
import json
import os

from .compare import CLASSES, classify, describe, outcome_of, outcome_of_error, outcome_of_record
from .errors import ConfigError, Problem, clip

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: O_APPEND alone keeps single writes whole
    fcntl = None


def record_line(decision) -> bytes:
    policy = decision.policy
    rec = {
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "policy": policy.identity(),
        "input": policy.normalize(decision.input),
        "decision": decision.to_dict(),
    }
    return (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def append_records(path: str, decisions) -> int:
    """Append one record per decision; returns how many. Raises ConfigError when the file cannot
    be written."""
    data = b"".join(record_line(d) for d in decisions)
    if not data:
        return 0
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError([Problem("C504", f"cannot open the record file: {exc.strerror or exc}", path)]) from None
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(data)
        while view:  # a regular file takes it in one write; loop for the pathological case
            written = os.write(fd, view)
            view = view[written:]
    except OSError as exc:
        raise ConfigError([Problem("C504", f"cannot write the record file: {exc.strerror or exc}", path)]) from None
    finally:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    return data.count(b"\n")


MAX_RECORDS = 1_000_000  # records one replay reads; --max-records raises it


def read_records(path: str, max_records: int = MAX_RECORDS):
    """Yield (line number, record or None, problem or None) for each line. The file is a regular
    file or a pipe (a device such as /dev/zero is refused); each line is read with the reader's
    limits (HISPARSE_MAX_FILE_BYTES, 64-bit integers, depth) and its fields are checked, so a
    tampered record is a C505 problem of its own line; more than `max_records` records stop the
    replay with C505."""
    from .streams import RUNAWAY, TOO_LONG, lines_of, open_stream
    from .yaml_reader import ReadError, max_file_bytes, parse_json

    limit = max_file_bytes()
    stream = open_stream("the record file", path)
    records = 0
    with stream:
        lines = lines_of(stream, limit)
        number = 0
        while True:
            try:
                line = next(lines, None)
            except OSError as exc:
                raise ConfigError([Problem("C504", f"cannot read the record file: {exc.strerror or exc}",
                                           path)]) from None
            if line is None:
                return
            number += 1
            if line is RUNAWAY or line is TOO_LONG:
                yield number, None, Problem("C505", f"a record longer than {limit} bytes "
                                            "(HISPARSE_MAX_FILE_BYTES)", path, number, 1)
                if line is RUNAWAY:
                    return
                continue
            try:
                text = line.decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                yield number, None, Problem("C505", f"not UTF-8 ({exc.reason} at column {exc.start + 1})",
                                            path, number, exc.start + 1)
                continue
            if not text:
                continue
            records += 1
            if records > max_records:
                raise ConfigError([Problem("C505", f"more than {max_records} records; stopped reading",
                                           path, number, 1, hint="raise the bound with --max-records")])
            try:
                rec = parse_json(text, path).data
            except ReadError as exc:
                yield number, None, Problem("C505", f"not a JSON record: {exc.problems[0].message}", path,
                                            number, exc.problems[0].col or 1)
                continue
            problem = record_problem(rec)
            if problem:
                yield number, None, Problem("C505", problem, path, number, 1)
                continue
            yield number, rec, None


_SCALARS = (str, int, float, bool, type(None))


def record_problem(rec) -> str | None:
    """What is wrong with a record's shape (None when nothing is): the fields replay reads must
    have the types --record writes, so a tampered record is refused by name, never crashes."""
    if not isinstance(rec, dict) or not isinstance(rec.get("input"), dict) \
            or not isinstance(rec.get("decision"), dict):
        return "a record has 'input' and 'decision' objects"
    for key, value in rec["input"].items():
        if not isinstance(value, _SCALARS):
            return f"input.{clip(key)}: expected a string, number, boolean or null, got {_kind(value)}"
    d = rec["decision"]
    if not isinstance(d.get("ok"), bool):
        return f"decision.ok: expected true or false, got {_kind(d.get('ok'))}"
    backends = d.get("backends", {})
    if not isinstance(backends, dict) or not all(isinstance(v, (str, type(None))) for v in backends.values()):
        return "decision.backends: expected an object of phase -> backend name or null"
    log = d.get("log", [])
    if not isinstance(log, list) or not all(isinstance(x, str) for x in log):
        return "decision.log: expected a list of strings"
    violations = d.get("violations", [])
    if not isinstance(violations, list) or not all(
            isinstance(v, dict) and isinstance(v.get("message"), (str, type(None)))
            and isinstance(v.get("check"), (str, type(None))) for v in violations):
        return "decision.violations: expected a list of objects with string 'check' and 'message'"
    for key, value in d.items():
        if key not in ("backends", "log", "violations", "sources", "policy") and not isinstance(value, _SCALARS):
            return f"decision.{clip(key)}: expected a string, number, boolean or null, got {_kind(value)}"
    if "policy" in rec and not isinstance(rec["policy"], (dict, type(None))):
        return f"policy: expected an object, got {_kind(rec['policy'])}"
    return None


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def replay(path: str, policy, max_examples: int = 3, max_records: int = MAX_RECORDS) -> dict:
    """Re-evaluate every recorded input with `policy`; classify what would change (diff's classes)."""
    counts = dict.fromkeys(CLASSES, 0)
    groups: dict = {}
    problems: list[Problem] = []
    total = 0
    for number, rec, problem in read_records(path, max_records):
        if problem is not None:
            problems.append(problem)
            continue
        total += 1
        old = outcome_of_record(rec["decision"])
        try:
            new = outcome_of(policy.evaluate(rec["input"]))
        except ConfigError as exc:
            new = outcome_of_error(exc)
        cls, key = classify(old, new)
        if cls is None:
            continue
        counts[cls] += 1
        g = groups.setdefault((cls, key), {"class": cls, "change": describe(cls, key), "count": 0,
                                           "lines": [], "example": None, "recorded_policy": rec.get("policy")})
        g["count"] += 1
        if len(g["lines"]) < 50:
            g["lines"].append(number)
        if g["example"] is None:
            g["example"] = {"line": number, "input": rec["input"], "recorded": _said(old), "now": _said(new)}
    ordered = sorted(groups.values(), key=lambda g: (CLASSES.index(g["class"]), -g["count"]))
    return {
        "policy": policy.identity(),
        "equivalent": not any(counts.values()),
        "total": total,
        "counts": counts,
        "groups": ordered,
        "examples": [g["example"] for g in ordered][:max_examples * len(CLASSES)],
        "problems": [p.to_dict() for p in problems],
    }


def _said(o) -> str:
    if o.accepted:
        return "accepted " + " ".join(f"{k}={v}" for k, v in o.backends)
    return ("invalid config: " if o.status == "error" else "rejected: ") + str(o.message)


def replay_text(result: dict) -> str:
    p = result["policy"]
    head = f"replay against {p['family']}@{p['version']}"
    if result["equivalent"]:
        text = f"{head}: all {result['total']} recorded decisions stay the same"
    else:
        changed = sum(result["counts"].values())
        text = (f"{head}: {changed} of {result['total']} recorded decisions would change ("
                + ", ".join(f"{c} {n}" for c, n in result["counts"].items() if n) + ")")
    lines = [text]
    for g in result["groups"]:
        more = " ..." if g["count"] > len(g["lines"]) else ""
        lines.append(f"{g['class']} {g['count']}: {g['change']} (lines {', '.join(map(str, g['lines'][:10]))}"
                     f"{' ...' if len(g['lines']) > 10 else more})")
        ex = g["example"]
        lines.append(f"    e.g. line {ex['line']}: {ex['recorded']}  =>  {ex['now']}")
    for prob in result["problems"]:
        lines.append(f"{prob['file']}:{prob['line']}:{prob['col']}: {prob['code']}: {prob['message']}")
    return "\n".join(lines)
