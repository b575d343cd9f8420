"""PolicyStore: the newest good version of a policy family, reloaded safely while it serves.

A server holds one store and asks it for decisions; operators edit, add and remove
`<family>/v<N>.yaml` files under it. A reload never makes things worse:

- the store serves the newest version N whose file has loaded cleanly at least once;
- a changed file is read only once it has been quiet for `settle` seconds (same size, mtime,
  ctime and inode at two looks that far apart), and its bytes count only if the file did not
  change while it was read: a writer that writes in place is never caught half-way through;
- new content that does not load (a syntax error, a schema error, a half-written file, an
  unreadable file) never replaces the last good policy of its version; the problems, with
  file:line:col, are kept in `errors` and logged;
- a removed file leaves its last good policy in service, reported as S801: versions move
  forward, never back (publish v<N+1> with the old content to roll back);
- the served policy is swapped with one reference assignment: a reader evaluates either the old
  policy or the new one, never a mixture, and never waits for a reload.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping

from .decision import Decision
from .errors import PolicyError, Problem
from .loader import VERSION_FILE, _display_dir, list_families, load_bytes
from .paths import policy_root
from .policy import Policy
from .suggest import did_you_mean
from .yaml_reader import ReadError, file_signature, max_file_bytes, read_snapshot

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
    removed: tuple = ()  # files that disappeared (their last good policy is kept)
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
    state: str = "pending"  # good | refused | removed | pending (changed, not yet judged)
    seen: tuple | None = None  # the signature last observed
    seen_at: float = 0.0  # when that signature was first observed (monotonic)
    judged: tuple | None = None  # the signature whose content was last loaded or refused
    good: Policy | None = None  # the last policy this file loaded into
    problems: list = field(default_factory=list)  # why its newest content is not what is kept


class PolicyStore:
    """The newest good version of `family` under `policy_dir`, safe to use from many threads.

    `current()` -> Policy, `evaluate(config)` -> Decision, `refresh()` -> Refresh, `errors`
    (file -> problems of its last refused content or removal). With `poll_interval`, a background
    thread refreshes every that many seconds (or call `start(interval)`; `stop()` or a `with`
    block ends it). Raises PolicyError at construction when no version loads.
    """

    def __init__(self, policy_dir: str | None = None, family: str = "nsa-backends", *,
                 poll_interval: float | None = None, settle: float = DEFAULT_SETTLE):
        if not isinstance(family, str) or not _FAMILY.fullmatch(family):
            raise PolicyError([Problem("R602", f"bad policy family {family!r}: expected a name such as "
                                       "nsa-backends")])
        self.family = family
        self.policy_dir = policy_root(policy_dir)
        self.folder = os.path.join(self.policy_dir, family)
        self.settle = float(settle)
        self._shown_dir = os.path.join(_display_dir(self.policy_dir), family)
        self._files: dict[int, _File] = {}
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
        if poll_interval:
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
                     for f in sorted(self._files.values(), key=lambda f: f.version)}
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
        if self._thread is not None and self._thread.is_alive():
            return
        if not interval or interval <= 0:
            raise ValueError(f"poll interval must be a positive number of seconds, got {interval!r}")
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, args=(float(interval),),
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
        loaded: list[str] = []
        refused: list[str] = []
        removed: list[str] = []
        pending: list[str] = []
        present = self._scan()
        if present is not None:
            for version in sorted(set(self._files) - set(present)):
                f = self._files[version]
                if f.state != "removed":
                    removed.append(f.display)
                    self._removed(f)
            for version, path in sorted(present.items()):
                f = self._files.get(version)
                if f is None:
                    f = self._files[version] = _File(version, path, self._display(version))
                outcome = self._look(f, initial)
                if outcome is not None:
                    {"loaded": loaded, "refused": refused, "pending": pending}[outcome].append(f.display)
        good = [f for f in self._files.values() if f.good is not None]
        if good:
            self._current = max(good, key=lambda f: f.version).good
        errors = {f.display: list(f.problems) for f in self._files.values() if f.problems}
        if self._folder_problem:
            errors[self._shown_dir] = list(self._folder_problem)
        self._errors = errors
        current = self._current
        if previous is not None and current is not previous:
            log.info("policy store %s: now serving %s (%s, sha256:%s)", self.folder, current.ref,
                     current.file, current.sha256[:12])
        return Refresh(current, previous, tuple(loaded), tuple(refused), tuple(removed), tuple(pending))

    def _scan(self) -> dict[int, str] | None:
        """version -> path of every v<N>.yaml in the family's folder; None when the folder cannot
        be listed (then nothing is taken as removed: a folder being swapped in a deploy)."""
        try:
            names = os.listdir(self.folder)
        except OSError as exc:
            self._folder_problem = [Problem("E101", f"cannot read the policy folder: {exc.strerror or exc}",
                                            self._shown_dir)]
            return None
        self._folder_problem = []
        out = {}
        for name in names:
            m = VERSION_FILE.fullmatch(name)
            if m:
                out[int(m.group(1))] = os.path.join(self.folder, name)
        return out

    def _display(self, version: int) -> str:
        return os.path.join(self._shown_dir, f"v{version}.yaml")

    def _look(self, f: _File, initial: bool) -> str | None:
        """Judge one present file; returns "loaded", "refused", "pending" or None (unchanged)."""
        now = time.monotonic()
        try:
            signature = file_signature(os.stat(f.path))
        except OSError:  # gone between the listing and now: the next refresh says removed
            return None
        if signature == f.judged:
            return None
        if signature != f.seen:
            f.seen, f.seen_at = signature, now
        if not initial and now - f.seen_at < self.settle:
            return self._pending(f)
        try:
            data, snapshot = read_snapshot(f.path, f.display, max_file_bytes())
        except ReadError as exc:
            return self._refuse(f, signature, exc.problems)
        if snapshot is None:  # it changed while it was read: the bytes may be torn
            f.seen, f.seen_at = None, now
            return self._pending(f)
        if snapshot != signature:  # replaced since it was looked at: let the new one settle
            f.seen, f.seen_at = snapshot, now
            if not initial:
                return self._pending(f)
        try:
            policy = load_bytes(data, f.display, f.path)
        except PolicyError as exc:
            return self._refuse(f, snapshot, exc.problems)
        except Exception as exc:  # a bug of ours: the file is refused, the store keeps serving
            log.exception("policy store %s: unexpected error loading %s", self.folder, f.display)
            return self._refuse(f, snapshot, [Problem(
                "S802", f"internal error while loading: {type(exc).__name__}: {exc}", f.display)])
        f.judged, f.good, f.problems, f.state = snapshot, policy, [], "good"
        return "loaded"

    @staticmethod
    def _pending(f: _File) -> str:
        if f.state != "refused":  # a refused file keeps saying why until its new content is judged
            f.state = "pending"
        return "pending"

    def _refuse(self, f: _File, signature: tuple, problems: list[Problem]) -> str:
        f.judged, f.problems, f.state = signature, list(problems), "refused"
        kept = (f"; keeping {f.good.ref} sha256:{f.good.sha256[:12]} from its last good content"
                if f.good is not None else "")
        log.warning("policy store %s: refused %s%s: %s", self.folder, f.display, kept,
                    "; ".join(str(p) for p in problems[:3]))
        return "refused"

    def _removed(self, f: _File) -> None:
        f.seen = f.judged = None
        if f.good is None:  # never loaded: nothing to keep, nothing to report
            del self._files[f.version]
            return
        f.state = "removed"
        serving = self._current is f.good
        f.problems = [Problem("S801", f"file removed; {'still serving' if serving else 'keeping'} "
                                      f"{f.good.ref} sha256:{f.good.sha256[:12]} from its last good content",
                              f.display, hint="versions move forward: publish a new version to roll back")]
        log.warning("policy store %s: %s", self.folder, f.problems[0])

    def _why_nothing_loaded(self) -> list[Problem]:
        if self._folder_problem:
            families = list_families(self.policy_dir)
            problem = Problem("R601", f"no policy family '{self.family}' in {_display_dir(self.policy_dir)}",
                              hint=did_you_mean(self.family, families) if families else "")
            return [problem]
        problems = [p for f in sorted(self._files.values(), key=lambda f: f.version) for p in f.problems]
        if problems:
            return problems
        pending = [f.display for f in self._files.values()]
        if pending:
            return [Problem("R601", f"no version of '{self.family}' could be read whole (changing while "
                                    f"read: {', '.join(pending)})")]
        return [Problem("R601", f"no version of '{self.family}' in {self._shown_dir} (files v<N>.yaml)")]
