"""Reading streams that might never end, with bounds: which files may be read as a stream (a
regular file, a pipe, a FIFO, a terminal on stdin; never a device such as /dev/zero), lines of a
bounded length, and the files records may be appended to."""
from __future__ import annotations

import os
import stat
import sys

from engine.errors import ConfigError, Problem


MAX_LINE_FACTOR = 64  # a line may run to 64 times the line limit before the input is given up


def lines_of(stream, limit: int):
    """The lines of `stream` (bytes, or str for a text stream), each at most `limit` bytes; a
    longer line is skipped without being held in memory and given as TOO_LONG, or as RUNAWAY
    (and the end) when no newline comes within MAX_LINE_FACTOR * limit bytes."""
    step = min(limit + 1, 1 << 16)  # a line is gathered a bounded chunk at a time
    while True:
        line = stream.readline(step)
        if not line:
            return
        newline = b"\n" if isinstance(line, bytes) else "\n"
        if len(line) == step and step <= limit and not line.endswith(newline):
            line = _rest_of_line(stream, line, limit, newline)
        if line is None or (len(line) > limit and not line.endswith(newline)):
            skipped, ended = (limit + 1 if line is None else len(line)), False
            while skipped <= MAX_LINE_FACTOR * limit:  # drop the rest, a bounded chunk at a time
                more = stream.readline(1 << 16)
                skipped += len(more)
                if not more or more.endswith(newline):
                    ended = True
                    break
            if not ended:
                yield RUNAWAY
                return
            yield TOO_LONG
        else:
            yield line


def _rest_of_line(stream, start, limit: int, newline):
    """`start` and what follows it up to a newline, at most limit + 1 characters, or None for a
    line this process cannot hold (a limit raised past its memory): then it is skipped as too
    long."""
    parts, size = [start], len(start)
    try:
        while size <= limit:
            more = stream.readline(min(limit + 1 - size, 1 << 16))
            if not more:
                break
            parts.append(more)
            size += len(more)
            if more.endswith(newline):
                break
        return start[:0].join(parts)
    except MemoryError:
        return None


TOO_LONG = object()
RUNAWAY = object()


def numbered_lines(stream, limit: int, what: str, source: str):
    """(line number, line) for each line of lines_of(stream, limit); a read that fails is C504
    naming `what` and `source` (only reading: what the caller does with a line is its own)."""
    lines = lines_of(stream, limit)
    number = 0
    while True:
        try:
            line = next(lines, None)
        except OSError as exc:
            raise ConfigError([Problem("C504", f"cannot read {what}: {exc.strerror or exc}", source)]) from None
        if line is None:
            return
        number += 1
        yield number, line


def open_stream(what: str, source: str):
    """A binary stream to read `source` ('-' = stdin) from: a regular file, a pipe or a FIFO (they
    end when their writer does; a named FIFO waits for its writer), or a terminal on stdin.
    A device or socket given by name, or on stdin a device that is not a terminal (/dev/zero),
    would never end and is refused with C504."""
    if source == "-":
        if sys.stdin is None:
            raise ConfigError([Problem("C504", f"cannot read {what}: standard input is closed", "-")])
        stream = getattr(sys.stdin, "buffer", sys.stdin)
        try:
            fd = stream.fileno()
            mode = os.fstat(fd).st_mode
        except (AttributeError, OSError, ValueError):
            return stream  # not a descriptor (an in-process caller's stream): read it as it is
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)):
            raise ConfigError([Problem("C504", f"cannot read {what}: standard input is {kind_of(mode)}, "
                                       "which never ends", "-", hint="redirect a file or a pipe")])
        return stream
    from engine.files.reading import ReadError, open_checked

    try:  # a regular file, or a FIFO waited for; a directory or device is refused unread
        fd = open_checked(source, source, "give a regular file or a pipe", fifo=True, code="C504")
    except ReadError as exc:
        raise ConfigError([Problem(p.code, p.message.replace("cannot read file", f"cannot read {what}"), p.file,
                                   p.line, p.col, p.hint) for p in exc.problems]) from None
    return os.fdopen(fd, "rb")


def kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISFIFO, "a pipe")):
        if test(mode):
            return name
    return "a special file"


def check_record_target(path: str) -> None:
    """Refuse, before anything runs, a record file that append_records could not append to: a
    FIFO (the append would wait for a reader forever), a device (it would swallow the records), a
    file this process may not read and write (append_records reads its last byte), or a new file
    in a folder that does not exist or that it may not write in. Raises ConfigError (C504)."""
    def refuse(why: str, hint: str = "name a file in a folder that exists and that this process may write in"):
        raise ConfigError([Problem("C504", f"cannot append records to this file: {why}", path, hint=hint)])

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except ValueError:
        raise ConfigError([Problem("C504", "cannot open the record file: the path holds a NUL byte", path)]) from None
    except OSError as exc:
        raise ConfigError([Problem("C504", f"cannot open the record file: {exc.strerror or exc}", path)]) from None
    if mode is not None:
        if not stat.S_ISREG(mode):
            refuse(f"it is {kind_of(mode)}; a record file is a regular file", hint="")
        if not _may(path, os.R_OK | os.W_OK):
            refuse("this process may not write to it (permission denied, or a read-only file system)")
        return
    folder = os.path.dirname(os.path.abspath(path))
    try:
        folder_mode = os.stat(folder).st_mode
    except OSError as exc:
        refuse(f"its folder {folder} {'does not exist' if isinstance(exc, FileNotFoundError) else exc.strerror}")
    if not stat.S_ISDIR(folder_mode):
        refuse(f"{folder} is not a folder")
    if not _may(folder, os.W_OK | os.X_OK):
        refuse(f"this process may not create files in its folder {folder} (permission denied, or a "
               "read-only file system)")


def _may(path: str, mode: int) -> bool:
    """os.access with the effective ids where the platform has them (as open() checks)."""
    if os.access in os.supports_effective_ids:
        return os.access(path, mode, effective_ids=True)
    return os.access(path, mode)
