"""No function of engine/ or kernels_bridge/ is over MAX_LINES lines (its `def` to its last line,
docstring and comments included): a longer one is split into pieces a reader can name."""
import ast
import os

from tests.helpers import ROOT, python_files

MAX_LINES = 80


def long_functions(source: str, rel: str = "<module>") -> list[str]:
    """'path:line name (n lines)' of each function or method over MAX_LINES lines, nested ones too."""
    return [f"{rel}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_LINES]


def test_no_function_is_over_the_limit():
    found = [line for path in python_files("engine", "kernels_bridge")
             for line in long_functions(open(path, encoding="utf-8").read(),
                                        os.path.relpath(path, ROOT).replace(os.sep, "/"))]
    assert not found, f"functions over {MAX_LINES} lines (split them):\n" + "\n".join(found)


def test_the_scan_sees_a_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES - 1))
    short = "def short():\n" + body
    nested = "class A:\n    def long(self):\n" + "    " + body.replace("\n    ", "\n        ") + "        pass\n"
    assert long_functions(short) == []
    assert long_functions(nested) == [f"<module>:2 long ({MAX_LINES + 1} lines)"]
