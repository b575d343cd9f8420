"""PolicyStore: the newest good version of a policy family, reloaded safely while it serves.

A server holds one store and asks it for decisions; operators add, replace and remove
`<family>/v<N>.yaml` files under it. The safe way to change a file is to write the new text
under another name and rename it into place (`mv`, `os.replace`): the name then holds the old
complete file or the new complete file, never anything in between. What the store does:

- it serves the newest version whose file has loaded cleanly; it reads versions newest first and
  stops at the first that loads, so older files are read only when they are needed;
- a file that appears under its name (renamed in, or new) is read once it has been quiet for
  `settle` seconds (same size, mtime, ctime and inode), and its bytes count only if it did not
  change while read;
- a file whose content changes in place (the same inode, other bytes: `cp` onto it, a shell
  redirection, an editor that writes in place) is refused (S803) and its last good content kept:
  the store cannot tell a finished in-place write from one stopped half-way, so it never serves
  one;
- but content that only extends what was judged (the same bytes, then more: a `cp` or `scp` of a
  new file that stalled after a prefix that loaded, or did not) is that writer finishing: once
  quiet for `settle` seconds it is judged as new content and, when it loads, replaces the prefix,
  so a half-written file never stays in service because its completion came late;
- new content that does not load never replaces the last good policy of its version; the
  problems, with file:line:col, are kept in `errors` and logged;
- two files that name the same version (v1.yaml, v001.yaml) are both refused (E313);
- a file removed (absent for `settle` seconds) is no longer served: the newest remaining good
  version is (S801 says so); only when no other version loads does its last good policy stay;
- the served policy is swapped with one reference assignment: a reader evaluates either the old
  policy or the new one, never a mixture, and never waits for a reload.
At construction the files are taken as they are (there is nothing older to compare with).
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping

from engine.language.decision import Decision
from engine.errors import PolicyError, Problem
from engine.files.catalog import VERSION_FILE, display_dir, duplicate_version, list_families
from engine.policy.loader import load_bytes
from engine.files.shipped import policy_root
from engine.policy.policy import Policy
from engine.suggest import did_you_mean
from engine.values import shown
from engine.files.reading import ReadError, file_signature, max_file_bytes, read_snapshot

__all__ = ["PolicyStore", "Refresh"]

log = logging.getLogger("hisparse.store")

_FAMILY = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
DEFAULT_SETTLE = 0.5


@dataclass(frozen=True)
class Refresh:
    """What one refresh did. Files are named as in messages (`display`)."""

    current: Policy  # served after the refresh
    previous: Policy | None  # served before it (None for the first load)
    loaded: tuple = ()  # files whose new content is now in service or ready (a good version)
    refused: tuple = ()  # files whose new content did not load (see PolicyStore.errors)
    removed: tuple = ()  # files that disappeared (no longer served)
    pending: tuple = ()  # changed files still settling, or changing while read

    @property
    def changed(self) -> bool:
        """Whether the policy in service changed (another version, or other bytes)."""
        return self.previous is None or self.previous is not self.current


@dataclass
class _File:
    """What the store knows of one v<N>.yaml."""

    version: int
    path: str
    display: str
    # good | refused | removed | pending (changed, not yet judged) | unread (older than needed)
    state: str = "unread"
    seen: tuple | None = None  # the signature last observed
    seen_at: float = 0.0  # when that signature was first observed (monotonic)
    judged: tuple | None = None  # the signature whose content was last loaded or refused
    judged_sha: str | None = None  # the sha256 of that content
    good: Policy | None = None  # the last policy this file loaded into
    problems: list = field(default_factory=list)  # why its newest content is not what is kept
    gone_at: float | None = None  # when it was first missed (monotonic), while not yet removed
    tainted: tuple | None = None  # (device, inode) seen changing in place: refused until replaced
    # the file held open on the inode compared against (judged, else seen): a held inode cannot be
    # freed, so its number cannot come back as a new file's (a rename after a delete would look
    # like an in-place change); None past _MAX_PINS, where an equal number is taken as the same
    pin: object = None
    pin_id: tuple | None = None


_MAX_PINS = 64


MAX_SECONDS = 86400.0  # a day: past it, a wait overflows the platform's timeout (1e10 did) or never ends


def _seconds(value, name: str, positive: bool) -> float:
    """A number of seconds (> 0, or >= 0) up to MAX_SECONDS; anything else (NaN, infinite, a
    string, a boolean, 1e10) is refused here, so that a bad value never becomes a poller that
    silently never runs or dies of an OverflowError."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0) or value > MAX_SECONDS:
        want = "a positive" if positive else "a non-negative"
        raise ValueError(f"{name} must be {want} number of seconds up to {MAX_SECONDS:g}, got {shown(value)}")
    return float(value)


class PolicyStore:
    """The newest good version of `family` under `policy_dir`, safe to use from many threads.

    `current()` -> Policy, `evaluate(config)` -> Decision, `refresh()` -> Refresh, `errors`
    (file -> problems of its last refused content or removal). With `poll_interval`, a background
    thread refreshes every that many seconds (or call `start(interval)`; `stop()` or a `with`
    block ends it). Raises PolicyError at construction when no version loads, ValueError for a
    `poll_interval` or `settle` that is not a number of seconds up to MAX_SECONDS (a day).
    `clock`: the monotonic seconds the settle window is measured in (tests pass their own).
    """

    def __init__(self, policy_dir: str | None = None, family: str = "dsa-backends", *,
                 poll_interval: float | None = None, settle: float = DEFAULT_SETTLE, clock=time.monotonic):
        if not isinstance(family, str) or not _FAMILY.fullmatch(family):
            raise PolicyError([Problem("R602", f"bad policy family {shown(family)}: expected a name such as "
                                       "dsa-backends")])
        self.settle = _seconds(settle, "settle", positive=False)
        if poll_interval is not None:
            poll_interval = _seconds(poll_interval, "poll_interval", positive=True)
        if not callable(clock):
            raise TypeError(f"clock must be a function returning seconds, got {shown(clock)}")
        self._clock = clock  # monotonic seconds: when a signature was first seen, a file missed
        self.family = family
        self.policy_dir = policy_root(policy_dir)
        self.folder = os.path.join(self.policy_dir, family)
        self._shown_dir = os.path.join(display_dir(self.policy_dir), family)
        self._files: dict[str, _File] = {}  # file name -> what is known of it
        self._folder_problem: list[Problem] = []
        self._errors: dict[str, list[Problem]] = {}
        self._current: Policy | None = None
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        with self._refresh_lock:
            for attempt in range(5):  # a file changing while read: look again, briefly
                result = self._refresh(initial=True)
                if self._current is not None or not result.pending:
                    break
                time.sleep(0.05 * (attempt + 1))
        if self._current is None:
            raise PolicyError(self._why_nothing_loaded())
        if poll_interval is not None:
            self.start(poll_interval)

    # -- serving ---------------------------------------------------------------------------------
    def current(self) -> Policy:
        """The policy in service: the newest version that loaded cleanly."""
        return self._current

    def evaluate(self, config: Mapping) -> Decision:
        """Decide with the policy in service (its identity is in the decision). Raises
        ConfigError for a bad config, as Policy.evaluate does."""
        return self._current.evaluate(config)

    @property
    def errors(self) -> dict[str, list[Problem]]:
        """File -> the problems of its last refused content (or S801 for a removed file), for
        every file whose newest content is not what the store holds for it. A copy."""
        return {name: list(problems) for name, problems in self._errors.items()}

    def status(self) -> dict:
        """A summary for health checks: the policy in service and the state of every file."""
        with self._refresh_lock:  # a consistent picture (a refresh in progress finishes first)
            current = self._current
            files = {f.display: {"version": f.version, "state": f.state,
                                 "sha256": f.good.sha256 if f.good is not None else None,
                                 "problems": [p.to_dict() for p in f.problems]}
                     for f in sorted(self._files.values(), key=lambda f: (f.version, f.display))}
        return {"family": self.family, "current": current.identity(), "file": current.file,
                "files": files}

    # -- reloading -------------------------------------------------------------------------------
    def refresh(self) -> Refresh:
        """Look at the folder once: adopt settled good changes, refuse bad ones, note removals.
        Never raises for what it finds in the folder; concurrent calls run one at a time."""
        with self._refresh_lock:
            return self._refresh(initial=False)

    def start(self, interval: float = 1.0) -> None:
        """Refresh every `interval` seconds in a daemon thread (no-op when already polling)."""
        interval = _seconds(interval, "poll interval", positive=True)
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, args=(interval,),
                                        name=f"hisparse-store-{self.family}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """End background polling (waits for a refresh in progress)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    close = stop

    def __enter__(self) -> "PolicyStore":
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def __repr__(self) -> str:
        current = self._current
        return f"<PolicyStore {self.folder} serving {current.ref if current else None}>"

    def _poll(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.refresh()
            except Exception:  # never let the poller die: it is how a fix gets picked up
                log.exception("policy store %s: refresh failed", self.folder)

    # -- the work --------------------------------------------------------------------------------
    def _refresh(self, initial: bool) -> Refresh:
        previous = self._current
        outcomes: dict[str, list[str]] = {"loaded": [], "refused": [], "pending": []}
        removed: list[str] = []
        present = self._scan()
        if present is not None:
            now = self._clock()
            for name, f in list(self._files.items()):
                if name in present:
                    f.gone_at = None
                elif f.state != "removed":
                    f.gone_at = now if f.gone_at is None else f.gone_at
                    if initial or now - f.gone_at >= self.settle:  # not a file being replaced
                        removed.append(f.display)
                        self._removed(name, f)
            by_version: dict[int, list[str]] = {}
            files = self._files
            for name, version in present.items():
                if name not in files:
                    files[name] = _File(version, os.path.join(self.folder, name),
                                        os.path.join(self._shown_dir, name))
                by_version.setdefault(version, []).append(name)
            for names in by_version.values():  # a duplicate gone: its twin is judged afresh
                f = self._files[names[0]]
                if len(names) == 1 and f.problems and f.problems[0].code == "E313":
                    f.state, f.problems = "unread", []
            found = None  # newest first, until a version serves
            for version in sorted(by_version, reverse=True):
                names = sorted(by_version[version])
                if len(names) > 1:  # which one is version N would be a guess: neither is read
                    for name in names:
                        self._duplicate(self._files[name], names)
                    found = found or next((self._files[n].good for n in names if self._files[n].good), None)
                else:
                    f = self._files[names[0]]
                    outcome = self._look(f, initial)
                    if outcome is not None:
                        outcomes[outcome].append(f.display)
                    found = found or f.good
                if found is not None:
                    break
            if found is not None:
                self._current = found
            self._resay_removed()
        errors = {f.display: list(f.problems) for f in self._files.values() if f.problems}
        if self._folder_problem:
            errors[self._shown_dir] = list(self._folder_problem)
        self._errors = errors
        current = self._current
        if previous is not None and current is not previous:
            log.info("policy store %s: now serving %s (%s, sha256:%s)", self.folder, current.ref,
                     current.file, current.sha256[:12])
        return Refresh(current, previous, tuple(outcomes["loaded"]), tuple(outcomes["refused"]),
                       tuple(removed), tuple(outcomes["pending"]))

    def _scan(self) -> dict[str, int] | None:
        """file name -> version of every v<N>.yaml in the family's folder; None when the
        folder cannot be listed (then nothing is taken as removed: a folder being swapped in a
        deploy)."""
        try:
            names = os.listdir(self.folder)
        except OSError as exc:
            self._folder_problem = [Problem("E101", f"cannot read the policy folder: {exc.strerror or exc}",
                                            self._shown_dir)]
            return None
        self._folder_problem = []
        match = VERSION_FILE.fullmatch
        return {name: int(m.group(1)) for name in names if (m := match(name))}

    def _look(self, f: _File, initial: bool) -> str | None:
        """Judge one present file; returns "loaded", "refused", "pending" or None (unchanged)."""
        now = self._clock()
        try:
            signature = file_signature(os.stat(f.path))
        except OSError:  # gone between the listing and now: the next refresh says removed
            return None
        if signature == f.judged:
            return None
        same = signature[:2] == (f.pin_id or (f.judged or f.seen or (None, None))[:2])
        if same and f.tainted == signature[:2]:  # the inode seen changing in place: never read again
            return self._in_place(f, signature)
        # written in place: the inode whose content was judged (a new file still growing is a
        # write in progress: it waits to be quiet like any other)
        in_place = same and f.judged_sha is not None
        if signature != f.seen:
            f.seen, f.seen_at = signature, now
            if f.judged is None:
                self._pin(f, signature)
        # quiet: two looks `settle` apart saw the same signature, or its ctime (which every write
        # moves and nothing can set back) is older than that
        quiet = initial or now - f.seen_at >= self.settle or time.time_ns() - signature[4] >= self.settle * 1e9
        if not quiet and not in_place:
            return self._pending(f)
        try:
            data, snapshot = read_snapshot(f.path, f.display, max_file_bytes())
        except ReadError as exc:
            return self._refuse(f, signature, exc.problems)
        extends = in_place and self._extends(f, data)
        if snapshot is None or snapshot != signature:  # it changed while read, or since the stat
            if extends:  # the writer of the judged prefix is still at work
                f.seen, f.seen_at = snapshot or signature, now
                return self._pending(f)
            if in_place or (f.judged_sha is not None and (snapshot or signature)[:2] == f.pin_id):
                return self._in_place(f, snapshot or signature)
            f.seen, f.seen_at = snapshot, now
            if not initial or snapshot is None:
                return self._pending(f)
        sha = hashlib.sha256(data).hexdigest()
        if in_place:
            if sha == f.judged_sha:  # touched: the same bytes
                f.judged = snapshot
                return None
            if not extends:
                return self._in_place(f, snapshot)
            if not quiet:  # a completion of the judged prefix: judged once it is quiet
                return self._pending(f)
            # the writer that left a prefix (served, or refused) finished: its whole file is judged
            # as new content and replaces the prefix when it loads
        try:
            policy = load_bytes(data, f.display, f.path)
        except PolicyError as exc:
            return self._refuse(f, snapshot, exc.problems, sha)
        except Exception as exc:  # a bug of ours: the file is refused, the store keeps serving
            log.exception("policy store %s: unexpected error loading %s", self.folder, f.display)
            return self._refuse(f, snapshot, [Problem(
                "S802", f"internal error while loading: {type(exc).__name__}: {exc}", f.display)], sha)
        f.judged, f.judged_sha, f.good, f.problems, f.state, f.tainted = snapshot, sha, policy, [], "good", None
        self._pin(f, snapshot)
        return "loaded"

    @staticmethod
    def _extends(f: _File, data: bytes) -> bool:
        """Whether `data` is the judged content with more after it: the same writer finishing
        a file it stalled in (cp, scp), not another text written over it."""
        size = f.judged[2] if f.judged is not None else None
        return (size is not None and f.judged_sha is not None and len(data) > size
                and hashlib.sha256(data[:size]).hexdigest() == f.judged_sha)

    def _pin(self, f: _File, signature: tuple) -> None:
        """Hold the file open on the inode `signature` names (see _File.pin)."""
        if f.pin is not None:
            f.pin.close()
        f.pin = f.pin_id = None
        if signature is None or sum(1 for g in self._files.values() if g.pin is not None) >= _MAX_PINS:
            return
        try:
            fd = os.open(f.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and file_signature(st)[:2] == signature[:2]:
                f.pin, f.pin_id = os.fdopen(fd, "rb", buffering=0), signature[:2]  # closed with it
                return
        except OSError:
            pass
        os.close(fd)  # not a regular file, or replaced since: the next look sees the new one

    @staticmethod
    def _pending(f: _File) -> str:
        if f.state != "refused":  # a refused file keeps saying why until its new content is judged
            f.state = "pending"
        return "pending"

    def _refuse(self, f: _File, signature: tuple, problems: list[Problem], sha: str | None = None) -> str:
        f.judged, f.judged_sha, f.problems, f.state = signature, sha, list(problems), "refused"
        if f.pin_id != signature[:2]:
            self._pin(f, signature)
        kept = (f"; keeping {f.good.ref} sha256:{f.good.sha256[:12]} from its last good content"
                if f.good is not None else "")
        log.warning("policy store %s: refused %s%s: %s", self.folder, f.display, kept,
                    "; ".join(str(p) for p in problems[:3]))
        return "refused"

    def _in_place(self, f: _File, signature: tuple) -> str:
        """Refuse a file changed in place, and every later content of that inode (S803)."""
        again = f.tainted == signature[:2] and f.state == "refused"
        f.tainted = signature[:2]
        kept = (f"; keeping {f.good.ref} sha256:{f.good.sha256[:12]} from its last good content"
                if f.good is not None else "")
        problems = [Problem(
            "S803", "changed in place (the same file, other bytes): a finished in-place write cannot be told "
                    f"from one stopped half-way, so it is not read{kept}", f.display,
            hint="publish by writing the new text under another name and renaming it into place "
                 "(mv, os.replace)")]
        if again:  # said already
            f.judged = signature
            return "refused"
        return self._refuse(f, signature, problems, f.judged_sha)

    def _duplicate(self, f: _File, names: list[str]) -> None:
        if f.state != "refused" or not f.problems or f.problems[0].code != "E313":
            f.state, f.judged, f.judged_sha, f.seen = "refused", None, None, None
            self._pin(f, None)
            f.problems = [duplicate_version(self.family, f.version, names, self._shown_dir, f.display)]
            log.warning("policy store %s: %s", self.folder, f.problems[0])

    def _removed(self, name: str, f: _File) -> None:
        if f.good is None:  # never loaded: nothing to keep, nothing to report
            self._pin(f, None)
            del self._files[name]
            return
        f.seen = f.judged = f.judged_sha = f.tainted = None
        self._pin(f, None)
        f.state = "removed"
        f.problems = []  # said by _resay_removed, which knows what is served instead

    def _resay_removed(self) -> None:
        current = self._current
        for f in self._files.values():
            if f.state != "removed":
                continue
            if f.good is current:
                text = (f"file removed, and no other version of '{self.family}' loads: still serving "
                        f"{current.ref} sha256:{current.sha256[:12]} from its last good content")
            else:
                text = f"file removed: no longer served; serving {current.ref} ({current.file})"
            if not f.problems or f.problems[0].message != text:
                f.problems = [Problem("S801", text, f.display,
                                      hint="to roll forward, publish a new version; removing the newest "
                                           "version rolls back to the one before")]
                log.warning("policy store %s: %s", self.folder, f.problems[0])

    def _why_nothing_loaded(self) -> list[Problem]:
        if self._folder_problem:
            families = list_families(self.policy_dir)
            problem = Problem("R601", f"no policy family '{self.family}' in {display_dir(self.policy_dir)}",
                              hint=did_you_mean(self.family, families) if families else "")
            return [problem]
        files = sorted(self._files.values(), key=lambda f: (f.version, f.display))
        problems = list({str(p): p for f in files for p in f.problems}.values())
        if problems:
            return problems
        pending = [f.display for f in files]
        if pending:
            return [Problem("R601", f"no version of '{self.family}' could be read whole (changing while "
                                    f"read: {', '.join(pending)})")]
        return [Problem("R601", f"no version of '{self.family}' in {self._shown_dir} (files v<N>.yaml)")]
