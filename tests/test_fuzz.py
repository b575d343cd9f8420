"""Fuzzing with hypothesis: random configs against every shipped policy, random mutations of the
shipped policy files, random bytes into the readers and --batch, random decode indices into the
bridge.

Budget: a short run by default (deterministic, a few seconds); HISPARSE_FUZZ_EXAMPLES=N gives
every property N examples (random, a new sample each run), HISPARSE_LONG=1 alone gives 2,000:

    HISPARSE_FUZZ_EXAMPLES=20000 python3 -m pytest tests/test_fuzz.py --hypothesis-show-statistics

The property that runs `hisparse check` in a fresh process gets a twentieth of the budget.
"""
from __future__ import annotations

import contextlib
import enum
import io
import json
import os
import re
import subprocess
import sys
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine
from engine.cli import batch, commands as cli
from engine.policy import loader
from engine.analysis.lint import lint
from engine.files.json_reader import parse_json
from engine.files.reading import ReadError, decode_utf8
from engine.files.yaml_reader import parse_yaml
from tests.helpers import ROOT, assert_bulk_equals_evaluate
from kernels_bridge import ValidationError, quantize_kv_fp8, reference, run_backend
from engine.analysis import domain

_ASKED = int(os.environ.get("HISPARSE_FUZZ_EXAMPLES") or 0)
LONG = _ASKED or (2000 if os.environ.get("HISPARSE_LONG") == "1" else 0)


def fuzz(ci_examples: int, share: int = 1):
    """Settings of one property: `ci_examples` by default, the long budget / `share` when set."""
    return settings(max_examples=max(1, LONG // share) if LONG else ci_examples, deadline=None,
                    database=None, derandomize=not LONG, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


SHIPPED = {f"dsa-backends@{v}": engine.load_policy(f"dsa-backends@{v}")
           for v in engine.list_families()["dsa-backends"]}
REFS = sorted(SHIPPED)
# the mutation fuzz, the slowest, runs in make test on the oldest and the two newest versions (the
# language's every construct among them), on every version in make test-whole
_BY_VERSION = sorted(REFS, key=lambda ref: SHIPPED[ref].version)
MUTATED = [ref if ref in (_BY_VERSION[0], *_BY_VERSION[-2:]) else pytest.param(ref, marks=pytest.mark.whole)
           for ref in REFS]


# -- random configs ---------------------------------------------------------------------------------
class Dtype(str, enum.Enum):  # what a server might pass: enum members standing for values
    FP8 = "fp8_e4m3"
    BF16 = "bfloat16"


class Arch(enum.IntEnum):
    HOPPER = 9
    BLACKWELL = 10


class Text(str):
    """A str subclass, as a StrEnum member or a framework's string type is."""


class Number(int):
    """An int subclass, as an IntEnum member is."""


JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2 ** 63 - 2, max_value=2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.binary(max_size=4),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from(["true", "false", "10", "9", "fp8", "FP8_E4M3", "bf16 ", "", "null", "\ud800",
                     Dtype.FP8, Dtype.BF16, Arch.HOPPER, Arch.BLACKWELL]),
)


def _spellings(policy) -> dict:
    out: dict = {}
    for key, name in policy.key_map.items():
        out.setdefault(name, []).append(key)
    return {name: sorted(keys) for name, keys in out.items()}


@st.composite
def configs(draw, policy):
    """A config for `policy`: mostly valid values under any accepted spelling, with wrong types,
    near-miss values, junk keys, and now and then something that is not a mapping at all."""
    if draw(st.integers(0, 40)) == 0:
        return draw(st.one_of(st.none(), st.lists(st.integers(), max_size=2), st.text(max_size=5)))
    valid_only = draw(st.booleans())
    cfg: dict = {}
    for name, keys in _spellings(policy).items():
        if not draw(st.booleans()):
            continue
        spec = policy.inputs[name]
        good = st.sampled_from(spec.domain())
        if spec.type == "int":
            good = st.one_of(good, st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1))
        if spec.type in ("enum", "int"):  # the same values as subclasses (enum members, numpy-free ints)
            sub = Text if spec.type == "enum" else Number
            good = st.one_of(good, st.sampled_from([v for v in spec.domain() if v is not None]).map(sub))
        value = draw(good if valid_only else st.one_of(good, good, JUNK))
        cfg[draw(st.sampled_from(keys))] = value
    if not valid_only and draw(st.integers(0, 5)) == 0:
        cfg[draw(st.one_of(st.text(max_size=15), st.integers(), st.none()))] = draw(JUNK)
    return cfg


def _outcome(call, config):
    """("ok", decision dict) or ("error", [problem dicts]); anything else propagates."""
    try:
        d = call(config)
    except engine.ConfigError as exc:
        return "error", [p.to_dict() for p in exc.problems]
    return "ok", d.to_dict()


@pytest.mark.parametrize("ref", REFS)
@fuzz(300)
@given(data=st.data())
def test_evaluate_raises_only_config_error_and_is_deterministic(ref, data):
    policy = SHIPPED[ref]
    config = data.draw(configs(policy))
    first = _outcome(policy.evaluate, config)
    assert _outcome(policy.evaluate, config) == first
    assert _outcome(lambda c: engine.evaluate(policy, c), config) == first


@pytest.mark.parametrize("ref", REFS)
@fuzz(300)
@given(data=st.data())
def test_traced_evaluation_equals_evaluate(ref, data):
    policy = SHIPPED[ref]
    config = data.draw(configs(policy))
    assert _outcome(policy.evaluate, config) == _outcome(lambda c: policy.trace(c)[0], config)


def _accepted_invariants(policy, d) -> None:
    """An accepted decision's backends are declared ones and pass every per-phase allowed table
    of every check that applies (checked here with the tables themselves, not the evaluator)."""
    backends = d.backends
    assert all(b is None or b in policy.backends for b in backends.values()), backends
    env = d.config
    user_set = {ph: d.sources[ph] == "user" for ph in policy.phases}
    checks = policy.stages["checks"]
    if not checks.when.eval(env, user_set):
        return
    for rule in checks.rules:
        if not rule.for_each_phase or rule.allowed is None:
            continue
        for ph, spec in policy.phases.items():
            scope = dict(env, phase=ph, backend=env[spec.input])
            if rule.when.eval(scope, user_set):
                assert scope["backend"] in rule.allowed.lookup(scope), (rule.name, ph, env)


@pytest.mark.parametrize("ref", REFS)
@fuzz(300)
@given(data=st.data())
def test_accepted_decisions_respect_declared_backends_and_allowed_tables(ref, data):
    policy = SHIPPED[ref]
    config = data.draw(configs(policy))
    try:
        d = policy.evaluate(config)
    except engine.ConfigError:
        return
    if d.ok:
        _accepted_invariants(policy, d)


# -- mutated policy files ---------------------------------------------------------------------------
TEXTS = {}
for _ref, _policy in SHIPPED.items():
    with open(_policy.path, "rb") as _fh:
        TEXTS[_ref] = _fh.read()
_KEY = re.compile(rb"^(\s*(?:- )?)([A-Za-z_][\w-]*)(:)", re.M)
_VALUE = re.compile(rb": ([^\s#{}\[\],][^\n#]*?)\s*$", re.M)
SNIPPETS = [b"!!python/object/apply:os.system [x]", b"&a ", b"*a", b"<<: {}", b"\t", b"{", b"}", b"[", b"]",
            b"'", b'"', b"{phase}", b"{nope}", b"9" * 30, b".nan", b"null", b"~", b"- ", b": ", b"\n  - x\n",
            b"{{", b"}}", b"\xff", b"\x00", b"\xef\xbb\xbf", b"\r\n", b"---\n", b"? ", b"#", b"0x10", b"1:30"]


@st.composite
def mutations(draw, original: bytes) -> bytes:
    data = original
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "delete", "duplicate", "rename", "swap", "truncate", "insert",
                                   "swap-lines"]))
        lines = data.split(b"\n")
        if op == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data = data[:i] + bytes([data[i] ^ (1 << draw(st.integers(0, 7)))]) + data[i + 1:]
        elif op == "delete" and len(lines) > 1:
            i = draw(st.integers(0, len(lines) - 1))
            data = b"\n".join(lines[:i] + lines[i + draw(st.integers(1, 3)):])
        elif op == "duplicate":
            i = draw(st.integers(0, len(lines) - 1))
            data = b"\n".join(lines[:i + 1] + lines[i:])
        elif op == "swap-lines" and len(lines) > 1:
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            data = b"\n".join(lines)
        elif op == "rename":
            keys = list(_KEY.finditer(data))
            if keys:
                m = draw(st.sampled_from(keys))
                names = sorted({k.group(2) for k in keys})
                new = draw(st.one_of(st.sampled_from(names), st.from_regex(rb"\A[a-z_]{1,12}\Z")))
                data = data[:m.start(2)] + new + data[m.end(2):]
        elif op == "swap":
            values = list(_VALUE.finditer(data))
            if len(values) > 1:
                a, b = sorted(draw(st.lists(st.sampled_from(values), min_size=2, max_size=2, unique_by=id)),
                              key=lambda m: m.start(1))
                if a.end(1) <= b.start(1):
                    data = (data[:a.start(1)] + b.group(1) + data[a.end(1):b.start(1)] + a.group(1)
                            + data[b.end(1):])
        elif op == "truncate" and data:
            data = data[:draw(st.integers(0, len(data) - 1))]
        elif op == "insert":
            i = draw(st.integers(0, len(data)))
            data = data[:i] + draw(st.sampled_from(SNIPPETS)) + data[i:]
    return data


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory):
    """A policy folder where mutated files sit at their real place (<family>/v<N>.yaml)."""
    root = tmp_path_factory.mktemp("fuzz-policies")
    (root / "dsa-backends").mkdir()
    return root


def _write_mutant(family_dir, ref, data) -> str:
    path = family_dir / "dsa-backends" / f"v{ref.split('@')[1]}.yaml"
    path.write_bytes(data)
    return str(path)


def _check_in_process(path: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["check", "--no-deep", path])
    return code, out.getvalue() + err.getvalue()


def _domain_config(policy, k: int) -> dict:
    """The k-th config of the policy's domain (the order of Policy.domain), without listing it."""
    config = {}
    for name in reversed(policy.input_names):
        values = policy.inputs[name].domain()
        k, i = divmod(k, len(values))
        config[name] = values[i]
    return {name: config[name] for name in policy.input_names}


@pytest.mark.parametrize("ref", MUTATED)
@fuzz(150)
@given(data=st.data())
def test_mutated_policies_load_or_fail_with_policy_error(ref, data, family_dir):
    mutant = data.draw(mutations(TEXTS[ref]))
    path = _write_mutant(family_dir, ref, mutant)
    try:
        policy = loader.load_file(path)
    except engine.PolicyError as exc:
        assert exc.problems and all(p.code in engine.CODES for p in exc.problems)
        code, text = _check_in_process(path)
        assert code == 2 and "internal error" not in text and "Traceback" not in text, text
        return
    code, text = _check_in_process(path)
    assert code == 0 and "internal error" not in text, text
    # a policy that loads decides alike in bulk and traced, on its domain and on random configs
    size = domain.config_count(policy)
    for k in data.draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=25)) if size else []:
        assert_bulk_equals_evaluate(policy, [_domain_config(policy, k)])
    for _ in range(5):
        config = data.draw(configs(policy))
        assert _outcome(policy.evaluate, config) == _outcome(lambda c: policy.trace(c)[0], config), config
    if domain.config_count(policy) <= 20_000:  # the deep lint too (the shipped v3 takes a second)
        problems, _ = lint(policy)
        assert all(p.code in engine.CODES for p in problems)


@fuzz(8, share=20)
@given(data=st.data())
def test_hisparse_check_on_a_mutant_never_shows_a_traceback(data, family_dir):
    ref = data.draw(st.sampled_from(REFS))
    path = _write_mutant(family_dir, ref, data.draw(mutations(TEXTS[ref])))
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "check", "--no-deep", path],
                          capture_output=True, cwd=ROOT, timeout=120)
    text = proc.stdout.decode("utf-8", "replace") + proc.stderr.decode("utf-8", "replace")
    assert proc.returncode in (0, 2) and "Traceback" not in text and "internal error" not in text, text


# -- readers and --batch ------------------------------------------------------------------------------
HOSTILE_BITS = st.sampled_from(["!!python/object/apply:os.system [id]", "&a x", "*a", "<<: {}", "\t", "[" * 80,
                                "{" * 80, "]", "}", "? [a]\n: b", "9" * 70, "1:" * 40 + "1", ".nan", "---\n",
                                "\x07", "\ufeff", "a: b: c", "'", '"', "\\ud800", '"\\ud800"', "NaN",
                                "1e999", "-", "|", ">", "%TAG ! tag:x\n"])
TEXT = st.lists(st.one_of(st.text(max_size=20), HOSTILE_BITS, st.sampled_from(["\n", " ", ": ", ", ", "- "])),
                max_size=25).map("".join)


@fuzz(400)
@given(text=TEXT, raw=st.binary(max_size=200))
def test_readers_raise_only_read_error(text, raw):
    for parse in (parse_yaml, parse_json):
        try:
            doc = parse(text, "fuzz")
        except ReadError as exc:
            assert exc.problems and all(p.code in engine.CODES for p in exc.problems)
        else:
            assert doc.data is None or isinstance(doc.data, (dict, list, str, int, float, bool))
    try:
        decode_utf8(raw, "fuzz")
    except ReadError as exc:
        assert exc.problems[0].code == "E103"


@fuzz(300)
@given(line=st.one_of(st.binary(max_size=120), TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")),
                      st.dictionaries(st.text(max_size=20), JUNK.filter(lambda v: not isinstance(v, bytes)),
                                      max_size=4).map(lambda d: repr(d).encode("utf-8", "surrogatepass"))),
       number=st.integers(1, 10 ** 6))
def test_a_batch_line_always_gets_one_answer(line, number):
    policy = SHIPPED[REFS[-1]]
    result, status, _, _ = batch.batch_line(policy, [], (), line, number)
    assert result["line"] == number and status in (0, 1, 2)
    assert ("error" in result) == (status == 2)
    json.dumps(result, ensure_ascii=False).encode("utf-8", "backslashreplace")


# -- the bridge: decode indices ----------------------------------------------------------------------
_CACHES: dict = {}


def _cache(num_blocks: int, block_size: int) -> torch.Tensor:
    key = (num_blocks, block_size)
    if key not in _CACHES:
        kv = torch.randn(num_blocks * block_size, 576, generator=torch.Generator().manual_seed(7))
        _CACHES[key] = quantize_kv_fp8(kv.to(torch.bfloat16)).view(num_blocks, block_size, 1, 656)
    return _CACHES[key]


@fuzz(300)
@given(b=st.integers(0, 3), s_q=st.integers(0, 2), topk=st.sampled_from([64, 128]),
       num_blocks=st.integers(1, 4), block_size=st.sampled_from([1, 2, 16, 64]), seed=st.integers(0, 2 ** 16),
       data=st.data())
def test_decode_indices_refused_out_of_range_and_accepted_in_range(b, s_q, topk, num_blocks, block_size,
                                                                   seed, data):
    rows = num_blocks * block_size
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, rows, (b, s_q, topk), generator=g, dtype=torch.int32)
    n = idx.numel()
    if n:  # plant values at the edges of the range, valid and not
        edges = st.one_of(st.sampled_from([-1, 0, rows - 1, rows, -2, 2 ** 31 - 1, -(2 ** 31)]),
                          st.integers(rows, 2 ** 31 - 1), st.integers(-(2 ** 31), -2), st.integers(-1, rows - 1))
        for pos, value in data.draw(st.lists(st.tuples(st.integers(0, n - 1), edges), max_size=4)):
            idx.view(-1)[pos] = value
    bad = (idx != -1) & ((idx < 0) | (idx >= rows))
    q = torch.randn(b, s_q, 64, 576, generator=g).to(torch.bfloat16)
    calls = []
    real = reference.decode_compute

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    with mock.patch.object(reference, "decode_compute", spy):
        if bool(bad.any()):
            with pytest.raises(ValidationError) as info:
                run_backend("flashmla_kv", q, _cache(num_blocks, block_size), idx, provider="reference")
            first = tuple(int(i) for i in bad.nonzero()[0])
            message = str(info.value)
            assert info.value.argument == "indices"
            assert f"{int(bad.sum())} of {n} entries" in message
            assert f"indices[{', '.join(map(str, first))}] = {int(idx[first])}" in message
            assert calls == []
        else:
            result = run_backend("flashmla_kv", q, _cache(num_blocks, block_size), idx, provider="reference")
            assert result.out.shape == (b, s_q, 64, 512)
            assert calls == ([1] if b and s_q else [])  # an empty batch runs no kernel
