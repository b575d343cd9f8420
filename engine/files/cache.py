"""The policy cache: a policy file's checked document (its parsed data and the positions of its
nodes, which passed the schema), kept on disk so that the next process skips parsing and schema
validation (and the imports of PyYAML and jsonschema). An entry holds data only, never code: the
rule model is built from it again at every load.

Where: $XDG_CACHE_HOME/hisparse/checked (default ~/.cache/hisparse/checked); HISPARSE_CACHE_DIR
names another folder; HISPARSE_NO_CACHE=1 turns the cache off.

An entry is keyed by the sha256 of the policy file's bytes, the name the file is shown by (the
checks read it: v3.yaml must hold version 3), the engine (its version and the size and
modification time of each of its source files) and the Python version, and it is only an
optimisation, never an authority:
- the policy file is always read and hashed; an entry is looked up by that hash and name and
  holds both, so it can only stand for exactly those bytes, which already passed every check;
- an entry is used only if it is a regular file owned by this user and writable by no one else,
  starts with this format's magic, its checksum (sha256 of the rest) matches, and the engine,
  Python version and file hash it records are this process's; anything else (truncated,
  corrupt, foreign, stale) is ignored and the file is parsed and checked again, and stored;
- entries are written to a temporary file and renamed into place, so a reader never sees half
  of one; a cache that cannot be written (read-only home, full disk) costs only the speed-up.
An entry is read with marshal, which builds plain values only (no classes, no code is run).
"""
from __future__ import annotations

import marshal
import os
import sys

from engine.files.reading import sha256
from engine.files.shipped import placement

MAGIC = b"hisparse-checked-policy 3\n"
MAX_ENTRY_BYTES = 16 << 20
_fingerprint: str | None = None


def directory() -> str | None:
    """The cache folder, or None when the cache is off."""
    if os.environ.get("HISPARSE_NO_CACHE"):
        return None
    explicit = os.environ.get("HISPARSE_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hisparse", "checked")


def engine_fingerprint() -> str:
    """The engine's version and its source files' names, sizes and modification times: an edit of
    the engine (or another install of it) never reads entries an older one wrote."""
    global _fingerprint
    if _fingerprint is None:
        from engine.version import __version__
        from engine.files.shipped import shipped_policy_dir

        engine_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        parts = [__version__, sys.version, str(marshal.version)]
        folders = [engine_dir, os.path.join(shipped_policy_dir(), "schema")]
        while folders:
            folder = folders.pop(0)
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                if entry.name.endswith((".py", ".json")):
                    st = entry.stat()
                    parts.append(f"{os.path.relpath(entry.path, engine_dir)}:{st.st_size}:{st.st_mtime_ns}")
                elif folder == engine_dir and entry.is_dir() and entry.name not in ("__pycache__", "policies"):
                    folders.append(entry.path)  # the engine's subpackages (one level)
        _fingerprint = sha256("\n".join(parts).encode()).hexdigest()
    return _fingerprint


def _key(digest: str, display: str) -> str:
    # everything the loader's verdict depends on: the bytes, the name, and where that name sits
    # from the current directory (the identity check E312 reads the folder's name)
    parts = (digest, display) + placement(display)
    return sha256("\0".join(parts).encode("utf-8", "surrogateescape")).hexdigest()


def entry_path(digest: str, display: str) -> str | None:
    folder = directory()
    if folder is None:
        return None
    tag = sys.implementation.cache_tag or "python"
    return os.path.join(folder, f"{_key(digest, display)[:40]}-{engine_fingerprint()[:16]}-{tag}.bin")


def load(digest: str, display: str):
    """The document stored for the policy whose bytes hash to `digest`, shown as `display`
    (data, positions, key positions), or None."""
    path = entry_path(digest, display)
    if path is None:
        return None
    try:
        # O_NONBLOCK: a FIFO planted at the entry's (predictable) path must not hang the open;
        # _trusted refuses it from the open descriptor
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError):  # ValueError: a NUL in HISPARSE_CACHE_DIR
        return None
    try:
        st = os.fstat(fd)
        if not _trusted(st):
            return None
        data = os.read(fd, st.st_size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return decode(data, digest, display)


def _trusted(st) -> bool:
    import stat

    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY_BYTES:
        return False
    if st.st_mode & 0o022:  # another user could have written it
        return False
    return not hasattr(os, "geteuid") or st.st_uid == os.geteuid()


def encode(digest: str, display: str, doc) -> bytes:
    body = marshal.dumps((engine_fingerprint(), digest, display, (doc.data, doc.positions, doc.key_positions)))
    return MAGIC + sha256(body).digest() + body


def decode(data: bytes, digest: str, display: str):
    """The document in an entry's bytes, or None unless the entry is whole and was made by this
    engine for these bytes under this name. The checksum is verified before anything is
    unmarshalled."""
    head = len(MAGIC) + 32
    if len(data) <= head or not data.startswith(MAGIC):
        return None
    body = data[head:]
    if sha256(body).digest() != data[len(MAGIC):head]:
        return None
    try:
        fingerprint, stored_digest, stored_display, doc = marshal.loads(body)
    except (ValueError, EOFError, TypeError):
        return None
    if (fingerprint, stored_digest, stored_display) != (engine_fingerprint(), digest, display) \
            or not (isinstance(doc, tuple) and len(doc) == 3 and isinstance(doc[0], dict)):
        return None
    return doc


def store(digest: str, display: str, doc) -> bool:
    """Write the entry for a checked document atomically (a temporary file renamed into place);
    False when it could not be written, which only costs the next process the parse and schema."""
    path = entry_path(digest, display)
    if path is None:
        return False
    tmp = f"{path}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        data = encode(digest, display, doc)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return True
    except (OSError, ValueError):
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
