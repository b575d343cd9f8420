"""The launch-command reader against SGLang 0.5.23's own parser (ServerArgs.add_cli_args, as
prepare_server_args builds it) on the same argument lists: what SGLang accepts, the reader
accepts with the same routing values; what SGLang refuses, the reader refuses, naming the same
word or option. Where the two differ on purpose, the test says why and holds the difference.
Skips without SGLang 0.5.23, except in CI, where its absence fails (tests/sglang_release.py)."""
import json
import shlex

import pytest

import engine
from engine.errors import ConfigError
from engine.sglang.launch import launch_layers
from tests.sglang_release import require

require("0.5.23", imported=True)
POLICY = "dsa-backends@10"  # the version that models SGLang 0.5.23

ACCEPTED = [
    "--model-path m --kv-cache-dtype fp8_e4m3",
    "--model-path=m --kv-cache-dtype=bf16 --enable-hisparse --disable-radix-cache",
    "--model m --dsa-decode-backend fa3 --tp-size 8 --trust-remote-code --dsa-prefill-backend flashmla_kv",
    "--model-path m --kv-cache-dtype fp8_e4m3 --kv-cache-dtype bf16",  # repeated: the last wins
    "--model-path m --dsa-decode-backend=fa3 --dsa-decode-backend flashmla_kv --enable-hisparse --enable-hisparse",
    "--model-path -5",  # a negative number is a value, not an option
    "--model-path 'a b' --cuda-graph-bs-decode 1 2 4 --kv-cache-dtype bfloat16",
    "--model-path m --hisparse-config '{\"top_k\": 2048, \"device_buffer_size\": 4096}'",
    "--model m --hierarchical-sparse-attention-extra-config='{\"top_k\": 1024}' --mem-fraction-static 0.8",
    "--model-path m --tp 8 --trust-remote",  # abbreviations of one flag each, which SGLang resolves
]
REFUSED = [
    "--model-path m --kv-cache-dtype",
    "--model-path m --kv-cache-dtype -x",  # a value that starts with '-' is an option
    "--model-path -m",
    "--model-path m --enable-hisparse=true",
    "--model-path m --enable-hisparse yes",
    "--model-path m --kv-cache-dtype bf16 extra",
    "--model-path m --kv-cache-dtype=bf16 extra",
    "--model-path m --tp-size=8 extra",
    "--model-path m --kv_cache_dtype bf16",
    "--model-path m -kv-cache-dtype bf16",
    "--model-path m --kv-cache-dtpye bf16",
    "--model-path m \u2014kv-cache-dtype bf16",
    "--model-path m --trust-remote-code \uff0d\uff0dkv-cache-dtype=fp8_e4m3",
    "--model-path m --nsa-decode-backend fa3",  # removed in 0.5.22
    "--model-path m -- --kv-cache-dtype bf16",
    # flags SGLang 0.5.23's parser lacks (engine/sglang/release_flags.txt): hisparse's own, a
    # misspelt one, an abbreviation of several, one of an earlier release
    "--model-path m --sm-major 10",
    "--model-path m --platform hip --enable-hisparse",
    "--model-path m --tensor-paralel-size 8",
    "--model-path m --enable-pref",
    "--model-path m --enable-dsa-prefill-context-parallel",
]
# SGLang resolves an abbreviation among its own flags; the reader does not know them all (they
# differ by release), so it refuses, naming the flag SGLang resolved it to
ABBREVIATED = [("--model-path m --disable-radix", "--disable-radix-cache"),
               ("--model-path m --kv-cache bf16", "--kv-cache-dtype")]
# the reader skips the words after a flag the policy does not read (SGLang's flag may take them,
# as --cuda-graph-bs-decode does); after a switch SGLang refuses them
LENIENT = ["--model-path m --trust-remote-code extra"]


@pytest.fixture(scope="module")
def sglang():
    from sglang.srt.server_args import ServerArgs

    from engine.sglang.conform.startup import ParserError, release_parser

    parser = release_parser(ServerArgs)

    def parse(argv):
        try:
            return parser.parse_args(argv), None
        except ParserError as exc:
            return None, exc.message

    parse.default = parser.get_default
    return parse


@pytest.fixture(scope="module")
def policy():
    return engine.load_policy(POLICY)


def ours(policy, argv):
    try:
        return launch_layers(policy, argv)[0][-1], None
    except ConfigError as exc:
        return None, str(exc)


@pytest.mark.parametrize("command", ACCEPTED)
def test_what_sglang_accepts_is_read_with_its_values(sglang, policy, command):
    argv = shlex.split(command)
    ns, refused = sglang(argv)
    layer, error = ours(policy, argv)
    assert refused is None and error is None, (refused, error)
    read = {name: value for name, (_, value) in layer.inputs.items()}
    shared = [name for name in policy.inputs if hasattr(ns, name)]
    assert {"kv_cache_dtype", "enable_hisparse", "disable_radix_cache", "dsa_decode_backend"} <= set(shared)
    for name in shared:
        assert read.get(name, sglang.default(name)) == getattr(ns, name), name
    assert layer.model[1] == ns.model_path
    option = layer.options.get("hisparse-config")
    assert (option[1] if option else None) == (json.loads(ns.hisparse_config) if ns.hisparse_config else None)


@pytest.mark.parametrize("command", REFUSED)
def test_what_sglang_refuses_is_refused_naming_the_same_word(sglang, policy, command):
    argv = shlex.split(command)
    ns, refused = sglang(argv)
    layer, error = ours(policy, argv)
    assert refused is not None and error is not None, (ns, layer)
    if refused.startswith("unrecognized arguments: "):
        named = refused.split(": ", 1)[1].split(" ")[0]
    elif refused.startswith("ambiguous option: "):  # the same flags matched (argparse lists them in its own order)
        named, matches = refused[len("ambiguous option: "):].split(" could match ")
        ours_listed = error.split(" could match ", 1)[1].split(": ", 1)[0]
        assert sorted(matches.split(", ")) == sorted(ours_listed.split(", ")), (refused, error)
    else:  # argument --kv-cache-dtype: expected one argument (--model-path/--model: one action, two spellings)
        named = refused.split(": ", 1)[0].split(" ")[1].split("/")[0]
        assert refused.split(": ", 1)[1] in error
    assert named in error, (refused, error)


@pytest.mark.parametrize("command, flag", ABBREVIATED)
def test_an_abbreviation_sglang_resolves_is_refused_naming_its_flag(sglang, policy, command, flag):
    argv = shlex.split(command)
    ns, refused = sglang(argv)
    dest = flag[2:].replace("-", "_")
    assert refused is None and getattr(ns, dest) != sglang.default(dest)
    _, error = ours(policy, argv)
    assert "an abbreviation is not accepted here" in error and f"did you mean {flag}?" in error


@pytest.mark.parametrize("command", LENIENT)
def test_words_after_a_flag_the_policy_does_not_read_are_skipped(sglang, policy, command):
    argv = shlex.split(command)
    assert sglang(argv)[1].startswith("unrecognized arguments: ")
    assert ours(policy, argv)[1] is None
