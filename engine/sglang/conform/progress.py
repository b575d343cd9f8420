"""A progress line for long runs: redrawn in place on a terminal, occasional full lines elsewhere
(a log file or CI output never gets `\\r`-glued lines)."""
from __future__ import annotations

import time


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Progress:
    """`update(done)` as work completes, `close()` at the end (also after an interruption)."""

    def __init__(self, stream, total: int, label: str = "conform", *, every: float | None = None,
                 clock=time.monotonic):
        self.stream, self.total, self.label, self.clock = stream, total, label, clock
        isatty = getattr(stream, "isatty", None)
        try:
            self.tty = bool(isatty()) if isatty else False
        except (ValueError, OSError):  # a closed stream
            self.tty = False
        # a terminal is redrawn up to 10 times a second; a file gets a line per 10% or 30 s
        self.every = every if every is not None else (0.1 if self.tty else 30.0)
        self.start = self.last = clock()
        self.done = 0
        self.shown_step = 0
        self.width = 0
        self.closed = False

    def line(self) -> str:
        elapsed = self.clock() - self.start
        pct = 100 * self.done // self.total if self.total else 100
        text = f"{self.label}: {self.done}/{self.total} launches ({pct}%), {_duration(elapsed)}"
        if self.done and elapsed > 0:
            rate = self.done / elapsed
            text += f", {rate:.0f}/s" if rate >= 10 else f", {rate:.1f}/s"
            if self.done < self.total:
                text += f", eta {_duration((self.total - self.done) / rate)}"
        return text

    def update(self, done: int) -> None:
        self.done = done
        if self.stream is None or self.closed:
            return
        now = self.clock()
        if self.tty:
            if now - self.last >= self.every:
                self._draw()
                self.last = now
            return
        step = 10 * done // self.total if self.total else 10
        if (step > self.shown_step and done < self.total) or now - self.last >= self.every:
            self.shown_step = max(step, self.shown_step)
            self._write(self.line() + "\n")
            self.last = now

    def close(self) -> None:
        if self.stream is None or self.closed:
            return
        self.closed = True
        if self.tty:
            self._draw()
            self._write("\n")
        else:
            self._write(self.line() + "\n")

    def _draw(self) -> None:
        text = self.line()
        pad = max(0, self.width - len(text))
        self.width = len(text)
        self._write("\r" + text + " " * pad)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream never stops the run
            self.closed = True
