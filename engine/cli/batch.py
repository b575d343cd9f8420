"""`hisparse evaluate --batch`: one decision per line of a JSON Lines source, in order."""
from __future__ import annotations

import sys

from engine.errors import ConfigError, Problem
from engine.cli.options import ERROR, OK, VIOLATION, emit_json
from engine.values import kind, one_line


def run_batch(policy, base: list, said: list, source: str, fmt: str, record: str | None = None,
              model=None) -> int:
    """Evaluate each line of a JSON Lines source. Lines are read as bytes and decoded one by one,
    at most HISPARSE_MAX_FILE_BYTES each, so a bad line (not UTF-8, too long, not JSON) gets its
    own error object and every other line is still evaluated, in order. The source is a regular
    file or a pipe (stdin, a FIFO, `<(...)`): a device such as /dev/zero never ends and is refused,
    and a line running on for MAX_LINE_FACTOR times the limit without a newline stops the batch."""
    from engine.files.streams import RUNAWAY, MAX_LINE_FACTOR, numbered_lines, open_stream
    from engine.files.reading import max_file_bytes

    stream = open_stream("batch input" if source == "-" else "batch file", source)

    worst = OK
    try:
        for number, line in numbered_lines(stream, max_file_bytes(), "batch input", source):
            if line is RUNAWAY:
                raise ConfigError([Problem("C505", f"line {number}: more than {MAX_LINE_FACTOR * max_file_bytes()} "
                                           "bytes without a newline; stopped reading", source,
                                           hint="one JSON object per line")])
            result, status, decision, given = batch_line(policy, base, said, line, number, model)
            if record and decision is not None:
                from engine.serving.records import append_records

                append_records(record, [decision], [given])
            worst = max(worst, status)
            if fmt == "json":
                emit_json(result)
            elif "error" in result:
                print(f"line {number}: ERROR {result['error']['code']}: {one_line(result['error']['message'])}")
            elif result["ok"]:
                chosen = " ".join(f"{ph}={result[spec.input]}" for ph, spec in policy.phases.items())
                print(f"line {number}: ok {one_line(chosen)}")
            else:
                print(f"line {number}: REJECTED {one_line(result['violations'][0]['message'])}")
            if source == "-":  # a pipe: answer each line as it comes
                sys.stdout.flush()
    finally:
        if source != "-":
            stream.close()
    return worst


def batch_line(policy, base, said, line, number: int, model=None):
    def bad(problems):
        first = problems[0]
        err = {"code": first.code, "message": first.message}
        if first.hint:
            err["hint"] = first.hint
        if len(problems) > 1:
            err["more"] = [p.to_dict() for p in problems[1:]]
        return {"ok": False, "line": number, "error": err}, ERROR, None, None

    from engine.files.streams import TOO_LONG

    if line is TOO_LONG:
        from engine.files.reading import max_file_bytes

        return bad([Problem("C505", f"line longer than {max_file_bytes()} bytes (HISPARSE_MAX_FILE_BYTES)")])
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            return bad([Problem("C505", f"not UTF-8 text (byte 0x{line[exc.start]:02x} at column "
                                        f"{exc.start + 1})")])
    if not line.strip():
        return bad([Problem("C505", "empty line (one JSON object per line)")])
    from engine.files.json_reader import parse_json
    from engine.files.reading import ReadError

    try:  # the reader's limits: depth, size, NaN, 64-bit integers, duplicate keys
        obj = parse_json(line.rstrip("\r\n"), f"line {number}").data
    except ReadError as exc:
        p = exc.problems[0]
        message = p.message
        if message.startswith("JSON syntax: "):
            message = "not JSON: " + message[len("JSON syntax: "):]
        return bad([Problem("C505", message + (f" at column {p.col}" if p.col else ""))])
    if not isinstance(obj, dict):
        return bad([Problem("C505", f"a line holds one JSON object, got {kind(obj)}")])
    try:  # the line is one more source, read as every other source is
        from engine.sglang.given import combine
        from engine.sglang.layers import read_layer

        layer = read_layer(policy, obj, f"line {number}")
        g = combine(policy, base + [layer], model)
        d = policy.evaluate(g.config)
    except ConfigError as exc:
        return bad(exc.problems)
    for note in g.notes:
        if note not in said:
            print(f"note: line {number}: {one_line(note)}", file=sys.stderr)
    from engine.analysis.capability import decision_json

    out = decision_json(d)
    out["line"] = number
    return out, (OK if d.ok else VIOLATION), d, g.given

