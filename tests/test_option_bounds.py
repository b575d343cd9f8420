"""Every numeric option of every command has a bound (its own range, or the memory limit that
names it), and a value past it is refused with exit 2 naming the option, before anything runs:
`attend --threads 100000` was a segmentation fault, `conform --workers 100000` would have forked
that many workers. The options are found by building each command's parser (`--help`), so a new
numeric option without a bound fails here; a policy's input flags (--sm-major, ...) are the
policy's inputs, bounded by its declared domain, and not options of the command."""
import argparse

import pytest

from engine.cli.commands import COMMANDS
from tests.helpers import run_cli

HUGE = str(2 ** 62)  # a 64-bit integer, far past any bound an option means
# the arguments each command needs besides the option probed
NEEDS = {"diff": ["dsa-backends@1", "dsa-backends@2"], "replay": ["/dev/null"], "policies": ["export", "/nowhere"],
         "attend": ["--requests", "1", "--context", "128", "--steps", "1", "--heads", "64", "--hisparse-top-k", "128",
                    "--hisparse-device-buffer-size", "128"]}
# options whose natural range is the whole 64-bit range above a floor: probed below it
FLOORED = {"--seed": "-1"}


def numeric_options() -> list[tuple[str, str]]:
    """(command, option) of every option whose type is not text, as each command builds it."""
    found = []
    real = argparse._ActionsContainer.add_argument

    def record(self, *args, **kwargs):
        action = real(self, *args, **kwargs)
        if action.type not in (None, str) and action.option_strings and "__" not in action.dest:
            found.append((self.prog if hasattr(self, "prog") else "", action.option_strings[0]))
        return action

    argparse._ActionsContainer.add_argument = record  # put back below
    try:
        import kernels_bridge.cli  # noqa: F401  (registers attend and doctor)

        out = []
        for name, (run, _) in sorted(COMMANDS.items()):
            found.clear()
            try:
                run(["--help"])
            except SystemExit:
                pass
            out += [(name, option) for _, option in found]
        return sorted(set(out))
    finally:
        argparse._ActionsContainer.add_argument = real


OPTIONS = numeric_options()


def test_the_numeric_options_are_found():
    assert {("attend", "--threads"), ("attend", "--steps"), ("conform", "--workers"), ("replay", "--max-records"),
            ("diff", "--max-patterns"), ("test", "--min-coverage")} <= set(OPTIONS), OPTIONS


@pytest.mark.parametrize("command, option", OPTIONS)
def test_a_value_past_the_bound_is_refused_naming_the_option(command, option, capsys):
    value = FLOORED.get(option, HUGE)
    code, out, err = run_cli(capsys, command, *NEEDS.get(command, []), option, value)
    assert code == 2 and out == "", (code, out, err)
    assert option in err and "Traceback" not in err and "internal error" not in err, err


def test_the_thread_and_worker_counts_are_bounded_by_the_cpus(capsys):
    from engine.cli.options import usable_cpus

    too_many = str(usable_cpus() + 1)
    code, _, err = run_cli(capsys, "attend", *NEEDS["attend"], "--threads", too_many)
    assert code == 2 and f"--threads: invalid value: '{too_many}' (from 1 to {usable_cpus()}: the CPUs" in err
    code, _, err = run_cli(capsys, "conform", "--workers", too_many)
    assert code == 2 and "--workers: invalid value" in err
