"""attend's own options belong to the bridge: the policy language leaves them free, and attend
refuses a policy whose input takes one as its flag (E309 at the flag's file:line:col), before
argparse could crash on the clash and before any workload is built."""
import json

import pytest

import engine

from engine.cli import options
from engine.language.parts import RESERVED_FLAGS
from engine.sglang.argv import add_input_flags
from tests.helpers import minimal_text, run_cli

SMALL = ["--requests", "1", "--context", "128", "--steps", "1", "--heads", "64",
         "--hisparse-top-k", "128", "--hisparse-device-buffer-size", "128"]


def _policy(tmp_path, flag_yaml: str, name: str = "p") -> str:
    text = minimal_text().replace("  sm_major:\n    type: int\n", "  sm_major:\n    type: int\n" + flag_yaml)
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "v1.yaml"
    path.write_text(text.replace("policy: mini", f"policy: {name}"))
    return str(path)


def _line_of(path: str, needle: str) -> int:
    with open(path, encoding="utf-8") as fh:
        return next(i for i, line in enumerate(fh, 1) if needle in line)


def _attend_options(monkeypatch, tmp_path) -> set:
    """The options attend's parser has of its own (with the minimal policy, which declares none
    of attend's workload inputs), less those the engine's commands reserve in the language."""
    import kernels_bridge.cli as bridge_cli

    seen = {}

    def capture(self, *a, **k):
        seen[self.prog] = self
        raise SystemExit(0)

    monkeypatch.setattr(options.Parser, "parse_args", capture)
    plain = _policy(tmp_path, "", "plain")
    with pytest.raises(SystemExit):
        bridge_cli.cmd_attend(["--policy", plain])
    monkeypatch.undo()
    parser = seen["hisparse attend"]
    empty = options.Parser(prog="inputs only")  # what add_input_flags gives any command
    add_input_flags(empty, engine.load_policy(plain))
    return set(parser._option_string_actions) - set(empty._option_string_actions) - RESERVED_FLAGS


def test_attend_options_are_not_reserved_by_the_language(monkeypatch, tmp_path):
    own = _attend_options(monkeypatch, tmp_path)
    assert {"--steps", "--threads", "--device", "--compare"} <= own
    assert not own & RESERVED_FLAGS


def test_every_attend_option_taken_by_an_input_is_refused_by_attend(monkeypatch, tmp_path, capsys):
    own = _attend_options(monkeypatch, tmp_path)
    for i, flag in enumerate(sorted(own)):
        path = _policy(tmp_path, f"    flags: [{flag}]\n", f"c{i}")
        code, out, err = run_cli(capsys, "attend", "--policy", path, *SMALL)
        assert code == 2, (flag, out, err)
        line = _line_of(path, f"flags: [{flag}]")
        assert f"{path}:{line}:" in err and "E309" in err, (flag, err)
        if flag.startswith("--no-"):  # the policy language keeps every --no-X for bool inputs
            assert f"flag {flag} is reserved by the hisparse command line" in err
        else:
            assert f"input 'sm_major' takes the flag {flag}, an option of hisparse attend" in err
        assert "Traceback" not in err and out == ""


def test_a_deprecated_spelling_is_guarded_too_and_check_accepts_the_policy(tmp_path, capsys):
    path = _policy(tmp_path, "    deprecated_flags:\n      --heads: {log: old}\n")
    code, out, err = run_cli(capsys, "check", "--no-deep", path)
    assert code == 0, out + err                      # the language leaves --heads free
    code, out, err = run_cli(capsys, "attend", "--policy", path, *SMALL)
    assert code == 2 and f"{path}:{_line_of(path, '--heads:')}:" in err
    assert "takes the flag --heads" in err


def test_a_policy_without_collisions_still_runs(tmp_path, capsys):
    path = _policy(tmp_path, "    flags: [--gpu-sm-major]\n")
    code, out, err = run_cli(capsys, "attend", "--policy", path, "--gpu-sm-major", "10", *SMALL,
                             "--format", "json")
    assert code == 0, err
    assert json.loads(out)["decision"]["decode_backend"] == "flashmla_sparse"
