"""The bridge's C helpers (kernels_bridge/native.py): the hot buffer's bookkeeping
(hot_buffer_lru.c) and FP8 unpacking (fp8_unpack.c) are what the CPU runs where they were built,
they agree with the tensor code bit for bit and state for state, and where they are missing or
switched off the bridge falls back and `doctor` says why."""
from __future__ import annotations

import importlib.machinery
import random

import pytest
import torch

from kernels_bridge import native
from kernels_bridge.doctor import doctor_report, render_doctor
from kernels_bridge.hot_buffer import HotBuffer
from tests.native_path import require_c, tensor_path


def _pool(R, S, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (R, S, 656), dtype=torch.uint8, generator=g)


@pytest.fixture
def fresh_loader(monkeypatch):
    """native.py forgets what it loaded, so that the next call looks again."""
    monkeypatch.setattr(native, "_loaded", None)
    monkeypatch.setattr(native, "_reason", "")
    return monkeypatch


def test_cpu_buffers_use_the_c_bookkeeping_where_built():
    require_c()
    assert native.reason() == ""
    assert HotBuffer(_pool(2, 300), 64)._native is not None
    with tensor_path():
        assert HotBuffer(_pool(2, 300), 64)._native is None


def _stream(rng, R, S, B, K, steps):
    """(call, args) per step: translates of random subsets with ~30 % fresh positions, repeats,
    padding and an empty top-k row, seq_lens that grow, roll back, and cross buffer_size, with a
    free() now and then."""
    lens = [rng.randrange(B - 20, S - 60) if r % 3 != 2 else rng.randrange(1, B)
            for r in range(R)]
    prev = [[] for _ in range(R)]
    for step in range(steps):
        if step % 9 == 8:
            yield "free", (rng.randrange(R),)
            continue
        ids = sorted(rng.sample(range(R), rng.randint(1, R)))
        rows = []
        for r in ids:
            lens[r] = max(1, min(S, lens[r] + rng.choice([1, 1, 1, 2, -3, -40])))
            L = lens[r]
            keep = [p for p in prev[r] if 0 <= p < L][: int(0.7 * K)]
            row = keep + [rng.randrange(L) for _ in range(K - len(keep))]
            row += rng.sample(row, min(3, len(row)))[: K - len(row)]  # repeats
            rng.shuffle(row)
            row = row[:K]
            if rng.random() < 0.3:
                row[rng.randrange(K)] = L - 1  # the newest token asked for
            if rng.random() < 0.2:
                row = row[: K // 2] + [-1] * (K - K // 2)  # padding
            rows.append(row)
            prev[r] = row
        yield "translate", (ids, [lens[r] for r in ids], rows)


@pytest.mark.parametrize("B,K,S", [(128, 96, 900), (2**15, 64, 2**15 + 400)])
def test_c_and_tensor_bookkeeping_agree_state_for_state(B, K, S):
    """Outputs, copies (in order), statistics, every slot, every LRU order and the bytes, after
    every step, for the int16 map and (buffer_size >= 2**15) the int32 one."""
    require_c()
    R = 5 if B < 2**15 else 3
    pool = _pool(R, S, seed=B)
    c_buf = HotBuffer(pool, B)
    with tensor_path():
        t_buf = HotBuffer(pool, B)
    assert c_buf._native is not None and t_buf._native is None
    copies = {}
    for name, hb in (("C", c_buf), ("tensors", t_buf)):
        real = hb._copy_rows

        def record(src, dst, real=real, name=name):
            copies[name] = (src.clone(), dst.clone())
            real(src, dst)
        hb._copy_rows = record
    rng = random.Random(B)
    long_steps = 0
    for call, args in _stream(rng, R, S, B, K, steps=40):
        if call == "free":
            c_buf.free(*args)
            t_buf.free(*args)
            continue
        ids, lens, rows = (torch.tensor(a) for a in args)
        copies.clear()
        a, b = c_buf.translate(ids, lens, rows), t_buf.translate(ids, lens, rows)
        assert torch.equal(a, b)
        assert copies.keys() == {"C", "tensors"} or not copies
        if copies:
            assert all(torch.equal(x, y) for x, y in zip(copies["C"], copies["tensors"]))
        assert c_buf.stats == t_buf.stats
        long_steps += bool((lens > B).any())
        for r in range(R):
            assert torch.equal(c_buf.slot_positions(r), t_buf.slot_positions(r))
            assert torch.equal(c_buf.lru_order(r), t_buf.lru_order(r))
        assert torch.equal(c_buf._pos_slot, t_buf._pos_slot)
    assert torch.equal(c_buf.buffer, t_buf.buffer)
    assert long_steps >= 10 and c_buf.stats.misses > 0 and c_buf.stats.hits > 0


def test_switched_off_by_the_environment(fresh_loader):
    fresh_loader.setenv("HISPARSE_NO_NATIVE", "1")
    assert native.translate_long() is None
    assert native.reason() == "switched off by HISPARSE_NO_NATIVE"
    hb = HotBuffer(_pool(1, 200), 64)
    assert hb._native is None
    out = hb.translate(torch.tensor([0]), torch.tensor([150]), torch.tensor([[5, 149, -1, 5]]))
    assert out.tolist() == [[0, 64, -1, 0]]  # the tensor code: first miss, newest, padding, repeat


def test_not_built(fresh_loader):
    fresh_loader.setattr(native.importlib.util, "find_spec", lambda name: None)
    assert native.translate_long() is None
    assert native.reason() == "not built (no C compiler or Python headers when the package was installed)"
    report = doctor_report()
    assert report["c_helpers"] == {"loaded": False, "reason": native.reason()}
    assert ("C helpers  not loaded, the tensor code runs (slower on the CPU): not built (no C compiler "
            "or Python headers when the package was installed)") in render_doctor(report)


def test_a_file_that_does_not_load_is_named(fresh_loader, tmp_path):
    bad = tmp_path / "_native.so"
    bad.write_bytes(b"not a shared library")
    spec = importlib.machinery.ModuleSpec(native.MODULE, None, origin=str(bad))
    fresh_loader.setattr(native.importlib.util, "find_spec", lambda name: spec)
    assert native.translate_long() is None
    assert native.reason().startswith(f"{bad} did not load: ")
    assert HotBuffer(_pool(1, 100), 64)._native is None


def test_doctor_names_the_c_helpers():
    require_c()
    report = doctor_report()
    assert report["c_helpers"] == {"loaded": True, "reason": None}
    assert "  C helpers  loaded: the hot buffer's CPU bookkeeping and FP8 unpacking run in C\n" in render_doctor(report)


@pytest.mark.parametrize("ids,lens,pos,words", [
    ([0, 0], [150, 150], [[1, 2], [3, 4]], "request 0 appears more than once"),
    ([1, 3], [150, 150], [[1, 2], [3, 4]], "req_ids: element 1 is 3"),
    ([0, 1], [150, 0], [[1, 2], [3, 4]], r"seq_lens: element 1 \(request 1\) is 0"),
    ([0, 1], [150, 150], [[1, 2], [3, 150]], r"positions: \[1, 1\] \(request 1\) is 150"),
    ([0, 1], [150, 150], [[1, -2], [3, 4]], r"positions: \[0, 1\] \(request 0\) is -2"),
])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_the_c_check_refuses_what_the_tensor_check_names(ids, lens, pos, words, dtype):
    """The C check finds the fault, the tensor code names it; nothing changes, and the next call
    (the same requests, valid) goes through: the check's marks are left clear."""
    require_c()
    hb = HotBuffer(_pool(3, 200), 64)
    assert hb._check is not None
    ok = (torch.tensor([0, 1]), torch.tensor([150, 150]), torch.tensor([[1, 2], [3, 4]], dtype=dtype))
    before = hb.translate(*ok)
    with pytest.raises(ValueError, match=words):
        hb.translate(torch.tensor(ids), torch.tensor(lens), torch.tensor(pos, dtype=dtype))
    assert int(hb._seen.sum()) == 0
    assert torch.equal(hb.translate(*ok), before) and hb.stats.steps == 2


def _fp8_rows(n, exponents, seed=0):
    """uint8 [n, 656] rows, 44 bytes apart in their storage (a strided view, as of a cache):
    every non-NaN code byte in turn, scales +-2**e from `exponents`, random bf16 RoPE dims."""
    g = torch.Generator().manual_seed(seed)
    holder = torch.randint(0, 256, (n, 700), dtype=torch.uint8, generator=g)
    rows = holder[:, :656]
    usable = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    rows[:, :512] = usable.repeat(n * 512 // len(usable) + 1)[: n * 512].view(n, 512)
    e = torch.tensor(exponents, dtype=torch.float32)[torch.randint(0, len(exponents), (n, 4), generator=g)]
    sign = torch.where(torch.rand(n, 4, generator=g) < 0.5, -1.0, 1.0)
    rows[:, 512:528] = (sign * torch.pow(2.0, e)).contiguous().view(torch.uint8).view(n, 16)
    rows[:, 528:] = torch.randn(n, 64, generator=g).to(torch.bfloat16).view(torch.uint8).view(n, 128)
    return rows


@pytest.mark.parametrize("f32", [False, True])
def test_c_unpacking_takes_every_row_the_exponent_path_takes(f32):
    """Scales 2**-126 .. 2**7 of either sign, every non-NaN code: C writes every row, with the
    tensor code's bits (bf16 and float32)."""
    from kernels_bridge.fp8 import dequantize_kv_fp8, dequantize_kv_fp8_f32

    require_c()
    rows = _fp8_rows(300, [-126, -125, -13, -1, 0, 1, 7])
    out = torch.empty(300, 576, dtype=torch.float32 if f32 else torch.bfloat16)
    assert native.unpack_fp8()(300, rows.data_ptr(), rows.stride(0), out.data_ptr(), int(f32)) == 300
    with tensor_path():
        want = dequantize_kv_fp8_f32(rows) if f32 else dequantize_kv_fp8(rows)
    bits = torch.int32 if f32 else torch.int16
    assert torch.equal(out.view(bits), want.view(bits))


@pytest.mark.parametrize("row,bad", [("codes", 0x7F), ("codes", 0xFF), ("scale", 3.0), ("scale", 2.0 ** 8),
                                     ("scale", 2.0 ** -127), ("scale", 0.0)])
def test_c_unpacking_stops_at_the_first_row_it_cannot_take(row, bad):
    """A NaN code or a scale off the exponent path (not a power of two, past 2**7, subnormal,
    zero) stops C at that row; dequantize_kv_fp8 gives the tensor code's bits all the same."""
    from kernels_bridge.fp8 import dequantize_kv_fp8

    require_c()
    rows = _fp8_rows(40, [-3, 0, 2], seed=1)
    if row == "codes":
        rows[17, 300] = bad
    else:
        rows[17, 516:520] = torch.tensor([bad], dtype=torch.float32).view(torch.uint8)
    out = torch.empty(40, 576, dtype=torch.bfloat16)
    assert native.unpack_fp8()(40, rows.data_ptr(), rows.stride(0), out.data_ptr(), 0) == 17
    got = dequantize_kv_fp8(rows)
    with tensor_path():
        want = dequantize_kv_fp8(rows)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
