"""Server configs from files: SGLang-style YAML or JSON config files, keys with dashes or
underscores. Values keep their YAML/JSON types; strings are never read as booleans or numbers
("true" in quotes is an error that says so), so a config means what it says."""
from __future__ import annotations

from engine.errors import ConfigError, Problem
from engine.values import kind


_PIPES: dict = {}  # path -> its Document or its ConfigError: a pipe (/dev/stdin) can be read only once


def read_config_file(path: str):
    """The parsed file (a files.document.Document); raises ConfigError (file:line:col) when
    unreadable or not a mapping. A pipe is read too (`--config <(...)`, /dev/stdin): the operator
    named it; a pipe is read once, then answered from memory, its error included (a command looks
    at its config twice: for the model, then for the config; a second open would wait forever)."""
    import os
    import stat

    if path in _PIPES:
        if isinstance(_PIPES[path], ConfigError):
            raise _PIPES[path]
        return _PIPES[path]
    try:
        pipe = stat.S_ISFIFO(os.stat(path).st_mode) or stat.S_ISCHR(os.stat(path).st_mode)
    except (OSError, ValueError):
        pipe = False
    try:
        doc = _read(path)
    except ConfigError as exc:
        if pipe:
            _PIPES[path] = exc
        raise
    if pipe:
        _PIPES[path] = doc
    return doc


def _read(path: str):
    from engine.files.load import load_document
    from engine.files.reading import ReadError

    try:
        doc = load_document(path, regular_only=False)
    except ReadError as exc:
        raise ConfigError([Problem("C504", p.message, p.file, p.line, p.col, p.hint) if p.code == "E101"
                           else p for p in exc.problems]) from None
    if doc.data is None:
        doc.data = {}
    if not isinstance(doc.data, dict):
        raise ConfigError([Problem("C504", f"a config file holds a mapping of option -> value, this one "
                                   f"holds {kind(doc.data)}", path, 1, 1)])
    return doc


def config_layer(policy, path: str):
    """The file as a layer (engine/sglang/layers.py), lenient: keys the policy does not read are
    ignored (SGLang config files carry many), a near miss of one it reads is an error."""
    from engine.sglang.layers import read_layer

    doc = read_config_file(path)
    return read_layer(policy, doc.data, path, file=path, doc=doc, lenient=True)
