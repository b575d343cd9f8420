"""What the user gave -> policy inputs: one path for hisparse's flags, --config files, --batch
lines and launch commands. The same routing keys give the same decision from every source, two
spellings of one input or option are C501 in every source, and a record keeps the spellings."""
import json
import shlex

import pytest

import engine
from engine.sglang.given import combine
from engine.sglang.layers import read_layer
from tests.helpers import NSA_ALIASES, run_cli, write_policy

V3 = NSA_ALIASES  # deprecated spellings: the test policy that has them


def glm5_next_dir(tmp_path):
    folder = tmp_path / "GLM-5.3-Flash-local"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["Glm5NextForConditionalGeneration"],
                                                    "index_topk": 2048}))
    return str(folder)


# what a user gives, as (key, value) in SGLang's spelling; True for a switch
CASES = [
    # a non-DSA model with HiSparse: rejected from every source (was accepted from a config file)
    [("model-path", "meta-llama/Llama-3.1-8B"), ("enable-hisparse", True), ("disable-radix-cache", True)],
    # GLM-5 on SM12: GLM's own defaults from every source (a config file gave DeepSeek's)
    [("model-path", "zai-org/GLM-5-FP8"), ("kv-cache-dtype", "fp8_e4m3"), ("sm-major", 12)],
    # the JSON option (a batch line refused it)
    [("model-path", "deepseek-ai/DeepSeek-V3.2"), ("enable-hisparse", True), ("disable-radix-cache", True),
     ("hisparse-config", '{"top_k": 2048, "device_buffer_size": 4096}')],
    # its long alias, a deprecated flag (logged first), the model alias
    [("model", "deepseek-ai/DeepSeek-V3.2-Exp"), ("kv-cache-dtype", "bfloat16"), ("nsa-decode-backend", "fa3"),
     ("hierarchical-sparse-attention-extra-config", '{"device_buffer_size": 4096}')],
    # a local checkpoint: decided by its config.json
    [("model-path", "GLM53"), ("kv-cache-dtype", "fp8_e4m3"), ("sm-major", 12)],
]
HISPARSE_ONLY = {"sm-major"}  # an input of the policy with no SGLang flag: hisparse's own flag


def materialise(case, tmp_path):
    return [(k, glm5_next_dir(tmp_path) if v == "GLM53" else v) for k, v in case]


def via_flags(capsys, case, tmp_path):
    argv = []
    for k, v in case:
        argv += [f"--{k}"] if v is True else [f"--{k}", str(v)]
    return run_cli(capsys, "evaluate", "--policy", V3, "--format", "json", *argv)


def via_config(capsys, case, tmp_path):
    path = tmp_path / "server.yaml"
    path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in case))
    return run_cli(capsys, "evaluate", "--policy", V3, "--config", str(path), "--format", "json")


def via_batch(capsys, case, tmp_path):
    path = tmp_path / "batch.jsonl"
    path.write_text(json.dumps(dict(case)) + "\n")
    code, out, err = run_cli(capsys, "evaluate", "--policy", V3, "--batch", str(path))
    return code, out, err


def via_launch(capsys, case, tmp_path):
    own, argv = [], ["python", "-m", "sglang.launch_server", "--tp", "8"]
    for k, v in case:
        target = own if k in HISPARSE_ONLY else argv
        target += [f"--{k}"] if v is True else [f"--{k}", str(v)]
    return run_cli(capsys, "evaluate", "--policy", V3, "--format", "json", *own, "--", *argv)


@pytest.mark.parametrize("index", range(len(CASES)))
def test_every_source_reads_the_same_keys_the_same_way(capsys, tmp_path, index):
    case = materialise(CASES[index], tmp_path)
    results = []
    for source in (via_flags, via_config, via_batch, via_launch):
        code, out, err = source(capsys, case, tmp_path)
        assert code in (0, 1), (source.__name__, err)
        decision = json.loads(out)
        decision.pop("line", None)
        results.append((source.__name__, code, decision))
    first = results[0]
    for name, code, decision in results[1:]:
        assert (code, decision) == first[1:], name
    decision = first[2]
    expected = {0: (False, "only supported for DSA"), 1: (True, "flashinfer_sparse_mla"),
                2: (True, "flashmla_sparse"), 3: (True, "fa3"), 4: (True, "trtllm")}[index]
    assert decision["ok"] is expected[0]
    assert expected[1] in json.dumps(decision["violations"] or decision["backends"])
    if index == 3:
        assert decision["log"][0].startswith("'--nsa-decode-backend' is deprecated")
        assert decision["hisparse_device_buffer_size"] == 4096
    if index == 4:  # GLM-5.3-Flash is DSA, but never GLM-5: no SM12x GLM defaults
        assert decision["dsa_model"] is True and decision["model_family"] == "deepseek_v32"


TWINS = [
    ("hisparse-config", '{"top_k": 2048}', "hisparse_config", '{"top_k": 1024}'),
    ("hisparse-config", '{"top_k": 2048}', "hierarchical-sparse-attention-extra-config", '{"top_k": 1024}'),
    ("kv-cache-dtype", "bfloat16", "kv_cache_dtype", "fp8_e4m3"),
    ("dsa-decode-backend", "fa3", "nsa-decode-backend", "flashmla_kv"),
    ("model-path", "deepseek-ai/DeepSeek-V3.2", "model", "meta-llama/Llama-3.1-8B"),
    ("hisparse-top-k", 1024, "hisparse-config", '{"top_k": 2048}'),
]


@pytest.mark.parametrize("a, va, b, vb", TWINS)
def test_two_spellings_of_one_input_are_c501_in_a_config_file_and_a_batch_line(capsys, tmp_path, a, va, b, vb):
    path = tmp_path / "server.yaml"
    path.write_text(f"{a}: {json.dumps(va)}\n{b}: {json.dumps(vb)}\n")
    code, out, err = run_cli(capsys, "evaluate", "--policy", V3, "--config", str(path))
    assert code == 2 and out == "" and f"{path}:2:1: C501: " in err and "to different values" in err, err
    batch = tmp_path / "b.jsonl"
    batch.write_text(json.dumps({a: va, b: vb}) + "\n" + json.dumps({a: va}) + "\n")
    code, out, _ = run_cli(capsys, "evaluate", "--policy", V3, "--batch", str(batch))
    first, second = [json.loads(line) for line in out.splitlines()]
    assert code == 2 and first["error"]["code"] == "C501" and "ok" in second and "error" not in second


@pytest.mark.parametrize("a, va, b, vb", [t for t in TWINS if t[0] != "hisparse-top-k"])
def test_the_same_value_under_two_spellings_is_accepted(capsys, tmp_path, a, va, b, vb):
    path = tmp_path / "server.yaml"
    path.write_text(f"{a}: {json.dumps(va)}\n{b}: {json.dumps(va)}\n")
    code, out, err = run_cli(capsys, "evaluate", "--policy", V3, "--config", str(path), "--format", "json")
    assert code in (0, 1) and "C501" not in err, err


@pytest.mark.parametrize("a, va, b, vb", [t for t in TWINS if "_" not in t[2] and t[0] != "hisparse-top-k"])
def test_two_spellings_in_a_launch_command_and_on_the_command_line(capsys, a, va, b, vb):
    launch = ["python", "-m", "sglang.launch_server", f"--{a}", str(va), f"--{b}", str(vb)]
    code, out, err = run_cli(capsys, "evaluate", "--policy", V3, "--", *launch)
    assert code == 2 and out == "" and "C501" in err and "to different values" in err, err
    code, out, err = run_cli(capsys, "evaluate", "--policy", V3, f"--{a}", str(va), f"--{b}", str(vb))
    assert code == 2 and "C501" in err, err


def test_an_input_with_two_flags_never_takes_the_last_one_silently(capsys, tmp_path):
    """An input declaring two flags (not one of the listed examples): given both with different
    values on hisparse's command line, or in a launch command, it is C501."""
    from tests.helpers import minimal_text

    text = minimal_text().replace("    default: 9\n", "    default: 9\n    flags: [--sm-major, --gpu-sm]\n", 1)
    path = write_policy(tmp_path, text, "mini/v1.yaml")
    code, out, err = run_cli(capsys, "evaluate", "--policy", path, "--sm-major", "9", "--gpu-sm", "10")
    assert code == 2 and "C501" in err and "'gpu-sm' and 'sm-major' both set 'sm_major'" in err, err
    code, _, err = run_cli(capsys, "evaluate", "--policy", path, "--", "--sm-major", "9", "--gpu-sm", "10")
    assert code == 2 and "C501" in err
    code, out, _ = run_cli(capsys, "evaluate", "--policy", path, "--gpu-sm", "10", "--format", "json")
    assert code in (0, 1) and json.loads(out)["sm_major"] == 10


def test_apply_refuses_two_attributes_of_one_input():
    from engine.sglang import apply

    class Args:
        model_path = "deepseek-ai/DeepSeek-V3.2"
        kv_cache_dtype = "bfloat16"
        dsa_decode_backend = "fa3"
        nsa_decode_backend = "flashmla_kv"

    with pytest.raises(ValueError, match="both set 'dsa_decode_backend'"):
        apply(Args(), V3)
    Args.nsa_decode_backend = None  # an attribute left at None is not a second value
    assert apply(Args(), V3).backends["decode"] == "fa3"


def test_layers_stack_and_an_option_is_replaced_whole():
    """A later source replaces an input; a later --hisparse-config replaces the earlier one
    whole (SGLang's parser keeps the last value of an option), an input given explicitly beats
    what the model path says, and `given` reads back into the same config."""
    p = engine.load_policy(V3)
    file = read_layer(p, {"hisparse-config": {"top_k": 1024, "device_buffer_size": 512},
                          "model-path": "zai-org/GLM-5", "kv-cache-dtype": "fp8_e4m3"}, "file")
    line = read_layer(p, {"hisparse_config": {"device_buffer_size": 4096}, "dsa-model": True,
                          "kv_cache_dtype": "bfloat16"}, "line")
    g = combine(p, [file, line])
    assert g.config == {"hisparse_device_buffer_size": 4096, "kv_cache_dtype": "bfloat16", "dsa-model": True,
                        "model_family": "glm5"}
    again = combine(p, [read_layer(p, g.given)])
    assert p.evaluate(again.config).to_dict() == p.evaluate(g.config).to_dict()
    top = read_layer(p, {"hisparse-top-k": 4096}, "flags")  # beats the option's top_k, which stays recorded
    g = combine(p, [file, top])
    assert g.given["hisparse-config"] == {"device_buffer_size": 512} and g.given["hisparse-top-k"] == 4096
    assert p.evaluate(combine(p, [read_layer(p, g.given)]).config).config["hisparse_top_k"] == 4096


@pytest.mark.parametrize("cmd", [
    "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 \u2014kv-cache-dtype fp8_e4m3",
    "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 \u2013-enable-hisparse",
    "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 \u2212\u2212disable-radix-cache",
    "python -m sglang.launch_server --trust-remote-code \uff0d\uff0dkv-cache-dtype=fp8_e4m3",
    "python -m sglang.launch_server --kv\u2010cache-dtype fp8_e4m3",
    "\u2014kv-cache-dtype fp8_e4m3",
])
def test_typographic_dashes_are_refused_as_sglang_refuses_them(cmd):
    policy = engine.load_policy(V3)
    from engine.sglang import config_from_launch

    with pytest.raises(engine.ConfigError) as exc:
        config_from_launch(policy, shlex.split(cmd))
    text = str(exc.value)
    assert "C501" in text and "typographic dash: type '-' (hyphen-minus) instead" in text, text


def test_typographic_dashes_on_the_command_line_and_in_a_config_file(capsys, tmp_path):
    code, out, err = run_cli(capsys, "evaluate", "\u2014kv-cache-dtype", "fp8_e4m3")
    assert code == 2 and "unrecognized arguments" in err and "U+2014 EM DASH is a typographic dash" in err
    path = tmp_path / "server.yaml"
    path.write_text("tp: 8\nkv\u2013cache-dtype: fp8_e4m3\n")
    code, out, err = run_cli(capsys, "evaluate", "--config", str(path))
    assert code == 2 and f"{path}:2:1: C501" in err and "U+2013 EN DASH" in err, err


@pytest.mark.parametrize("cmd, text", [
    ("python -m sglang.launch_server --kv-cache-dtype fp8_e4m3 bfloat16", "unrecognized argument 'bfloat16' after "
                                                                          "--kv-cache-dtype"),
    ("python -m sglang.launch_server --enable-hisparse yes", "unrecognized argument 'yes' after --enable-hisparse"),
    ("python -m sglang.launch_server --kv_cache_dtype fp8_e4m3", "did you mean --kv-cache-dtype?"),
    ("python -m sglang.launch_server -kv-cache-dtype fp8_e4m3", "did you mean --kv-cache-dtype?"),
    ("python -m sglang.launch_server stray --model-path m", "unrecognized argument 'stray': SGLang's parser"),
    ("python -m sglang.launch_server --tp=8 stray", "unrecognized argument 'stray' after --tp"),
    ("python -m sglang.launch_server --model-path m -- --kv-cache-dtype bf16",
     "unrecognized arguments '-- --kv-cache-dtype bf16'"),
    ("python -m sglang.launch_server --model-path -m", "argument --model-path: expected one argument"),
    ("python -m sglang.launch_server --sm-major 1e3", "argument --sm-major: invalid int value: '1e3'"),
])
def test_what_sglangs_parser_refuses_is_refused(cmd, text):
    from engine.sglang import config_from_launch

    with pytest.raises(engine.ConfigError) as exc:
        config_from_launch(engine.load_policy(V3), shlex.split(cmd))
    assert text in str(exc.value)


def test_unrelated_flags_with_several_values_are_still_skipped():
    """SGLang's --cuda-graph-bs takes one or more values (nargs="+" in 0.5.11-0.5.19): the words
    after a flag the policy does not read are its own, never strays."""
    from engine.sglang import config_from_launch

    config, notes = config_from_launch(engine.load_policy(V3), shlex.split(
        "python -m sglang.launch_server --cuda-graph-bs 1 2 4 --model-path deepseek-ai/DeepSeek-V3.2 "
        "--kv-cache-dtype fp8_e4m3"))
    assert config["kv-cache-dtype"] == "fp8_e4m3" and config["dsa_model"] is True
    assert notes == []


def test_a_launch_command_past_the_word_limit_is_refused_unparsed():
    """argparse's time grows with the square of the options given: a command longer than any real
    one is refused before it is parsed, and one at the limit is read."""
    from engine.sglang import config_from_launch
    from engine.sglang.launch import MOST_WORDS

    policy = engine.load_policy(V3)
    words = ["--model-path", "zai-org/GLM-5"] + ["--tp", "8"] * ((MOST_WORDS - 2) // 2)
    assert config_from_launch(policy, words)[0]["dsa_model"] is True
    with pytest.raises(engine.ConfigError, match=f"a launch command of {MOST_WORDS + 2:,} words: at most"):
        config_from_launch(policy, words + ["--tp", "8"])


def test_sglang_serve_reads_a_first_bare_word_as_the_model_path():
    """`sglang serve MODEL ...` (SGLang 0.5.16 on) is `--model-path MODEL`; the launcher's other
    spellings take no positional."""
    from engine.sglang import config_from_launch

    policy = engine.load_policy(V3)
    config, _ = config_from_launch(policy, ["sglang", "serve", "zai-org/GLM-5", "--kv-cache-dtype", "bf16"])
    assert config["dsa_model"] is True and config["model_family"] == "glm5"
    with pytest.raises(engine.ConfigError, match="unrecognized argument 'zai-org/GLM-5'"):
        config_from_launch(policy, ["python", "-m", "sglang.launch_server", "zai-org/GLM-5"])


def test_a_removed_spelling_names_its_replacement_in_every_source(capsys, tmp_path):
    """dsa-backends@10 (SGLang 0.5.23) removed --nsa-decode-backend: refused from a launch
    command, a config file and a batch line alike, naming --dsa-decode-backend."""
    code, _, err = run_cli(capsys, "evaluate", "--policy", "dsa-backends@10", "--",
                           "--model-path", "deepseek-ai/DeepSeek-V3.2", "--nsa-decode-backend", "fa3")
    assert code == 2 and "--nsa-decode-backend was removed" in err and "use --dsa-decode-backend" in err, err
    path = tmp_path / "server.yaml"
    path.write_text("tp: 8\nnsa-decode-backend: fa3\n")
    code, _, err = run_cli(capsys, "evaluate", "--policy", "dsa-backends@10", "--config", str(path))
    assert code == 2 and f"{path}:2:1: C501" in err and "was removed" in err, err
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"nsa_decode_backend": "fa3"}\n')
    code, out, _ = run_cli(capsys, "evaluate", "--policy", "dsa-backends@10", "--batch", str(batch))
    assert code == 2 and json.loads(out)["error"]["hint"] == "use --dsa-decode-backend"
