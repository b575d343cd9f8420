"""Every validation rule fires before any computation, naming the argument, shape and dtype."""
import math

import pytest
import torch

from kernels_bridge import ValidationError, attend, quantize_kv_fp8, reference, run_backend
from kernels_bridge import sparse_decode_fp8, sparse_prefill
from kernels_bridge.validate import check_decode, check_prefill

BF16, I32 = torch.bfloat16, torch.int32


@pytest.fixture(autouse=True)
def no_compute(monkeypatch):
    """Any attention computation fails the test: validation must stop bad calls first."""
    def refuse(*args, **kwargs):
        raise AssertionError("computed before validating")
    monkeypatch.setattr(reference, "_sparse_attention", refuse)


def misaligned(shape, dtype, offset_elems=1):
    """A tensor of `shape` whose base address is offset_elems elements past an aligned one."""
    numel = math.prod(shape)
    return torch.zeros(numel + offset_elems, dtype=dtype)[offset_elems:].view(shape)


def prefill_args(s_q=2, h_q=64, s_kv=300, topk=128):
    gen = torch.Generator().manual_seed(0)
    return dict(
        q=torch.randn(s_q, h_q, 576, generator=gen).to(BF16),
        kv=torch.randn(s_kv, 1, 576, generator=gen).to(BF16),
        indices=torch.randint(-1, s_kv, (s_q, 1, topk), generator=gen).to(I32),
        sm_scale=0.1, d_v=512, attn_sink=None, topk_length=None)


def decode_args(b=2, s_q=1, h_q=64, nb=4, bs=64, topk=64):
    gen = torch.Generator().manual_seed(1)
    kv = torch.randn(nb * bs, 576, generator=gen).to(BF16)
    return dict(
        q=torch.randn(b, s_q, h_q, 576, generator=gen).to(BF16),
        k_cache=quantize_kv_fp8(kv).view(nb, bs, 1, 656),
        indices=torch.randint(-1, nb * bs, (b, s_q, topk), generator=gen).to(I32),
        softmax_scale=None, attn_sink=None)


def strided_last(shape, dtype):
    return torch.zeros(*shape[:-1], shape[-1] * 2, dtype=dtype)[..., ::2]


# (case id, field, replacement builder, argument named, fragments the message must hold)
PREFILL_CASES = [
    ("q-dtype", "q", lambda a: a["q"].float(), "q", ["dtype torch.float32", "(2, 64, 576)"]),
    ("q-rank", "q", lambda a: a["q"][0], "q", ["shape (64, 576)"]),
    ("q-dim", "q", lambda a: a["q"][..., :512], "q", ["shape (2, 64, 512)", "576"]),
    ("q-heads", "q", lambda a: a["q"][:, :32], "q", ["shape (2, 32, 576)", "(64, 128)"]),
    ("q-last-dim", "q", lambda a: strided_last((2, 64, 576), BF16), "q", ["stride(-1)"]),
    ("q-aligned", "q", lambda a: misaligned((2, 64, 576), BF16), "q", ["aligned to 16"]),
    ("kv-stride-int32", "kv", lambda a: a["kv"].as_strided((300, 1, 576), (576, 2 ** 31, 1)),
     "kv", ["2**31"]),
    ("kv-dtype", "kv", lambda a: a["kv"].half(), "kv", ["dtype torch.float16"]),
    ("kv-rank", "kv", lambda a: a["kv"][:, 0], "kv", ["shape (300, 576)"]),
    ("kv-heads", "kv", lambda a: a["kv"].expand(300, 2, 576), "kv", ["shape (300, 2, 576)"]),
    ("kv-dim", "kv", lambda a: a["kv"][..., :575], "kv", ["shape (300, 1, 575)"]),
    ("kv-empty", "kv", lambda a: a["kv"][:0], "kv", ["shape (0, 1, 576)", "s_kv >= 1"]),
    ("kv-fp8", "kv", lambda a: torch.zeros(300, 1, 656, dtype=torch.uint8), "kv",
     ["dtype torch.uint8"]),
    ("kv-device", "kv", lambda a: a["kv"].to("meta"), "kv", ["device meta", "q's device"]),
    ("kv-aligned", "kv", lambda a: misaligned((300, 1, 576), BF16, 3), "kv",
     ["aligned to 16"]),
    ("idx-dtype", "indices", lambda a: a["indices"].long(), "indices", ["dtype torch.int64"]),
    ("idx-uint", "indices", lambda a: a["indices"].to(torch.int16), "indices",
     ["dtype torch.int16"]),
    ("idx-rank", "indices", lambda a: a["indices"][:, 0], "indices", ["shape (2, 128)"]),
    ("idx-s_q", "indices", lambda a: a["indices"][:1], "indices", ["shape (1, 1, 128)", "s_q=2"]),
    ("idx-hkv", "indices", lambda a: a["indices"].expand(2, 2, 128), "indices",
     ["shape (2, 2, 128)"]),
    ("idx-topk-64", "indices", lambda a: a["indices"][..., :64], "indices",
     ["shape (2, 1, 64)", "multiple of 128"]),
    ("idx-topk-0", "indices", lambda a: a["indices"][..., :0], "indices", ["shape (2, 1, 0)"]),
    ("idx-last-dim", "indices", lambda a: strided_last((2, 1, 128), I32), "indices",
     ["stride(-1)"]),
    ("idx-outer-stride", "indices", lambda a: torch.zeros(2, 1, 130, dtype=I32)[..., :128],
     "indices", ["multiples of 8"]),
    ("idx-device", "indices", lambda a: a["indices"].to("meta"), "indices", ["device meta"]),
    ("scale-none", "sm_scale", lambda a: None, "sm_scale", ["None"]),
    ("scale-nan", "sm_scale", lambda a: math.nan, "sm_scale", ["finite", "nan"]),
    ("scale-inf", "sm_scale", lambda a: math.inf, "sm_scale", ["inf"]),
    ("scale-str", "sm_scale", lambda a: "0.1", "sm_scale", ["a str"]),
    ("scale-bool", "sm_scale", lambda a: True, "sm_scale", ["a bool"]),
    ("scale-tensor", "sm_scale", lambda a: torch.tensor(0.1), "sm_scale", ["shape ()"]),
    ("d_v", "d_v", lambda a: 576, "d_v", ["512", "576"]),
    ("sink-dtype", "attn_sink", lambda a: torch.zeros(64, dtype=BF16), "attn_sink",
     ["dtype torch.bfloat16", "float32"]),
    ("sink-shape", "attn_sink", lambda a: torch.zeros(128), "attn_sink",
     ["shape (128,)", "h_q=64"]),
    ("sink-nan", "attn_sink", lambda a: torch.full((64,), math.nan), "attn_sink", ["NaN"]),
    ("sink-strided", "attn_sink", lambda a: torch.zeros(128)[::2], "attn_sink", ["contiguous"]),
    ("sink-device", "attn_sink", lambda a: torch.zeros(64, device="meta"), "attn_sink",
     ["device meta"]),
    ("len-dtype", "topk_length", lambda a: torch.zeros(2, dtype=torch.int64), "topk_length",
     ["dtype torch.int64"]),
    ("len-shape", "topk_length", lambda a: torch.zeros(3, dtype=I32), "topk_length",
     ["shape (3,)"]),
    ("len-neg", "topk_length", lambda a: torch.tensor([-1, 5], dtype=I32), "topk_length",
     ["min -1"]),
    ("len-big", "topk_length", lambda a: torch.tensor([129, 5], dtype=I32), "topk_length",
     ["max 129", "topk=128"]),
    ("len-strided", "topk_length", lambda a: torch.zeros(4, dtype=I32)[::2], "topk_length",
     ["contiguous"]),
]


@pytest.mark.parametrize("case", PREFILL_CASES, ids=[c[0] for c in PREFILL_CASES])
@pytest.mark.parametrize("entry", ["reference", "run_backend"])
def test_prefill_rules_fire_before_compute(case, entry):
    _, field, build, argument, fragments = case
    args = prefill_args()
    args[field] = build(args)
    with pytest.raises(ValidationError) as info:
        if entry == "reference":
            sparse_prefill(**args)
        else:
            run_backend("flashmla_sparse", args["q"], args["kv"], args["indices"],
                        sm_scale=args["sm_scale"], attn_sink=args["attn_sink"],
                        topk_length=args["topk_length"], d_v=args["d_v"], provider="reference")
    assert info.value.argument == argument
    message = str(info.value)
    assert message.startswith(f"{argument}: ")
    for fragment in fragments:
        assert fragment in message, message
    if isinstance(args[field], torch.Tensor):
        assert "shape (" in message and "dtype torch." in message and "device " in message


DECODE_CASES = [
    ("q-dtype", "q", lambda a: a["q"].half(), "q", ["dtype torch.float16", "(2, 1, 64, 576)"]),
    ("q-rank", "q", lambda a: a["q"][:, 0], "q", ["shape (2, 64, 576)"]),
    ("q-heads", "q", lambda a: torch.zeros(2, 1, 16, 576, dtype=BF16), "q",
     ["shape (2, 1, 16, 576)"]),
    ("q-dim", "q", lambda a: a["q"][..., :512], "q", ["shape (2, 1, 64, 512)"]),
    ("q-last-dim", "q", lambda a: strided_last((2, 1, 64, 576), BF16), "q", ["stride(-1)"]),
    ("q-aligned", "q", lambda a: misaligned((2, 1, 64, 576), BF16), "q", ["aligned"]),
    ("cache-bf16", "k_cache", lambda a: torch.zeros(4, 64, 1, 576, dtype=BF16), "k_cache",
     ["dtype torch.bfloat16", "656"]),
    ("cache-f16", "k_cache", lambda a: torch.zeros(4, 64, 1, 328, dtype=torch.float16),
     "k_cache", ["dtype torch.float16"]),
    ("cache-rank", "k_cache", lambda a: a["k_cache"][:, :, 0], "k_cache",
     ["shape (4, 64, 656)"]),
    ("cache-row", "k_cache", lambda a: a["k_cache"][..., :655], "k_cache",
     ["shape (4, 64, 1, 655)"]),
    ("cache-heads", "k_cache", lambda a: a["k_cache"].expand(4, 64, 2, 656), "k_cache",
     ["shape (4, 64, 2, 656)"]),
    ("cache-empty", "k_cache", lambda a: a["k_cache"][:0], "k_cache", ["shape (0, 64, 1, 656)"]),
    ("cache-block-rows", "k_cache",
     lambda a: torch.zeros(4, 64, 1, 672, dtype=torch.uint8)[..., :656], "k_cache",
     ["stride(1) == 656"]),
    ("cache-block-stride", "k_cache",
     lambda a: torch.zeros(4 * 64 * 656 + 8, dtype=torch.uint8).as_strided(
         (4, 64, 1, 656), (64 * 656 + 1, 656, 656, 1)), "k_cache", ["multiple of 656 bytes"]),
    # padded by 16 bytes: aligned, but not a whole row, which SM100's TMA map needs
    ("cache-block-stride-16", "k_cache",
     lambda a: torch.zeros(4 * (64 * 656 + 16), dtype=torch.uint8).as_strided(
         (4, 64, 1, 656), (64 * 656 + 16, 656, 656, 1)), "k_cache", ["multiple of 656 bytes"]),
    # blocks of one row with padded rows: FlashMLA checks stride(1) whatever the block size
    ("cache-one-row-blocks", "k_cache",
     lambda a: torch.zeros(256, 1, 1, 672, dtype=torch.uint8)[..., :656], "k_cache",
     ["stride(1) == 656, for every block size"]),
    ("cache-aligned", "k_cache", lambda a: misaligned((4, 64, 1, 656), torch.uint8, 5),
     "k_cache", ["aligned"]),
    ("cache-device", "k_cache", lambda a: a["k_cache"].to("meta"), "k_cache", ["device meta"]),
    ("idx-dtype", "indices", lambda a: a["indices"].long(), "indices", ["dtype torch.int64"]),
    ("idx-rank", "indices", lambda a: a["indices"][:, 0], "indices", ["shape (2, 64)"]),
    ("idx-b", "indices", lambda a: a["indices"][:1], "indices", ["shape (1, 1, 64)", "b=2"]),
    ("idx-s_q", "indices", lambda a: a["indices"].expand(2, 3, 64), "indices",
     ["shape (2, 3, 64)", "s_q=1"]),
    ("idx-topk-32", "indices", lambda a: a["indices"][..., :32], "indices",
     ["shape (2, 1, 32)", "multiple of 64"]),
    ("idx-topk-0", "indices", lambda a: a["indices"][..., :0], "indices", ["shape (2, 1, 0)"]),
    ("idx-outer-stride", "indices", lambda a: torch.full((2, 1, 66), -1, dtype=I32)[..., :64],
     "indices", ["multiples of 8"]),
    ("idx-device", "indices", lambda a: a["indices"].to("meta"), "indices", ["device meta"]),
    ("scale-nan", "softmax_scale", lambda a: math.nan, "softmax_scale", ["nan"]),
    ("scale-bool", "softmax_scale", lambda a: False, "softmax_scale", ["a bool"]),
    ("sink-shape", "attn_sink", lambda a: torch.zeros(128), "attn_sink", ["shape (128,)"]),
    ("sink-dtype", "attn_sink", lambda a: torch.zeros(64, dtype=torch.float64), "attn_sink",
     ["dtype torch.float64"]),
]


@pytest.mark.parametrize("case", DECODE_CASES, ids=[c[0] for c in DECODE_CASES])
@pytest.mark.parametrize("entry", ["reference", "run_backend"])
def test_decode_rules_fire_before_compute(case, entry):
    _, field, build, argument, fragments = case
    args = decode_args()
    args[field] = build(args)
    with pytest.raises(ValidationError) as info:
        if entry == "reference":
            sparse_decode_fp8(**args)
        else:
            run_backend("flashmla_kv", args["q"], args["k_cache"], args["indices"],
                        softmax_scale=args["softmax_scale"], attn_sink=args["attn_sink"],
                        provider="reference")
    assert info.value.argument == argument
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    if isinstance(args[field], torch.Tensor):
        assert "shape (" in message and "dtype torch." in message and "device " in message


@pytest.mark.parametrize("bad", [256, -2, -1000, 2 ** 31 - 1, -2 ** 31])
def test_decode_index_out_of_range_is_named(bad):
    args = decode_args()
    idx = args["indices"].clone()
    idx[1, 0, 17] = bad
    idx[1, 0, 40] = bad
    args["indices"] = idx
    with pytest.raises(ValidationError) as info:
        sparse_decode_fp8(**args)
    message = str(info.value)
    assert info.value.argument == "indices"
    assert "2 of 128 entries" in message
    assert f"indices[1, 0, 17] = {bad}" in message
    assert "valid rows are 0..255" in message and "-1" in message
    assert "shape (2, 1, 64)" in message and "dtype torch.int32" in message


def test_prefill_accepts_every_index_value():
    args = prefill_args()
    args["indices"][0, 0, :4] = torch.tensor([-2 ** 31, 2 ** 31 - 1, -5, 300], dtype=I32)
    shape = check_prefill(**args)
    assert (shape.s_q, shape.h_q, shape.s_kv, shape.topk) == (2, 64, 300, 128)


def test_check_finite_is_opt_in():
    args = prefill_args()
    args["q"][1, 3, 7] = math.nan
    check_prefill(**args)                       # not looked for by default
    with pytest.raises(ValidationError) as info:
        check_prefill(**args, check_finite=True)
    assert "q[1, 3, 7] = nan" in str(info.value) and info.value.argument == "q"
    dargs = decode_args()
    dargs["q"][0, 0, 2, 5] = math.inf
    with pytest.raises(ValidationError, match=r"q\[0, 0, 2, 5\] = inf"):
        run_backend("flashmla_kv", dargs["q"], dargs["k_cache"], dargs["indices"],
                    check_finite=True)


def test_attn_sink_infinities_are_allowed():
    args = prefill_args()
    args["attn_sink"] = torch.tensor([math.inf, -math.inf] * 32)
    check_prefill(**args)


def test_empty_batches_are_valid_topk_zero_is_not():
    args = decode_args(b=0)
    shape = check_decode(**args)
    assert shape.empty and shape.rows == 256
    args = decode_args(s_q=0)
    assert check_decode(**args).empty
    args = prefill_args(s_q=0)
    assert check_prefill(**args).empty
    with pytest.raises(ValidationError, match="positive multiple of 64"):
        check_decode(**decode_args(topk=0))


@pytest.mark.parametrize("backend,kwargs,argument,fragment", [
    ("flashmla_sparse", {}, "sm_scale", "requires sm_scale"),
    ("flashmla_sparse", {"sm_scale": 0.1, "softmax_scale": 0.1}, "softmax_scale", "sm_scale"),
    ("flashmla_kv", {"sm_scale": 0.1}, "sm_scale", "softmax_scale"),
    ("flashmla_kv", {"topk_length": torch.zeros(2, dtype=I32)}, "topk_length", "-1"),
    ("flashmla_kv", {"d_v": 256}, "d_v", "512"),
])
def test_backend_argument_rules(backend, kwargs, argument, fragment):
    args = prefill_args() if backend == "flashmla_sparse" else decode_args()
    cache = args["kv"] if backend == "flashmla_sparse" else args["k_cache"]
    with pytest.raises(ValidationError) as info:
        run_backend(backend, args["q"], cache, args["indices"], **kwargs)
    assert info.value.argument == argument and fragment in str(info.value)


@pytest.mark.parametrize("name,hint", [
    ("flashmla_sprase", "did you mean 'flashmla_sparse'"),
    ("flashmla-kv", "did you mean 'flashmla_kv'"),
    ("fa3", "'flashmla_sparse', 'flashmla_kv'"),
    (None, "'flashmla_sparse', 'flashmla_kv'"),
])
def test_unknown_backend_lists_backends(name, hint):
    args = decode_args()
    with pytest.raises(ValidationError) as info:
        run_backend(name, args["q"], args["k_cache"], args["indices"])
    assert info.value.argument == "backend" and hint in str(info.value)


def test_unknown_provider_suggests():
    args = decode_args()
    with pytest.raises(ValidationError, match="did you mean 'flashmla'"):
        run_backend("flashmla_kv", args["q"], args["k_cache"], args["indices"],
                    provider="flashmal")


# -- through every entry, and combined -----------------------------------------------------------
HISPARSE_FP8 = {"enable_hisparse": True, "disable_radix_cache": True}


def _entries(kind):
    """Callables running a decode (or prefill) call through each public entry."""
    if kind == "decode":
        return {
            "reference": lambda a: sparse_decode_fp8(**a),
            "run_backend": lambda a: run_backend("flashmla_kv", a["q"], a["k_cache"], a["indices"],
                                                 softmax_scale=a["softmax_scale"], attn_sink=a["attn_sink"]),
            "attend": lambda a: attend(HISPARSE_FP8, a["q"], a["k_cache"], a["indices"],
                                       policy="dsa-backends@2", softmax_scale=a["softmax_scale"],
                                       attn_sink=a["attn_sink"]),
        }
    return {
        "reference": lambda a: sparse_prefill(**a),
        "run_backend": lambda a: run_backend("flashmla_sparse", a["q"], a["kv"], a["indices"],
                                             sm_scale=a["sm_scale"], attn_sink=a["attn_sink"],
                                             topk_length=a["topk_length"]),
        "attend": lambda a: attend(dict(HISPARSE_FP8, kv_cache_dtype="bfloat16"), a["q"], a["kv"],
                                   a["indices"], phase="prefill", policy="dsa-backends@2",
                                   sm_scale=a["sm_scale"], attn_sink=a["attn_sink"],
                                   topk_length=a["topk_length"]),
    }


def _meta(args):
    return {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _set(args, **changes):
    out = dict(args)
    out.update(changes)
    return out


def _oob(args, value=10_000):
    idx = args["indices"].clone()
    idx.view(-1)[5] = value
    return idx


def _shrunk(t, nbytes=0):
    """t's values in a storage shrunk to nbytes afterwards (0: freed): torch keeps the shape."""
    t = t.clone()
    t.untyped_storage().resize_(nbytes)
    return t


def _nested(t):
    return torch.nested.nested_tensor([t[0], t[0, ..., :3, :]])


# (case, kind, build(args) -> args, argument named, fragment)
ENTRY_CASES = [
    ("freed-k_cache", "decode", lambda a: _set(a, k_cache=_shrunk(a["k_cache"])), "k_cache", "storage was freed"),
    ("short-k_cache", "decode", lambda a: _set(a, k_cache=_shrunk(a["k_cache"], 4096)), "k_cache",
     "of a storage of 4096"),
    ("freed-indices", "decode", lambda a: _set(a, indices=_shrunk(a["indices"])), "indices", "storage was freed"),
    ("short-kv", "prefill", lambda a: _set(a, kv=_shrunk(a["kv"], 1000)), "kv", "of a storage of 1000"),
    ("nested-q", "prefill", lambda a: _set(a, q=_nested(a["q"])), "q", "nested"),
    ("all-meta", "decode", _meta, "q", "meta tensor has no values"),
    ("all-meta", "prefill", _meta, "q", "meta tensor has no values"),
    ("sparse-q", "decode", lambda a: _set(a, q=a["q"].to_sparse()), "q", "layout torch.sparse_coo"),
    ("sparse-indices", "prefill", lambda a: _set(a, indices=a["indices"].to_sparse()), "indices",
     "layout torch.sparse_coo"),
    ("index-out-of-range", "decode", lambda a: _set(a, indices=_oob(a)), "indices", "= 10000"),
    ("index-minus-2", "decode", lambda a: _set(a, indices=_oob(a, -2)), "indices", "= -2"),
    ("topk-0", "decode", lambda a: _set(a, indices=a["indices"][..., :0]), "indices", "shape (2, 1, 0)"),
    ("topk-0", "prefill", lambda a: _set(a, indices=a["indices"][..., :0]), "indices", "shape (2, 1, 0)"),
    ("q-not-a-tensor", "decode", lambda a: _set(a, q=a["q"].tolist()), "q", "a list"),
    # several bad arguments: the first in the documented order is named, nothing computes
    ("q-dtype+index", "decode", lambda a: _set(a, q=a["q"].half(), indices=_oob(a)), "q", "torch.float16"),
    ("index-device+range", "decode", lambda a: _set(a, indices=_oob(a).to("meta")), "indices", "device meta"),
    ("sink-nan+index", "decode", lambda a: _set(a, attn_sink=torch.full((64,), math.nan), indices=_oob(a)),
     "attn_sink", "NaN"),
    ("index-strides+range", "decode",
     lambda a: _set(a, indices=torch.full((2, 1, 66), 99_999, dtype=I32)[..., :64]), "indices", "multiples of 8"),
    ("kv-meta+q-dtype", "prefill", lambda a: _set(a, kv=a["kv"].to("meta"), q=a["q"].float()), "q", "float32"),
    ("len-range+sink-shape", "prefill",
     lambda a: _set(a, topk_length=torch.tensor([500, 1], dtype=I32), attn_sink=torch.zeros(3)), "attn_sink",
     "shape (3,)"),
]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("case", ENTRY_CASES, ids=[f"{c[1]}-{c[0]}" for c in ENTRY_CASES])
@pytest.mark.parametrize("entry", ["reference", "run_backend", "attend"])
def test_every_entry_refuses_before_any_work(case, entry, monkeypatch):
    _, kind, build, argument, fragment = case
    for name in ("decode_compute", "prefill_compute"):
        monkeypatch.setattr(reference, name, lambda *a, **k: pytest.fail("a kernel ran"))
    args = build(decode_args() if kind == "decode" else prefill_args())
    call = _entries(kind)[entry]
    with pytest.raises(ValidationError) as info:
        call(args)
    assert info.value.argument == argument, str(info.value)
    assert str(info.value).startswith(f"{argument}: ") and fragment in str(info.value), str(info.value)


@pytest.mark.parametrize("config, code", [
    ({"kv_cache_dtyp": "fp8_e4m3"}, "C501"),
    ({"enable_hisparse": "true"}, "C503"),
    ({"kv_cache_dtype": "fp9"}, "C502"),
    (["enable_hisparse"], "C504"),
])
def test_attend_names_a_bad_config(config, code):
    args = decode_args()
    with pytest.raises(ValidationError) as info:
        attend(config, args["q"], args["k_cache"], args["indices"], policy="dsa-backends@2")
    assert info.value.argument == "config" and str(info.value).startswith(f"config: {code}: ")
    assert [p.code for p in info.value.problems] == [code]


@pytest.mark.parametrize("field, value", [("q", None), ("kv_cache", [[0] * 656]), ("kv_cache", 3)])
def test_attend_names_a_non_tensor(field, value):
    args = decode_args()
    q, cache = (value, args["k_cache"]) if field == "q" else (args["q"], value)
    with pytest.raises(ValidationError) as info:
        attend(HISPARSE_FP8, q, cache, args["indices"], policy="dsa-backends@2")
    assert info.value.argument == field and "expected a torch.Tensor" in str(info.value)


@pytest.mark.parametrize("entry", ["run_backend", "attend"])
def test_nan_in_q_is_refused_on_request_through_every_entry(entry):
    args = decode_args()
    args["q"][1, 0, 3, 9] = math.nan
    with pytest.raises(ValidationError, match=r"q\[1, 0, 3, 9\] = nan"):
        if entry == "run_backend":
            run_backend("flashmla_kv", args["q"], args["k_cache"], args["indices"], check_finite=True)
        else:
            attend(HISPARSE_FP8, args["q"], args["k_cache"], args["indices"], policy="dsa-backends@2",
                   check_finite=True)


@pytest.mark.parametrize("b, s_q", [(0, 1), (2, 0), (0, 0)])
@pytest.mark.parametrize("entry", ["run_backend", "attend"])
def test_empty_decode_batches_run_no_kernel(b, s_q, entry, monkeypatch):
    monkeypatch.setattr(reference, "decode_compute", lambda *a, **k: pytest.fail("a kernel ran"))
    args = decode_args(b=b, s_q=s_q)
    if entry == "run_backend":
        result = run_backend("flashmla_kv", args["q"], args["k_cache"], args["indices"])
    else:
        result = attend(HISPARSE_FP8, args["q"], args["k_cache"], args["indices"], policy="dsa-backends@2")
    assert result.out.shape == (b, s_q, 64, 512) and result.out.dtype == BF16
    assert result.lse.shape == (b, 64, s_q) and result.lse.dtype == torch.float32
    assert result.max_logits is None and result.provider == "reference"


def test_empty_prefill_runs_no_kernel(monkeypatch):
    monkeypatch.setattr(reference, "prefill_compute", lambda *a, **k: pytest.fail("a kernel ran"))
    args = prefill_args(s_q=0)
    result = run_backend("flashmla_sparse", args["q"], args["kv"], args["indices"], sm_scale=0.1)
    assert result.out.shape == (0, 64, 512) and result.lse.shape == result.max_logits.shape == (0, 64)


@pytest.mark.parametrize("scale", [10 ** 400, -(10 ** 400), float("inf"), float("nan"), True, "0.1"])
def test_a_scale_no_float_can_hold_is_a_validation_error(scale):
    q = torch.zeros(1, 1, 64, 576, dtype=torch.bfloat16)
    cache = torch.zeros(1, 64, 1, 656, dtype=torch.uint8)
    idx = torch.full((1, 1, 64), -1, dtype=torch.int32)
    with pytest.raises(ValidationError, match="softmax_scale: expected None or a finite real number"):
        run_backend("flashmla_kv", q, cache, idx, softmax_scale=scale)
    kv = torch.zeros(64, 1, 576, dtype=torch.bfloat16)
    with pytest.raises(ValidationError, match="sm_scale: expected a finite real number"):
        run_backend("flashmla_sparse", q[0], kv, torch.full((1, 1, 128), -1, dtype=torch.int32), sm_scale=scale)


def test_every_message_describes_a_tensor_one_way():
    """The kernels' checks, the FP8 packer and the hot buffer name a bad tensor with the same words
    (errors.describe), and no module of the bridge formats a tensor's shape by hand."""
    import os
    import re

    from kernels_bridge.errors import describe
    from kernels_bridge.hot_buffer import HotBuffer, HotBufferError

    bad = torch.zeros(3, 5, dtype=torch.int64)
    with pytest.raises(ValidationError) as kernel:
        check_decode(torch.zeros(1, 1, 64, 576, dtype=BF16), torch.zeros(1, 64, 1, 656, dtype=torch.uint8), bad)
    with pytest.raises(ValidationError) as fp8:
        quantize_kv_fp8(bad)
    hb = HotBuffer(torch.zeros(2, 8, 656, dtype=torch.uint8), buffer_size=4, page_size=4)
    with pytest.raises(HotBufferError) as buffer:
        hb.translate(bad, torch.ones(1, dtype=torch.int64), torch.zeros(1, 1, dtype=torch.int64))
    text = describe(bad)
    assert text == "shape (3, 5), dtype torch.int64, device cpu"
    for err in (kernel, fp8, buffer):
        assert text in str(err.value)
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels_bridge")
    by_hand = [name for name in sorted(os.listdir(root)) if name.endswith(".py") and name != "errors.py"
               and re.search(r"shape \{|dtype \{|\.shape\)\}", open(os.path.join(root, name)).read())]
    assert not by_hand
