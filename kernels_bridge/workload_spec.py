"""The workload `hisparse attend` runs, as plain numbers: its knobs, their checks and the bytes it
will allocate. No torch here, so a bad argument or a workload too big for the memory limit is
refused before torch is imported (workload.py builds and runs it).

Messages name the flags as `hisparse attend` spells them; a value the user did not type (the hot
buffer's default, 2 x top-k) is named as the default it is."""
from __future__ import annotations

import re
from dataclasses import dataclass

from engine.values import INT_MAX
from kernels_bridge.errors import ValidationError, shown
from kernels_bridge.layout import (BF16_ROW_BYTES, D_QK, DECODE_TOPK_MULTIPLE, FP8_ROW_BYTES, HEAD_COUNTS,
                                   PAGE_SIZE, PREFILL_TOPK_MULTIPLE, hot_buffer_bytes)
from kernels_bridge.model_config import V32_SOFTMAX_SCALE

# The workload's knobs are SGLang's --hisparse-config names, with SGLang's defaults: top_k 2048,
# device_buffer_size 2 * top_k.
TOP_K_FLAG, BUFFER_FLAG = "--hisparse-top-k", "--hisparse-device-buffer-size"
DEFAULT_TOP_K = 2048
MAX_SEED = INT_MAX  # --seed is read as a 64-bit integer, as every integer flag
MAX_STEPS = 100_000  # a run's time grows with its steps (its memory is bounded by --max-memory)
PART_NAMES = {"--requests x --context": "KV", f"--requests x {BUFFER_FLAG}": "hot buffer",
              f"--requests x {TOP_K_FLAG}": "per-step scratch"}
# the decode backends the bridge runs (dispatch.BACKENDS), with the top-k multiple each kernel needs
TOPK_MULTIPLE = {"flashmla_sparse": PREFILL_TOPK_MULTIPLE, "flashmla_kv": DECODE_TOPK_MULTIPLE}
_DEVICE = re.compile(r"(cpu|cuda)(:[0-9]{1,4})?")


@dataclass
class Workload:
    """`buffer_size` None: SGLang's default, 2 x top_k."""
    requests: int = 2
    context: int = 4096
    heads: int = 128
    top_k: int = DEFAULT_TOP_K
    buffer_size: int | None = None
    steps: int = 8
    locality: float = 0.7
    seed: int = 0
    provider: str = "auto"
    device: str = "cpu"
    softmax_scale: float = V32_SOFTMAX_SCALE  # DeepSeek-V3.2's layer.scaling, as SGLang computes it
    admission: str = "normal"   # how SGLang admits a request: after its own prefill, or disaggregated
    release: str = "0.5.23"     # which generation of SGLang's swap-in kernel
    kernel: bool = True         # False: the hot buffer's books alone (--no-kernel), no KV, no kernel
    draft_tokens: int = 0       # 2..4: speculative decoding (SGLang 0.5.23's CLOCK kernel), books only

    @property
    def buffer(self) -> int:
        """The hot buffer's slots per request: the one given, else 2 x top_k."""
        return 2 * self.top_k if self.buffer_size is None else self.buffer_size

    def problems(self, backends=()) -> list[str]:
        """What the kernels, the hot buffer or `hisparse attend` would refuse, one phrase each,
        naming the flag; `backends`: the decode backends it will run on (their top-k multiple)."""
        out = []
        if self.requests < 1:
            out.append(f"--requests {self.requests}: at least 1")
        if self.context < 1:
            out.append(f"--context {self.context}: at least 1")
        if self.heads not in HEAD_COUNTS:
            out.append(f"--heads {self.heads}: FlashMLA supports {' or '.join(map(str, HEAD_COUNTS))}")
        if self.top_k < 1:
            out.append(f"{TOP_K_FLAG} {self.top_k}: at least 1")
        elif self.buffer_size is None and self.buffer % PAGE_SIZE:
            out.append(f"{BUFFER_FLAG} is not given, and its default, 2 x {TOP_K_FLAG} = {self.buffer}, is not "
                       f"a multiple of {PAGE_SIZE}: give {BUFFER_FLAG} (a multiple of {PAGE_SIZE}, at least "
                       f"{self.top_k}) or a {TOP_K_FLAG} that is a multiple of {PAGE_SIZE // 2}")
        elif self.buffer_size is not None and (self.buffer_size % PAGE_SIZE or self.buffer_size < self.top_k):
            out.append(f"{BUFFER_FLAG} {self.buffer_size}: a multiple of {PAGE_SIZE} and at least "
                       f"{TOP_K_FLAG} ({self.top_k})")
        for backend in dict.fromkeys(backends):
            multiple = TOPK_MULTIPLE.get(backend)
            if multiple is None:
                out.append(f"the policy chose {shown(backend)} for decode; the bridge runs "
                           + ", ".join(repr(b) for b in TOPK_MULTIPLE))
            elif self.top_k >= 1 and self.top_k % multiple:
                out.append(f"{TOP_K_FLAG} {self.top_k}: {backend} needs a multiple of {multiple}")
        out += self._spec_problems()
        if not 1 <= self.steps <= MAX_STEPS:
            out.append(f"--steps {self.steps}: from 1 to {MAX_STEPS:,}")
        if not 0.0 <= self.locality <= 1.0:
            out.append(f"--locality {self.locality}: a share between 0 and 1")
        if not 0 <= self.seed <= MAX_SEED:
            out.append(f"--seed {self.seed}: between 0 and 2**63 - 1")
        if not isinstance(self.device, str) or not _DEVICE.fullmatch(self.device):
            out.append(f"--device: {shown(self.device)} is not a device name (cpu, cuda, cuda:N)")
        return out

    def _spec_problems(self) -> list[str]:
        """What SGLang's speculative hot buffer (and attend) refuse with --draft-tokens."""
        if not self.draft_tokens:
            return []
        if self.draft_tokens not in (2, 3, 4):
            return [f"--draft-tokens {self.draft_tokens}: 2, 3 or 4 (SGLang's speculative hot buffer)"]
        out = []
        if self.kernel:
            out.append("--draft-tokens counts what SGLang's speculative hot buffer copies; the kernels' verify "
                       "pass is not run: add --no-kernel")
        if self.top_k < 1024 or self.draft_tokens * self.top_k > 8192:
            out.append(f"{TOP_K_FLAG} {self.top_k}: with --draft-tokens {self.draft_tokens}, at least 1024 and "
                       f"--draft-tokens x {TOP_K_FLAG} at most 8192 (SGLang's speculative hot buffer)")
        if self.release != "0.5.23":
            out.append(f"--kernel-release {self.release}: --draft-tokens models 0.5.23's CLOCK kernel")
        if self.requests > self.buffer:
            out.append(f"--requests {self.requests}: with --draft-tokens, at most the buffer size {self.buffer}")
        return out

    @property
    def kv_length(self) -> int:
        """Tokens of KV per request by the last step (with draft tokens: every step accepting all
        of them, and the last step's drafts)."""
        if self.draft_tokens:
            return self.context + (self.steps + 1) * self.draft_tokens
        return self.context + self.steps

    def check(self, backends=(), max_bytes: int | None = None, limit: str = "--max-memory",
              raisable: bool = True) -> None:
        """Raise ValidationError naming every problem, or the flags that drive a workload needing
        more than `max_bytes` (host and device together; `limit` says where that figure comes
        from), before anything is built. `raisable`: whether --max-memory could raise that limit
        (not past what the machine can hold)."""
        problems = self.problems(backends)
        if problems:
            raise ValidationError("; ".join(problems), argument="workload")
        if max_bytes is not None:
            parts = self.bytes_needed()
            need = sum(parts.values())
            if need > max_bytes:
                from kernels_bridge.resources import format_bytes

                flags, _ = max(parts.items(), key=lambda kv: kv[1])
                listed = ", ".join(f"{PART_NAMES[k]} {format_bytes(v)}" for k, v in parts.items() if v)
                raise ValidationError(
                    f"{flags}: this workload needs {format_bytes(need)} ({listed}); the limit is "
                    f"{format_bytes(max_bytes)} ({limit}); make it smaller"
                    + (", or raise the limit with --max-memory" if raisable else ""), argument="workload")

    def bytes_needed(self) -> dict:
        """Bytes the run allocates, by the flags that drive each part: the KV of every request
        (the BF16 truth, the FP8 rows and their scratch) grows with --requests and --context
        (+ --steps), the hot buffer with the buffer size, a step's picks and reference with the
        top-k. An upper bound: FP8 rows are counted whatever the backend."""
        length = self.kv_length
        row = max(FP8_ROW_BYTES, BF16_ROW_BYTES) if self.kernel else 0  # --no-kernel: no rows at all
        kv = self.requests * length * (BF16_ROW_BYTES + FP8_ROW_BYTES) if self.kernel else 0
        kv_scratch = min(length, BUILD_CHUNK) * D_QK * 4 * 3 if self.kernel else 0  # float32 randn, product, quantize
        width = max(length, self.top_k)
        picks = self.requests * width * (4 + 1 + 8) * 2  # random keys, mask, sort indices
        hb = hot_buffer_bytes(self.requests, length, self.buffer, PAGE_SIZE, row, self.device.partition(":")[0],
                              self.draft_tokens, self.top_k if self.draft_tokens else None)
        reference = (self.requests * self.top_k * D_QK * 8 * 3 + self.requests * self.heads * self.top_k * 8 * 3
                     if self.kernel else 0)
        return {"--requests x --context": kv + kv_scratch + picks, f"--requests x {BUFFER_FLAG}": hb,
                f"--requests x {TOP_K_FLAG}": reference}


BUILD_CHUNK = 1 << 16  # tokens of KV made (and quantized) at a time: bounded scratch, progress as it goes
