"""Launch commands from SGLang's own documentation and tests, read by `hisparse evaluate -- CMD` and
from a `--config` file, against what SGLang 0.5.23 itself does with the same arguments (its parser,
resolution, checks and --hisparse-config parse, run by the conform driver on a local model folder of
the architecture the hub name stands for). Skips without SGLang 0.5.23, except in CI, where its
absence fails (tests/sglang_release.py)."""
import json
import shlex
import subprocess
import sys

import pytest
import yaml

from engine.sglang.conform.drivers import installed_sglang
from engine.sglang.conform.protocol import Case
from tests.sglang_release import require

require("0.5.23", imported=True)
VERSION, REASON = installed_sglang()

# (where it comes from, the command); the model is a hub name, replaced by a local folder for SGLang
COMMANDS = [
    ("sglang docs/basic_usage/deepseek_v32.md: TP + DP",
     "python -m sglang.launch_server --model deepseek-ai/DeepSeek-V3.2-Exp --tp 8 --dp 8 --enable-dp-attention"),
    ("sglang docs/basic_usage/deepseek_v32.md: EP + DP",
     "python -m sglang.launch_server --model deepseek-ai/DeepSeek-V3.2-Exp --tp 8 --ep 8 --dp 8 "
     "--enable-dp-attention"),
    ("sglang docs/basic_usage/deepseek_v32.md: pure TP",
     "python -m sglang.launch_server --model deepseek-ai/DeepSeek-V3.2-Exp --tp 8"),
    ("sglang docs/basic_usage/deepseek_v32.md: function calling and reasoning parser",
     "python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --trust-remote-code "
     "--tp-size 8 --dp-size 8 --enable-dp-attention --tool-call-parser deepseekv32 --reasoning-parser deepseek-v3"),
    ("sglang test/srt HiSparse server test (BF16, flashmla_sparse), flags as 0.5.23 spells them",
     "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --tp 8 --disable-radix-cache "
     "--kv-cache-dtype bfloat16 --dsa-decode-backend flashmla_sparse --enable-hisparse "
     "--hisparse-config '{\"top_k\": 2048, \"device_buffer_size\": 4096, \"host_to_device_ratio\": 5}'"),
    ("sglang test/srt HiSparse server test as written before the DSA rename (--nsa-*: removed in 0.5.23)",
     "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --tp 8 --disable-radix-cache "
     "--kv-cache-dtype bfloat16 --nsa-decode-backend flashmla_sparse --enable-hisparse"),
    ("HiSparse with an FP8 KV cache (PR #23013's pairing)",
     "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --tp 8 --disable-radix-cache "
     "--kv-cache-dtype fp8_e4m3 --enable-hisparse"),
    ("GLM-5 with an FP8 KV cache",
     "python -m sglang.launch_server --model-path zai-org/GLM-5 --tp 8 --kv-cache-dtype fp8_e4m3"),
]
ARCH = {"deepseek-ai/DeepSeek-V3.2-Exp": "DeepseekV32ForCausalLM", "deepseek-ai/DeepSeek-V3.2": "DeepseekV32ForCausalLM",
        "zai-org/GLM-5": "GlmMoeDsaForCausalLM"}
MACHINES = [(9, 0), (10, 0), (12, 0)]


def server_args(command: str) -> tuple[list[str], str]:
    """(the arguments without the model, the model's architecture)."""
    tokens = shlex.split(command)
    args = tokens[tokens.index(next(t for t in tokens if t.endswith("launch_server"))) + 1:]
    i = next(i for i, t in enumerate(args) if t in ("--model", "--model-path"))
    model = args[i + 1]
    return args[:i] + args[i + 2:], ARCH[model]


def hisparse(*args) -> dict:
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "evaluate", "--format", "json", *args],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode == 2:  # refused as input (e.g. a removed flag): what a parser error is
        return {"ok": False, "error": proc.stderr}
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def driver():
    from engine.sglang.conform.drivers import driver_for

    module = driver_for(VERSION)
    module.load()
    return module


def agree(ours: dict, theirs) -> bool:
    if not theirs.ok:
        if "error" in ours:  # our input error: SGLang's parser refused it too
            return theirs.stage == "parser" and "unrecognized arguments" in theirs.message
        return not ours["ok"] and ours["violations"][0]["message"] == theirs.message \
            and tuple(ours["log"]) == theirs.log
    return ours.get("ok") is True and ours["kv_cache_dtype"] == theirs.kv_cache_dtype \
        and (ours["backends"]["prefill"], ours["backends"]["decode"]) == theirs.backends \
        and tuple(ours["log"]) == theirs.log


@pytest.mark.parametrize("where,command", COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.parametrize("capability", MACHINES, ids=lambda c: f"sm{c[0]}{c[1]}")
def test_launch_command_agrees_with_sglang(driver, where, command, capability, tmp_path):
    args, arch = server_args(command)
    theirs = driver.run_case(Case(tuple(args), arch, "cuda", capability))
    machine = ["--platform", "cuda", "--sm-major", str(capability[0])]
    ours = hisparse(*machine, "--", *shlex.split(command))
    assert agree(ours, theirs), (ours, theirs)
    # the same options as an SGLang config file give the same answer
    tokens = shlex.split(command)
    opts = tokens[tokens.index(next(t for t in tokens if t.endswith("launch_server"))) + 1:]
    data, i = {}, 0
    while i < len(opts):
        key = opts[i][2:]
        if i + 1 < len(opts) and not opts[i + 1].startswith("--"):
            data[key], i = opts[i + 1], i + 2
        else:
            data[key], i = True, i + 1
    for key in ("tp", "dp", "ep", "tp-size", "dp-size"):
        if key in data:
            data[key] = int(data[key])
    cfg = tmp_path / "server.yaml"
    cfg.write_text(yaml.safe_dump(data))
    from_file = hisparse(*machine, "--config", str(cfg))
    assert agree(from_file, theirs), (from_file, theirs)
