"""A parsed file: its plain data, where each node sits, the identity of its bytes; and the limits
both readers (yaml_reader, json_reader) hold every file to."""
from __future__ import annotations

from engine.errors import Problem

MAX_DEPTH = 64
MAX_NODES = 50_000
MAX_NUMBER_CHARS = 64

Path = tuple  # a path into the data: keys and list indices


class Document:
    """Parsed file: plain `data`, where each node sits, and the identity of the bytes. (A plain
    class: a JSON option's text is parsed on `hisparse evaluate`'s start-up path, where importing
    the dataclasses module would cost more than the parse.)"""

    __slots__ = ("data", "file", "sha256", "positions", "key_positions")

    def __init__(self, data, file: str, sha256: str, positions: dict | None = None,
                 key_positions: dict | None = None):
        self.data = data
        self.file = file  # display name used in messages
        self.sha256 = sha256
        self.positions = {} if positions is None else positions  # path -> (line, col) of the value
        self.key_positions = {} if key_positions is None else key_positions  # path -> (line, col) of the key

    def pos(self, path: Path, key: bool = False) -> tuple[int, int]:
        """Position of `path`, or of its nearest ancestor that has one (1-based)."""
        table = self.key_positions if key else self.positions
        path = tuple(path)
        while path:
            if path in table:
                return table[path]
            if key and path in self.positions:
                return self.positions[path]
            path = path[:-1]
        return self.positions.get((), (1, 1))

    def placed(self, problem: Problem, key) -> Problem:
        """`problem` moved to where config key `key` sits (a top-level key of this file)."""
        line, col = self.pos((key,), key=True)
        return Problem(problem.code, problem.message, problem.file, line, col, problem.hint)

    def problem(self, code: str, message: str, path: Path = (), key: bool = False, hint: str = "") -> Problem:
        line, col = self.pos(path, key)
        return Problem(code, message, self.file, line, col, hint)
