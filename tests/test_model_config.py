"""The model's softmax scale (kernels_bridge/model_config.py) is the one SGLang computes from the
model's config: its own compute_mla_mscale_scaling gives the same number."""
import math

import pytest

from kernels_bridge.model_config import DEEPSEEK_V32, V32_SOFTMAX_SCALE, softmax_scale
from kernels_bridge.workload_spec import Workload


def test_deepseek_v32_scale_is_the_yarn_scaled_qk_head_dim():
    assert V32_SOFTMAX_SCALE == pytest.approx(192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2, rel=1e-15)
    assert V32_SOFTMAX_SCALE == pytest.approx(0.13523, abs=1e-5)
    assert V32_SOFTMAX_SCALE / 576 ** -0.5 == pytest.approx(3.245, abs=1e-3)  # against FlashMLA's default


def test_attend_runs_at_the_models_scale():
    assert Workload().softmax_scale == V32_SOFTMAX_SCALE


@pytest.mark.parametrize("rope_scaling", [
    DEEPSEEK_V32["rope_scaling"],
    {"type": "yarn", "factor": 4, "mscale_all_dim": 0.707},
    {"rope_type": "yarn", "factor": 40, "mscale_all_dim": 1.0, "apply_scale": False},
    {"rope_type": "default"},
    {"type": "yarn", "factor": 0.5, "mscale_all_dim": 1.0},
])
def test_the_scale_is_sglangs_own(rope_scaling):
    from tests.sglang_release import require

    require("0.5.23")
    from engine.sglang.conform import drivers

    drivers.stand_ins()  # SGLang's configs import torchvision, which a CPU torch cannot have
    from sglang.srt.configs.model_config import compute_mla_mscale_scaling

    config = dict(DEEPSEEK_V32, rope_scaling=rope_scaling)
    assert softmax_scale(config) == compute_mla_mscale_scaling(rope_scaling, 192 ** -0.5)


def test_no_rope_scaling_is_the_plain_head_dim():
    assert softmax_scale(dict(DEEPSEEK_V32, rope_scaling=None)) == 192 ** -0.5
