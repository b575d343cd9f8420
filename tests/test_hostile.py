"""Hostile policy files. Each is refused through all three doors, `hisparse check FILE`,
`load_policy(FILE)` and `hisparse evaluate --policy FILE`: exit 2, one message with file:line:col
where there is a position, no traceback, no side effect (no file created by a payload, the cache
of good policies untouched), in bounded work and memory.

Small fixtures are committed under tests/fixtures/hostile/; large, binary and special files are
made here at run time. Set HISPARSE_FIGURES=1 to print the measured time and memory of each.
"""
import errno
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc

import pytest
import yaml

import engine
from engine.policy import loader
from tests.helpers import FIXTURES, ROOT, minimal_text

HOSTILE = os.path.join(FIXTURES, "hostile")
PAYLOAD = "hisparse-payload-ran"  # what the payload fixtures would create in the working folder
# Work is bounded in function calls (Python and C, counted by a profiler), never in seconds: a
# busy machine stretches time, not work. A hostile file may cost the calls of loading a good policy
# plus CALLS_PER_BYTE a byte of it: work linear in the input, where an alias bomb, a quadratic scan
# or a runaway recursion is not (the most seen is about 4.5 a byte, a file of 100,000 small values).
# The work inside one C call is bounded by the file-size limit and the memory peak. A child process
# has no call count: its memory is bounded, and a hang fails at HANG_S.
CALLS_PER_BYTE = 8
HANG_S = 60
CHILD_EXTRA_MB = 48  # a child's peak RSS above a clean run's
IN_PROCESS_MB = 32  # tracemalloc peak of load_policy

# fixture -> (code, (line, col) of the offending node, or None when the file has no position)
COMMITTED = {
    "python-object-apply.yaml": ("E106", (4, 14)),
    "python-object-apply-root.yaml": ("E106", (1, 1)),
    "python-object-new.yaml": ("E106", (3, 14)),
    "python-name.yaml": ("E106", (3, 14)),
    "tag-directive.yaml": ("E106", (5, 14)),
    "tag-binary.yaml": ("E106", (3, 14)),
    "tag-set.yaml": ("E106", (3, 11)),
    "tag-local.yaml": ("E106", (3, 14)),
    "merge-key.yaml": ("E106", (5, 5)),
    "billion-laughs.yaml": ("E107", (3, 4)),
    "tabs.yaml": ("E104", (4, 1)),
    "duplicate-key.yaml": ("E105", (5, 1)),
    "top-level-list.yaml": ("E109", (1, 1)),
    "top-level-scalar.yaml": ("E109", (1, 1)),
    "empty.yaml": ("E109", (1, 1)),
    "comment-only.yaml": ("E109", (1, 1)),
    "two-documents.yaml": ("E110", (3, 1)),
    "non-string-key.yaml": ("E111", (2, 1)),
    "complex-key.yaml": ("E111", (2, 3)),
    "control-character.yaml": ("E104", (3, 18)),
    "integer-beyond-64-bits.yaml": ("E112", (2, 10)),
    "not-a-number.yaml": ("E112", (2, 10)),
    "bad-explicit-type.yaml": ("E104", (3, 14)),
    "name-with-newline.yaml": ("E201", (26, 13)),
}
PAYLOADS = ["python-object-apply.yaml", "python-object-apply-root.yaml", "python-object-new.yaml",
            "tag-directive.yaml"]


def _deep_block(levels: int) -> str:
    # one-space indentation keeps 1100 levels under the size limit
    return "".join(" " * i + f"k{i}:\n" for i in range(levels)) + " " * levels + "x\n"


# generated case -> (writer(path), code, (line, col) or None, environment)
GENERATED = {
    "deep-flow.yaml": (lambda p: p.write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n"),
                       "E108", (1, 67), {}),
    "deep-flow-mapping.yaml": (lambda p: p.write_text("a: " + "{b: " * 50_000 + "1" + "}" * 50_000 + "\n"),
                               "E108", (1, 256), {}),
    "deep-block-mapping.yaml": (lambda p: p.write_text(_deep_block(1100)), "E108", (65, 65), {}),
    "deep-block-list.yaml": (lambda p: p.write_text("- " * 1100 + "x\n"), "E108", (1, 129), {}),
    "over-size-limit.yaml": (lambda p: p.write_bytes(b"# padding\n" * 104_858), "E102", None, {}),
    "over-configured-limit.yaml": (lambda p: p.write_text(minimal_text()), "E102", None,
                                   {"HISPARSE_MAX_FILE_BYTES": "512"}),
    "latin-1.yaml": (lambda p: p.write_bytes(b"policy: mini\ndescription: caf\xe9\n"), "E103", (2, 17), {}),
    "utf-16.yaml": (lambda p: p.write_bytes(minimal_text().encode("utf-16")), "E103", (1, 1), {}),
    "random-bytes.yaml": (lambda p: p.write_bytes(random.Random(0).randbytes(64 * 1024)), "E103", (1, 1), {}),
    "nul-bytes.yaml": (lambda p: p.write_bytes(b"policy: mini\n" + b"\x00" * 4096), "E103", (2, 1), {}),
    "base-60-integer.yaml": (lambda p: p.write_text("policy: mini\nversion: 1" + ":1" * 300_000 + "\n"),
                             "E112", (2, 10), {}),
    "many-values.yaml": (lambda p: p.write_text("policy: mini\ndescription: [" + "1," * 200_000 + "1]\n"),
                         "E113", (2, 100_005), {}),
    "megabyte-key.yaml": (lambda p: p.write_text(minimal_text() + "? " + "k" * 900_000 + "\n: 1\n"),
                          "E201", (minimal_text().count("\n") + 1, 3), {}),
    "megabyte-plain-key.yaml": (lambda p: p.write_text("policy: mini\n" + "k" * 900_000 + ": 1\n"),
                                "E104", (2, 900_001), {}),  # YAML caps implicit keys at 1024 characters
    "megabyte-line.yaml": (lambda p: p.write_text(minimal_text().replace(
        "description: A small", "description: " + "x" * 900_000 + "\x07 A small", 1)),
        "E104", (3, 900_014), {}),
}


def _directory(p):
    p.mkdir()


def _fifo(p):
    os.mkfifo(p)


def _device(p):
    os.symlink(os.devnull, p)


def _unreadable(p):
    p.write_text(minimal_text())
    p.chmod(0)


SPECIAL = {  # not regular files, or not readable; check reads a folder as a folder of policies
    "directory": (_directory, ("a folder without policy files", "is a directory")),
    "fifo": (_fifo, "not a regular file (a FIFO)"),
    "device": (_device, "not a regular file (a character device)"),
    "unreadable": (_unreadable, "Permission denied"),
}


def _calls(fn, raises=None) -> int:
    """Function calls (Python and C) made while fn runs; fn must raise `raises` when given."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        count += event in ("call", "c_call")
    sys.setprofile(profile)
    try:
        if raises is None:
            fn()
        else:
            with pytest.raises(raises):
                fn()
    finally:
        sys.setprofile(None)
    return count


_GOOD_CALLS = []


def _good_load_calls() -> int:
    """Calls of a first load of a good policy (read, parsed, checked, built; not from the cache)."""
    if not _GOOD_CALLS:
        text = minimal_text()
        with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as mp:
            mp.setenv("HISPARSE_NO_CACHE", "1")  # every step of a load, none skipped
            path = os.path.join(folder, "good.yaml")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            before = dict(loader._cache)  # leave the loader's cache as the tests found it
            _GOOD_CALLS.append(_calls(lambda: engine.load_policy(path)))
            loader._cache.clear()
            loader._cache.update(before)
    return _GOOD_CALLS[0]


@pytest.fixture(scope="module")
def clean_rss_kb():
    """Peak RSS of a child checking a good policy: the baseline memory figures are compared to."""
    return _run_child(["check", "--no-deep", os.path.join(ROOT, "policies", "dsa-backends", "v8.yaml")],
                      ROOT, {})[3]


# The CLI as the console script runs it, reporting its peak memory at exit. The peak is read
# from /proc/self/status (VmHWM, this process's own address space): getrusage's ru_maxrss of a
# child includes the parent's size at fork, which says nothing about the child.
_CHILD = """
import atexit, os, resource, sys

def _peak():
    try:
        with open("/proc/self/status") as fh:
            kb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // (1024 if sys.platform == "darwin" else 1)
    with open(os.environ["HISPARSE_PEAK_FILE"], "w") as fh:
        fh.write(str(kb))

atexit.register(_peak)
from kernels_bridge.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _run_child(argv, cwd, env):
    """(exit code, stdout, stderr, peak RSS in KiB, CPU seconds) of `hisparse ARGV` in a fresh process."""
    peak_file = os.path.join(cwd, f".child-peak-{os.getpid()}")  # one per test process (pytest -n)
    full_env = dict(os.environ, PYTHONPATH=ROOT, HISPARSE_PEAK_FILE=peak_file, **env)
    start = _children_cpu()
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, *argv], cwd=cwd, env=full_env,
                              capture_output=True, stdin=subprocess.DEVNULL, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hisparse {' '.join(argv)} hung (no exit in {HANG_S} s)")
    elapsed = _children_cpu() - start
    with open(peak_file, encoding="ascii") as fh:
        rss_kb = int(fh.read())
    os.remove(peak_file)
    decode = lambda b: b.decode("utf-8", errors="replace")  # noqa: E731
    return proc.returncode, decode(proc.stdout), decode(proc.stderr), rss_kb, elapsed


def _children_cpu() -> float:
    """CPU seconds (user and system) of the waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _expect_line(path, code, pos) -> str:
    return f"{path}:{pos[0]}:{pos[1]}: {code}: " if pos else f"{path}: {code}: "


@pytest.fixture
def good_cache():
    """The good policies loaded, and a snapshot of the cache a hostile load must not touch."""
    for version in engine.list_families()["dsa-backends"]:
        engine.load_policy(f"dsa-backends@{version}")
    before = dict(loader._cache)
    yield before
    assert dict(loader._cache) == before and all(loader._cache[k] is v for k, v in before.items())


def _check_all_doors(path, code, pos, cwd, env, clean_rss_kb, figures, case, fragment=""):
    """`fragment`: text the message must hold; a pair: (for check, for the other doors)."""
    path = str(path)
    expected = _expect_line(path, code, pos)
    check_fragment, fragment = fragment if isinstance(fragment, tuple) else (fragment, fragment)
    for argv, stream in ((["check", path], "stdout"), (["evaluate", "--policy", path], "stderr")):
        rc, out, err, rss_kb, elapsed = _run_child(argv, str(cwd), env)
        text = out if stream == "stdout" else err
        assert rc == 2, (argv, out, err)
        assert "Traceback" not in out + err and "internal error" not in out + err, out + err
        problems = [line for line in text.splitlines() if f": {code}: " in line or ": E" in line]
        assert problems == [problems[0]] and problems[0].startswith(expected), (argv, text)
        assert (check_fragment if argv[0] == "check" else fragment) in problems[0], problems[0]
        assert rss_kb < clean_rss_kb + CHILD_EXTRA_MB * 1024, f"{argv[0]} peaked at {rss_kb} KiB"
        figures.append((case, f"hisparse {argv[0]}", elapsed, rss_kb / 1024, "child peak RSS"))
    # in process: the work counted, then the peak of Python allocations, then the time (a figure)
    calls = _calls(lambda: engine.load_policy(path), raises=engine.PolicyError)
    start = time.process_time()
    with pytest.raises(engine.PolicyError) as info:
        engine.load_policy(path)
    elapsed = time.process_time() - start
    tracemalloc.start()
    try:
        with pytest.raises(engine.PolicyError):
            engine.load_policy(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    (problem,) = info.value.problems
    assert problem.code == code and str(problem).startswith(expected), str(problem)
    assert fragment in str(problem)
    size = os.path.getsize(path) if os.path.isfile(path) else 0  # a special file is refused unread
    assert calls <= _good_load_calls() + CALLS_PER_BYTE * size, (calls, size)
    assert peak < IN_PROCESS_MB * 2 ** 20, peak
    figures.append((case, "load_policy", elapsed, peak / 2 ** 20, "tracemalloc peak"))
    assert not os.path.exists(os.path.join(cwd, PAYLOAD)), "a payload ran"


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_committed_fixture(name, tmp_path, monkeypatch, clean_rss_kb, good_cache, figures):
    code, pos = COMMITTED[name]
    monkeypatch.chdir(tmp_path)  # a payload that ran would create its file here
    _check_all_doors(os.path.join(HOSTILE, name), code, pos, tmp_path, {}, clean_rss_kb, figures, name)


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_generated_file(name, tmp_path, monkeypatch, clean_rss_kb, good_cache, figures):
    write, code, pos, env = GENERATED[name]
    path = tmp_path / name
    write(path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    _check_all_doors(path, code, pos, tmp_path, env, clean_rss_kb, figures, name)


@pytest.mark.parametrize("kind", sorted(SPECIAL))
def test_special_file(kind, tmp_path, clean_rss_kb, good_cache, figures):
    make, fragment = SPECIAL[kind]
    path = tmp_path / "dsa-backends" / "v9.yaml"  # named like a policy: check must look at it
    path.parent.mkdir()
    make(path)
    if kind == "unreadable" and os.geteuid() == 0:
        path.chmod(0o644)
        pytest.skip("running as root, where chmod 000 does not deny reads; the denial itself is "
                    "covered by test_permission_denied_is_reported")
    try:
        _check_all_doors(path, "E101", None, tmp_path, {}, clean_rss_kb, figures, kind, fragment)
    finally:
        if kind == "unreadable":
            path.chmod(0o644)


def test_permission_denied_is_reported(tmp_path, monkeypatch, capsys):
    """The unreadable-file path without relying on chmod (tests may run as root): open() fails
    with EACCES, as it does for an unprivileged user on a chmod 000 file."""
    path = tmp_path / "v1.yaml"
    path.write_text(minimal_text())
    real_open = os.open

    def denied(name, *args, **kwargs):
        if os.fspath(name) == str(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(engine.PolicyError) as info:
        engine.load_policy(str(path))
    assert str(info.value) == f"{path}: E101: cannot read file: Permission denied"
    from engine.cli.commands import main

    assert main(["check", str(path)]) == 2
    assert capsys.readouterr().out.splitlines()[0] == f"{path}: E101: cannot read file: Permission denied"


def test_payloads_are_live_under_an_unsafe_loader(tmp_path, monkeypatch):
    """The payload fixtures are real: PyYAML's unsafe loader creates the file (so the absence of
    that file after our three doors means something)."""
    monkeypatch.chdir(tmp_path)
    for name in PAYLOADS:
        with open(os.path.join(HOSTILE, name), encoding="utf-8") as fh:
            yaml.unsafe_load(fh)
        assert os.path.exists(PAYLOAD), name
        os.remove(PAYLOAD)


def test_deep_fixtures_break_a_recursive_loader(tmp_path):
    """The deep cases really are beyond Python's recursion limit for a recursive composer."""
    for name in ("deep-flow.yaml", "deep-block-mapping.yaml", "deep-block-list.yaml"):
        path = tmp_path / name
        GENERATED[name][0](path)
        with pytest.raises(RecursionError):
            yaml.load(path.read_text(), Loader=yaml.SafeLoader)


def test_billion_laughs_would_expand(tmp_path):
    """Nine levels of nine aliases: 9**9 (387 million) strings if expanded. PyYAML's composer
    shares the nodes, but any consumer that copies them (a JSON dump, a deep copy, a schema walk
    that reports every node) expands it."""
    with open(os.path.join(HOSTILE, "billion-laughs.yaml"), encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    node, size = data["description"], 1
    while isinstance(node, list):
        size *= len(node)
        node = node[0]
    assert size == 9 ** 9


def test_folder_named_like_a_policy_without_files(tmp_path, capsys):
    from engine.cli.commands import main

    folder = tmp_path / "empty-family"
    folder.mkdir()
    assert main(["check", str(folder)]) == 2
    assert capsys.readouterr().out.splitlines()[0] == (f"{folder}: E101: a folder without policy files "
                                                       "(<family>/v<N>.yaml)")


def test_special_files_among_a_folders_policies_do_not_block_check(tmp_path, capsys):
    from engine.cli.commands import main

    family = tmp_path / "mini"
    family.mkdir()
    (family / "v1.yaml").write_text(minimal_text())
    os.mkfifo(family / "v2.yaml")
    assert main(["check", "--no-deep", str(tmp_path)]) == 2  # the FIFO is never opened to wait
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"{family / 'v2.yaml'}: E101: cannot read file: not a regular file (a FIFO) " \
                                  "(policy files are regular files)"


@pytest.mark.parametrize("variant", ["bom", "crlf", "bom-crlf"])
def test_byte_order_mark_and_crlf_are_accepted_with_the_same_positions(tmp_path, variant):
    text = minimal_text().replace("{phase} needs", "{phse} needs")  # one problem, at 38:16
    data = text.encode()
    if "crlf" in variant:
        data = data.replace(b"\n", b"\r\n")
    if "bom" in variant:
        data = b"\xef\xbb\xbf" + data
    path = tmp_path / "policy.yaml"
    path.write_bytes(data)
    with pytest.raises(engine.PolicyError) as info:
        engine.load_policy(str(path))
    assert [(p.code, p.line, p.col) for p in info.value.problems] == [("E306", 38, 16)]
    path.write_bytes(data.replace(b"{phse}", b"{phase}"))
    policy = engine.load_policy(str(path))
    assert policy.evaluate({"kv_cache_dtype": "fp8_e4m3"}).backends == {"decode": "flashmla_kv"}


def test_unknown_key_a_megabyte_long_is_clipped(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(minimal_text() + "? " + "k" * 900_000 + "\n: 1\n")
    with pytest.raises(engine.PolicyError) as info:
        engine.load_policy(str(path))
    (problem,) = info.value.problems
    assert problem.code == "E201" and len(problem.message) < 200
    assert "(900002 characters)" in problem.message  # its repr, quotes included


def test_a_valid_policy_with_a_megabyte_line_loads(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(minimal_text().replace("description: A small", "description: " + "x" * 900_000, 1))
    policy = None

    def load():
        nonlocal policy
        policy = engine.load_policy(str(path))
    assert _calls(load) <= 2 * _good_load_calls()  # the long line is one scalar, not more work
    assert len(policy.description) > 900_000


def test_nesting_error_does_not_depend_on_the_libyaml_version(monkeypatch):
    """libyaml 0.2.6+ stops at 1000 flow levels while scanning ahead; the reader then reparses
    with the pure-Python parser, so the error is E108 at the 65th level either way."""
    from engine.files import yaml_reader

    text = "a: " + "[" * 5000 + "]" * 5000 + "\n"
    real_parse = yaml.parse

    def libyaml_026(stream, Loader):
        if Loader is not yaml.SafeLoader:  # what libyaml 0.2.6 raises for this text
            mark = yaml.Mark("<unicode string>", 1002, 0, 1002, None, None)
            raise yaml.scanner.ScannerError("while increasing flow level", mark,
                                            "exceeded maximum nesting depth", mark)
        return real_parse(stream, Loader=Loader)

    outcomes = []
    for patch in (False, True):
        if patch:
            monkeypatch.setattr(yaml_reader.yaml, "parse", libyaml_026)
        with pytest.raises(yaml_reader.ReadError) as exc:
            yaml_reader.parse_yaml(text, "f.yaml")
        outcomes.append(str(exc.value))
    assert outcomes[0] == outcomes[1] == "f.yaml:1:67: E108: nesting deeper than 64 levels"
