"""The SGLang command-line adapter on real-world style launch commands, and apply() on a
stand-in object with SGLang's attribute names."""
import json
import logging
import os
import shlex

import pytest

import engine
from engine.sglang import apply, config_from_launch, model_is_dsa
from tests.helpers import NSA_ALIASES, run_cli

V2 = "dsa-backends@2"


def launch(cmd: str, ref=V2):
    policy = engine.load_policy(ref)
    config, notes = config_from_launch(policy, shlex.split(cmd))
    return policy.evaluate(config), config, notes


@pytest.mark.parametrize("cmd, ok, prefill, decode", [
    # 1. the seed's example: HiSparse + FP8 on DeepSeek-V3.2
    ("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --tp 8 --enable-hisparse "
     "--kv-cache-dtype fp8_e4m3 --disable-radix-cache --trust-remote-code", True, "flashmla_kv", "flashmla_kv"),
    # 2. --flag=value spellings, python3 with a version, dp attention flags around
    ("python3.11 -m sglang.launch_server --model=deepseek-ai/DeepSeek-V3.2-Exp --tp-size=8 --dp 8 "
     "--enable-dp-attention --kv-cache-dtype=bf16 --mem-fraction-static 0.85", True, "flashmla_sparse", "fa3"),
    # 3. environment variables before the interpreter; BF16 HiSparse
    ("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 SGLANG_ENABLE_JIT_DEEPGEMM=0 python -m sglang.launch_server "
     "--model-path /models/DeepSeek-V3.2 --enable-hisparse --kv-cache-dtype bfloat16 --disable-radix-cache "
     "--host 0.0.0.0 --port 30000", True, "flashmla_sparse", "flashmla_sparse"),
    # 4. the seed's compatibility risk: explicit flashmla_sparse decode with FP8
    ("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --enable-hisparse "
     "--kv-cache-dtype fp8_e4m3 --disable-radix-cache --nsa-decode-backend flashmla_sparse", False, None, None),
    # 5. HiSparse on a model without DSA
    ("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B-Instruct --enable-hisparse "
     "--disable-radix-cache --tp 4", False, None, None),
    # 6. GLM-5 counts as DSA; radix cache left on
    ("python -m sglang.launch_server --model-path zai-org/GLM-5-FP8 --enable-hisparse --kv-cache-dtype fp8_e4m3",
     False, None, None),
    # 7. explicit backends, speculative decoding flags with values around them
    ("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --speculative-algorithm EAGLE "
     "--speculative-num-steps 3 --nsa-prefill-backend flashmla_sparse --nsa-decode-backend fa3 "
     "--kv-cache-dtype bfloat16", True, "flashmla_sparse", "fa3"),
    # 8. the path of the launcher script itself
    ("/opt/venv/bin/python /opt/sglang/python/sglang/launch_server.py --model-path deepseek-ai/DeepSeek-V3.2 "
     "--kv-cache-dtype fp8_e4m3", True, "flashmla_kv", "flashmla_kv"),
    # 9. a DeepSeek V3 (not V3.2) model skips DSA routing entirely
    ("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3-0324 --tp 8 --kv-cache-dtype fp8_e5m2",
     True, None, None),
    # 10. unsupported dtype for DSA stops in the resolve stage
    ("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --kv-cache-dtype fp4_e2m1",
     False, None, None),
    # 11. the arguments alone, no launcher
    ("--model-path deepseek-ai/DeepSeek-V3.2 --enable-hisparse --disable-radix-cache", True,
     "flashmla_sparse", "flashmla_sparse"),
])
def test_launch_commands(cmd, ok, prefill, decode):
    d, _, _ = launch(cmd)
    assert d.ok is ok, d.error
    if ok:
        assert (d.backends["prefill"], d.backends["decode"]) == (prefill, decode)


def test_rejections_carry_sglangs_messages():
    d, _, _ = launch("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --enable-hisparse "
                     "--kv-cache-dtype fp8_e4m3 --disable-radix-cache --nsa-decode-backend flashmla_sparse")
    assert d.error == ("HiSparse with --kv-cache-dtype=fp8_e4m3 requires --nsa-decode-backend in "
                       "['flashmla_kv'], but got flashmla_sparse.")
    d, config, _ = launch("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B-Instruct "
                          "--enable-hisparse --disable-radix-cache")
    assert config["dsa_model"] is False
    assert d.error.startswith("--enable-hisparse is only supported for DSA")


def test_config_file_inside_the_command(tmp_path):
    cfg = tmp_path / "server.yaml"
    cfg.write_text("model-path: deepseek-ai/DeepSeek-V3.2\nenable-hisparse: true\nkv-cache-dtype: bfloat16\n"
                   "disable-radix-cache: true\ntp: 8\n")
    d, _, _ = launch(f"python -m sglang.launch_server --config {cfg} --kv-cache-dtype fp8_e4m3")
    assert d.ok and d.backends["decode"] == "flashmla_kv"  # the command line wins over the file


@pytest.mark.parametrize("cmd, text", [
    ("python -m sglang.launch_server --kv-cache-dtpye fp8_e4m3", "did you mean --kv-cache-dtype?"),
    ("python -m sglang.launch_server --enable-hisparce", "did you mean --enable-hisparse?"),
    ("python -m sglang.launch_server --disable-radix", "abbreviation is not accepted"),
    # argparse's own words, as SGLang's parser says them
    ("python -m sglang.launch_server --enable-hisparse=true", "argument --enable-hisparse: ignored explicit argument 'true'"),
    ("python -m sglang.launch_server --kv-cache-dtype", "argument --kv-cache-dtype: expected one argument"),
    ("python -m sglang.launch_server --kv-cache-dtype fp8", "did you mean one of 'fp8_e4m3', 'fp8_e5m2'?"),
    ("vllm serve deepseek-ai/DeepSeek-V3.2", "not an SGLang launch command"),
])
def test_mistakes_are_caught(cmd, text):
    with pytest.raises(engine.ConfigError) as exc:
        launch(cmd)
    assert text in str(exc.value)


def test_unknown_model_is_said(capsys):
    _, config, notes = launch("python -m sglang.launch_server --model-path /data/ckpt/step-1200 --tp 8")
    assert "dsa_model" not in config
    assert any("cannot tell whether /data/ckpt/step-1200 uses DeepSeek Sparse Attention" in n for n in notes)


@pytest.mark.parametrize("path, dsa", [
    ("deepseek-ai/DeepSeek-V3.2", True), ("deepseek-ai/DeepSeek-V3.2-Exp", True),
    ("deepseek-ai/DeepSeek-V3.2-Speciale", True), ("/models/glm-5", True), ("zai-org/GLM-5-FP8", True),
    ("deepseek-ai/DeepSeek-V3.1", False), ("deepseek-ai/DeepSeek-R1", False), ("zai-org/GLM-4.6", False),
    ("Qwen/Qwen3-235B-A22B", False), ("my-org/finetune-7", None), ("zai-org/GLM-50", None),
    ("zai-org/GLM-5.3-Flash", True),
])
def test_model_recognition(path, dsa):
    assert model_is_dsa(path) is dsa


@pytest.mark.parametrize("config, dsa, family", [
    ({"architectures": ["DeepseekV32ForCausalLM"], "index_topk": 2048}, True, "deepseek_v32"),
    ({"architectures": ["GlmMoeDsaForCausalLM"], "index_topk": 2048}, True, "glm5"),
    ({"architectures": ["Glm5NextForConditionalGeneration"], "index_topk": 2048}, True, "glm5_next"),
    ({"architectures": ["Glm5NextForConditionalGeneration"], "text_config": {"index_topk": 2048}}, True, "glm5_next"),
    ({"architectures": ["DeepseekV3ForCausalLM"]}, False, None),  # DeepSeek-V3: no indexer
    ({"architectures": ["DeepseekV3ForCausalLM"], "index_topk": 2048}, True, "deepseek_v32"),
    ({"architectures": ["DeepseekV32ForCausalLM"], "index_topk": None}, False, None),
    ({"architectures": ["LlamaForCausalLM"], "index_topk": 2048}, False, None),
])
def test_a_local_checkpoint_is_read_by_its_architecture(tmp_path, config, dsa, family):
    """A folder's config.json decides, whatever the folder is called (a name that says
    DeepSeek-V3.2 holding a DeepSeek-V3 checkpoint is not DSA)."""
    import json

    from engine.sglang.models import identify

    folder = tmp_path / "DeepSeek-V3.2-copy"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    model = identify(str(folder))
    assert (model.dsa, model.family) == (dsa, family)


def test_glm5_next_never_gets_glm5_defaults(tmp_path, capsys):
    """GLM-5.3-Flash is DSA but not GLM-5: on SM12 with FP8 it must not get GLM-5's
    flashinfer_sparse_mla defaults; the policy has no value for it, so its default applies
    and a note says so. A policy that declares glm5_next gets it."""
    import json

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Glm5NextForConditionalGeneration"],
                                                    "index_topk": 2048}))
    for argv in (["--model-path", str(folder)], ["--", "--model-path", str(folder)]):
        code, out, err = run_cli(capsys, "evaluate", "--policy", V3, "--sm-major", "12", "--kv-cache-dtype",
                                 "fp8_e4m3", "--format", "json", *argv)
        d = json.loads(out)
        assert code == 0 and d["dsa_model"] is True and d["model_family"] == "deepseek_v32"
        assert d["backends"] == {"prefill": "trtllm", "decode": "trtllm"}
        assert "no value for 'glm5_next': the policy default (deepseek_v32) applies" in err
    # by hub name too
    code, out, _ = run_cli(capsys, "evaluate", "--policy", V3, "--sm-major", "12", "--kv-cache-dtype", "fp8_e4m3",
                           "--model-path", "zai-org/GLM-5.3-Flash", "--format", "json")
    assert json.loads(out)["backends"]["decode"] == "trtllm"
    policy = engine.load_policy("dsa-backends@10")  # declares glm5_next
    config, notes = config_from_launch(policy, ["--model-path", str(folder)])
    assert config["model_family"] == "glm5_next" and not any("glm5_next" in n for n in notes)
    d = policy.evaluate(dict(config, sm_major=12, kv_cache_dtype="fp8_e4m3"))
    assert d.ok and d.backends["decode"] != "flashinfer_sparse_mla"


@pytest.mark.parametrize("ref, dsa, family, note", [
    ("dsa-backends@1", False, None, "counts as DSA only from SGLang 0.5.16 on; sglang 0.5.11"),
    ("dsa-backends@5", True, None, None),  # 0.5.16: DSA, and every DSA model routes alike
    ("dsa-backends@6", True, "longcat_flash", None),  # 0.5.17 names the family
])
def test_longcat_flash_is_dsa_from_the_release_that_says_so(tmp_path, ref, dsa, family, note):
    """LongCat-Flash with an indexer is DSA from SGLang 0.5.16 (is_deepseek_dsa's list): a policy
    that models only older releases reads it as not DSA, and says why."""
    import json

    folder = tmp_path / "LongCat-Flash"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LongcatFlashForCausalLM"],
                                                    "index_topk": 2048}))
    config, notes = config_from_launch(engine.load_policy(ref), ["--model-path", str(folder)])
    assert config.get("dsa_model") is dsa
    assert config.get("model_family") == family
    assert any(note in n for n in notes) if note else not notes


@pytest.mark.parametrize("content, text", [
    ("{not json", "JSON syntax"), ("[1, 2]", "expected a JSON object, got a list"),
    ('{"architectures": []}', "'architectures' must be a non-empty list of names"),
    ('{"model_type": "deepseek_v32"}', "'architectures' must be a non-empty list"),
    ('{"architectures": ["DeepseekV32ForCausalLM"], "model_type": ["deepseek_v32"]}',
     "'model_type' must be a name, got a list"),
    ('{"architectures": ["DeepseekV4ForCausalLM"], "model_type": 4}', "'model_type' must be a name, got an integer"),
    (b"\xff\xfe", "not UTF-8"), (None, "cannot read file"),
])
def test_an_unreadable_model_config_is_an_error_naming_the_file(tmp_path, capsys, content, text):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    path = folder / "config.json"
    if content is None:
        path.mkdir()  # a folder where the file should be
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    for argv in (["--model-path", str(folder)], ["--", "--model-path", str(folder)]):
        code, out, err = run_cli(capsys, "evaluate", *argv)
        assert code == 2 and out == "" and str(path) in err and text in err and "C504" in err, err
    with pytest.raises(ValueError, match="model config"):
        apply(ServerArgs(model_path=str(folder)), V3)


def test_cli_launch_command_and_overrides(capsys):
    base = ["--", "python", "-m", "sglang.launch_server", "--model-path", "deepseek-ai/DeepSeek-V3.2",
            "--enable-hisparse", "--disable-radix-cache"]
    code, out, _ = run_cli(capsys, "evaluate", "--policy", V2, "--format", "json", *base)
    assert code == 0 and '"nsa_decode_backend": "flashmla_sparse"' in out
    # hisparse's own flags before -- win over the launch command
    code, out, _ = run_cli(capsys, "evaluate", "--policy", V2, "--sm-major", "10", "--format", "json", *base)
    assert code == 0 and '"nsa_decode_backend": "flashmla_kv"' in out
    code, out, _ = run_cli(capsys, "evaluate", "--policy", V2, "--no-dsa-model", *base)
    assert code == 1 and "only supported for DSA" in out
    code, out, _ = run_cli(capsys, "explain", "--policy", V2, *base)
    assert code == 0 and "CHOSEN" in out
    code, _, err = run_cli(capsys, "evaluate", "--", "python", "-m", "sglang.launch_server", "--kv-cache-dtpye", "x")
    assert code == 2 and "did you mean --kv-cache-dtype?" in err


class ServerArgs:
    """A stand-in with SGLang's attribute names (and unrelated ones)."""

    def __init__(self, **kw):
        self.model_path = "deepseek-ai/DeepSeek-V3.2"
        self.tp_size = 8
        self.enable_hisparse = False
        self.kv_cache_dtype = "auto"
        self.disable_radix_cache = False
        self.nsa_prefill_backend = None
        self.nsa_decode_backend = None
        self.__dict__.update(kw)


def test_apply_fills_backends_and_logs(caplog):
    args = ServerArgs(enable_hisparse=True, kv_cache_dtype="fp8_e4m3", disable_radix_cache=True)
    with caplog.at_level(logging.WARNING, logger="sglang.srt.server_args"):
        d = apply(args, V2, sm_major=9, platform="cuda")
    assert d.ok
    assert (args.nsa_prefill_backend, args.nsa_decode_backend) == ("flashmla_kv", "flashmla_kv")
    assert args.tp_size == 8  # untouched
    assert [r.getMessage() for r in caplog.records] == [
        "HiSparse enabled (fp8_e4m3): using NSA backends prefill=flashmla_kv, decode=flashmla_kv."]


def test_apply_resolves_auto_from_the_arch():
    args = ServerArgs()
    apply(args, V2, sm_major=10, platform="cuda")
    assert args.kv_cache_dtype == "fp8_e4m3"
    assert (args.nsa_prefill_backend, args.nsa_decode_backend) == ("trtllm", "trtllm")


def test_apply_raises_like_sglang_and_writes_nothing():
    args = ServerArgs(enable_hisparse=True, kv_cache_dtype="fp8_e4m3", disable_radix_cache=True,
                      nsa_decode_backend="flashmla_sparse")
    before = dict(vars(args))
    with pytest.raises(ValueError) as exc:
        apply(args, V2, sm_major=9, platform="cuda")
    assert str(exc.value) == ("HiSparse with --kv-cache-dtype=fp8_e4m3 requires --nsa-decode-backend in "
                              "['flashmla_kv'], but got flashmla_sparse.")
    assert vars(args) == before


def test_apply_reads_the_model_path():
    args = ServerArgs(model_path="meta-llama/Llama-3.1-8B", enable_hisparse=True, disable_radix_cache=True)
    with pytest.raises(AssertionError, match="only supported for DSA"):  # an assert in SGLang
        apply(args, V2, sm_major=9, platform="cuda")
    plain = ServerArgs(model_path="meta-llama/Llama-3.1-8B", kv_cache_dtype="fp8_e5m2")
    apply(plain, V2)
    assert plain.nsa_decode_backend is None  # no DSA routing for it


V3 = NSA_ALIASES  # deprecated spellings mirrored: the test policy that has them


def test_v3_deprecated_spelling_in_a_launch_command_is_logged():
    d, config, _ = launch("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 "
                          "--kv-cache-dtype bfloat16 --nsa-decode-backend fa3", V3)
    assert "nsa-decode-backend" in config
    assert d.ok and d.backends["decode"] == "fa3"
    assert d.log[0] == ("'--nsa-decode-backend' is deprecated and will be removed in a future release. "
                        "Use '--dsa-decode-backend' instead.")
    d, _, _ = launch("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 "
                     "--kv-cache-dtype bfloat16 --dsa-decode-backend fa3", V3)
    assert not any("deprecated" in line for line in d.log)


def test_v3_hisparse_config_json():
    base = ("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --enable-hisparse "
            "--disable-radix-cache --kv-cache-dtype fp8_e4m3 ")
    d, config, _ = launch(base + """--hisparse-config '{"top_k": 2048, "device_buffer_size": 1024, "host_to_device_ratio": 2}'""", V3)
    assert config["hisparse_device_buffer_size"] == 1024
    assert d.error == "device_buffer_size (1024) must be no smaller than top_k (2048)"
    d, _, _ = launch(base + """--hisparse-config='{"device_buffer_size": 4096}'""", V3)
    assert d.ok and d.backends["decode"] == "flashmla_kv"
    with pytest.raises(engine.ConfigError, match="hisparse-config: not a JSON object"):
        launch(base + "--hisparse-config top_k=2048", V3)
    # a policy without those inputs ignores the option like any unrelated flag
    d, config, _ = launch(base + """--hisparse-config '{"device_buffer_size": 1}'""", V2)
    assert d.ok and not any("hisparse_" in k for k in config)


def test_v3_glm5_on_sm12_is_read_from_the_model_path(capsys):
    code, out, _ = run_cli(capsys, "evaluate", "--policy", V3, "--sm-major", "12", "--format", "json", "--",
                           "python", "-m", "sglang.launch_server", "--model-path", "zai-org/GLM-5-FP8",
                           "--kv-cache-dtype", "fp8_e4m3")
    assert code == 0
    d = __import__("json").loads(out)
    assert d["model_family"] == "glm5" and d["dsa_decode_backend"] == "flashinfer_sparse_mla"
    assert d["nsa_decode_backend"] == "flashinfer_sparse_mla"  # the deprecated key mirrors it


def test_v3_cli_deprecated_flag(capsys):
    code, out, _ = run_cli(capsys, "evaluate", "--policy", V3, "--kv-cache-dtype", "bfloat16",
                           "--nsa-prefill-backend", "flashmla_sparse", "--format", "json")
    assert code == 0
    log = __import__("json").loads(out)["log"]
    assert log[0].startswith("'--nsa-prefill-backend' is deprecated")


def test_v3_config_file_with_hisparse_config(capsys, tmp_path):
    cfg = tmp_path / "server.yaml"
    cfg.write_text("model-path: deepseek-ai/DeepSeek-V3.2\nenable-hisparse: true\ndisable-radix-cache: true\n"
                   "hisparse-config: '{\"top_k\": 2048, \"device_buffer_size\": 512}'\n")
    code, out, _ = run_cli(capsys, "evaluate", "--policy", V3, "--config", str(cfg))
    assert code == 1 and "device_buffer_size (512) must be no smaller than top_k (2048)" in out


def test_apply_v3_with_hisparse_config_attribute():
    args = ServerArgs(enable_hisparse=True, kv_cache_dtype="fp8_e4m3", disable_radix_cache=True,
                      dsa_prefill_backend=None, dsa_decode_backend="flashinfer_sparse_mla",
                      hisparse_config='{"top_k": 2048, "device_buffer_size": 4096}')
    d = apply(args, V3, sm_major=9, platform="cuda")
    assert d.ok
    assert (args.dsa_prefill_backend, args.dsa_decode_backend) == ("flashmla_kv", "flashinfer_sparse_mla")
    assert args.nsa_prefill_backend == "flashmla_kv"  # the deprecated attribute is kept in step too
    args.hisparse_config = '{"device_buffer_size": 1000}'
    with pytest.raises(ValueError, match=r"device_buffer_size \(1000\)"):
        apply(args, V3, sm_major=9, platform="cuda")


@pytest.mark.parametrize("argv", [
    ["evaluate", "--model-path", "{m}", "--format", "json"],
    ["explain", "--model-path", "{m}"],
    ["evaluate", "--", "python", "-m", "sglang.launch_server", "--model-path", "{m}"],
    ["evaluate", "--model-path", "{m}", "--batch", "{batch}"],
])
def test_a_model_folder_is_read_once_per_command(tmp_path, capsys, monkeypatch, argv):
    """The model read to choose the family's version is handed on: its config.json is read once,
    not again where the config is put together (a batch line naming no model of its own included)."""
    from engine.sglang import models

    folder = tmp_path / "v4"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["DeepseekV4ForCausalLM"],
                                                    "model_type": "deepseek_v4"}))
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"kv_cache_dtype": "fp8_e4m3"}\n{"kv_cache_dtype": "bfloat16"}\n')
    reads = []
    real = models._from_config
    monkeypatch.setattr(models, "_from_config", lambda path: reads.append(path) or real(path))
    argv = [a.format(m=folder, batch=batch) for a in argv]
    code, out, err = run_cli(capsys, argv[0], "--policy", "sglang==0.5.23", *argv[1:])
    assert code == 0 and ("dsv4-backends@13" in out or '"family": "dsv4-backends", "version": 13' in out), err
    assert reads == [os.path.join(str(folder), "config.json")]
