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


def slot_bytes(device_type: str, buffer_size: int) -> int:
    """Bytes of one entry of the hot buffer's position -> slot map: int16 on the CPU when slot
    numbers fit (as SGLang's lru_slots), elsewhere int32 (portable atomics)."""
    return 2 if device_type == "cpu" and buffer_size < 2**15 else 4


def hot_buffer_bytes(num_requests: int, max_seq_len: int, buffer_size: int, page_size: int,
                     row_bytes: int, device_type: str = "cpu") -> int:
    """Bytes a HotBuffer of these sizes allocates on its device: the rows, the slot/position maps
    and LRU order, the staging of a copy."""
    rows = num_requests * (buffer_size + page_size) * row_bytes
    sb = slot_bytes(device_type, buffer_size)
    state = (num_requests * buffer_size * (4 + 8 + 8)  # slot -> host row, the LRU order and the next one
             + (num_requests * max_seq_len + 1) * sb
             + num_requests)  # the C check's mark per request
    constants = num_requests * buffer_size * (8 + sb + 4)  # entry ids, repeat tags, scattered ones
    # the bookkeeping's scratch, reused every step, each at most [R, B + 1]: over the top-k
    # 6 int32, the raw slots, 2 int64 (scatter indices, the misses); over the slots 4 int32
    # (marks, hits in order, running count, new places) and 3 int64 (new places as an index,
    # a partial batch's LRU rows and their new order)
    scratch = num_requests * (buffer_size + 1) * (6 * 4 + sb + 2 * 8 + 4 * 4 + 3 * 8)
    return rows + state + constants + scratch + min(STAGING_BYTES, rows)
