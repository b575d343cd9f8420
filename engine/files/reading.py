"""Reading files safely: regular files only, bounded size, UTF-8 text, and whether the file
changed while it was read. Apart from the readers (yaml_reader.py imports PyYAML) so that a load
served from the compiled cache imports neither."""
from __future__ import annotations

import codecs
import os
import stat

from engine.errors import HisparseError, Problem
from engine.values import parse_int

try:  # hashlib loads OpenSSL, a few ms at every start-up; the built-in module gives the same digest
    from _sha2 import sha256  # Python 3.12+
except ImportError:
    try:
        from _sha256 import sha256  # Python 3.10, 3.11
    except ImportError:  # pragma: no cover - a build without the built-in hash modules
        from hashlib import sha256

DEFAULT_MAX_BYTES = 1 << 20


class ReadError(HisparseError):
    """A file could not be read or parsed (the caller re-raises as PolicyError or ConfigError)."""


# -- bytes -----------------------------------------------------------------------------------------
def file_signature(st: os.stat_result) -> tuple:
    """What changes when a file is replaced or written: device, inode, size, mtime, ctime."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_bytes(path: str, display: str, max_bytes: int = DEFAULT_MAX_BYTES,
               regular_only: bool = True) -> bytes:
    """The file's bytes, refusing directories, unreadable files and files over `max_bytes`; with
    `regular_only`, also FIFOs, devices and sockets (policy files are regular files)."""
    return read_snapshot(path, display, max_bytes, regular_only)[0]


def read_snapshot(path: str, display: str, max_bytes: int = DEFAULT_MAX_BYTES,
                  regular_only: bool = True) -> tuple[bytes, tuple | None]:
    """(bytes, signature): as read_bytes, with the file's signature (file_signature) when it did
    not change while it was read, else None (a writer was at work: the bytes may be torn).

    What is read: a regular file; without `regular_only`, also a pipe or FIFO, whose writer is
    waited for (`--config <(...)`, /dev/stdin, a FIFO named on purpose). Anything else (a
    directory, /dev/null, /dev/zero, a terminal, a socket) is refused before a byte is read: it
    would answer on no input or never end. A pipe is read 64 KiB at a time and given up at its
    first NUL byte (binary data, refused by decode_utf8), so a stream of zeros is never held
    whole, whatever HISPARSE_MAX_FILE_BYTES allows."""

    def refuse(code: str, message: str, hint: str = "") -> ReadError:
        return ReadError([Problem(code, message, display, hint=hint)])

    fd = open_checked(path, display, "policy files are regular files" if regular_only else
                      "give a regular file or a pipe", fifo=not regular_only)
    try:
        before = os.fstat(fd)
        regular = stat.S_ISREG(before.st_mode)
        if regular and before.st_size > max_bytes:
            raise _too_large(display, max_bytes)
        chunks, total = [], 0
        # first the size it claims plus one byte (to see it grow), then 64 KiB at a time
        size = before.st_size + 1 if regular else 1 << 16
        while total <= max_bytes:  # never more than max_bytes + 1, whatever the file claims
            chunk = os.read(fd, min(size, max_bytes + 1 - total))
            size = 1 << 16
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if not regular and b"\0" in chunk:  # binary: what follows cannot make it text
                break
        after = os.fstat(fd)
    except OSError as exc:
        raise refuse("E101", f"cannot read file: {exc.strerror or exc}") from None
    except MemoryError:  # a pipe longer than this process can hold (a limit raised that far)
        chunks = None
        raise refuse("E102", "file is larger than this process can hold in memory",
                      "lower HISPARSE_MAX_FILE_BYTES") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise _too_large(display, max_bytes)
    same = file_signature(before) == file_signature(after) and stat.S_ISREG(after.st_mode) \
        and len(data) == after.st_size
    return data, (file_signature(after) if same else None)


def open_checked(path: str, display: str, want: str, fifo: bool = False, code: str = "E101") -> int:
    """A descriptor open for reading on `path` when it is a regular file (or, with `fifo`, a pipe
    or FIFO, opened again to wait for its writer); anything else is refused with `code` naming
    what it is and `want`. The first open never waits (O_NONBLOCK) and the kind is taken from
    the open descriptor (fstat), so a FIFO or device planted at the path can neither hang the
    caller nor be swapped in between a check and the open."""
    def refuse(message: str, hint: str = "") -> ReadError:
        return ReadError([Problem(code, message, display, hint=hint)])

    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except ValueError:  # a NUL in the path: no file can have that name
        raise refuse("cannot read file: the path holds a NUL byte") from None
    except OSError as exc:
        try:  # a socket cannot be opened at all: say what it is
            mode = os.stat(path).st_mode
        except (OSError, ValueError):
            mode = stat.S_IFREG
        if stat.S_ISDIR(mode):
            raise refuse("cannot read file: is a directory") from None
        if not stat.S_ISREG(mode) and not (fifo and stat.S_ISFIFO(mode)):
            raise refuse(f"cannot read file: not a regular file (a {_file_type(mode)})", want) from None
        raise refuse(f"cannot read file: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise refuse(f"cannot read file: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode) or (fifo and stat.S_ISFIFO(mode)):
        if stat.S_ISFIFO(mode):
            _wait_for_writer(fd)
        os.set_blocking(fd, True)
        return fd
    os.close(fd)
    if stat.S_ISDIR(mode):
        raise refuse("cannot read file: is a directory")
    raise refuse(f"cannot read file: not a regular file (a {_file_type(mode)})", want)


def _wait_for_writer(fd: int) -> None:
    """Wait, as `cat` does, until the FIFO open on `fd` has a writer that wrote or left: a read
    before that would see no input at all. The same descriptor is kept (a writer that came for
    it is never lost); poll reports nothing until a writer has come."""
    import select

    if hasattr(select, "poll"):
        waiter = select.poll()
        waiter.register(fd, select.POLLIN | select.POLLHUP)
        waiter.poll()
    else:  # pragma: no cover - no poll(): select waits alike
        select.select([fd], [], [])


def _too_large(display: str, max_bytes: int) -> ReadError:
    return ReadError([Problem("E102", f"file is larger than the limit of {max_bytes} bytes", display,
                              hint="raise the limit with HISPARSE_MAX_FILE_BYTES if this file is genuine")])


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def decode_utf8(data: bytes, display: str) -> str:
    """UTF-8 text (a leading byte-order mark skipped); binary data and other encodings refused."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise ReadError([Problem("E103", "not UTF-8 text: a UTF-16 byte-order mark", display, 1, 1,
                                 "save the file as UTF-8")])
    nul = data.find(b"\x00")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if 0 <= nul < exc.start:
            return _binary(data, nul, display)
        line, col = line_col(data, exc.start)
        raise ReadError(
            [Problem("E103", f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                     display, line, col)]
        ) from None
    if nul >= 0:
        _binary(data, nul, display)
    return text


def _binary(data: bytes, offset: int, display: str):
    line, col = line_col(data, offset)
    raise ReadError([Problem("E103", f"binary data, not text (a NUL byte at offset {offset})",
                             display, line, col)])


def line_col(text, offset: int) -> tuple[int, int]:
    """The 1-based (line, column) of `offset` in `text` (str: characters; bytes: bytes)."""
    newline = b"\n" if isinstance(text, bytes) else "\n"
    before = text[:offset]
    return before.count(newline) + 1, offset - (before.rfind(newline) + 1) + 1


def max_file_bytes() -> int:
    """HISPARSE_MAX_FILE_BYTES when it is a positive decimal number, else 1 MiB."""
    raw = (os.environ.get("HISPARSE_MAX_FILE_BYTES") or "").strip()
    value = parse_int(raw) if raw.isdigit() else None
    if value is not None and value > 0:
        return value
    return DEFAULT_MAX_BYTES
