"""DeepSeek-V4 launches as an operator types them, through `hisparse evaluate` with no --policy:
the model (a local folder's config.json, or a hub name the project knows) picks the family, and
the answer is SGLang 0.5.23's own (outcome, first refusal text, KV dtype, attention backends),
as `hisparse conform` finds it on dsv4-backends@13's whole declared domain."""
import json

import pytest

from tests.helpers import run_cli


@pytest.fixture
def folders(tmp_path):
    def folder(name, config):
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
        return str(path)

    return {"v4": folder("v4", {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}),
            "v41": folder("v41", {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41"}),
            "v32": folder("v32", {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
                                  "index_topk": 2048})}


def evaluate(capsys, *argv):
    code, out, err = run_cli(capsys, "evaluate", "--format", "json", *argv)
    assert code in (0, 1), err
    return json.loads(out)


HISPARSE = ["--enable-hisparse", "--disable-radix-cache"]


@pytest.mark.parametrize("model, argv, ok, kv, dsv4, error", [
    ("v4", HISPARSE, True, "fp8_e4m3", "flashmla", None),
    ("v41", ["--sm-major", "10"], True, "fp8_e4m3", "flashmla_mega", None),
    ("v41", ["--sm-major", "10", "--tp-size", "8"], True, "fp8_e4m3", "flashmla", None),
    ("v4", ["--sm-major", "10", "--dsv4-attn-backend", "trtllm", *HISPARSE], False, None, None,
     "--dsv4-attn-backend trtllm does not support enable_hisparse."),
    ("v4", ["--kv-cache-dtype", "fp8_e5m2"], False, None, None, "fp8_e5m2 is not supported for DeepseekV4ForCausalLM"),
    ("v41", ["--sm-major", "10", *HISPARSE], False, None, None,
     "DeepSeek-V4.1 does not support HiSparse yet; disable it to serve this model."),
    ("deepseek-ai/DeepSeek-V4", HISPARSE, True, "fp8_e4m3", "flashmla", None),
    ("deepseek-ai/DeepSeek-V4-Flash", ["--platform", "npu", *HISPARSE], True, "bfloat16", "flashmla", None),
    ("deepseek-ai/DeepSeek-V4.1", ["--sm-major", "10", "--tp-size", "8", "--attn-dp-size", "8"], True,
     "fp8_e4m3", "flashmla_mega", None),
])
def test_every_v4_launch_gets_sglangs_answer(capsys, folders, model, argv, ok, kv, dsv4, error):
    d = evaluate(capsys, "--model-path", folders.get(model, model), *argv)
    assert d["policy"]["family"] == "dsv4-backends" and d["in_scope"]
    assert d["ok"] is ok
    if ok:
        assert (d["kv_cache_dtype"], d["backends"]["attention"], d["backends"]["dsv4_attention"]) == \
            (kv, "dsv4", dsv4)
    else:
        assert d["violations"][0]["message"] == error


def test_a_dsa_model_still_takes_the_dsa_family_and_an_unknown_name_is_said_so(capsys, folders):
    d = evaluate(capsys, "--model-path", folders["v32"], *HISPARSE, "--kv-cache-dtype", "fp8_e4m3")
    assert d["policy"]["family"] == "dsa-backends" and d["backends"] == {"prefill": "flashmla_kv",
                                                                         "decode": "flashmla_kv"}
    code, out, err = run_cli(capsys, "evaluate", "--model-path", "someone/unheard-of-model", *HISPARSE)
    assert "cannot tell" in out + err
