"""SGLang functions whose HiSparse backend and dtype checks are inline statements (0.5.11's
`ServerArgs.check_server_args`, 0.5.12 and 0.5.13's `hisparse_hook.validate_hisparse`): the
function is compiled again from the release's own source with those statements, and only those,
replaced by a call to the policy's check (engine/sglang/hook_targets.py says where they sit).

Everything else is SGLang's code as installed: the checks before and after, the model and
radix-cache asserts, with the file name and line numbers of the release's source, in its module's
globals. A function that does not hold the statements where the release's table says (a changed
release, an edited install) is refused with the reason: the plugin then stops the launch."""
from __future__ import annotations

import ast
import inspect
import textwrap

from engine.errors import EngineError

CHECK = "__hisparse_router_check__"  # the name the policy's check has inside the compiled function
MARK = "# Check hisparse"


class NotInline(EngineError):
    """The function does not hold the inline check where it was expected."""


def compile_with_check(function, where, check):
    """`function` (SGLang's, unwrapped) compiled from its source with the inline statements
    `where` (hook_targets.Inline) replaced by `check(first argument)`. Raises NotInline."""
    return _compiled(function, where, check, keep=False)


def inline_statements(function, where):
    """The inline statements `where` of `function` alone, compiled from its source as a function
    of the same first argument (SGLang's own check, for values the policy does not model).
    Raises NotInline."""
    return _compiled(function, where, None, keep=True)


def _compiled(function, where, check, keep: bool):
    try:
        filename = inspect.getsourcefile(function)
        lines, first = inspect.getsourcelines(function)
    except (OSError, TypeError) as exc:
        raise NotInline(f"its source cannot be read ({exc})") from None
    tree = ast.parse(textwrap.dedent("".join(lines)))
    definition = tree.body[0]
    if not isinstance(definition, ast.FunctionDef) or any(
            isinstance(n, ast.Name) and n.id == "super" for n in ast.walk(definition)):
        raise NotInline("it is not a plain function (decorated or calling super())")
    body = _block(definition, where.block, lines)
    start = next((i for i, st in enumerate(body) if _raises_hisparse(st)), None)
    if start is None or len(body) - start != where.count or not _raises_hisparse(body[-1]):
        raise NotInline(f"it does not end its {'`if ' + where.block + ':` block' if where.block else 'body'} with "
                        f"{where.count} statements from one raising SGLang's HiSparse ValueError to another")
    argument = definition.args.args[0].arg
    if keep:  # the statements alone (they read only the function's argument)
        definition.body = body[start:]
    else:
        call = ast.Expr(ast.Call(ast.Name(CHECK, ast.Load()), [ast.Name(argument, ast.Load())], []))
        ast.copy_location(call, body[start])
        ast.copy_location(call.value, body[start])
        del body[start:]
        body.append(call)
    definition.decorator_list = []
    # a factory binds the check as a closure cell; the globals stay the module's own dict
    factory = ast.FunctionDef(name="__factory__", args=ast.arguments(
        posonlyargs=[], args=[ast.arg(CHECK)], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
        defaults=[]), body=[definition, ast.Return(ast.Name(definition.name, ast.Load()))], decorator_list=[],
        returns=None, type_params=[])
    ast.fix_missing_locations(factory)
    module = ast.Module(body=[factory], type_ignores=[])
    ast.increment_lineno(module, first - 1)
    ast.fix_missing_locations(module)
    space: dict = {}
    exec(compile(module, filename, "exec"), function.__globals__, space)
    compiled = space["__factory__"](check)
    compiled.__qualname__ = function.__qualname__
    compiled.__module__ = function.__module__
    compiled.__doc__ = function.__doc__
    return compiled


def _block(definition, block: str | None, lines: list) -> list:
    """The statement list holding the inline check."""
    if block is None:
        return definition.body
    picked = [st for st in definition.body if isinstance(st, ast.If) and ast.unparse(st.test) == block
              and lines[st.lineno - 2].strip() == MARK]
    if len(picked) != 1:
        raise NotInline(f"it has {len(picked)} '{MARK}' statements `if {block}:`, not 1")
    return picked[0].body


def _raises_hisparse(statement) -> bool:
    """The statement raises a ValueError whose message starts with "HiSparse"."""
    for node in ast.walk(statement):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and \
                ast.unparse(node.exc.func) == "ValueError" and node.exc.args:
            text = node.exc.args[0]
            head = text.values[0] if isinstance(text, ast.JoinedStr) and text.values else text
            if isinstance(head, ast.Constant) and str(head.value).startswith("HiSparse"):
                return True
    return False
