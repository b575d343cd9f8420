"""Each release's server flags (engine/sglang/release_flags.txt, read by the registry) and the
launch reader's use of them: a flag the releases a policy models lack is refused as their parser
refuses it, with a hint saying where the flag does exist.

The table against the release's own parser runs in the release's environment
(HISPARSE_PLUGIN_RELEASE_ENV; tools/conform-releases.sh runs it for every release), else on the
installed SGLang."""
from __future__ import annotations

import json
import subprocess

import pytest

import engine
from engine.errors import ConfigError
from engine.sglang.launch import config_from_launch
from engine.sglang.registry import RELEASES, flag_releases, release_flags
from tests.helpers import ROOT, load_text
from tests.sglang_release import release_environment


def test_the_table_is_the_releases_own_parser(tmp_path_factory):
    python, env, release = release_environment(tmp_path_factory)
    proc = subprocess.run([python, "-W", "ignore", "-m", "engine.sglang.conform.parser_flags"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("FLAGS ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    report = json.loads(lines[-1][len("FLAGS "):])
    assert report["release"] == release
    assert sorted(release_flags(release)) == report["flags"]


def test_every_listed_release_has_its_flags_and_no_other_release_does():
    assert all(len(release_flags(r.version)) > 300 for r in RELEASES)
    assert release_flags("0.5.99") is None and release_flags("not a version") is None
    assert flag_releases("--enable-prefill-cp")[0] == "0.5.14" and flag_releases("--sm-major") == []
    assert "--enable-prefill-cp" not in release_flags("0.5.13") and "--enable-prefill-cp" in release_flags("0.5.14")


def _refusal(ref: str, command: str) -> str:
    policy = engine.load_policy(ref)
    with pytest.raises(ConfigError) as info:
        config_from_launch(policy, command.split())
    return str(info.value)


@pytest.mark.parametrize("ref, command, text", [
    ("dsv4-backends@3", "--model-path deepseek-ai/DeepSeek-V4 --enable-prefill-cp",
     "unrecognized argument '--enable-prefill-cp': SGLang 0.5.13, 0.5.13.post1's parser refuses it "
     "(--enable-prefill-cp is a flag of SGLang 0.5.14 to 0.5.23)"),
    ("dsa-backends@1", "--model-path m --hierarchical-sparse-attention-extra-config {}",
     "(--hierarchical-sparse-attention-extra-config is a flag of SGLang 0.5.12 to 0.5.23)"),
    ("dsa-backends@10", "--model-path m --sm-major 10",
     "'--sm-major': SGLang 0.5.22, 0.5.23's parser refuses it (--sm-major is hisparse's own flag, not SGLang's: "
     "give it before --)"),
    ("dsa-backends@10", "--model-path m --tensor-paralel-size 8", "did you mean --tensor-parallel-size?"),
    ("dsa-backends@10", "--model-path m --enable-pref", "ambiguous option: --enable-pref could match"),
])
def test_a_flag_the_release_lacks_is_refused(ref, command, text):
    assert text in _refusal(ref, command)


def test_what_the_release_has_or_resolves_is_read(tmp_path):
    policy = engine.load_policy("dsv4-backends@4")  # 0.5.14: --enable-prefill-cp is its flag
    config, _ = config_from_launch(policy, "--model-path deepseek-ai/DeepSeek-V4 --enable-prefill-cp --tp 8".split())
    assert policy.evaluate(config).config["enable_prefill_cp"] is True
    # a version that models a pull request, not a listed release, has no table: a flag the policy
    # does not read is skipped, as before there was one
    text = open(engine.load_policy("dsa-backends@10").file, encoding="utf-8").read()
    assert text.count("releases: [0.5.22, 0.5.23]") == 1
    pr = load_text(tmp_path, text.replace("releases: [0.5.22, 0.5.23]", "pr: 23013"), "dsa-backends/v10.yaml")
    config, _ = config_from_launch(pr, "--model-path m --no-such-flag --sm-major 10".split())
    assert pr.evaluate(config).config["sm_major"] == 10
    assert "unrecognized argument '--no-such-flag'" in _refusal("dsa-backends@10", "--model-path m --no-such-flag")
