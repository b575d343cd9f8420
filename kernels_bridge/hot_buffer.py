"""HiSparse hot buffer: a per-request device cache of KV rows fed from a host pool, as SGLang fills it.

HiSparse keeps the full KV cache of every request in host memory and gives each request a
fixed-size region of device rows, the *hot buffer*. Every decode step the sparse indexer picks
``top_k`` token positions per request; :meth:`HotBuffer.translate` does what SGLang does for that
step: its coordinator writes the new token's KV on the device and its swap-in kernel makes the
picked rows resident, copying only what is missing host -> device, and returns flat row indices
into :attr:`HotBuffer.buffer`, which FlashMLA's sparse kernels consume as they are. One
:class:`HotBuffer` models one layer's KV cache.

The semantics (`hot_buffer_coordinator` and `hot_buffer_kernel` say them in full) are SGLang's
coordinator (``srt/managers/hisparse_coordinator.py``) and kernel (``hisparse.cuh``,
``load_cache_to_device_buffer_kernel``) of the release chosen (``release``: "0.5.23", the kernel
of 0.5.21 and later, or "0.5.12", up to 0.5.20), and its admission (``admission``: "normal",
after the request's own prefill, warm; or "disaggregated", a decode node's, cold). They are held
step for step to an independent transcription of SGLang's kernel and coordinator
(``tests/oracles/sglang_hisparse.py``). With ``draft_tokens`` (speculative decoding, MTP / EAGLE)
every translate is a target verify through SGLang 0.5.23's CLOCK kernel instead
(``hot_buffer_spec``; transcribed in ``tests/oracles/sglang_hisparse_spec.py``), and each request
owns scratch rows after its slots.

Layout, ``R`` = num_requests, ``S`` = max_seq_len, ``B`` = buffer_size, ``P`` = page_size:
``host_pool`` ``[R, S, *row]`` on the CPU (pinned when the buffer is on CUDA): row ``[r, p]`` is the
KV of position ``p`` of request ``r``, append-only while the request lives. ``buffer``
``[R * (B + P), *row]`` on the device: request ``r`` owns rows ``r * (B + P)`` onward; its slots
``0 .. B-1`` are LRU-managed, slot ``B`` holds the newest token once the request is longer than
``B``, the rest pad the region to whole pages so the buffer views as FlashMLA's paged cache.
Rows never written are zero. ``row`` = ``[576]`` bfloat16 or ``[656]`` uint8 (the FP8 V3.2 row).

Every argument is checked before any state changes, so a translate applies fully or raises
:class:`HotBufferError` and leaves the buffer, the state and the statistics as they were. A
``HotBuffer`` is not thread-safe, and its data-dependent shapes keep it out of CUDA graphs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from kernels_bridge.errors import describe
from kernels_bridge.hot_buffer_checks import (ADMISSIONS, RELEASES, ROW_BYTES, ROW_LAYOUTS, INT32_MAX,
                                              HotBufferError, check_batch, check_choice, check_host_pool,
                                              check_ids_lens, check_max_bytes, check_req_ids, check_size)
from kernels_bridge.hot_buffer_coordinator import admit_and_write
from kernels_bridge.hot_buffer_kernel import long_pass, short_pass
from kernels_bridge.hot_buffer_rows import RowCopier
from kernels_bridge.hot_buffer_spec import SpecState, check_spec_batch, check_spec_sizes, spec_step
from kernels_bridge.hot_buffer_state import State
from kernels_bridge.layout import hot_buffer_bytes
from kernels_bridge.resources import format_bytes, memory_budget, resolve_device
from kernels_bridge.tensor_checks import check_readable

__all__ = ["HotBuffer", "HotBufferError", "HotBufferStats", "ROW_LAYOUTS", "ADMISSIONS", "RELEASES"]


@dataclass(frozen=True)
class HotBufferStats:
    """Cumulative counters since creation or :meth:`HotBuffer.reset_stats`, as SGLang would count
    them.

    ``lookups``: valid top-k entries served (padding and, in a short request, entries past its
    length are not); ``misses``: entries whose row the kernel copied host -> device (each entry of
    a repeated position counts); ``hits = lookups - misses`` (the newest token is always a hit).
    ``rows_copied``: host -> device rows: the kernel's copies (for release 0.5.12 with padding or
    repeats, more than the misses) and a disaggregated short request's preload.
    ``rows_written``: new tokens written on the device by the decode steps (no host copy).
    """

    steps: int = 0
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    rows_copied: int = 0
    bytes_copied: int = 0
    rows_written: int = 0

    @property
    def hit_rate(self) -> float:
        """hits / lookups; 0.0 before any lookup."""
        return self.hits / self.lookups if self.lookups else 0.0


IntArg = Union[int, "list[int]", torch.Tensor]


class HotBuffer:
    """HiSparse host pool + per-request device hot buffer + SGLang's swap-in of top-k positions.

    Args:
        host_pool: ``[num_requests, max_seq_len, 576]`` bfloat16 or ``[num_requests,
            max_seq_len, 656]`` uint8 (FP8 rows viewed as bytes), contiguous, on the CPU. Kept by
            reference; when ``device`` is CUDA and the tensor is not pinned, a pinned copy is
            made: write new tokens through :attr:`host_pool` then.
        buffer_size: LRU slots per request (SGLang's ``device_buffer_size``, default there
            ``2 * top_k``); a positive multiple of ``page_size``.
        device: device of :attr:`buffer` and of the state; default the host pool's.
        page_size: rows per page of the paged view (64 for FlashMLA); also the size of the extra
            page each request gets for its newest token.
        max_bytes: the most the buffer and its state may take on ``device`` (default:
            ``resources.memory_budget``, half of what can still be allocated there); a larger
            request is refused before anything is allocated.
        admission: ``"normal"`` (default) or ``"disaggregated"``: how a request's first
            translate admits it (``hot_buffer_coordinator``).
        release: ``"0.5.23"`` (default) or ``"0.5.12"``: which generation of SGLang's kernel.
        draft_tokens: 0 (default) or 2..4: speculative decoding (MTP / EAGLE) with that many draft
            tokens, SGLang 0.5.23's CLOCK kernel (``hot_buffer_spec``): every translate is then a
            target verify, positions ``[n, draft_tokens, top_k]``; ``release`` must be "0.5.23".
        top_k: the indexer's top-k, needed with ``draft_tokens`` (it sizes each request's scratch
            rows); at least 1024 and ``draft_tokens * top_k <= 8192``, as SGLang requires.
    """

    def __init__(self, host_pool: torch.Tensor, buffer_size: int, device: Union[str, torch.device, None] = None,
                 page_size: int = 64, max_bytes: Optional[int] = None, *, admission: str = "normal",
                 release: str = "0.5.23", draft_tokens: int = 0, top_k: Optional[int] = None) -> None:
        row_shape, kind = check_host_pool(host_pool)
        num_requests, max_seq_len = int(host_pool.shape[0]), int(host_pool.shape[1])
        dev = self._setup(num_requests, max_seq_len, buffer_size, page_size, kind, device or host_pool.device,
                          max_bytes, admission, release, spec=(draft_tokens, top_k))
        if dev.type == "cuda" and not host_pool.is_pinned():
            host_pool = host_pool.pin_memory()
        self._host_pool = host_pool
        self._buffer = torch.zeros((num_requests * self.rows_per_request, *row_shape), dtype=host_pool.dtype,
                                   device=dev)
        self._rows = RowCopier(host_pool.view(num_requests * max_seq_len, *row_shape), self._buffer)

    @classmethod
    def counting(cls, num_requests: int, max_seq_len: int, buffer_size: int, *, kv_format: str = "fp8",
                 device: Union[str, torch.device, None] = None, page_size: int = 64,
                 max_bytes: Optional[int] = None, admission: str = "normal",
                 release: str = "0.5.23", draft_tokens: int = 0, top_k: Optional[int] = None) -> "HotBuffer":
        """A HotBuffer that keeps SGLang's bookkeeping and statistics but no rows (no host pool,
        no buffer: :attr:`buffer` is None): what `hisparse attend --trace --no-kernel` runs.
        kv_format "fp8" or "bf16" sets the bytes a copied row counts."""
        kind = check_choice("kv_format", kv_format, tuple(ROW_BYTES))
        self = cls.__new__(cls)
        num_requests, max_seq_len = check_size("num_requests", num_requests), check_size("max_seq_len", max_seq_len)
        self._setup(num_requests, max_seq_len, buffer_size, page_size, kind, device or "cpu", max_bytes,
                    admission, release, rows=False, spec=(draft_tokens, top_k))
        self._host_pool = self._buffer = self._rows = None
        return self

    def _setup(self, num_requests, max_seq_len, buffer_size, page_size, kind, device, max_bytes, admission,
               release, rows: bool = True, spec: tuple = (0, None)) -> torch.device:
        """Check the sizes and choices, refuse what the memory budget cannot hold, make the state."""
        buffer_size, page_size = check_size("buffer_size", buffer_size), check_size("page_size", page_size)
        if buffer_size % page_size:
            raise HotBufferError(f"buffer_size: got {buffer_size}; expected a multiple of page_size {page_size} "
                                 f"so that every request's region is page-aligned for the paged view",
                                 argument="buffer_size")
        self._admission = check_choice("admission", admission, ADMISSIONS)
        self._release = check_choice("release", release, RELEASES)
        self._draft_tokens, self._top_k = self._check_spec(spec, buffer_size, page_size, num_requests)
        dev = resolve_device(device, "device", HotBufferError)
        if num_requests * max_seq_len + buffer_size >= INT32_MAX:
            raise HotBufferError(f"host_pool: {num_requests} x {max_seq_len} positions; expected num_requests * "
                                 f"max_seq_len + buffer_size < {INT32_MAX} (positions are indexed as int32)",
                                 argument="host_pool")
        if num_requests * (buffer_size + page_size) > INT32_MAX:
            raise HotBufferError(f"num_requests * (buffer_size + page_size) = {num_requests * (buffer_size + page_size)}; "
                                 f"expected <= {INT32_MAX} (translated rows are int32)", argument="buffer_size")
        check_max_bytes(max_bytes)
        self._kind, self._row_bytes = kind, ROW_BYTES[kind]
        need = hot_buffer_bytes(num_requests, max_seq_len, buffer_size, page_size,
                                self._row_bytes if rows else 0, dev.type, *spec)
        limit, source = (int(max_bytes), "max_bytes") if max_bytes is not None else memory_budget(dev)
        if need > limit:
            raise HotBufferError(f"buffer_size: {buffer_size} slots x {num_requests} requests need {format_bytes(need)} "
                                 f"on {dev} (buffer rows and translation state); the limit is "
                                 f"{format_bytes(limit)} ({source})", argument="buffer_size")
        self._state = State(num_requests, max_seq_len, buffer_size, page_size, dev, self._release)
        self._spec = (SpecState(num_requests, max_seq_len, buffer_size, page_size, self._draft_tokens, self._top_k)
                      if self._draft_tokens else None)
        self._stats = [0] * 7  # steps, lookups, hits, misses, rows copied, bytes copied, rows written
        return dev

    def _check_spec(self, spec: tuple, buffer_size: int, page_size: int, num_requests: int) -> tuple:
        """(draft_tokens, top_k): (0, None) without speculative decoding."""
        draft_tokens, top_k = spec
        if isinstance(draft_tokens, int) and not isinstance(draft_tokens, bool) and draft_tokens == 0:
            if top_k is not None:
                raise HotBufferError(f"top_k: got {top_k!r}; it sizes the speculative scratch and goes with "
                                     f"draft_tokens 2..4", argument="top_k")
            return 0, None
        if self._release != "0.5.23":
            raise HotBufferError(f"release: {self._release}; speculative decoding is modelled with SGLang "
                                 f"0.5.23's CLOCK kernel (release \"0.5.23\")", argument="release")
        return check_spec_sizes(draft_tokens, top_k, buffer_size, page_size, num_requests)

    @staticmethod
    def bytes_needed(num_requests: int, max_seq_len: int, buffer_size: int, page_size: int,
                     row_bytes: int, device=None, draft_tokens: int = 0, top_k: Optional[int] = None) -> int:
        """Bytes a HotBuffer of these sizes allocates at most: the rows, the state, a step's
        temporaries and the staging of a copy (row_bytes 0: a counting one)."""
        return hot_buffer_bytes(num_requests, max_seq_len, buffer_size, page_size, row_bytes,
                                torch.device(device or "cpu").type, draft_tokens, top_k)

    # ------------------------------------------------------------------ properties
    @property
    def buffer(self) -> Optional[torch.Tensor]:
        """The device rows ``[num_requests * (buffer_size + page_size), *row]`` (None for a counting
        HotBuffer); request ``r`` owns rows ``r * rows_per_request ..``, its reserved newest-token
        row is ``r * rows_per_request + buffer_size``. Rows never written are zero."""
        return self._buffer

    @property
    def host_pool(self) -> Optional[torch.Tensor]:
        """The host pool ``[num_requests, max_seq_len, *row]`` this buffer copies from."""
        return self._host_pool

    @property
    def kv_format(self) -> str:
        """``"bf16"`` (576 bfloat16 per row) or ``"fp8"`` (656 bytes per row)."""
        return self._kind

    @property
    def num_requests(self) -> int:
        return self._state.R

    @property
    def max_seq_len(self) -> int:
        return self._state.S

    @property
    def buffer_size(self) -> int:
        return self._state.B

    @property
    def page_size(self) -> int:
        return self._state.P

    @property
    def rows_per_request(self) -> int:
        """The rows of one request's region: ``buffer_size + page_size``, and with draft tokens its
        scratch rows after them, padded to whole pages."""
        return self._spec.RW if self._spec is not None else self._state.W

    @property
    def draft_tokens(self) -> int:
        """0, or the draft tokens of every speculative step (2..4)."""
        return self._draft_tokens

    @property
    def top_k(self) -> Optional[int]:
        """The top-k of the speculative steps (None without draft tokens)."""
        return self._top_k

    @property
    def row_bytes(self) -> int:
        """Bytes per KV row: 1152 (bf16) or 656 (fp8)."""
        return self._row_bytes

    @property
    def device(self) -> torch.device:
        return self._state.device

    @property
    def admission(self) -> str:
        return self._admission

    @property
    def release(self) -> str:
        return self._release

    @property
    def stats(self) -> HotBufferStats:
        """Cumulative :class:`HotBufferStats`."""
        return HotBufferStats(*self._stats)

    def reset_stats(self) -> None:
        """Zero the statistics; residency is kept."""
        self._stats = [0] * 7

    def allocated_bytes(self) -> int:
        """Bytes this HotBuffer holds on its device now: the rows, the state, the kept staging."""
        held = list(self._state.tensors().values())
        if self._spec is not None:
            held += list(self._spec.tensors().values())
        if self._buffer is not None:
            held.append(self._buffer)
        total = sum(t.numel() * t.element_size() for t in held)
        return total + (self._rows.staging_bytes() if self._rows is not None else 0)

    def row_range(self, req_id: int) -> range:
        """Flat buffer rows owned by ``req_id``; its reserved newest-token row is
        ``row_range(r).start + buffer_size``."""
        r = self._req(req_id)
        return range(r * self.rows_per_request, (r + 1) * self.rows_per_request)

    def paged_view(self) -> torch.Tensor:
        """The buffer in the layout the FlashMLA sparse kernels read; shares storage.

        Returns:
            fp8: uint8 ``[num_pages, page_size, 1, 656]`` (flashmla_kv's paged k_cache; the flat
            row index ``page * page_size + offset`` is exactly what :meth:`translate` returns).
            bf16: bfloat16 ``[rows, 1, 576]`` (flashmla_sparse's kv).
        """
        if self._buffer is None:
            raise HotBufferError("paged_view: a counting HotBuffer has no rows", argument="buffer")
        if self._kind == "fp8":
            return self._buffer.view(-1, self.page_size, 1, self._buffer.shape[-1])
        return self._buffer.view(-1, 1, self._buffer.shape[-1])

    def slot_positions(self, req_id: int) -> torch.Tensor:
        """int64 ``[buffer_size + 1]``: the position held by each LRU (or CLOCK) slot of ``req_id``
        and, last, by its reserved slot; -1 where empty. A copy."""
        r, st = self._req(req_id), self._state
        if self._spec is not None:
            return self._spec.tokens[r, : st.B + 1].clone()
        rows = st.slot_rows(r)
        pos = torch.where(rows == st.empty, -1, rows - r * st.S)
        return torch.cat([pos, st.newest[r: r + 1]]).cpu()

    def lru_order(self, req_id: int) -> torch.Tensor:
        """int64 ``[buffer_size]``: the LRU slots of ``req_id``, least- to most-recently used
        (eviction takes from the front). A copy."""
        r = self._req(req_id)
        if self._spec is not None:
            raise HotBufferError("lru_order: a speculative HotBuffer (draft_tokens) keeps a CLOCK, not an LRU "
                                 "order; see clock_state()", argument="req_id")
        return self._state.lru(r).to("cpu", copy=True)

    def clock_state(self, req_id: int) -> dict:
        """A speculative HotBuffer's CLOCK tables of ``req_id`` (copies): ``tokens`` int64 [B + P]
        (the position each slot holds, -1 none; slots B+1.. hold the last step's drafts), ``rows``
        int64 [B + P] (the buffer row of each slot: an admitted miss swaps rows with the scratch),
        ``scratch`` int64 [C] (the scratch rows), ``ref`` int64 [B] (each slot's reference epoch),
        ``epoch`` and ``cursor`` (ints)."""
        r = self._req(req_id)
        if self._spec is None:
            raise HotBufferError("clock_state: this HotBuffer has no draft tokens; see lru_order()",
                                 argument="req_id")
        sp = self._spec
        return {"tokens": sp.tokens[r].clone(), "rows": sp.locs[r].clone(), "scratch": sp.scratch[r].clone(),
                "ref": sp.ref[r].clone(), "epoch": int(sp.epoch[r]), "cursor": int(sp.cursor[r])}

    # ------------------------------------------------------------------ lifecycle
    def free(self, req_ids: IntArg) -> None:
        """SGLang's ``request_finished``: the requests' slots empty, their LRU order reset, and the
        next translate of each admits it anew (its rows now in ``host_pool[r]``). Buffer bytes
        are left as they are (rewritten before they are read again).

        Args:
            req_ids: an int, or ints ``[n]`` (an integer tensor or a sequence); repeats are harmless.
        """
        rid = check_req_ids(req_ids, self.num_requests)
        if rid.numel():
            self._state.forget(rid.to(self.device))
            if self._spec is not None:
                self._spec.forget(rid)

    def reset(self) -> None:
        """Free every request and zero the statistics."""
        self.free(torch.arange(self.num_requests))
        self.reset_stats()

    # ------------------------------------------------------------------ translate
    def translate(self, req_ids: torch.Tensor, seq_lens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One decode step of the requests: their new tokens written on the device, then the
        top-k rows made resident; returns their flat buffer rows.

        Args:
            req_ids: int ``[n]``, distinct request ids in ``[0, num_requests)``. A request's first
                translate (or its first after :meth:`free`) admits it, with a prefill of
                ``seq_len - 1`` tokens.
            seq_lens: int ``[n]``, current length of each request, ``1 <= seq_len <=
                max_seq_len``, never below the request's last one (SGLang's decode only grows a
                request; free it to start again). Several tokens ahead stands for the steps in
                between.
            positions: int ``[n, top_k]``, request-local token positions, ``-1`` for padding,
                otherwise ``0 <= position < seq_len``; ``top_k <= buffer_size``.
            Any integer dtype, on the CPU or the buffer's device.

        With ``draft_tokens`` N (speculative decoding, ``hot_buffer_spec``): ``seq_lens`` are the
        committed lengths L (a request's first translate admits it with a prefill of L tokens, each
        later one grows it by the drafts its last step accepted, 1..N), ``positions`` is ``[n, N,
        top_k]``, draft i's positions below L + i + 1, and the result is ``[n, N, top_k]``.

        Returns:
            int32 ``[n, top_k]`` on the buffer's device: the row of :attr:`buffer` holding each
            position, ``-1`` for padding and for the entries SGLang's kernel does not serve.

        Raises:
            HotBufferError: before any state change, on a bad argument.
        """
        st = self._state
        if self._host_pool is not None:  # its storage may have shrunk since construction
            check_readable(self._host_pool, "host_pool", HotBufferError)
        if self._spec is not None:
            return self._translate_spec(req_ids, seq_lens, positions)
        batch = check_batch(req_ids, seq_lens, positions, num_requests=st.R, max_seq_len=st.S,
                            buffer_size=st.B, last_lens=st.seq_len, device=st.device)
        return self._apply(*batch)

    def _apply(self, rid: torch.Tensor, lens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Run one validated step: rid, lens int64 [n], pos int32 [n, k]."""
        n, k = pos.shape
        st = self._state
        if n == 0:
            self._stats[0] += 1
            return torch.full((0, k), -1, dtype=torch.int32, device=st.device)
        short = lens <= st.B
        groups = [(short.nonzero().squeeze(1), short_pass), ((~short).nonzero().squeeze(1), long_pass)]
        passes = []
        last, newest = st.seq_len.index_select(0, rid), st.newest.index_select(0, rid)
        writes = admit_and_write(st, rid, lens, self._admission)
        try:
            for rows, fn in groups:
                if rows.numel():
                    passes.append((rows, fn(st, rid[rows], lens[rows], pos[rows])))
        except HotBufferError:  # only a request admitted before can be refused: undo the coordinator
            st.forget(rid[last == 0])
            st.newest.index_copy_(0, rid, newest)
            st.seq_len.index_copy_(0, rid, last)
            raise
        for moves in writes[:3]:  # the prefill's rows, the preload, the new tokens, in that order
            self._move(moves.src, moves.dst)
        out = torch.empty((n, k), dtype=torch.int32, device=st.device)
        for rows, p in passes:
            out[rows] = p.out
            self._move(p.src, p.dst)
        self._count(passes, writes)
        return out

    def _translate_spec(self, req_ids, seq_lens, positions) -> torch.Tensor:
        """A speculative step (hot_buffer_spec): checked, then run request by request."""
        sp = self._spec
        rid, lens = check_ids_lens(req_ids, seq_lens, num_requests=sp.R, max_seq_len=sp.S,
                                   last_lens=sp.seq_len.to(self.device), device=self.device)
        pos = check_spec_batch(req_ids, seq_lens, positions, sp, rid.cpu(), lens.cpu())
        p = spec_step(sp, rid, lens, pos, self._admission)
        self._move(p.moves_src, p.moves_dst)
        self._move(p.src, p.dst)
        s = self._stats
        s[0] += 1
        s[1] += p.lookups
        s[2] += p.lookups - p.misses
        s[3] += p.misses
        s[4] += p.copies
        s[5] += p.copies * self._row_bytes
        s[6] += p.written
        return p.out.to(self.device)

    def _count(self, passes, writes) -> None:
        lookups = sum(p.lookups for _, p in passes)
        misses = sum(p.misses for _, p in passes)
        copies = sum(p.copies for _, p in passes) + writes.rows_preloaded
        s = self._stats
        s[0] += 1
        s[1] += lookups
        s[2] += lookups - misses
        s[3] += misses
        s[4] += copies
        s[5] += copies * self._row_bytes
        s[6] += writes.tokens_written

    def _move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        if self._rows is not None and src.numel():
            self._rows.copy(src, dst)

    def _req(self, req_id) -> int:
        if isinstance(req_id, torch.Tensor) and req_id.numel() == 1 and not req_id.is_floating_point():
            req_id = int(req_id)
        if isinstance(req_id, bool) or not isinstance(req_id, int) or not 0 <= req_id < self.num_requests:
            raise HotBufferError(f"req_id: got {describe(req_id) if not isinstance(req_id, int) else req_id}; "
                                 f"expected an int in [0, {self.num_requests})", argument="req_id")
        return req_id
