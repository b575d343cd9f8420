"""Driver for SGLang 0.5.11: the HiSparse routing before PR #23013, inline in `srt/server_args.py`.
See `prepipeline` for what runs and what is patched.

The HiSparse check of 0.5.11 has no entry point of its own: it is the "# Check hisparse" statement
(`if self.enable_hisparse: ...`) in the middle of `ServerArgs.check_server_args`, whose earlier checks
read defaults that `__post_init__` fills (`chunked_prefill_size > 0` with None raises TypeError), so
check_server_args itself cannot run on a ServerArgs built without `__post_init__`. The driver runs
that one statement: it is taken from the installed source of check_server_args
(`inspect.getsource`), the function body cut down to it, compiled with the file name and line numbers
of `srt/server_args.py`, in that module's globals, under the name check_server_args. So the code,
the frames and the line numbers of a raise are the release's. Skipped: every other check of
check_server_args (parallelism, LoRA, speculative decoding, chunked prefill, pdmux, scheduling,
metrics, two-batch overlap, ...), before and after it."""
from __future__ import annotations

import ast
import inspect
import textwrap

from engine.sglang import registry
from engine.sglang.conform.prepipeline import NSA, Driver

VERSION = registry.driven_by(__name__)[-1]
MARK = "# Check hisparse"


def hisparse_block(server_args):
    """check_server_args cut down to its "# Check hisparse" statement, compiled from the source."""
    function = server_args.ServerArgs.check_server_args
    filename = inspect.getsourcefile(function)
    lines, first = inspect.getsourcelines(function)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    definition = tree.body[0]
    picked = [st for st in definition.body if isinstance(st, ast.If)
              and ast.unparse(st.test) == "self.enable_hisparse"
              and lines[st.lineno - 2].strip() == MARK]
    if len(picked) != 1:
        raise RuntimeError(f"{filename}: check_server_args has {len(picked)} '{MARK}' statements, not 1")
    definition.body = picked
    definition.decorator_list = []
    ast.increment_lineno(tree, first - 1)
    space: dict = {}
    exec(compile(tree, filename, "exec"), vars(server_args), space)
    return space[definition.name]


# imported inside _handle_model_specific_adjustments
LAZY = ("sglang.srt.configs.model_config",)
_driver = Driver(VERSION, hisparse_block, LAZY, NSA)


# the driver protocol (drivers.py): module functions bound to this release's driver
import_sglang = _driver.import_sglang  # import SGLang 0.5.11 with the stand-ins (raises what the import raised)
load = _driver.load  # import it, build its parser and the model folders (once per process)
run_case = _driver.run_case
