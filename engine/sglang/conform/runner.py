"""Run many cases through a driver on forked workers.

The parent loads the driver once (SGLang's import and warm-up, 5-8 s), then forks the workers,
which inherit the imports and the case list; only case indices and Results cross the pipes.
Results come back in input order. Ctrl-C stops the workers and re-raises KeyboardInterrupt; a
worker that dies raises WorkerCrashed naming the case it was running; a driver that raises
(instead of returning a Result) raises DriverError naming the case."""
from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
import traceback
from collections import deque

from engine.errors import EngineError
from engine.sglang.conform.drivers import resolve
from engine.progress import Progress


def describe(case) -> str:
    argv = " ".join(case.argv)
    extra = f", model {dict(case.model_extra)}" if case.model_extra else ""
    return (f"{case.architecture} on {case.platform} SM{case.capability[0]}{case.capability[1]}"
            f"{extra}: {argv or '(no arguments)'}")


class WorkerCrashed(EngineError, RuntimeError):
    """A worker process died while running a case."""

    def __init__(self, index: int, case, exitcode):
        self.index, self.case, self.exitcode = index, case, exitcode
        if exitcode is not None and exitcode < 0:
            try:
                how = f"killed by {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"killed by signal {-exitcode}"
        else:
            how = f"exit code {exitcode}"
        super().__init__(f"conform worker died ({how}) on case {index}: {describe(case)}")


class DriverError(EngineError, RuntimeError):
    """The driver raised on a case instead of returning a Result."""

    def __init__(self, index: int, case, detail: str):
        self.index, self.case, self.detail = index, case, detail
        super().__init__(f"the driver failed on case {index} ({describe(case)}): {detail}")


CASE_TIMEOUT = 120.0  # seconds one launch may take (one costs milliseconds; SGLang stuck is not a result)


class CaseTimedOut(EngineError, RuntimeError):
    """A case ran longer than the timeout: SGLang's code hung on it (the worker is stopped)."""

    def __init__(self, index: int, case, seconds: float):
        self.index, self.case, self.seconds = index, case, seconds
        super().__init__(f"SGLang ran for more than {seconds:g} s on case {index} and was stopped "
                         f"(--case-timeout): {describe(case)}")


class _Alarm(BaseException):
    """Raised in this process by the timer of an in-process run; never a driver's result."""


def _run_one(driver, index, case):
    try:
        return True, driver.run_case(case)
    except (KeyboardInterrupt, _Alarm):
        raise
    except BaseException as exc:  # sent back as text: the exception may not pickle
        tail = traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:]
        return False, f"{type(exc).__name__}: {exc}\n{''.join(tail)}"


def _worker(driver, cases, conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    try:
        while True:
            chunk = conn.recv()
            if chunk is None:
                return
            for index in chunk:
                ok, value = _run_one(driver, index, cases[index])
                conn.send((index, ok, value))
    except (EOFError, BrokenPipeError):
        return  # the parent went away


def _chunk_size(n: int, workers: int) -> int:
    # small enough to balance the load and keep crash attribution exact, large enough that the
    # pipe round trips stay well under the ~10 ms a config costs
    return max(1, min(32, n // (workers * 8) or 1))


def launches_line(stream, total: int, label: str = "conform", clock=time.monotonic) -> Progress:
    """The progress line of a run: shown from the start, a line per tenth (or 30 s) off a terminal,
    and a closing line with the rate whatever happened."""
    return Progress(label, total, stream=stream, delay=0.0, every=30.0, unit="launches", tenths=True,
                    summary=True, clock=clock)


def run_cases(driver, cases, workers: int = 1, progress=None, *, label: str = "conform",
              case_timeout: float | None = CASE_TIMEOUT):
    """Results of `driver` on `cases`, in input order.

    driver: a driver module, an SGLang version ("0.5.23"), a module name, or None for the
    installed SGLang's driver. workers: forked processes (0: run in this process). progress: a
    text stream for the progress line, or None. case_timeout: seconds one case may run before the
    run stops with CaseTimedOut (None: no limit; in this process only on the main thread, where
    a timer signal can interrupt it)."""
    driver = resolve(driver)
    cases = list(cases)
    bar = launches_line(progress, len(cases), label) if progress is not None else None
    try:
        driver.load()
        if workers <= 0 or not cases:
            results = []
            for index, case in enumerate(cases):
                ok, value = _run_timed(driver, index, case, case_timeout)
                if not ok:
                    raise DriverError(index, case, value)
                results.append(value)
                if bar:
                    bar(index + 1)
            return results
        return _run_forked(driver, cases, min(workers, len(cases)), bar, case_timeout)
    finally:
        if bar:
            bar.close()


def _run_timed(driver, index, case, seconds):
    if not seconds or threading.current_thread() is not threading.main_thread():
        return _run_one(driver, index, case)

    def ring(signum, frame):
        raise _Alarm()

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return _run_one(driver, index, case)
    except _Alarm:
        raise CaseTimedOut(index, case, seconds) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _run_forked(driver, cases, workers, bar, case_timeout=None):
    ctx = multiprocessing.get_context("fork")
    # the parent's objects (SGLang, torch, transformers: ~500 MB) go to the permanent generation, so
    # a worker's garbage collector never walks them, which would copy every page they live on
    gc.freeze()
    size = _chunk_size(len(cases), workers)
    todo = deque(range(i, min(i + size, len(cases))) for i in range(0, len(cases), size))
    results = [None] * len(cases)
    done = 0
    procs = []
    try:
        for _ in range(workers):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(driver, cases, child_end), daemon=True)
            proc.start()
            child_end.close()
            procs.append({"proc": proc, "conn": parent_end, "pending": deque(), "since": None})
        for _ in range(2):  # two chunks in flight per worker, so it never waits for the next one
            for state in procs:
                _send_next(state, todo)
        live = []
        for state in procs:
            if state["pending"]:
                live.append(state)
            else:  # more workers than chunks
                _stop(state)
        while live:
            now = time.monotonic()
            for state in live:  # the clock of a worker's current case starts when it is handed one
                if state["pending"] and state["since"] is None:
                    state["since"] = now
            wait = None
            if case_timeout:
                late = max(((now - s["since"], s) for s in live if s["pending"]), key=lambda x: x[0],
                           default=(0.0, None))
                if late[0] > case_timeout:  # its case hung: stopping it is the finally's
                    first = late[1]["pending"][0]
                    raise CaseTimedOut(first, cases[first], case_timeout)
                wait = case_timeout - late[0]
            ready = multiprocessing.connection.wait(
                [s["conn"] for s in live] + [s["proc"].sentinel for s in live], wait)
            for state in list(live):
                conn, proc = state["conn"], state["proc"]
                if conn not in ready and proc.sentinel not in ready:
                    continue
                gone = False
                try:
                    while conn.poll():
                        index, ok, value = conn.recv()
                        if not ok:
                            raise DriverError(index, cases[index], value)
                        results[index] = value
                        done += 1
                        state["pending"].remove(index)
                        state["since"] = None  # its next case starts now
                except (EOFError, OSError):  # the worker's end closed: it died
                    gone = True
                if bar:
                    bar(done)
                if not state["pending"]:
                    if not _send_next(state, todo):
                        live.remove(state)
                        _stop(state)
                    continue
                if gone or proc.sentinel in ready or not proc.is_alive():
                    proc.join(5)
                    first = state["pending"][0]
                    raise WorkerCrashed(first, cases[first], proc.exitcode)
                if len(state["pending"]) <= size:
                    _send_next(state, todo)
        return results
    finally:
        for state in procs:
            if state["proc"].is_alive():
                state["proc"].terminate()
        for state in procs:
            state["proc"].join(5)
            if state["proc"].is_alive():
                state["proc"].kill()
                state["proc"].join(5)
            state["conn"].close()
        gc.unfreeze()


def _send_next(state, todo) -> bool:
    """Give the worker the next chunk; False when there is none (and it holds none)."""
    if todo:
        chunk = todo.popleft()
        state["pending"].extend(chunk)
        try:
            state["conn"].send(list(chunk))
        except (BrokenPipeError, OSError):
            pass  # it died: the crash is reported from its sentinel
        return True
    return bool(state["pending"])


def _stop(state) -> None:
    try:
        state["conn"].send(None)
    except (BrokenPipeError, OSError):
        pass
