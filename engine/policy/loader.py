"""Loading policies: reading, checking and caching them.

`load_policy(ref)`: ref is a family ("dsa-backends", its newest version), a family and version
("dsa-backends@2"), the SGLang release a version models ("sglang==0.5.18", "installed": see
engine/files/releases.py) or a file path (engine/files/catalog.py finds the file). A load reads the file's bytes and hashes them; a policy already
loaded from the same bytes is served from memory, so repeated loads cost a read and a hash. In a
new process the checked document comes from the on-disk cache (cache.py) when it holds these
bytes; only otherwise is the file parsed and schema-checked (and the document stored there).

`load_head(path)`: what a version file says of itself (family, version, models, the releases it
models), for finding the version a release reference names among every version file: the policy
itself when this process built it, else read from the file's checked document in the on-disk
cache, without building its rules; only a file without an entry is loaded whole.
"""
from __future__ import annotations

import os
import _thread
from collections import OrderedDict

import engine.files.releases as releases
import engine.files.cache as cache
from engine.errors import PolicyError, Problem
from engine.files.catalog import looks_like_path, resolve_ref, version_paths
from engine.files.document import Document
from engine.files.heads import head_of
from engine.files.reading import ReadError, decode_utf8, max_file_bytes, read_bytes, sha256
from engine.files.shipped import placement, policy_root
from engine.policy.policy import Policy
from engine.values import shown

_CACHE_SIZE = 64
_cache: OrderedDict = OrderedDict()  # (sha256, display, placement) -> Policy
_lock = _thread.allocate_lock()  # (the threading module is not needed here)
_heads: OrderedDict = OrderedDict()  # (sha256, display, placement) -> Head


def load_policy(ref, policy_dir: str | None = None) -> Policy:
    """Load a policy by reference. Raises PolicyError (every problem, with file:line:col)."""
    if isinstance(ref, Policy):
        return ref
    if not isinstance(ref, str) or not ref:
        raise PolicyError([Problem("R602", f"a policy reference is FAMILY, FAMILY@N or a file path, got {shown(ref)}")])
    if looks_like_path(ref):
        return load_file(os.path.expanduser(ref), ref)
    if releases.is_release_ref(ref):
        path, display = releases.resolve(ref, version_paths(policy_root(policy_dir)), load_head)
    else:
        path, display = resolve_ref(ref, policy_dir)
    return load_file(path, display)


def load_file(path: str, display: str | None = None) -> Policy:
    return load_bytes(_read(path, display or path), display or path, path)


def _read(path: str, display: str) -> bytes:
    try:
        return read_bytes(path, display, max_file_bytes())
    except ReadError as exc:
        raise PolicyError(exc.problems) from None


def _keep(table: OrderedDict, key, value):
    """`value` kept in one of the in-memory caches, the least recently kept one dropped."""
    with _lock:
        table[key] = value
        while len(table) > _CACHE_SIZE:
            table.popitem(last=False)
    return value


def load_bytes(data: bytes, display: str, path: str = "") -> Policy:
    """The policy in `data` (the bytes of the file at `path`, shown as `display`), from memory
    when the same bytes were loaded before; its checked document from the on-disk cache when
    stored there. Raises PolicyError."""
    digest = sha256(data).hexdigest()
    key = (digest, display, placement(display))  # what the checks read (cache.py's key alike)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    policy = None
    stored = cache.load(digest, display)
    if stored is not None:
        try:  # bytes that passed the schema when the entry was made
            policy = Policy.from_document(Document(stored[0], display, digest, *stored[1:]), path, schema=False)
        except Exception:  # an entry this engine cannot use (the checks make it unlikely): read again
            policy = None
    if policy is None:
        policy = compile_bytes(data, display, digest, path)
        cache.store(digest, display, policy.doc)
    return _keep(_cache, key, policy)


def load_head(path: str, display: str | None = None):
    """The policy at `path` as far as its head (engine.files.heads.Head): the Policy when this
    process loaded these bytes; else, when the on-disk cache holds their checked document, the
    head read from it (an entry stands for bytes that passed every check of a load, so loading
    them gives that head); else the Policy, loaded (which stores the entry). Raises PolicyError
    as load_file does."""
    from engine.language.parts import Parts

    display = display or path
    data = _read(path, display)
    digest = sha256(data).hexdigest()
    key = (digest, display, placement(display))
    with _lock:
        hit = _cache.get(key) or _heads.get(key)
        if hit is not None:
            return hit
    stored = cache.load(digest, display)
    head = head_of(stored[0], Parts.DEFAULTS["models"]) if stored is not None else None
    return load_bytes(data, display, path) if head is None else _keep(_heads, key, head)


def compile_bytes(data: bytes, display: str, digest: str, path: str = "", schema: bool = True) -> Policy:
    """Parse, schema-check and check names and values. Raises PolicyError."""
    from engine.files.yaml_reader import parse_yaml  # not needed when the cache holds the document

    try:
        doc = parse_yaml(decode_utf8(data, display), display, digest)
    except ReadError as exc:
        raise PolicyError(exc.problems) from None
    return Policy.from_document(doc, path, schema)


def clear_cache() -> None:
    with _lock:
        _cache.clear()
        _heads.clear()
