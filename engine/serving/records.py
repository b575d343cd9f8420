"""Decision records (`--record FILE`) and their replay against another policy.

A record is one JSON line: UTC time, the policy's identity (family, version, sha256 of the file),
the input as the user gave it (keys as spelled, the model path and SGLang's options; replay reads
it as every source is read), and the decision. Appends are atomic: each record is written with
one write() on a file opened for appending, under an exclusive lock, so concurrent writers
(threads or processes) never interleave or truncate lines; an append that fails part-way (a full
disk, a file size limit) is cut back to the size the file had, so it leaves no torn line; and a
file whose last line is torn (an older writer that crashed) gets a newline first, so a new record
is never glued to it.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import stat

from engine.analysis.outcomes import CLASSES, classify, describe, outcome_of, outcome_of_error, outcome_of_record
from engine.errors import ConfigError, Problem
from engine.values import clip, kind
from engine.sglang.given import config_of

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: O_APPEND alone keeps single writes whole
    fcntl = None


def record_line(decision, given=None) -> bytes:
    """One record. `given`: what the user gave (engine.sglang.given.Given.given), keys as spelled, so
    that a replay against a version with other names reads it as that version would; default:
    the config the decision was asked for."""
    from engine.analysis.capability import decision_json

    policy = decision.policy
    rec = {
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "policy": policy.identity(),
        "input": dict(decision.input if given is None else given),
        "decision": decision_json(decision),
    }
    return (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def append_records(path: str, decisions, inputs=None) -> int:
    """Append one record per decision (`inputs`: what the user gave for each, see record_line);
    returns how many. Raises ConfigError when the file cannot be written."""
    decisions = list(decisions)
    inputs = list(inputs) if inputs is not None else [None] * len(decisions)
    data = b"".join(record_line(d, g) for d, g in zip(decisions, inputs))
    if not data:
        return 0
    try:
        # read and write: the last byte is read (is the last line whole?) through the same open file
        # O_NONBLOCK: a FIFO planted at the path never blocks the open; it is refused below
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o644)
    except ValueError:
        raise ConfigError([Problem("C504", "cannot open the record file: the path holds a NUL byte", path)]) from None
    except OSError as exc:
        raise ConfigError([Problem("C504", f"cannot open the record file: {exc.strerror or exc}", path)]) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # a FIFO would take the record with no one to read it, a device lose it
        os.close(fd)
        from engine.files.streams import kind_of

        raise ConfigError([Problem("C504", f"cannot append records to {kind_of(mode)}: a record file is a "
                                   "regular file (nothing was appended)", path)])
    os.set_blocking(fd, True)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size  # under the lock: where this append starts
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # a torn last line stays on its own line (replay reports it)
        try:
            view = memoryview(data)
            while view:  # a regular file takes it in one write; loop for the pathological case
                written = _write(fd, view)
                view = view[written:]
        except OSError as exc:
            raise ConfigError([Problem("C504", f"cannot write the record file: {exc.strerror or exc}"
                                       f"{_cut_back(fd, size)}", path)]) from None
    except OSError as exc:  # the lock or the size
        raise ConfigError([Problem("C504", f"cannot write the record file: {exc.strerror or exc}", path)]) from None
    finally:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                pass
        os.close(fd)
    return len(decisions)


_write = os.write  # one place for the tests to make a write fail part-way


def _cut_back(fd: int, size: int) -> str:
    """Truncate a failed append back to `size` (still under the lock): the file is as it was."""
    try:
        os.ftruncate(fd, size)
    except OSError as exc:
        return f"; the file could not be cut back to its {size} bytes ({exc.strerror or exc}): its last line is torn"
    return " (nothing was appended)"


MAX_RECORDS = 1_000_000  # records one replay reads; --max-records raises it


def _bad(path: str, number: int, what: str, torn: bool) -> Problem:
    if torn:
        return Problem("C505", f"torn record: the file ends inside this line, without its newline ({what})",
                       path, number, 1, hint="an append that did not finish; the other records are replayed")
    return Problem("C505", what, path, number, 1)


def read_records(path: str, max_records: int = MAX_RECORDS):
    """Yield (line number, record or None, problem or None) for each line. The file is a regular
    file or a pipe (a device such as /dev/zero is refused); each line is read with the reader's
    limits (HISPARSE_MAX_FILE_BYTES, 64-bit integers, depth) and its fields are checked, so a
    tampered record is a C505 problem of its own line; more than `max_records` records stop the
    replay with C505."""
    from engine.files.streams import RUNAWAY, TOO_LONG, numbered_lines, open_stream
    from engine.files.json_reader import parse_json
    from engine.files.reading import ReadError, max_file_bytes

    limit = max_file_bytes()
    stream = open_stream("the record file", path)
    records = 0
    with stream:
        for number, line in numbered_lines(stream, limit, "the record file", path):
            torn = isinstance(line, bytes) and not line.endswith(b"\n")  # only the last line can lack one
            if line is RUNAWAY or line is TOO_LONG:
                yield number, None, Problem("C505", f"a record longer than {limit} bytes "
                                            "(HISPARSE_MAX_FILE_BYTES)", path, number, 1)
                if line is RUNAWAY:
                    return
                continue
            try:
                text = line.decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                yield number, None, _bad(path, number, f"not UTF-8 (byte {exc.start + 1})", torn)
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
                p = exc.problems[0]
                where = f" at column {p.col}" if p.col else ""
                yield number, None, _bad(path, number, f"not a JSON record ({p.message}{where})", torn)
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
    d = rec["decision"]
    if not isinstance(d.get("ok"), bool):
        return f"decision.ok: expected true or false, got {kind(d.get('ok'))}"
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
    scope = d.get("out_of_scope")
    if scope is not None and not (isinstance(scope, dict) and all(isinstance(scope.get(k), str) for k in ("where", "why"))):
        return "decision.out_of_scope: expected an object with string 'where' and 'why'"
    na = d.get("not_applicable", [])
    if not isinstance(na, list) or not all(isinstance(x, str) for x in na):
        return "decision.not_applicable: expected a list of input names"
    incapable = d.get("incapable", [])
    if not isinstance(incapable, list) or not all(isinstance(x, dict) for x in incapable):
        return "decision.incapable: expected a list of objects"
    for key, value in d.items():
        if key not in ("backends", "log", "violations", "sources", "policy", "out_of_scope", "not_applicable",
                       "incapable") \
                and not isinstance(value, _SCALARS):
            return f"decision.{clip(key)}: expected a string, number, boolean or null, got {kind(value)}"
    if "policy" in rec and not isinstance(rec["policy"], (dict, type(None))):
        return f"policy: expected an object, got {kind(rec['policy'])}"
    return None


def replay(path: str, policy, max_examples: int = 3, max_records: int = MAX_RECORDS) -> dict:
    """Re-evaluate every recorded input with `policy`; classify what would change (diff's classes)."""
    counts = dict.fromkeys(CLASSES, 0)
    groups: dict = {}
    problems: list[Problem] = []
    total = out_of_scope = 0
    for number, rec, problem in read_records(path, max_records):
        if problem is not None:
            problems.append(problem)
            continue
        total += 1
        old = outcome_of_record(rec["decision"])
        try:  # read as every source is: spellings, model path and options as the user gave them
            new = outcome_of(policy.evaluate(config_of(policy, rec["input"])[0]))
        except ConfigError as exc:
            new = outcome_of_error(exc)
        out_of_scope += new.scope is not None
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
        "out_of_scope": out_of_scope,  # re-evaluated decisions outside what the policy models
        "counts": counts,
        "groups": ordered,
        "examples": [g["example"] for g in ordered][:max_examples * len(CLASSES)],
        "problems": [p.to_dict() for p in problems],
    }


def _said(o) -> str:
    scope = " (out of scope)" if o.scope is not None and o.scope is not ... else ""
    if o.accepted:
        return "accepted " + " ".join(f"{k}={v}" for k, v in o.backends) + scope
    return ("invalid config: " if o.status == "error" else "rejected: ") + str(o.message) + scope

