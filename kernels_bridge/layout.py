"""The sizes the bridge's rows, kernels and hot buffer are made of, as plain numbers: no torch, so
`hisparse attend` checks and sizes a workload before torch is imported (fp8.py, validate.py and
hot_buffer.py take them from here)."""
from __future__ import annotations

D_NOPE = 512          # quantized dims (the latent, also V)
D_ROPE = 64           # rotary dims, kept in bf16
D_QK = D_NOPE + D_ROPE  # 576
D_V = 512
TILE = 128            # dims per FP8 scale
NUM_TILES = D_NOPE // TILE  # 4
SCALE_BYTES = 4 * NUM_TILES  # 16
FP8_ROW_BYTES = D_NOPE + SCALE_BYTES + 2 * D_ROPE  # 656
BF16_ROW_BYTES = 2 * D_QK  # 1152
SCALES_AT = D_NOPE            # byte offset of the 4 float32 scales in an FP8 row
ROPE_AT = D_NOPE + SCALE_BYTES  # byte offset of the 64 bf16 RoPE dims (528)

HEAD_COUNTS = (64, 128)       # the head counts FlashMLA instantiates
PREFILL_TOPK_MULTIPLE = 128   # flashmla_sparse (safe on SM90 and SM100 at both head counts)
DECODE_TOPK_MULTIPLE = 64     # flashmla_kv (the decode kernels' B_TOPK)
PAGE_SIZE = 64                # HiSparse's page: the hot buffer views as FlashMLA's paged cache
STAGING_BYTES = 8 << 20       # a hot-buffer copy's staging: about 12k FP8 or 7k BF16 rows per chunk
# how SGLang admits a request: "normal" after its own prefill (warm: slots 0..B-1 hold tokens
# 0..B-1), "disaggregated" on a decode node the prefill's KV reached through host memory (cold)
ADMISSIONS = ("normal", "disaggregated")
KERNEL_RELEASES = ("0.5.23", "0.5.12")  # the swap-in kernel's two generations (0.5.21+, up to 0.5.20)


STEP_BYTES_PER_SLOT = 256     # a step's temporaries: at most 32 int64 values a slot of every request


def spec_scratch_rows(draft_tokens: int, top_k: int, buffer_size: int) -> int:
    """A speculative request's scratch rows, SGLang's scratch_capacity: min(N * top_k, max(1024,
    N * top_k - buffer_size)); 0 without draft tokens."""
    if not draft_tokens:
        return 0
    work = draft_tokens * top_k
    return min(work, max(1024, work - buffer_size))


def hot_buffer_parts(num_requests: int, max_seq_len: int, buffer_size: int, page_size: int,
                     row_bytes: int, draft_tokens: int = 0, top_k: int = 0) -> dict:
    """Bytes a HotBuffer of these sizes holds on its device, by part: "rows" (the buffer; 0 for a
    counting one, row_bytes 0), "state" (the LRU order packed with each slot's host row, int64; the
    newest position and seq_len int64 per request; the int32 scratch map of every host row, and a
    dump per slot and an empty marker; with draft tokens, the CLOCK tables of hot_buffer_spec),
    "staging" (the kept staging of a copy, at most STAGING_BYTES), "step" (the most one step's
    temporaries take: STEP_BYTES_PER_SLOT a slot and its top-k entry, for a step of every
    request)."""
    R, S, B = num_requests, max_seq_len, buffer_size
    scratch = spec_scratch_rows(draft_tokens, top_k or 0, B)
    rows = R * (B + page_size + -(-scratch // page_size) * page_size) * row_bytes  # scratch in whole pages
    state = R * B * 8 + R * (8 + 8) + (R * S + B + 1) * 4
    if draft_tokens:  # the CLOCK tables, int64: slot tokens and rows, scratch rows, reference epochs, 3 counters
        state += R * ((B + page_size) * 16 + scratch * 8 + B * 8 + 3 * 8)
    return {"rows": rows, "state": state, "staging": min(STAGING_BYTES, rows),
            "step": R * (B + 1) * STEP_BYTES_PER_SLOT}


def hot_buffer_bytes(num_requests: int, max_seq_len: int, buffer_size: int, page_size: int,
                     row_bytes: int, device_type: str = "cpu", draft_tokens: int = 0, top_k=None) -> int:
    """Bytes a HotBuffer of these sizes takes at most (hot_buffer_parts, summed); the same on every
    device type."""
    return sum(hot_buffer_parts(num_requests, max_seq_len, buffer_size, page_size, row_bytes, draft_tokens,
                                top_k or 0).values())
