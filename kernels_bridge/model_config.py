"""The model's own softmax scale: what SGLang passes the DSA kernels as `layer.scaling`.

SGLang's DeepSeek-V2/V3/V3.2 attention (`srt/models/deepseek_v2.py`) sets
scaling = qk_head_dim ** -0.5 with qk_head_dim = qk_nope_head_dim + qk_rope_head_dim, and, when the
config has YaRN rope scaling, multiplies it by mscale ** 2
(`srt/configs/model_config.py: compute_mla_mscale_scaling`: mscale = 0.1 * mscale_all_dim *
ln(factor) + 1 for factor > 1, else 1). For DeepSeek-V3.2 (qk head dim 128 + 64, factor 40,
mscale_all_dim 1) that is 192 ** -0.5 * (0.1 * ln 40 + 1) ** 2 = 0.1352, about 3.2 times FlashMLA's
default 1/sqrt(576) = 0.0417: attention over the same logits is that much sharper. Plain numbers
only: no torch here.
"""
from __future__ import annotations

import math
from typing import Mapping

__all__ = ["DEEPSEEK_V32", "softmax_scale", "V32_SOFTMAX_SCALE"]

# The attention fields of DeepSeek-V3.2's config.json (deepseek-ai/DeepSeek-V3.2-Exp; the same as
# DeepSeek-V3's): the qk head dims and the YaRN rope scaling SGLang's scaling reads.
DEEPSEEK_V32: Mapping = {
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1},
}


def _yarn_mscale(factor: float, mscale: float) -> float:
    """SGLang's yarn_get_mscale (srt/layers/rotary_embedding/yarn.py)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def softmax_scale(config: Mapping = DEEPSEEK_V32) -> float:
    """The scale SGLang's DeepSeek attention layer computes from a model config (the fields of
    DEEPSEEK_V32): qk_head_dim ** -0.5, times mscale ** 2 under YaRN rope scaling, step for step
    as deepseek_v2.py and compute_mla_mscale_scaling do it."""
    qk_head_dim = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
    scaling = qk_head_dim ** -0.5
    rope_scaling = config.get("rope_scaling")
    if not rope_scaling or config["qk_rope_head_dim"] <= 0 or not rope_scaling.get("apply_yarn_scaling", True):
        return scaling
    rope_type = rope_scaling.get("rope_type") or rope_scaling.get("type")
    if rope_type == "default" or not rope_scaling.get("apply_scale", True):
        return scaling
    mscale = _yarn_mscale(rope_scaling.get("factor", 1.0), float(rope_scaling.get("mscale_all_dim", False)))
    return scaling * mscale * mscale


V32_SOFTMAX_SCALE = softmax_scale()
