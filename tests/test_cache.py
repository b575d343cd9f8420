"""The policy cache: a policy built from its cached document decides exactly what the file
decides, an entry holds plain data only (never code), and an entry that is corrupt, foreign,
stale, not ours or a link is never used (the file is parsed and checked, and the entry written
again)."""
import marshal
import os
import subprocess
import sys
import threading

import pytest

import engine
from engine.files import cache
from engine.policy import loader
from engine.files import catalog
from engine.files.heads import Head
from engine.files.reading import sha256
from tests.helpers import ROOT, minimal_text, write_policy
from engine.analysis import domain

SHIPPED = [f"{family}@{v}" for family, versions in engine.list_families().items() for v in versions]


_PARSED: set = set()  # ids of the policies whose file was parsed (not served from the cache)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    where = tmp_path / "cache"
    monkeypatch.setenv("HISPARSE_CACHE_DIR", str(where))
    monkeypatch.delenv("HISPARSE_NO_CACHE", raising=False)
    parse = loader.compile_bytes

    def parsed(*args, **kw):
        policy = parse(*args, **kw)
        _PARSED.add(id(policy))
        return policy

    monkeypatch.setattr(loader, "compile_bytes", parsed)
    loader.clear_cache()
    yield where
    loader.clear_cache()
    _PARSED.clear()


def _fresh_load(ref):
    """A load as a new process does it: nothing in memory."""
    loader.clear_cache()
    return engine.load_policy(ref)


def _from_cache(policy) -> bool:
    return id(policy) not in _PARSED


def _entry(ref):
    path, display = catalog.resolve_ref(ref)
    with open(path, "rb") as fh:
        digest = sha256(fh.read()).hexdigest()
    return cache.entry_path(digest, display)


@pytest.mark.parametrize("ref", SHIPPED)
def test_a_cached_policy_decides_what_the_file_decides(folder, ref):
    compiled = _fresh_load(ref)
    assert not _from_cache(compiled) and os.path.exists(_entry(ref))
    cached = _fresh_load(ref)
    assert _from_cache(cached) and cached is not compiled
    assert cached.identity() == compiled.identity() and cached.file == compiled.file
    # the same rule model (every field of every rule) decides alike: a stride of the domain here,
    # the whole domain in bulk below
    assert cached.rule_list == compiled.rule_list
    for k, config in enumerate(domain.configs(compiled)):
        if not k % 97:
            assert cached.evaluate(config).to_dict() == compiled.evaluate(config).to_dict()
    assert [r.name for r in cached.rule_list] == [r.name for r in compiled.rule_list]
    config = {"enable_hisparse": True, "kv_cache_dtype": "fp8_e4m3"}
    (d1, t1), (d2, t2) = cached.trace(config), compiled.trace(config)
    assert d1.to_dict() == d2.to_dict() and [e.op for e in t1] == [e.op for e in t2]


@pytest.mark.parametrize("ref", SHIPPED)
def test_a_cached_load_equals_a_fresh_load(folder, ref, monkeypatch):
    """What a policy declares (upstream, inputs with their removed and deprecated spellings,
    phases with the backends each accepts) comes from the entry as the file gives it, and so does
    every decision of the whole domain, from evaluate and from the bulk probe."""
    monkeypatch.setenv("HISPARSE_NO_CACHE", "1")
    fresh = _fresh_load(ref)
    monkeypatch.delenv("HISPARSE_NO_CACHE")
    _fresh_load(ref)  # writes the entry
    cached = _fresh_load(ref)
    assert _from_cache(cached) and not _from_cache(fresh)
    for key in ("family", "version", "description", "source", "backends", "upstream", "inputs", "phases",
                "written", "rule_meta", "key_map", "deprecated_keys", "removed_keys", "phase_key_aliases",
                "tables", "capabilities", "scope", "applies"):
        assert getattr(cached, key) == getattr(fresh, key), key
    # the document itself, positions included (what later analyses report problems at)
    assert (cached.doc.data, cached.doc.positions, cached.doc.key_positions) == \
        (fresh.doc.data, fresh.doc.positions, fresh.doc.key_positions)
    assert (cached.upstream.label() if cached.upstream else None) == (fresh.upstream.label() if fresh.upstream else None)
    assert [(ph, s.backends) for ph, s in cached.phases.items()] == [(ph, s.backends) for ph, s in fresh.phases.items()]
    for key in fresh.removed_keys:  # a removed spelling is refused alike (the message names upstream)
        with pytest.raises(engine.ConfigError) as want:
            fresh.evaluate({key: None})
        with pytest.raises(engine.ConfigError) as got:
            cached.evaluate({key: None})
        assert got.value.problems == want.value.problems
    configs = list(domain.configs(fresh))
    for config in configs[::97]:
        a, b = cached.evaluate(config), fresh.evaluate(config)
        assert a.to_dict() == b.to_dict() and a.violations == b.violations, config
    rows = [tuple(c.values()) for c in configs]
    assert [r for chunk in domain.results(cached, rows) for r in chunk] == \
        [r for chunk in domain.results(fresh, rows) for r in chunk]
    assert [(r.name, r.stage, r.at, r.line) for r in cached.rule_list] == \
        [(r.name, r.stage, r.at, r.line) for r in fresh.rule_list]
    assert cached.rule_list == fresh.rule_list  # every field of every rule, conditions and templates


def test_a_release_reference_on_a_warm_cache_builds_only_the_versions_it_names(folder, monkeypatch):
    """Finding the version of each family that models a release reads every version file's head
    (family, version, models, upstream.releases) from its entry, which gives what the policy itself
    gives; only the versions the reference names are built (what the SGLang plugin's start-up
    pays for HISPARSE_POLICY=installed)."""
    from engine.policy import policy as policy_module
    from engine.sglang.policy_sets import load_policy_set

    for ref in SHIPPED:
        path, display = catalog.resolve_ref(ref)
        built = _fresh_load(ref)  # writes the entry
        loader.clear_cache()
        head = loader.load_head(path, display)
        assert isinstance(head, Head)
        assert (head.family, head.version, head.models) == (built.family, built.version, built.models), ref
        assert (head.upstream is None) == (built.upstream is None), ref
        assert head.upstream is None or head.upstream.releases == built.upstream.releases, ref
        assert loader.load_head(path, display) is head  # then from memory
        assert loader.load_file(path, display) is not head and loader.load_head(path, display).rule_list
    builds = []
    build = policy_module.Policy.from_document.__func__

    def counted(cls, doc, *args, **kwargs):
        builds.append(doc.file)
        return build(cls, doc, *args, **kwargs)

    monkeypatch.setattr(policy_module.Policy, "from_document", classmethod(counted))
    for release in ("0.5.23", "0.5.16"):
        loader.clear_cache()
        found = load_policy_set(f"sglang=={release}")
        assert builds == [p.file for p in found.policies] and all(_from_cache(p) for p in found.policies)
        assert [p.ref for p in found.policies] == [p.ref for p in _release_set_without_heads(release, monkeypatch)]
        builds.clear()


def _release_set_without_heads(release, monkeypatch):
    """The set as loading every version file whole finds it."""
    from engine.sglang import policy_sets as sets

    with monkeypatch.context() as m:
        m.setattr(sets, "load_head", loader.load_file)
        return sets.load_policy_set(f"sglang=={release}").policies


def test_a_version_file_without_an_entry_is_still_loaded_whole_for_a_release_reference(folder, tmp_path):
    """A head is read only from an entry (bytes that passed every check): a broken version file in
    the folder stops a release reference with its own problem, as before."""
    from engine.sglang.policy_sets import load_policy_set

    root = tmp_path / "policies"
    family = root / "dsa-backends"
    family.mkdir(parents=True)
    for v in (9, 10):
        src, _ = catalog.resolve_ref(f"dsa-backends@{v}")
        with open(src, encoding="utf-8") as fh:
            (family / f"v{v}.yaml").write_text(fh.read(), encoding="utf-8")
    loader.clear_cache()
    assert [p.ref for p in load_policy_set("sglang==0.5.23", str(root)).policies] == ["dsa-backends@10"]
    (family / "v11.yaml").write_text("policy: dsa-backends\nversion: 11\ninputs: [\n", encoding="utf-8")
    loader.clear_cache()
    with pytest.raises(engine.PolicyError) as exc:
        load_policy_set("sglang==0.5.23", str(root))
    assert "v11.yaml" in exc.value.problems[0].file


def _plain(value) -> bool:
    """Only plain data: dicts, lists, tuples, strings, numbers, booleans, None."""
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


@pytest.mark.parametrize("ref", SHIPPED)
def test_an_entry_holds_plain_data_only(folder, ref):
    """The checked document, never code: whoever can write the cache folder can at most make a
    load use another document for the same bytes, which the rule model's checks still read."""
    _fresh_load(ref)
    with open(_entry(ref), "rb") as fh:
        data = fh.read()
    body = marshal.loads(data[len(cache.MAGIC) + 32:])
    assert _plain(body) and body[1] == engine.load_policy(ref).sha256  # a code object is not plain


def test_a_new_process_skips_parsing_and_the_schema(folder):
    _fresh_load("dsa-backends@8")  # writes the entry
    probe = ("import sys, engine; d = engine.evaluate('dsa-backends@8', {'enable_hisparse': True}); "
             "print(d.ok, sorted(m for m in ('yaml', 'jsonschema', 'engine.files.yaml_reader', 'dataclasses') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "[]"]


HEAVY = ("yaml", "jsonschema", "torch", "sglang", "engine.language.compiler", "dataclasses")


@pytest.mark.parametrize("argv", [
    ["--enable-hisparse", "--kv-cache-dtype", "fp8_e4m3", "--disable-radix-cache"],
    ["--dsa-prefill-backend", "tilelang", "--kv-cache-dtype", "fp8_e4m3"],  # a check at defaults fails
    # a launch command with a model path
    ["--", "python", "-m", "sglang.launch_server", "--model-path", "deepseek-ai/DeepSeek-V3.2", "--enable-hisparse",
     "--kv-cache-dtype", "fp8_e4m3"],
    # a JSON option's text is read by the JSON reader, which needs neither PyYAML nor dataclasses
    ["--enable-hisparse", "--kv-cache-dtype", "fp8_e4m3", "--disable-radix-cache",
     "--hisparse-config", '{"top_k": 2048, "device_buffer_size": 4096}'],
])
def test_hisparse_evaluate_on_a_warm_cache_imports_nothing_heavy(folder, argv):
    """`hisparse evaluate` of the default policies (the newest version of each family) with their
    entries written: no PyYAML, jsonschema, torch, SGLang, bulk evaluator or dataclasses in the
    process."""
    for family in ("dsa-backends", "dsv4-backends", "minimax-m3-backends"):
        _fresh_load(family)  # writes the entry of each family the default set holds (a second run)
    probe = ("import sys; from kernels_bridge.cli import main\n"
             f"try:\n    code = main(['evaluate'] + {argv!r})\nexcept SystemExit as exc:\n    code = exc.code\n"
             f"print('IMPORTED', code, sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ), timeout=120)
    assert "IMPORTED" in out.stdout, out.stderr
    code, imported = out.stdout.split("IMPORTED ", 1)[1].split(" ", 1)
    assert imported.strip() == "[]", (code, out.stderr)
    assert code in ("0", "1")  # decided (accepted or rejected), not a usage error


def _damaged(data: bytes) -> list:
    head = len(cache.MAGIC) + 32
    flipped = bytearray(data)
    flipped[head + len(data[head:]) // 2] ^= 0x40
    return [b"", data[:10], data[: len(data) // 2], bytes(flipped), b"\x00" * len(data),
            b"garbage" * 100, cache.MAGIC + b"\x00" * 32 + b"not marshal"]


def _body(data: bytes):
    assert data.startswith(cache.MAGIC)
    return marshal.loads(data[len(cache.MAGIC) + 32:])


@pytest.mark.parametrize("every", [pytest.param(1, marks=pytest.mark.whole), 13])
def test_corrupt_entries_are_ignored_and_rewritten(folder, every):
    """A damaged entry is never used: the policy parsed again decides as before on every config
    (every 13th in make test)."""
    v2 = engine.load_policy("dsa-backends@2")
    want = {tuple(c.items()): v2.evaluate(c).to_dict() for k, c in enumerate(domain.configs(v2)) if not k % every}
    path = _entry("dsa-backends@2")
    with open(path, "rb") as fh:
        good = fh.read()
    for bad in _damaged(good):
        with open(path, "wb") as fh:
            fh.write(bad)
        policy = _fresh_load("dsa-backends@2")
        assert not _from_cache(policy)  # parsed from the file
        for c_key, d in want.items():
            assert policy.evaluate(dict(c_key)).to_dict() == d
        with open(path, "rb") as fh:  # written again, whole (marshal's bytes may differ in reference flags)
            assert _body(fh.read()) == _body(good)
        assert not [f for f in os.listdir(folder) if f.endswith(".tmp")]


def test_an_entry_made_for_other_bytes_or_names_is_not_used(folder, tmp_path):
    text = minimal_text()
    a = write_policy(tmp_path, text, "a/policy.yaml")
    b = write_policy(tmp_path, text.replace("description:", "description: changed,", 1), "b/policy.yaml")
    pa, pb = _fresh_load(a), _fresh_load(b)
    with open(a, "rb") as fh:
        da = sha256(fh.read()).hexdigest()
    with open(b, "rb") as fh:
        db = sha256(fh.read()).hexdigest()
    # b's entry copied to where a's belongs: it records b's bytes, so a is parsed again
    with open(cache.entry_path(db, b), "rb") as fh:
        foreign = fh.read()
    with open(cache.entry_path(da, a), "wb") as fh:
        fh.write(foreign)
    again = _fresh_load(a)
    assert not _from_cache(again) and again.description == pa.description != pb.description
    # the same bytes under another name are checked under that name (v3.yaml must be version 3)
    moved = write_policy(tmp_path, text, "other/v3.yaml")
    with pytest.raises(engine.PolicyError) as err:
        _fresh_load(moved)
    assert "E312" in str(err.value)


def test_an_edited_file_is_never_answered_from_its_old_entry(folder, tmp_path):
    path = write_policy(tmp_path, minimal_text(), "p/policy.yaml")
    before = _fresh_load(path)
    write_policy(tmp_path, minimal_text().replace("description:", "description: edited,", 1), "p/policy.yaml")
    after = _fresh_load(path)
    assert after.sha256 != before.sha256 and "edited" in after.description


def test_entries_of_another_engine_are_ignored(folder, monkeypatch):
    _fresh_load("dsa-backends@1")
    monkeypatch.setattr(cache, "_fingerprint", "0" * 64)  # as if the engine's sources had changed
    assert not _from_cache(_fresh_load("dsa-backends@1"))
    assert _from_cache(_fresh_load("dsa-backends@1"))  # its own entry, written just now


def test_entries_others_could_write_and_links_are_ignored(folder, tmp_path):
    _fresh_load("dsa-backends@1")
    path = _entry("dsa-backends@1")
    os.chmod(path, 0o666)
    assert not _from_cache(_fresh_load("dsa-backends@1"))
    os.chmod(path, 0o600)
    assert _from_cache(_fresh_load("dsa-backends@1"))
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # root can give the file away
        os.chown(path, 4321, -1)
        assert not _from_cache(_fresh_load("dsa-backends@1"))
    os.replace(path, str(tmp_path / "elsewhere.bin"))
    os.symlink(str(tmp_path / "elsewhere.bin"), path)
    assert not _from_cache(_fresh_load("dsa-backends@1"))


def test_the_cache_can_be_turned_off_and_may_be_unwritable(folder, monkeypatch, tmp_path):
    monkeypatch.setenv("HISPARSE_NO_CACHE", "1")
    assert cache.directory() is None
    assert not _from_cache(_fresh_load("dsa-backends@2"))
    assert not folder.exists()
    monkeypatch.delenv("HISPARSE_NO_CACHE")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HISPARSE_CACHE_DIR", str(blocker / "cache"))
    assert not _from_cache(_fresh_load("dsa-backends@2"))  # nothing could be written: still loads
    assert _fresh_load("dsa-backends@2").evaluate({}).ok


def test_default_location_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("HISPARSE_CACHE_DIR", raising=False)
    monkeypatch.delenv("HISPARSE_NO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.directory() == str(tmp_path / "xdg" / "hisparse" / "checked")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.directory() == str(tmp_path / "home" / ".cache" / "hisparse" / "checked")


def test_concurrent_writers_leave_one_whole_entry(folder):
    policy = _fresh_load("dsa-backends@8")
    path, display = catalog.resolve_ref("dsa-backends@8")
    threads = [threading.Thread(target=cache.store, args=(policy.sha256, display, policy.doc)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.load(policy.sha256, display) is not None
    assert not [f for f in os.listdir(folder) if f.endswith(".tmp")]


def test_threads_loading_a_cached_policy_at_once(folder):
    _fresh_load("dsa-backends@8")
    loader.clear_cache()
    seen, errors = [], []

    def use():
        try:
            policy = engine.load_policy("dsa-backends@8")
            seen.append((len(policy.rule_list), policy.evaluate({"enable_hisparse": True}).to_dict()["ok"]))
        except Exception as exc:  # a reader must never see a half-built policy
            errors.append(exc)

    threads = [threading.Thread(target=use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(seen)) == 1 and len(seen) == 8


# -- the key holds everything the verdict depends on; a planted entry never hangs a run --------
def _placed(tmp_path, folder_name):
    """The same bytes (a policy of family 'mini') as <folder_name>/v1.yaml."""
    return write_policy(tmp_path / "places", minimal_text(), f"{folder_name}/v1.yaml")


def _check_from(cwd, env_cache):
    env = dict(os.environ, HISPARSE_CACHE_DIR=str(env_cache), PYTHONPATH=ROOT)
    env.pop("HISPARSE_NO_CACHE", None)
    return subprocess.run([sys.executable, "-m", "engine.cli", "check", "--no-deep", "v1.yaml"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_folder_check_is_never_answered_from_another_directorys_entry(folder, tmp_path, monkeypatch):
    """v1.yaml of family 'mini' is refused in a folder named 'foo' (E312) and accepted in 'mini';
    loading it by the same name from either directory, in any order, gives each its own verdict,
    in one process (the memory cache) and across processes (the disk cache)."""
    good, bad = os.path.dirname(_placed(tmp_path, "mini")), os.path.dirname(_placed(tmp_path, "foo"))
    for order in ((good, bad, good, bad), (bad, good, bad)):
        for cwd in order:
            monkeypatch.chdir(cwd)
            if cwd == good:
                assert engine.load_policy("v1.yaml").family == "mini"
            else:
                with pytest.raises(engine.PolicyError) as info:
                    engine.load_policy("v1.yaml")
                assert info.value.problems[0].code == "E312"
    for cwd in (good, bad, good, bad):
        proc = _check_from(cwd, folder)
        assert proc.returncode == (0 if cwd == good else 2), proc.stdout + proc.stderr
        assert ("E312" in proc.stdout) == (cwd == bad)
    # a relative path through the folder counts as the folder: the same verdict as from inside it
    monkeypatch.chdir(os.path.dirname(bad))
    with pytest.raises(engine.PolicyError):
        engine.load_policy("foo/v1.yaml")


@pytest.mark.parametrize("shared", [False, True])
def test_a_fifo_planted_at_the_entry_path_never_hangs_a_run(folder, tmp_path, shared):
    """The entry's path is predictable (a hash of the bytes and the name): a FIFO there (ours,
    mode 0600, so every owner check holds) is refused from its open descriptor, never waited on;
    the policy is parsed from the file, and a shared cache folder gets the same."""
    path = _placed(tmp_path, "mini")
    data = open(path, "rb").read()
    cache_dir = tmp_path / "shared" if shared else folder
    if shared:
        cache_dir.mkdir(mode=0o755)
    env = dict(os.environ, HISPARSE_CACHE_DIR=str(cache_dir), PYTHONPATH=ROOT)
    probe = subprocess.run([sys.executable, "-c", "import sys; from engine.files import cache; "
                            "print(cache.entry_path(sys.argv[1], sys.argv[2]))", sha256(data).hexdigest(), path],
                           env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)
    entry = probe.stdout.strip()
    os.makedirs(os.path.dirname(entry), exist_ok=True)
    os.mkfifo(entry, 0o600)
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "evaluate", "--policy", path, "--format", "json"],
                          env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and '"family": "mini"' in proc.stdout, proc.stderr
    assert os.path.isfile(entry)  # written again as a regular file, renamed over the FIFO
