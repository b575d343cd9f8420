"""The flags of the installed SGLang's own server parser (`ServerArgs.add_cli_args`), read by
importing the release through its conform driver: what engine/sglang/release_flags.txt records
per release, and what the tests hold that table to."""
from __future__ import annotations

import argparse
import json
import sys


def parser_flags() -> list[str]:
    """The installed release's server flags, sorted (SGLang imported through its driver)."""
    from engine.sglang.conform.drivers import installed_sglang

    version, reason = installed_sglang()
    if version is None:
        raise RuntimeError(reason)
    from sglang.srt.server_args import ServerArgs

    parser = _Parser(add_help=False)
    ServerArgs.add_cli_args(parser)
    return parser.flags()


class _Parser(argparse.ArgumentParser):
    def flags(self) -> list[str]:
        """Every option string, its groups' included (argparse keeps one table of them)."""
        return sorted(o for o in self._option_string_actions if o.startswith("--"))


if __name__ == "__main__":  # one JSON line: {"release", "flags"} (tools/release_flags.py reads it)
    from engine.sglang.registry import installed_release

    print("FLAGS " + json.dumps({"release": installed_release(), "flags": parser_flags()}))
    sys.exit(0)
