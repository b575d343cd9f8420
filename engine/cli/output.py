"""Where the command line writes: standard streams that escape terminal controls, turn write
failures into one clear error (the progress line is engine/progress.py).

Every text the CLI prints passes through `SafeStream.write`, so a control character in a policy
message, a config key or a model path is shown as an escape (engine.values.escape) and can never
redraw or recolour the operator's terminal. A stream that cannot be written (closed, EBADF,
ENOSPC on /dev/full) raises OutputError for stdout; errors on stderr are dropped, there being
nowhere left to report them. A broken pipe (the reader left: `| head`, `| true`) is not an error
and not a verdict either: stdout is pointed at /dev/null, `reader_gone` is set, and the command
runs on to its own exit code, so a rejected config or a difference never exits 0 because the
reader went away.
"""
from __future__ import annotations

import os
import sys

from engine.errors import EngineError
from engine.values import escape


class OutputError(EngineError):
    """Standard output cannot be written (exit 2)."""


class SafeStream:
    def __init__(self, raw, name: str, strict: bool):
        self.raw = raw  # None when the descriptor was closed before Python started
        self.name = name
        self.strict = strict  # stdout: failures are errors; stderr: they are dropped
        self.reader_gone = False  # a pipe whose reader left: the rest of the output is dropped

    def _fail(self, exc: BaseException | None):
        if not self.strict:
            return None
        why = "it is closed" if exc is None else (getattr(exc, "strerror", None) or str(exc))
        raise OutputError(f"cannot write to {self.name}: {why}") from None

    def _left(self) -> None:
        """The reader left: drop what is buffered and everything after (the exit code is still
        the command's verdict)."""
        self.reader_gone = True
        silence(self.raw)

    def write(self, text: str):
        if self.raw is None:
            return self._fail(None)
        if self.reader_gone:
            return None
        try:
            return self.raw.write(escape(text))
        except BrokenPipeError:
            self._left()
        except (OSError, ValueError) as exc:  # ValueError: I/O on a closed file
            return self._fail(exc)
        return None

    def flush(self) -> None:
        if self.raw is None or self.reader_gone:
            return
        try:
            self.raw.flush()
        except BrokenPipeError:
            self._left()
            try:  # what the buffer held now goes to /dev/null
                self.raw.flush()
            except (OSError, ValueError):
                pass
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
