"""Finding, reading and checking policies.

`load_policy(ref)`: ref is a family ("dsa-backends", its newest version), a family and version
("dsa-backends@2"), the SGLang release a version models ("sglang==0.5.18", "installed": see
releases.py) or a file path. A load reads the file's bytes and hashes them; a policy already
loaded from the same bytes is served from memory, so repeated loads cost a read and a hash. In a
new process the checked document comes from the on-disk cache (cache.py) when it holds these
bytes; only otherwise is the file parsed and schema-checked (and the document stored there).
"""
from __future__ import annotations

import os
import re
import _thread
from collections import OrderedDict

import engine.policy.cache as cache
import engine.policy.releases as releases
from engine.errors import PolicyError, Problem
from engine.files.document import Document
from engine.files.shipped import default_policy_dir, placement, policy_root, shipped_policy_dir
from engine.policy.policy import Policy
from engine.policy.releases import is_release_ref
from engine.files.reading import ReadError, max_file_bytes, read_bytes, sha256
from engine.values import clip, kind, parse_int, shown

_REF = re.compile(r"(?P<family>[a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?:@(?P<version>[0-9]+))?")
VERSION_FILE = re.compile(r"v([0-9]+)\.yaml")  # matched whole (fullmatch): v<N>.yaml, N in ASCII digits
_CACHE_SIZE = 64
_cache: OrderedDict = OrderedDict()  # (sha256, display, placement) -> Policy
_lock = _thread.allocate_lock()  # (the threading module is not needed here)


def load_policy(ref, policy_dir: str | None = None) -> Policy:
    """Load a policy by reference. Raises PolicyError (every problem, with file:line:col)."""
    if isinstance(ref, Policy):
        return ref
    if not isinstance(ref, str) or not ref:
        raise PolicyError([Problem("R602", f"a policy reference is FAMILY, FAMILY@N or a file path, got {shown(ref)}")])
    if looks_like_path(ref):
        return load_file(os.path.expanduser(ref), ref)
    if is_release_ref(ref):
        path, display = releases.resolve(ref, version_paths(policy_root(policy_dir)), load_file)
    else:
        path, display = resolve_ref(ref, policy_dir)
    return load_file(path, display)


def looks_like_path(ref: str) -> bool:
    """Whether a reference names a file. Only its spelling decides, never what happens to exist:
    a file named `dsa-backends` in the working directory must not replace the shipped policy."""
    return (os.sep in ref or "/" in ref or (os.altsep or "/") in ref
            or ref.endswith((".yaml", ".yml", ".json")) or ref.startswith((".", "~")))


def resolve_ref(ref: str, policy_dir: str | None = None) -> tuple[str, str]:
    """(path, display name) of the file a FAMILY or FAMILY@N reference names."""
    m = _REF.fullmatch(ref)
    if not m:
        raise PolicyError([Problem("R602", f"bad policy reference {shown(ref)}: expected FAMILY, FAMILY@N "
                                   "(e.g. dsa-backends@2), sglang==X, installed or a path to a .yaml file")])
    root = policy_root(policy_dir)
    family, version = m.group("family"), m.group("version")
    families = list_families(root)
    if family not in families:
        from engine.suggest import did_you_mean

        gone = releases.retired(family, version, root)
        if gone is not None:
            raise PolicyError([gone])
        raise PolicyError([Problem("R601", f"no policy family '{family}' in {display_dir(root)}",
                                   hint=did_you_mean(family, families))])
    versions = families[family]
    if version is None:
        number = max(versions)
    else:
        number = parse_int(version)  # None for a number too long to be a version
        if number not in versions:
            listed = ", ".join(f"{family}@{v}" for v in sorted(versions))
            raise PolicyError([Problem("R601", f"no version {clip(version)} of '{family}'",
                                       hint=f"available: {listed}")])
    names = version_files(os.path.join(root, family))[number]
    folder = os.path.join(display_dir(root), family)
    if len(names) > 1:
        raise PolicyError([duplicate_version(family, number, names, folder)])
    return os.path.join(root, family, names[0]), os.path.join(folder, names[0])


def version_files(folder: str) -> dict[int, list[str]]:
    """version -> the names of the files that say they are that version (v<N>.yaml; v1.yaml and
    v001.yaml both say 1), sorted. Raises OSError when the folder cannot be listed."""
    out: dict[int, list[str]] = {}
    for name in os.listdir(folder):
        m = VERSION_FILE.fullmatch(name)
        if m:
            out.setdefault(int(m.group(1)), []).append(name)
    return {v: sorted(names) for v, names in out.items()}


def duplicate_version(family: str, version: int, names, folder: str, file: str = "") -> Problem:
    return Problem("E313", f"version {version} of '{family}' has {len(names)} files: "
                   + ", ".join(os.path.join(folder, n) for n in names), file,
                   hint="keep one file per version, named v<N>.yaml")


def list_families(root: str | None = None) -> dict[str, list[int]]:
    """family -> sorted versions found under a policy folder."""
    root = root or default_policy_dir()
    out: dict[str, list[int]] = {}
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for name in names:
        folder = os.path.join(root, name)
        if name == "schema" or not os.path.isdir(folder):
            continue
        try:
            versions = sorted(version_files(folder))
        except OSError:
            continue
        if versions:
            out[name] = versions
    return out


def version_paths(root: str):
    """(FAMILY@N, path, display) of every version file under a policy folder."""
    for family, versions in list_families(root).items():
        files = version_files(os.path.join(root, family))
        for number in versions:
            for name in files[number]:
                yield f"{family}@{number}", os.path.join(root, family, name), os.path.join(display_dir(root), family, name)


def display_dir(root: str) -> str:
    """How messages name a policy folder: as given, except the shipped one, named where it really
    is (relative to the working directory inside it, as `policies` in a checkout; else absolute,
    as an installed copy), so a location in a message is a file that exists."""
    shipped = os.path.abspath(shipped_policy_dir())
    if os.path.abspath(root) != shipped:
        return root
    try:
        relative = os.path.relpath(shipped)
    except (OSError, ValueError):  # no working directory, or another drive
        return shipped
    return shipped if relative == os.pardir or relative.startswith(os.pardir + os.sep) else relative


def load_file(path: str, display: str | None = None) -> Policy:
    display = display or path
    try:
        data = read_bytes(path, display, max_file_bytes())
    except ReadError as exc:
        raise PolicyError(exc.problems) from None
    return load_bytes(data, display, path)


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
    with _lock:
        _cache[key] = policy
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return policy


def compile_bytes(data: bytes, display: str, digest: str, path: str = "", schema: bool = True) -> Policy:
    """Parse, schema-check and check names and values. Raises PolicyError."""
    from engine.language.parts import parse_document

    return Policy.from_document(parse_document(data, display, digest), path, schema)


def clear_cache() -> None:
    with _lock:
        _cache.clear()
