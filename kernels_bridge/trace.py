"""Decode traces for `hisparse attend --trace FILE`: what SGLang's hot buffer does on a real
top-k stream, replayed step by step through a HotBuffer that keeps the books without rows.

The format is JSON Lines, one decode step a line (blank lines are skipped):

    {"requests": [{"id": 0, "seq_len": 4097, "top_k": [12, 4096, 7, -1]}, ...], "finished": [3]}

- ``requests``: the requests decoded this step, each with ``id`` (an int >= 0, SGLang's request
  slot; distinct within a line), ``seq_len`` (its length this step, >= 1, never below its previous
  one) and ``top_k`` (the indexer's picks: positions < seq_len, -1 for padding; every row of a
  trace has the same width, the top-k).
- ``finished`` (optional): the requests that finish after this step (SGLang's
  ``request_finished``); an id may come back as a new request.

A request's first line admits it with a prefill of seq_len - 1 tokens.

With speculative decoding (`hisparse attend --trace FILE --draft-tokens N`) each line is a target
verify: ``seq_len`` is the request's committed length L (its first line admits it with a prefill
of L tokens), ``top_k`` is N rows, one per draft token, and draft i's positions are below
L + i + 1; the next line of a request has its seq_len grown by the drafts accepted, 1 to N.

Nothing else is allowed:
an unknown field, a wrong type or a value out of range is an error naming the line and the field.
The file is read twice: once to check every line (nothing runs on a bad trace) and size the
buffer, once to replay it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterator, List, Optional

import torch

from kernels_bridge.errors import ValidationError, shown
from kernels_bridge.validate import INT32_MAX

__all__ = ["TraceError", "TraceInfo", "Step", "scan", "steps"]

MAX_SEQ_LEN = INT32_MAX
_LINE_FIELDS = ("requests", "finished")
_REQUEST_FIELDS = ("id", "seq_len", "top_k")


class TraceError(ValidationError):
    """A trace line the replay cannot take; the message is FILE:LINE: field: what is wrong."""


@dataclass
class TraceInfo:
    """What a checked trace holds: its steps, the largest request id + 1, the longest seq_len,
    the top-k (the rows' width) and how many requests it admits."""
    path: str
    steps: int = 0
    num_requests: int = 0
    max_seq_len: int = 0
    top_k: Optional[int] = None
    admitted: int = 0
    draft_tokens: int = 0


@dataclass
class Step:
    """One line of a trace, checked: ids and seq_lens [n], positions int32 [n, top_k] (with draft
    tokens [n, draft_tokens, top_k])."""
    line: int
    req_ids: torch.Tensor
    seq_lens: torch.Tensor
    positions: torch.Tensor
    finished: List[int] = field(default_factory=list)


def _fail(path: str, line: int, where: str, message: str) -> TraceError:
    return TraceError(f"{path}:{line}: {where}: {message}", argument="trace")


def _int(value, path, line, where, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path, line, where, f"got {shown(value)}; expected an integer")
    if not low <= value <= high:
        raise _fail(path, line, where, f"got {value}; expected {low} <= {where.rsplit('.', 1)[-1]} <= {high}")
    return value


def _positions(row, seq_len: int, path, line, where) -> torch.Tensor:
    if not isinstance(row, list):
        raise _fail(path, line, where, f"got {shown(row)}; expected a list of positions")
    bad = next((i for i, p in enumerate(row) if isinstance(p, bool) or not isinstance(p, int)), None)
    if bad is not None:
        raise _fail(path, line, f"{where}[{bad}]", f"got {shown(row[bad])}; expected an integer position")
    try:
        values = torch.tensor(row, dtype=torch.int64)
    except (OverflowError, RuntimeError, ValueError):  # a value past int64
        bad = next(i for i, p in enumerate(row) if not -1 <= p < seq_len)
        values = None
    else:
        wrong = ((values < -1) | (values >= seq_len)).nonzero()
        bad = int(wrong[0, 0]) if wrong.numel() else None
    if bad is not None:
        raise _fail(path, line, f"{where}[{bad}]", f"got {row[bad]}; expected -1 (padding) or a position "
                    f"0 <= p < seq_len {seq_len}")
    return values.to(torch.int32)


def _read(path: str, info: TraceInfo) -> Iterator[Step]:
    """Every step of the file, each line checked against the trace so far (`info` is updated)."""
    live: dict = {}  # request id -> its last seq_len
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror or exc})", argument="trace") from None
    with fh:
        for number, text in enumerate(fh, 1):
            if not text.strip():
                continue
            yield _line(path, number, text, info, live)


def _line(path: str, number: int, text: str, info: TraceInfo, live: dict) -> Step:
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise _fail(path, number, "line", f"not JSON ({exc})") from None
    if not isinstance(record, dict):
        raise _fail(path, number, "line", f"got {shown(record)}; expected an object {{\"requests\": [...]}}")
    unknown = [k for k in record if k not in _LINE_FIELDS]
    if unknown:
        raise _fail(path, number, unknown[0], f"unknown field; a line has {', '.join(_LINE_FIELDS)}")
    requests = record.get("requests")
    if not isinstance(requests, list):
        raise _fail(path, number, "requests", f"got {shown(requests)}; expected a list of requests")
    ids, lens, rows = [], [], []
    for i, req in enumerate(requests):
        r, L, row = _request(path, number, f"requests[{i}]", req, info, live)
        if r in ids:
            raise _fail(path, number, f"requests[{i}].id", f"request {r} is already in this line")
        ids.append(r)
        lens.append(L)
        rows.append(row)
    for r, L in zip(ids, lens):
        info.admitted += r not in live
        live[r] = L
    finished = _finished(path, number, record.get("finished", []), live)
    info.steps += 1
    width = (info.draft_tokens, info.top_k or 0) if info.draft_tokens else (info.top_k or 0,)
    positions = torch.stack(rows) if rows else torch.empty((0, *width), dtype=torch.int32)
    return Step(number, torch.tensor(ids, dtype=torch.int64), torch.tensor(lens, dtype=torch.int64),
                positions, finished)


def _request(path, number, where, req, info: TraceInfo, live: dict):
    if not isinstance(req, dict):
        raise _fail(path, number, where, f"got {shown(req)}; expected an object with {', '.join(_REQUEST_FIELDS)}")
    for name in _REQUEST_FIELDS:
        if name not in req:
            raise _fail(path, number, f"{where}.{name}", "missing")
    unknown = [k for k in req if k not in _REQUEST_FIELDS]
    if unknown:
        raise _fail(path, number, f"{where}.{unknown[0]}", f"unknown field; a request has {', '.join(_REQUEST_FIELDS)}")
    r = _int(req["id"], path, number, f"{where}.id", 0, INT32_MAX)
    L = _int(req["seq_len"], path, number, f"{where}.seq_len", 1, MAX_SEQ_LEN)
    if L < live.get(r, 0):
        raise _fail(path, number, f"{where}.seq_len", f"{L} is below request {r}'s previous {live[r]}; a request "
                    f"only grows until it is finished")
    N = info.draft_tokens
    if N:
        if r in live and not 1 <= L - live[r] <= N:
            raise _fail(path, number, f"{where}.seq_len", f"{L} after request {r}'s {live[r]}; a speculative step "
                        f"commits 1 to {N} drafts")
        row = _draft_rows(req["top_k"], L, N, path, number, f"{where}.top_k")
    else:
        row = _positions(req["top_k"], L, path, number, f"{where}.top_k")
    if info.top_k is None:
        if row.shape[-1] == 0:
            raise _fail(path, number, f"{where}.top_k", "empty; expected the indexer's top-k positions")
        info.top_k = row.shape[-1]
    elif row.shape[-1] != info.top_k:
        raise _fail(path, number, f"{where}.top_k", f"{row.shape[-1]} positions; every row of the trace has "
                    f"the top-k's {info.top_k}")
    info.num_requests = max(info.num_requests, r + 1)
    info.max_seq_len = max(info.max_seq_len, L + N)  # the drafts' positions need host rows too
    return r, L, row


def _draft_rows(rows, L: int, N: int, path, number, where) -> torch.Tensor:
    """N rows of positions, draft i's below L + i + 1, of one width: int32 [N, width]."""
    if not isinstance(rows, list) or len(rows) != N or not all(isinstance(x, list) for x in rows):
        raise _fail(path, number, where, f"got {shown(rows)}; expected {N} lists of positions (one per draft "
                    f"token, --draft-tokens {N})")
    out = [_positions(row, L + i + 1, path, number, f"{where}[{i}]") for i, row in enumerate(rows)]
    if len({t.numel() for t in out}) != 1:
        raise _fail(path, number, where, f"rows of {', '.join(str(t.numel()) for t in out)} positions; every "
                    f"draft's row has the same width, the top-k")
    return torch.stack(out)


def _finished(path, number, finished, live: dict) -> List[int]:
    if not isinstance(finished, list):
        raise _fail(path, number, "finished", f"got {shown(finished)}; expected a list of request ids")
    out = []
    for i, r in enumerate(finished):
        r = _int(r, path, number, f"finished[{i}]", 0, INT32_MAX)
        if r not in live:
            raise _fail(path, number, f"finished[{i}]", f"request {r} is not running")
        del live[r]
        out.append(r)
    return out


def scan(path: str, top_k: Optional[int] = None, draft_tokens: int = 0) -> TraceInfo:
    """Check every line of the trace (the first error raises TraceError); `top_k`: the width every
    row must have (default: the first row's); `draft_tokens`: N rows per request a line."""
    info = TraceInfo(path, top_k=top_k, draft_tokens=draft_tokens)
    for _ in _read(path, info):
        pass
    if info.steps == 0:
        raise TraceError(f"{path}: no steps; expected one JSON object a line", argument="trace")
    if info.top_k is None:
        raise TraceError(f"{path}: no request in any step", argument="trace")
    return info


def steps(path: str, top_k: int, draft_tokens: int = 0) -> Iterator[Step]:
    """The steps of a trace scan() accepted."""
    return _read(path, TraceInfo(path, top_k=top_k, draft_tokens=draft_tokens))
