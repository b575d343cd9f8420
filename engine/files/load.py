"""One file read and parsed by its name: JSON by its .json suffix (without importing PyYAML), YAML
otherwise."""
from __future__ import annotations

import hashlib

from engine.files.document import Document
from engine.files.json_reader import parse_json
from engine.files.reading import decode_utf8, max_file_bytes, read_bytes


def load_document(path: str, display: str | None = None, max_bytes: int | None = None,
                  regular_only: bool = True) -> Document:
    """Read, decode and parse one file (JSON by its .json suffix, YAML otherwise)."""
    display = display or path
    if max_bytes is None:
        max_bytes = max_file_bytes()
    data = read_bytes(path, display, max_bytes, regular_only)
    digest = hashlib.sha256(data).hexdigest()
    text = decode_utf8(data, display)
    if path.endswith(".json"):
        return parse_json(text, display, digest)
    from engine.files.yaml_reader import parse_yaml  # imports PyYAML: only for a YAML file

    return parse_yaml(text, display, digest)
