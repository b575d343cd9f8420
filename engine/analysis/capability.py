"""Capability verdicts of a decision: each phase an accepted decision routes to a backend whose
declared capabilities (the policy's `capabilities`) do not cover that phase and config. `hisparse
check` refuses such routes over the whole domain (L407) where a default or an allow-list makes
them; a decision says so for its own config, whoever chose the backend (a user's flag, or an
edited default), in its text, its JSON ("incapable", decision_json) and, for a log (the SGLang
plugin's), warning_lines.

Computed on demand from the decision, never while evaluating: a warm decision costs what it did."""
from __future__ import annotations

from collections import namedtuple

from engine.explain.words import capability_words


def can_run(cap, phase: str, env: dict, user_set: dict | None = None) -> bool:
    """Whether an entry of the backend's `runs` covers (phase, config). `user_set`: phase ->
    whether the user set its backend (an entry may hold only for a user's choice); a phase not
    given was not set."""
    return any(_covers(e, phase, env, user_set) for e in cap.runs)


def known_gap(cap, phase: str, env: dict, user_set: dict | None = None):
    """The entry of the backend's `known_gaps` that covers (phase, config), or None."""
    return next((e for e in cap.gaps if _covers(e, phase, env, user_set)), None)


def _covers(entry, phase: str, env: dict, user_set: dict | None) -> bool:
    return phase in entry.phases and entry.when.eval(env, _UserSet(user_set or {}))


class _UserSet(dict):
    def __missing__(self, key):
        return False


class Incapable(namedtuple("Incapable", "phase backend source runs capability gap")):
    """phase, backend: the route; source: "user" or the rule that chose the backend; runs: where
    the backend runs that phase, in words; capability: FILE:LINE of its capabilities; gap: the
    stated why when the config is one of the backend's `known_gaps` (upstream routes it there
    anyway), else None."""

    __slots__ = ()

    def to_dict(self) -> dict:
        out = {"phase": self.phase, "backend": self.backend, "source": self.source, "runs": self.runs,
               "capability": self.capability}
        if self.gap is not None:
            out["known_gap"] = self.gap
        return out

    def reason(self) -> str:
        gap = f"; a known gap: {self.gap}" if self.gap is not None else ""
        return f"{self.runs} (capabilities of {self.backend}, {self.capability}){gap}"

    def text(self) -> str:
        return f"the {self.phase} phase goes to {self.backend}, which cannot run this config: {self.reason()}"


def incapable(decision) -> list[Incapable]:
    """The incapable routes of an accepted decision (a refused one routes nothing), in phase order."""
    policy = decision.policy
    caps = policy.capabilities
    if not caps or not decision.ok:
        return []
    env = decision.config
    sources = decision.sources
    user_set = {ph: src == "user" for ph, src in sources.items()}
    out = []
    for phase, backend in decision.backends.items():
        cap = caps.get(backend)
        if cap is None or can_run(cap, phase, env, user_set):
            continue
        gap = known_gap(cap, phase, env, user_set)
        out.append(Incapable(phase, backend, sources[phase], capability_words(cap, phase), _where(policy, cap),
                             gap.text if gap is not None else None))
    return out


def decision_json(decision) -> dict:
    """The decision's JSON form (Decision.to_dict) with its capability verdicts, "incapable",
    after its backends: what every command and record writes."""
    out = {}
    for key, value in decision.to_dict().items():
        out[key] = value
        if key == "backends":
            out["incapable"] = [i.to_dict() for i in incapable(decision)]
    return out


def warning_lines(decision) -> list[str]:
    """One line per incapable route, for a log (the SGLang plugin logs each as a WARNING)."""
    ref = f"{decision.policy.family}@{decision.policy.version}"
    return [f"hisparse-router: policy {ref} routes the {i.phase} phase to {i.backend}, which cannot run this "
            f"config: {i.reason()}" for i in incapable(decision)]


def _where(policy, cap) -> str:
    line = policy.doc.pos(cap.path, key=True)[0] if policy.doc is not None and cap.path else 0
    return f"{policy.file}:{line}" if line else policy.file
