"""Where the command line writes: standard streams that escape terminal controls, turn write
failures into one clear error, and a progress line that suits the stream it goes to.

Every text the CLI prints passes through `SafeStream.write`, so a control character in a policy
message, a config key or a model path is shown as an escape (engine.values.escape) and can never
redraw or recolour the operator's terminal. A stream that cannot be written (closed, EBADF,
ENOSPC on /dev/full) raises OutputError for stdout; errors on stderr are dropped, there being
nowhere left to report them. A broken pipe stays BrokenPipeError (the reader left: not an error).
"""
from __future__ import annotations

import os
import sys
import time

from engine.errors import EngineError
from engine.values import escape


class OutputError(EngineError):
    """Standard output cannot be written (exit 2)."""


class SafeStream:
    def __init__(self, raw, name: str, strict: bool):
        self.raw = raw  # None when the descriptor was closed before Python started
        self.name = name
        self.strict = strict  # stdout: failures are errors; stderr: they are dropped

    def _fail(self, exc: BaseException | None):
        if not self.strict:
            return None
        why = "it is closed" if exc is None else (getattr(exc, "strerror", None) or str(exc))
        raise OutputError(f"cannot write to {self.name}: {why}") from None

    def write(self, text: str):
        if self.raw is None:
            return self._fail(None)
        try:
            return self.raw.write(escape(text))
        except BrokenPipeError:
            if self.strict:
                raise
        except (OSError, ValueError) as exc:  # ValueError: I/O on a closed file
            return self._fail(exc)
        return None

    def flush(self) -> None:
        if self.raw is None:
            return
        try:
            self.raw.flush()
        except BrokenPipeError:
            if self.strict:
                raise
        except (OSError, ValueError) as exc:
            self._fail(exc)

    def isatty(self) -> bool:
        try:
            return self.raw is not None and self.raw.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name):  # encoding, fileno, buffer ... of the stream underneath
        if self.raw is None:
            raise AttributeError(name)
        return getattr(self.raw, name)


def silence(raw) -> None:
    """Point a failed stream's descriptor at /dev/null, so that what its buffer still holds is
    dropped quietly when Python flushes it at exit (instead of a second error there)."""
    try:
        fd = raw.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except (AttributeError, OSError, ValueError):
        pass


class Progress:
    """`label done/total` on stderr while a long job runs. On a terminal one line redrawn in place
    (at most 10 times a second); elsewhere (a log, a pipe) whole lines, at most one every
    `every` seconds, so a log reads `step 5/8` lines and never `step 5/8step 6/8`. Nothing is
    shown for a job that ends within `delay` seconds."""

    def __init__(self, label: str, total: int, delay: float = 1.0, every: float = 10.0, stream=None):
        self.label, self.total = label, total
        self.stream = stream
        self.tty = self._stream_isatty()
        self.start = time.monotonic()
        self.delay, self.every = delay, every
        self.shown_at = None  # when the last line was written
        self.drawn = False  # a terminal line is waiting for its newline

    def _out(self):
        s = self.stream or sys.stderr
        return getattr(s, "raw", s)  # progress writes its own control (\r): not escaped

    def _stream_isatty(self) -> bool:
        try:
            return bool(self._out().isatty())
        except (AttributeError, OSError, ValueError):
            return False

    def __call__(self, done: int, total: int | None = None) -> None:
        total = self.total if total is None else total
        now = time.monotonic()
        if now - self.start < self.delay and done < total:
            return
        gap = 0.1 if self.tty else self.every
        if self.shown_at is not None and now - self.shown_at < gap and done < total:
            return
        if done >= total and self.shown_at is None:
            return  # finished before anything was shown: nothing to close
        self.shown_at = now
        text = f"{self.label} {done}/{total}"
        if self.tty:
            self._write(f"\r{text}" + ("\n" if done >= total else ""))
            self.drawn = done < total
        else:
            self._write(text + "\n")

    def close(self) -> None:
        if self.drawn:
            self._write("\n")
            self.drawn = False

    def _write(self, text: str) -> None:
        try:
            out = self._out()
            out.write(text)
            out.flush()
        except (AttributeError, OSError, ValueError):
            pass  # progress is a courtesy: a stderr that fails must not stop the work
