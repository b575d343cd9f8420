"""PolicyStore: safe reload. Files are published by renaming them into place; a broken edit
never replaces the last good policy, a file changed in place is refused whatever it holds (a
writer stalled half-way cannot be told from a finished one), a new good version becomes current,
a removed file is no longer served, duplicate versions are refused, and readers evaluating all
along never see an exception nor a decision from a text that is not a complete good file."""
import hashlib
import os
import threading
import time

import pytest

import engine
from engine import PolicyStore
from engine.serving import store as store_module
from tests.helpers import minimal_text

CONFIGS = [{}, {"kv_cache_dtype": "fp8_e4m3"}, {"kv_cache_dtype": "bfloat16", "sm_major": 10},
           {"decode_backend": "flashmla_kv"}]
SECOND_CHECK = '''    - name: sm-check
      require: {sm_major: {">=": 9}}
      message: "needs SM9 or newer, got SM{sm_major}"
'''


def policy_text(version: int, note: str = "") -> str:
    """A good `mini` policy of `version`; `note` makes other bytes of the same version. Its
    prefix up to the second check is itself a good policy (what a torn write could leave)."""
    text = minimal_text().replace("version: 1", f"version: {version}", 1)
    text = text.replace("A small valid policy", f"A small valid policy{note}", 1)
    return text + SECOND_CHECK


class Clock:
    """The store's monotonic seconds, moved by the test: settle windows pass when the test
    says so, never because the machine was slow or fast."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# a settle window no file's ctime in these tests can be older than: quietness is the clock's
LONG = 3600.0


def valid_prefix(text: str) -> str:
    return text.split("    - name: sm-check")[0]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def replace(path, text):
    """The safe publish: the whole text under another name, renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@pytest.fixture
def family(tmp_path):
    folder = tmp_path / "mini"
    folder.mkdir()

    def put(version, text, name=None):
        path = folder / (name or f"v{version}.yaml")
        replace(path, text)
        return str(path)

    put.folder = folder
    put.root = str(tmp_path)
    return put


def test_sanity_of_the_texts(tmp_path):
    """The torn-write stand-in really is a good policy (so serving it would be a real failure)."""
    for text in (policy_text(1), valid_prefix(policy_text(1))):
        path = tmp_path / "mini" / "v1.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        engine.load_policy(str(path))
    assert sha(policy_text(1)) != sha(valid_prefix(policy_text(1)))


def test_serves_the_newest_good_version(family):
    family(1, policy_text(1))
    family(2, policy_text(2))
    family(3, "policy: mini\nversion: [\n")  # never good
    store = PolicyStore(family.root, "mini")
    assert store.current().version == 2 and store.current().sha256 == sha(policy_text(2))
    decision = store.evaluate({"kv_cache_dtype": "fp8_e4m3"})
    assert decision.backends == {"decode": "flashmla_kv"} and decision.policy is store.current()
    (problem,) = store.errors[os.path.join(family.root, "mini", "v3.yaml")]
    assert problem.code == "E104" and (problem.line, problem.col) == (3, 1)
    status = store.status()
    assert status["current"]["version"] == 2
    # newest first, stopping at the first that loads: v1 is not needed, so not read
    assert [f["state"] for f in status["files"].values()] == ["unread", "good", "refused"]


def test_a_new_good_version_becomes_current(family):
    family(1, policy_text(1))
    store = PolicyStore(family.root, "mini", settle=0)
    assert store.refresh().changed is False
    v2 = family(2, policy_text(2))
    result = store.refresh()
    assert result.changed and result.loaded == (v2,) and result.previous.version == 1
    assert store.current().version == 2 and store.evaluate({}).policy.version == 2


def test_a_broken_edit_never_replaces_the_last_good_policy(family):
    path = family(1, policy_text(1))
    store = PolicyStore(family.root, "mini", settle=0)
    good = store.current()
    family(1, policy_text(1).replace("    default: 9", "    default: [9"))  # YAML syntax error
    result = store.refresh()
    assert result.refused == (path,) and not result.changed and store.current() is good
    (problem,) = store.errors[path]
    assert str(problem) == (f"{path}:13:9: E104: YAML syntax: while parsing a flow sequence did not "
                            "find expected ',' or ']'")
    assert store.evaluate({}).policy is good
    # a schema error, then a name error: the same, each reported with its position
    family(1, policy_text(1).replace("kv_cache_dtype: fp8_e4m3}", "kv_cache_dtyp: fp8_e4m3}"))
    store.refresh()
    assert store.current() is good and [p.code for p in store.errors[path]] == ["E301"]
    assert str(store.errors[path][0]).startswith(f"{path}:24:")
    # fixed: served, errors cleared
    family(1, policy_text(1, " (fixed)"))
    result = store.refresh()
    assert result.changed and result.loaded == (path,) and store.errors == {}
    assert store.current().sha256 == sha(policy_text(1, " (fixed)"))


def test_a_broken_new_version_leaves_the_current_one(family):
    family(1, policy_text(1))
    store = PolicyStore(family.root, "mini", settle=0)
    v2 = family(2, policy_text(2).replace("version: 2", "version: 3"))  # identity mismatch
    result = store.refresh()
    assert result.refused == (v2,) and store.current().version == 1
    assert [p.code for p in store.errors[v2]] == ["E312"]


def test_removing_the_current_file_stops_serving_it(family):
    v1 = family(1, policy_text(1))
    v2 = family(2, policy_text(2))
    store = PolicyStore(family.root, "mini", settle=0)
    assert store.current().version == 2
    os.remove(v2)
    result = store.refresh()
    assert result.removed == (v2,) and result.changed and store.current().version == 1
    assert store.evaluate({}).policy.version == 1  # v1 was read only now, when it was needed
    (problem,) = store.errors[v2]
    assert problem.code == "S801" and f"no longer served; serving mini@1 ({v1})" in problem.message
    assert store.status()["files"][v2]["state"] == "removed"
    assert store.refresh().removed == ()  # said once
    family(2, policy_text(2))  # back: served again
    result = store.refresh()
    assert result.loaded == (v2,) and store.current().version == 2 and store.errors == {}
    os.remove(v2)
    os.remove(v1)
    store.refresh()
    assert store.current().version == 2  # nothing else loads: the last good policy stays, and says so
    assert "no other version of 'mini' loads: still serving mini@2" in store.errors[v2][0].message


def test_a_file_replaced_by_delete_and_create_is_not_a_removal(family):
    family(1, policy_text(1))
    v2 = family(2, policy_text(2))
    clock = Clock()
    store = PolicyStore(family.root, "mini", settle=LONG, clock=clock)
    os.remove(v2)
    assert store.refresh().removed == () and store.current().version == 2  # not yet settle seconds
    family(2, policy_text(2, " again"))
    assert store.refresh().pending == (v2,)
    clock.advance(LONG)
    result = store.refresh()
    assert result.removed == () and store.current().sha256 == sha(policy_text(2, " again"))


def test_a_never_good_file_removed_is_forgotten(family):
    family(1, policy_text(1))
    bad = family(2, "not: [valid")
    store = PolicyStore(family.root, "mini", settle=0)
    assert bad in store.errors
    os.remove(bad)
    assert store.refresh().removed == (bad,) and store.errors == {}


def test_an_in_place_writer_stalled_past_the_settle_window_is_never_served(family):
    """The writer truncates the file and writes a prefix that is itself a good policy, then
    stalls longer than `settle`: the store cannot tell that from a finished write, so it keeps
    the old content (S803); after the writer finishes, still nothing in-place is read; a rename
    publishes."""
    path = family(1, policy_text(1))
    clock = Clock()
    store = PolicyStore(family.root, "mini", settle=LONG, clock=clock)
    old = store.current()
    full = policy_text(1, " (second)")
    with open(path, "w", encoding="utf-8") as fh:  # in place: truncate, then write in two parts
        fh.write(valid_prefix(full))
        fh.flush()
        for _ in range(3):
            result = store.refresh()
            assert store.current() is old and store.evaluate({}).policy is old
            clock.advance(LONG)  # longer than settle
        fh.write(full[len(valid_prefix(full)):])
    assert result.refused == (path,) or store.errors[path][0].code == "S803"
    clock.advance(LONG)
    store.refresh()
    assert store.current() is old
    (problem,) = store.errors[path]
    assert problem.code == "S803" and "keeping mini@1" in problem.message and "renaming it into place" in problem.hint
    family(1, full)  # renamed into place: read once quiet
    assert store.refresh().pending == (path,)
    clock.advance(LONG)
    result = store.refresh()
    assert result.loaded == (path,) and store.current().sha256 == sha(full) and store.errors == {}


def test_touching_a_file_is_not_a_change(family):
    path = family(1, policy_text(1))
    store = PolicyStore(family.root, "mini", settle=0)
    os.utime(path, (1, 1))
    os.chmod(path, 0o600)
    result = store.refresh()
    assert result.refused == () and store.errors == {} and store.status()["files"][path]["state"] == "good"


def test_a_new_file_seen_growing_is_read_once_quiet(family):
    """A new file written in place (cp, scp) is a write in progress while it grows: pending,
    then read whole once it has been quiet for `settle`."""
    family(1, policy_text(1))
    path = str(family.folder / "v2.yaml")
    clock = Clock()
    store = PolicyStore(family.root, "mini", settle=LONG, clock=clock)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(valid_prefix(policy_text(2)))
        fh.flush()
        assert store.refresh().pending == (path,)
        fh.write(policy_text(2)[len(valid_prefix(policy_text(2))):])
    assert store.refresh().pending == (path,) and store.current().version == 1
    clock.advance(LONG)
    assert store.refresh().loaded == (path,) and store.current().sha256 == sha(policy_text(2))
    assert store.errors == {}


@pytest.mark.parametrize("prefix", ["valid", "broken", "empty"])
def test_a_new_file_stalled_past_settle_is_replaced_by_its_completion(family, prefix):
    """The writer of a new version stalls after a prefix for longer than `settle`: the prefix is
    judged (served when it loads, refused when it does not); when the writer finishes, the
    completed file (the prefix, then more) replaces it once quiet, never refused as changed in
    place, so a half-written version never stays in service. Another text written over it
    in place is still S803."""
    family(1, policy_text(1))
    path = str(family.folder / "v2.yaml")
    full = policy_text(2)
    head = {"valid": valid_prefix(full), "broken": full[:len(valid_prefix(full)) + 9], "empty": ""}[prefix]
    assert full.startswith(head) and head != full
    clock = Clock()
    store = PolicyStore(family.root, "mini", settle=LONG, clock=clock)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(head)
        fh.flush()
        store.refresh()
        clock.advance(LONG)  # the stall outlasts settle: the prefix is judged
        result = store.refresh()
        if prefix == "valid":
            assert result.loaded == (path,) and store.current().sha256 == sha(head)
        else:
            assert result.refused == (path,) and store.current().version == 1
        fh.write(full[len(head):])  # the writer finishes
        fh.flush()
        result = store.refresh()
        assert result.pending == (path,) and result.refused == ()  # not yet quiet, never S803
        clock.advance(LONG)
        result = store.refresh()
        assert result.loaded == (path,) and store.current().sha256 == sha(full) and store.errors == {}
        fh.seek(0)  # now another text over it, in place: refused, the completed text kept
        fh.write(full.replace("version: 2", "version: 2  ", 1))
    clock.advance(LONG)
    store.refresh()
    assert store.current().sha256 == sha(full) and store.errors[path][0].code == "S803"


def test_duplicate_versions_are_refused(family, capsys):
    """v1.yaml and v001.yaml both say version 1: neither is served under a guessed label; the
    last good content of the version stays; `hisparse check` reports both."""
    from tests.helpers import run_cli

    v1 = family(1, policy_text(1))
    store = PolicyStore(family.root, "mini", settle=0)
    good = store.current()
    v001 = family(1, policy_text(1, " other"), "v001.yaml")
    store.refresh()
    assert store.current() is good
    for path in (v1, v001):
        (problem,) = store.errors[path]
        assert problem.code == "E313" and "version 1 of 'mini' has 2 files" in problem.message
    with pytest.raises(engine.PolicyError, match="E313"):
        PolicyStore(family.root, "mini")
    with pytest.raises(engine.PolicyError, match="E313"):
        engine.load_policy("mini", policy_dir=family.root)
    code, out, _ = run_cli(capsys, "check", "--no-deep", str(family.folder))
    assert code == 2 and out.count("E313") == 2
    family(2, policy_text(2), "v002.yaml")  # alone, a padded name is fine, and named as it is
    store.refresh()
    assert store.current().version == 2 and store.current().file.endswith("v002.yaml")
    os.remove(v001)
    family(3, policy_text(3))
    store.refresh()
    assert store.current().version == 3 and v1 not in store.errors


def test_opening_a_folder_of_many_versions_reads_only_what_it_serves(family, monkeypatch):
    """Newest first, stopping at the first good version: 300 versions, two files read."""
    text = policy_text(1)
    for version in range(1, 301):
        (family.folder / f"v{version}.yaml").write_text(text.replace("version: 1", f"version: {version}", 1))
    (family.folder / "v301.yaml").write_text("policy: mini\nversion: [\n")
    reads = []
    real = store_module.read_snapshot
    monkeypatch.setattr(store_module, "read_snapshot", lambda path, *a, **k: reads.append(path) or real(path, *a, **k))
    store = PolicyStore(family.root, "mini", settle=0)
    assert store.current().version == 300 and len(reads) == 2
    store.refresh()
    assert len(reads) == 2  # unchanged files are only looked at


@pytest.mark.parametrize("kw", [
    {"poll_interval": float("nan")}, {"poll_interval": float("inf")}, {"poll_interval": -1},
    {"poll_interval": 0}, {"poll_interval": "1"}, {"poll_interval": True}, {"settle": float("nan")},
    {"settle": float("inf")}, {"settle": -0.5}, {"settle": "0.5"}, {"settle": None},
    {"poll_interval": 1e10}, {"poll_interval": 86401}, {"poll_interval": -0.0}, {"settle": 1e10},
])
def test_bad_poll_interval_and_settle_are_refused(family, kw):
    family(1, policy_text(1))
    with pytest.raises(ValueError, match=r"must be a (positive|non-negative) number of seconds up to 86400, got"):
        PolicyStore(family.root, "mini", **kw)
    store = PolicyStore(family.root, "mini")
    if "poll_interval" in kw:
        with pytest.raises(ValueError):
            store.start(kw["poll_interval"])
    assert store._thread is None


def test_bytes_that_change_while_read_are_not_used(family, monkeypatch):
    path = family(1, policy_text(1))
    store = PolicyStore(family.root, "mini", settle=0)
    family(1, policy_text(1, " (edited)"))
    real = store_module.read_snapshot
    monkeypatch.setattr(store_module, "read_snapshot", lambda *a, **k: (real(*a, **k)[0][:100], None))
    assert store.refresh().pending == (path,) and store.current().sha256 == sha(policy_text(1))
    monkeypatch.setattr(store_module, "read_snapshot", real)
    assert store.refresh().loaded == (path,) and store.current().sha256 == sha(policy_text(1, " (edited)"))


def test_special_and_unreadable_files_are_refused_without_blocking(family):
    family(1, policy_text(1))
    store = PolicyStore(family.root, "mini", settle=0)
    os.mkfifo(family.folder / "v2.yaml")
    (family.folder / "v3.yaml").mkdir()
    result = store.refresh()  # the FIFO is opened O_NONBLOCK and judged from its descriptor: no wait
    assert len(result.refused) == 2 and store.current().version == 1
    messages = {os.path.basename(f): str(p[0]) for f, p in store.errors.items()}
    assert "E101: cannot read file: not a regular file (a FIFO)" in messages["v2.yaml"]
    assert "E101: cannot read file: is a directory" in messages["v3.yaml"]


def test_an_unexpected_error_is_contained(family, monkeypatch):
    path = family(1, policy_text(1))
    store = PolicyStore(family.root, "mini", settle=0)
    family(1, policy_text(1, " (edited)"))

    def boom(*args, **kwargs):
        raise IndexError("a bug")

    monkeypatch.setattr(store_module, "load_bytes", boom)
    result = store.refresh()
    assert result.refused == (path,) and store.current().sha256 == sha(policy_text(1))
    assert str(store.errors[path][0]) == f"{path}: S802: internal error while loading: IndexError: a bug"


def test_the_folder_going_away_keeps_everything(family):
    family(1, policy_text(1))
    store = PolicyStore(family.root, "mini", settle=0)
    served = store.current()
    moved = family.folder.with_name("mini-moved")
    family.folder.rename(moved)
    result = store.refresh()
    assert result.removed == () and store.current() is served
    (problem,) = store.errors[os.path.join(family.root, "mini")]
    assert problem.code == "E101" and "cannot read the policy folder" in problem.message
    moved.rename(family.folder)
    store.refresh()
    assert store.errors == {}


@pytest.mark.parametrize("setup, family_name, code, text", [
    (lambda f: None, "mini", "R601", "no version of 'mini'"),
    (lambda f: f(1, "policy: [mini\n"), "mini", "E104", "YAML syntax"),
    (lambda f: f(1, policy_text(1)), "mni", "R601", "did you mean 'mini'?"),
    (lambda f: f(1, policy_text(1)), "../mini", "R602", "bad policy family"),
])
def test_nothing_to_serve_is_an_error(family, setup, family_name, code, text):
    setup(family)
    with pytest.raises(engine.PolicyError) as info:
        PolicyStore(family.root, family_name)
    assert info.value.problems[0].code == code and text in str(info.value)


def test_the_shipped_policies():
    store = PolicyStore()
    assert store.current().ref == engine.load_policy("dsa-backends").ref
    assert store.evaluate({"enable_hisparse": True, "kv_cache_dtype": "fp8_e4m3",
                           "disable_radix_cache": True}).backends["decode"] == "flashmla_kv"
    assert store.current().file == "policies/dsa-backends/v10.yaml"
    assert store.errors == {}


def test_background_polling_picks_up_changes(family):
    family(1, policy_text(1))
    with PolicyStore(family.root, "mini", poll_interval=0.01, settle=0.02) as store:
        family(2, policy_text(2))
        assert _wait(lambda: store.current().version == 2)
        thread = store._thread
    assert not thread.is_alive()


def test_the_poller_survives_a_failing_refresh(family, monkeypatch):
    family(1, policy_text(1))
    store = PolicyStore(family.root, "mini", settle=0)
    calls = []
    real = store._refresh

    def flaky(initial):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("transient")
        return real(initial)

    monkeypatch.setattr(store, "_refresh", flaky)
    store.start(0.01)
    try:
        family(2, policy_text(2))
        assert _wait(lambda: store.current().version == 2)
    finally:
        store.stop()
    assert len(calls) >= 2


def test_poll_interval_must_be_positive(family):
    family(1, policy_text(1))
    store = PolicyStore(family.root, "mini")
    with pytest.raises(ValueError):
        store.start(0)


def _wait(condition, timeout=120.0) -> bool:  # a hang guard: waits on a condition, asserts no speed
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def test_readers_never_see_a_broken_policy_while_a_writer_edits(family):
    """A writer edits the folder (good texts renamed into place, broken texts renamed into
    place, in-place writes that stall half-way longer than `settle` with a prefix that is itself
    a good policy, a new version, the current file deleted) while reader threads evaluate
    without pause and a poller reloads. Every decision must come from a complete text renamed
    into place (or the first one); no reader may see an exception."""
    settle = 0.05
    good: set[str] = set()

    def publish(version, text, how="rename"):
        path = family.folder / f"v{version}.yaml"
        if how == "rename":
            replace(path, text)
        else:  # in place, stalled inside the write far longer than `settle`, then finished
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(valid_prefix(text))
                fh.flush()
                time.sleep(settle * 6)
                fh.write(text[len(valid_prefix(text)):])

    def publish_good(version, text):
        good.add(sha(text))
        publish(version, text)

    first = policy_text(1)
    publish_good(1, first)
    store = PolicyStore(family.root, "mini", poll_interval=0.005, settle=settle)
    served, failures, stop = set(), [], threading.Event()
    counts = [0] * 3

    def reader(i):
        n = 0
        while not stop.is_set():
            try:
                d = store.evaluate(CONFIGS[n % len(CONFIGS)])
                served.add(d.policy.sha256)
                assert d.ok in (True, False) and d.backends["decode"] in ("flashmla_kv", "flashmla_sparse")
            except BaseException as exc:  # noqa: BLE001 - any exception at all is a failure
                failures.append(repr(exc))
            n += 1
        counts[i] = n

    readers = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for t in readers:
        t.start()
    refused_seen = set()

    def wait_for(check):
        deadline = time.monotonic() + 120  # a hang guard, not a speed bound
        while time.monotonic() < deadline:
            refused_seen.update((f, p[0].code) for f, p in store.errors.items())
            if check():
                return
            time.sleep(0.005)
        raise AssertionError("the store did not reach the expected state")

    def refused(version, code=None):
        return lambda: any(f.endswith(f"v{version}.yaml") and p[0].code not in ("S801",)
                           and (code is None or p[0].code == code) for f, p in store.errors.items())

    def serving(text):
        return lambda: store.current().sha256 == sha(text)

    try:
        steps = [
            (lambda: publish_good(1, policy_text(1, " a")), serving(policy_text(1, " a"))),
            (lambda: publish(1, "policy: mini\nversion: [1\n"), refused(1)),
            (lambda: publish(1, policy_text(1, " b"), "in place"), refused(1, "S803")),
            (lambda: publish_good(1, policy_text(1, " c")), serving(policy_text(1, " c"))),
            (lambda: publish_good(2, policy_text(2)), serving(policy_text(2))),
            (lambda: publish(2, policy_text(2, " d")[:-40]), refused(2)),
            (lambda: publish(2, policy_text(2, " e"), "in place"), refused(2, "S803")),
            (lambda: publish(3, policy_text(3).replace("flashmla_kv]", "flashmla_kx]")), refused(3)),
            (lambda: publish_good(3, policy_text(3, " f")), serving(policy_text(3, " f"))),
            (lambda: os.remove(family.folder / "v3.yaml"), lambda: store.current().version == 2),
            (lambda: publish_good(4, policy_text(4, " g")), serving(policy_text(4, " g"))),
            (lambda: publish(4, "- a list\n"), refused(4)),
            (lambda: publish(4, policy_text(4, " h"), "in place"), refused(4, "S803")),
            (lambda: publish_good(4, policy_text(4, " i")), serving(policy_text(4, " i"))),
        ]
        for act, done in steps:
            act()
            wait_for(done)
        time.sleep(settle * 4)  # let every reader run against the final state too
    finally:
        stop.set()
        for t in readers:
            t.join()
        store.stop()
    assert failures == []
    assert served <= good, f"served {len(served - good)} decision(s) from a text that is not a good one"
    assert len(served) >= 6 and min(counts) > 100  # it really reloaded under load
    assert {code for _, code in refused_seen} >= {"E104", "E303", "E109", "S801", "S803"}
    assert store.current().sha256 == sha(policy_text(4, " i"))
