"""Run many cases through a driver on forked workers.

The parent loads the driver once (SGLang's import and warm-up, 5-8 s), then starts a process pool
(concurrent.futures, fork context) whose workers inherit the imports and the case list; only
ranges of case indices and Results cross the pipes. Results come back in input order. Ctrl-C
stops the workers and re-raises KeyboardInterrupt; a worker that dies raises WorkerCrashed naming
the case it was running; a driver that raises (instead of returning a Result) raises DriverError
naming the case; a case that runs past the timeout raises CaseTimedOut naming it."""
from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import signal
import threading
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

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
        what = "between cases" if case is None else f"on case {index}: {describe(case)}"
        super().__init__(f"conform worker died ({how}) {what}")


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


class _Slots:
    """What each worker is running, in shared memory the workers inherit: per worker its pid, the
    index of its case (-1 between cases) and when that case started (time.monotonic, one clock for
    every process of the machine). The parent reads it to name the case of a crash or a hang."""

    def __init__(self, ctx, workers: int):
        self.array = ctx.Array("d", 3 * workers)  # with a lock: index and start are read together
        self.next = ctx.Value("i", 0)
        for slot in range(workers):
            self.array[3 * slot + 1] = -1

    def take(self) -> int:
        """A worker's slot, taken once when it starts."""
        with self.next.get_lock():
            slot, self.next.value = self.next.value, self.next.value + 1
        self.array[3 * slot] = os.getpid()
        return slot

    def mark(self, slot: int, index: int) -> None:
        with self.array.get_lock():
            self.array[3 * slot + 1:3 * slot + 3] = [index, time.monotonic()]

    def running(self) -> list:
        """(pid, case index, seconds it has run) of each worker running a case."""
        lock = self.array.get_lock()
        locked = lock.acquire(timeout=1.0)  # a worker killed while holding it never lets go
        try:
            values = self.array.get_obj()[:]
        finally:
            if locked:
                lock.release()
        now = time.monotonic()
        return [(int(values[i]), int(values[i + 1]), now - values[i + 2])
                for i in range(0, len(values), 3) if values[i + 1] >= 0]

    def case_of(self, pid: int) -> int | None:
        for running_pid, index, _ in self.running():
            if running_pid == pid:
                return index
        return None


_WORK = None  # in a worker: (driver, cases, slots, its slot)


def _start_worker(driver, cases, slots, listed) -> None:
    global _WORK
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    _WORK = (driver, cases, slots, slots.take())
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True).start()
    # no case runs before the parent holds every worker's process: one that died before would be
    # reaped unseen by the parent's listing, and its crash could not be told from the others'
    listed.wait()


def _exit_with(parent: int) -> None:
    """End this worker once its parent is gone (killed, so it could not stop us): the pool's
    queue never closes while another worker holds it, so a worker would wait on it forever."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)  # at once: no exit handler of the parent's runs here


def _run_chunk(start: int, stop: int) -> list:
    """Run cases start..stop-1 on this worker: (index, ok, Result or error text) for each, up to
    the first the driver raised on."""
    driver, cases, slots, slot = _WORK
    out = []
    for index in range(start, stop):
        slots.mark(slot, index)
        ok, value = _run_one(driver, index, cases[index])
        out.append((index, ok, value))
        if not ok:
            break
    slots.mark(slot, -1)
    return out


def _run_forked(driver, cases, workers, bar, case_timeout=None):
    """The cases on a pool of `workers` forked processes (concurrent.futures), in chunks; at most
    two chunks a worker are queued, so the parent holds only the results and a few chunks."""
    ctx = multiprocessing.get_context("fork")
    slots = _Slots(ctx, workers)
    size = _chunk_size(len(cases), workers)
    chunks = iter(range(0, len(cases), size))
    results = [None] * len(cases)
    done = 0
    before = set(multiprocessing.active_children())
    # the parent's objects (SGLang, torch, transformers: ~500 MB) go to the permanent generation, so
    # a worker's garbage collector never walks them, which would copy every page they live on
    gc.freeze()
    listed = ctx.Event()
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_worker,
                               initargs=(driver, cases, slots, listed))
    procs = []

    def submit(start):
        try:  # a worker may die before a later chunk is queued: the pool then refuses the chunk
            return pool.submit(_run_chunk, start, min(start + size, len(cases)))
        except BrokenProcessPool:
            raise _crash(slots, procs, cases) from None

    try:
        pending = set()
        for start in itertools.islice(chunks, 2 * workers):
            pending.add(submit(start))
            if not procs:  # a fork pool starts all its workers at the first submit
                procs = [p for p in multiprocessing.active_children() if p not in before]
                listed.set()
        while pending:
            finished, pending = wait(pending, _next_deadline(slots, case_timeout), FIRST_COMPLETED)
            for future in finished:
                try:
                    chunk = future.result()
                except BrokenProcessPool:
                    raise _crash(slots, procs, cases) from None
                for index, ok, value in chunk:
                    if not ok:
                        raise DriverError(index, cases[index], value)
                    results[index] = value
                done += len(chunk)
                start = next(chunks, None)
                if start is not None:
                    pending.add(submit(start))
            if bar:
                bar(done)
            _check_timeout(slots, cases, case_timeout)
        return results
    finally:
        listed.set()  # never leave a worker waiting (a first submit that failed)
        if done < len(cases):  # stopped early: a running case may never end by itself
            for proc in procs:
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        gc.unfreeze()


def _next_deadline(slots, case_timeout):
    """Seconds until the longest-running case reaches the timeout (None: no timeout)."""
    if not case_timeout:
        return None
    longest = max((seconds for _, _, seconds in slots.running()), default=0.0)
    return max(0.0, case_timeout - longest) + 0.01


def _check_timeout(slots, cases, case_timeout) -> None:
    if not case_timeout:
        return
    for _, index, seconds in slots.running():
        if seconds > case_timeout:  # its case hung: stopping the worker is the caller's finally
            raise CaseTimedOut(index, cases[index], case_timeout)


def _crash(slots, procs, cases) -> WorkerCrashed:
    """The worker that died, and its case. The pool stops the other workers (SIGTERM) once one
    dies: the one that died first is the one that did not die of that, if any."""
    deadline = time.monotonic() + 5
    # the pool stops every worker once one dies: wait for all, as a death seen early may not be
    # the first (the pool's own thread may be reaping the first while this one looks)
    while time.monotonic() < deadline and any(p.exitcode is None for p in procs):
        time.sleep(0.01)
    dead = [p for p in procs if p.exitcode is not None]
    dead.sort(key=lambda p: p.exitcode == -signal.SIGTERM)
    proc = dead[0] if dead else None
    index = slots.case_of(proc.pid) if proc else None
    return WorkerCrashed(index, None if index is None else cases[index],
                         proc.exitcode if proc else None)
