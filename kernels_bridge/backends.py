"""The backends the bridge runs, by SGLang's DSA backend names (no torch here: `hisparse attend`
refuses another one before it imports torch or builds a workload)."""
from __future__ import annotations

from engine.analysis.capability import can_run
from engine.explain.words import capability_words

BACKENDS = ("flashmla_sparse", "flashmla_kv")  # flash_mla_sparse_fwd over BF16 rows; flash_mla_with_kvcache over FP8 rows


def unsupported(decision) -> str | None:
    """Why the bridge cannot run the decode phase of `decision`, or None when it can: a backend it
    does not run, or one the policy's own capabilities say cannot run this config."""
    policy = decision.policy
    backend = decision.backends.get("decode")
    source = decision.sources.get("decode")
    how = "set by the user" if source == "user" else (f"rule {source}" if source else "no rule chose one")
    if backend not in BACKENDS:
        return (f"{policy.ref} routes decode to {backend if backend is not None else 'no backend'} ({how}); the "
                f"bridge runs only {', '.join(BACKENDS)} (FlashMLA, or its CPU reference kernels)")
    cap = (getattr(policy, "capabilities", None) or {}).get(backend)
    user_set = {ph: src == "user" for ph, src in decision.sources.items()}
    if cap is not None and not can_run(cap, "decode", decision.config, user_set):
        return (f"{policy.ref} routes decode to {backend} ({how}) with kv_cache_dtype="
                f"{decision.config.get('kv_cache_dtype')}, which its declared capabilities say {backend} cannot run: "
                f"{capability_words(cap, 'decode')}")
    return None
