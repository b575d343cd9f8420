"""A progress line for long jobs, the same for every command (diff and table over a domain, attend's
steps, conform's launches): on a terminal one line redrawn in place, at most 10 times a second;
elsewhere (a log, a pipe, CI output) whole lines, so a log never reads `step 5/8step 6/8`.
`Waiting` is the same line for a step that cannot count (conform importing SGLang): the seconds
it has taken."""
from __future__ import annotations

import sys
import time

REDRAW = 0.1  # seconds between two redraws of a terminal line


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Progress:
    """`progress(done)` (or `progress(done, total)`) as work completes, `close()` at the end, also
    after an interruption.

    The line reads `label done/total`, or with a `unit` `label: done/total unit (pct%), elapsed,
    rate, eta`. Nothing is shown within `delay` seconds of the start, so a quick job stays quiet.
    Off a terminal a line is written at most every `every` seconds, and with `tenths` also each
    time another tenth of the total is done. With `summary`, close() always writes the last state
    (a run's closing line); without it a job's end closes the line only if one was shown."""

    def __init__(self, label: str, total: int, *, stream=None, delay: float = 1.0, every: float = 10.0,
                 unit: str = "", tenths: bool = False, summary: bool = False, clock=time.monotonic):
        self.label, self.total, self.unit = label, total, unit
        self.stream, self.delay, self.every, self.tenths, self.summary = stream, delay, every, tenths, summary
        self.clock = clock
        self.tty = self._isatty()
        self.start = clock()
        self.done = 0
        self.shown_at = None  # when a line was last written
        self.tenth = 0  # the last tenth a line was written for
        self.width = 0  # of the terminal line drawn last
        self.drawn = False  # a terminal line is waiting for its newline
        self.closed = False

    def _out(self):
        s = self.stream or sys.stderr
        return getattr(s, "raw", s)  # the line writes its own control (\r): never escaped

    def _isatty(self) -> bool:
        try:
            return bool(self._out().isatty())
        except (AttributeError, OSError, ValueError):  # no isatty, or a closed stream
            return False

    def line(self) -> str:
        if not self.unit:
            return f"{self.label} {self.done}/{self.total}"
        elapsed = self.clock() - self.start
        pct = 100 * self.done // self.total if self.total else 100
        text = f"{self.label}: {self.done}/{self.total} {self.unit} ({pct}%), {duration(elapsed)}"
        if self.done and elapsed > 0:
            rate = self.done / elapsed
            text += f", {rate:.0f}/s" if rate >= 10 else f", {rate:.1f}/s"
            if self.done < self.total:
                text += f", eta {duration((self.total - self.done) / rate)}"
        return text

    def __call__(self, done: int, total: int | None = None) -> None:
        if total is not None:
            self.total = total
        self.done = done
        if self.closed:
            return
        now = self.clock()
        if done >= self.total and not self.summary:  # the end: close a line that was shown
            if self.shown_at is not None:
                self._show(now, end=True)
                self.closed = True
            return
        if self.shown_at is None:
            due = now - self.start >= self.delay
        else:
            due = now - self.shown_at >= (REDRAW if self.tty else self.every)
        tenth = 10 * done // self.total if self.total else 10
        if self.tenths and not self.tty and tenth > self.tenth and done < self.total:
            due = due or now - self.start >= self.delay
        if due:
            self.tenth = max(tenth, self.tenth)
            self._show(now)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.summary:
            self._show(self.clock(), end=True)
        elif self.drawn:
            self._write("\n")
            self.drawn = False

    def _show(self, now: float, end: bool = False) -> None:
        self.shown_at = now
        text = self.line()
        if self.tty:
            pad = max(0, self.width - len(text))  # a shorter line must not leave the old one's tail
            self.width = len(text)
            self._write("\r" + text + " " * pad + ("\n" if end else ""))
            self.drawn = not end
        else:
            self._write(text + "\n")

    def _write(self, text: str) -> None:
        try:
            out = self._out()
            out.write(text)
            out.flush()
        except (AttributeError, OSError, ValueError):  # a closed or broken stream never stops the job
            self.closed = True


class Waiting(Progress):
    """`with Waiting(label):` around a step that cannot count its progress: `label... 0s` at once,
    then the time taken, redrawn every second on a terminal and written every `every` seconds
    elsewhere, and a closing line when the step ends (however it ends)."""

    def __init__(self, label: str, *, stream=None, every: float = 10.0, clock=time.monotonic):
        import threading  # here: only a step that waits starts a thread (a cold evaluate never does)

        super().__init__(label, 0, stream=stream, delay=0.0, every=every, clock=clock)
        self._stop = threading.Event()
        self._ticker = None

    def line(self) -> str:
        return f"{self.label}... {duration(self.clock() - self.start)}"

    def __enter__(self):
        import threading

        self._show(self.clock())
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self._ticker.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(1.0 if self.tty else self.every) and not self.closed:
            self._show(self.clock())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._ticker.join()
        if not self.closed:
            self._show(self.clock(), end=True)
            self.closed = True
