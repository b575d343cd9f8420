/* HotBuffer's LRU bookkeeping for long requests (seq_len > buffer_size), on the CPU.

   The same translation as HotBuffer._translate_long_tensors, one request at a time: two passes
   over the request's top-k (the slots, then hits, misses and the newest token), one over its LRU
   order (which slots the misses take, the new order), then the slot maps are written only where
   a slot changed. The tensor code does
   the same in whole-batch passes, which on one CPU thread cost several times this in memory
   traffic; it stays the path on other devices and where this file was not built.

   Plain C: kernels_bridge/native.py calls it through ctypes with the tensors' data pointers.
   hb_translate_long's arguments were validated by hb_check (or HotBuffer's tensor code) first:
   positions in [-1, seq_len), seq_len in (buffer_size, max_seq_len], distinct requests,
   top_k <= buffer_size. */
#include <stdint.h>
#include <string.h>

/* Slot numbers (the position -> slot map, the LRU order and the lists of slots) are int16 when
   buffer_size < 2**15, else int32: `wide` is a constant in each of the two copies of translate(). */
static inline int32_t get(const void *a, int wide, int64_t i) {
    return wide ? ((const int32_t *)a)[i] : ((const int16_t *)a)[i];
}

static inline void put(void *a, int wide, int64_t i, int32_t v) {
    if (wide)
        ((int32_t *)a)[i] = v;
    else
        ((int16_t *)a)[i] = (int16_t)v;
}

static inline __attribute__((always_inline)) int64_t translate(
    int64_t g, int64_t k, int64_t B, int64_t S, int64_t W, int64_t sink, const int64_t *rid,
    const int64_t *lens, const int32_t *pos, void *pos_slot, int32_t *slot_row, void *lru,
    int64_t *newest_pos, int32_t *out, int64_t *src, int64_t *dst, int64_t *counts,
    uint8_t *mark, void *held, int32_t *cur, int32_t *cand, int64_t *miss_flat, void *miss_slot,
    int64_t *fresh, const int wide) {
    const size_t width = wide ? 4 : 2;
    int64_t copies = 0, hits = 0, misses = 0, n_fresh = 0;
    for (int64_t j = 0; j < g; j++) {
        const int64_t r = rid[j], newest = lens[j] - 1, base = r * S, region = r * W;
        const int32_t *row = pos + j * k;
        int32_t *orow = out + j * k;
        int64_t nm = 0;
        int asked = 0;
        memset(mark, 0, (size_t)B + 1);

        /* The slot of every position first, in a loop without branches, so that its loads run
           ahead together rather than one cache miss at a time (padding and the newest read the
           sink's -1). */
        for (int64_t t = 0; t < k; t++) {
            const int32_t p = row[t];
            cur[t] = get(pos_slot, wide, (p >= 0 && p != newest) ? base + p : sink);
        }
        /* Hits keep their slot and are marked (mark[B] absorbs the rest); the newest reads the
           reserved slot B; candidates without a slot are listed for the next loop. No branches:
           which entries hit is as random as the indexer's picks. */
        /* Meanwhile the next request's map entries are fetched: with them cold, its first loop
           would wait on one cache miss after another. */
        const int32_t *next_row = j + 1 < g ? pos + (j + 1) * k : row;
        const char *next_map = (const char *)pos_slot + rid[j + 1 < g ? j + 1 : j] * S * (int64_t)width;
        int64_t n_cand = 0;
        for (int64_t t = 0; t < k; t++) {
            __builtin_prefetch(next_map + (int64_t)(next_row[t] < 0 ? 0 : next_row[t]) * (int64_t)width);
            const int32_t p = row[t], s = cur[t];
            const int is_new = p == newest, hit = s >= 0;
            const int64_t at = hit ? s : B;
            asked |= is_new;
            hits += hit & !mark[at];
            mark[at] = 1;
            orow[t] = hit ? (int32_t)(region + s) : is_new ? (int32_t)(region + B) : -1;
            cand[n_cand] = (int32_t)t;
            n_cand += (p >= 0) & !is_new & !hit;
        }
        /* The misses in row order. A miss is tagged -2 - (its index) in the map, so that a repeat
           of it finds the tag (tags fit int16: a miss index is below k <= B < 2**15). */
        for (int64_t i = 0; i < n_cand; i++) {
            const int64_t t = cand[i], flat = base + row[t];
            const int32_t s = get(pos_slot, wide, flat);
            if (s == -1) {
                miss_flat[nm] = flat;
                put(pos_slot, wide, flat, (int32_t)(-2 - nm));
                orow[t] = (int32_t)nm++;
            } else {
                orow[t] = -2 - s;  /* a repeat: the first appearance's miss index */
            }
        }

        /* SGLang's new order: the evictables not taken keep their order at the front, then the
           slots just filled in miss order, then the hits in their old order. The i-th miss takes
           the i-th least-recently-used slot not hit. Each slot is stored to all three lists and
           counted in one (miss_slot has k + 1 entries; the order is compacted in place, as
           neither count passes t). */
        void *order = (char *)lru + r * B * (int64_t)width;
        int64_t kept = 0, n_held = 0, taken = 0;
        /* Meanwhile the next request's slot rows are fetched, a cache line every 16 slots (as
           its map entries were in the loop over the top-k). */
        const char *next_rows = (const char *)(slot_row + rid[j + 1 < g ? j + 1 : j] * B);
        const int64_t rows_ahead = j + 1 < g ? (B * 4 + 63) / 64 : 0;
        for (int64_t t = 0; t < B; t++) {
            if ((t & 15) == 0 && (t >> 4) < rows_ahead)
                __builtin_prefetch(next_rows + (t >> 4) * 64);
            const int32_t s = get(order, wide, t);
            const int here = mark[s], take = !here & (taken < nm);
            put(held, wide, n_held, s);
            n_held += here;
            put(miss_slot, wide, taken, s);
            taken += take;
            put(order, wide, kept, s);
            kept += !here & !take;
        }
        if (taken < nm)
            return -1;
        memcpy((char *)order + kept * width, miss_slot, (size_t)nm * width);
        memcpy((char *)order + (kept + nm) * width, held, (size_t)n_held * width);

        /* Evict the occupants (an empty slot's occupant is the sink), place the misses. No
           occupant is a miss: occupants are resident, misses are not. */
        int32_t *rows = slot_row + r * B;
        for (int64_t i = 0; i < nm; i++) {
            const int32_t s = get(miss_slot, wide, i);
            put(pos_slot, wide, rows[s], -1);
            rows[s] = (int32_t)miss_flat[i];
            put(pos_slot, wide, miss_flat[i], s);
            src[copies] = miss_flat[i];
            dst[copies] = region + s;
            copies++;
        }
        for (int64_t i = 0; i < n_cand; i++)  /* a miss's entry holds its miss index till here */
            orow[cand[i]] = (int32_t)(region + get(miss_slot, wide, orow[cand[i]]));
        misses += nm;

        /* The reserved slot always holds the newest token: copied when it changed. */
        const int refresh = newest_pos[r] != newest;
        newest_pos[r] = newest;
        hits += asked & !refresh;
        misses += asked & refresh;
        if (refresh)
            fresh[n_fresh++] = j;
    }
    for (int64_t i = 0; i < n_fresh; i++) {  /* after every miss, as the tensor code orders them */
        const int64_t j = fresh[i];
        src[copies] = rid[j] * S + lens[j] - 1;
        dst[copies] = rid[j] * W + B;
        copies++;
    }
    counts[0] = hits;
    counts[1] = misses;
    return copies;
}

/* Translate g long requests. Shapes: rid, lens [g]; pos, out [g, k]; pos_slot [R * S + 1] (its
   last entry, index sink = R * S, stays -1); slot_row [R, B]; lru [R, B], least- to
   most-recently used; newest_pos [R]; src, dst [g * k + g]. Scratch: mark [B + 1], held [B],
   cur [k], cand [k], miss_flat [k], miss_slot [k + 1]. pos_slot, lru, held and miss_slot are
   int32 if wide, else int16. counts[0], counts[1] receive the hits and misses.
   Returns the number of rows to copy (src[i] host row -> dst[i] buffer row), or -1 if a request
   had more misses than slots to evict (impossible after validation). */
int64_t hb_translate_long(int64_t g, int64_t k, int64_t B, int64_t S, int64_t W, int64_t sink,
                          const int64_t *rid, const int64_t *lens, const int32_t *pos,
                          void *pos_slot, int wide, int32_t *slot_row, void *lru,
                          int64_t *newest_pos, int32_t *out, int64_t *src, int64_t *dst,
                          int64_t *counts, uint8_t *mark, void *held, int32_t *cur,
                          int32_t *cand, int64_t *miss_flat, void *miss_slot, int64_t *fresh) {
    if (wide)
        return translate(g, k, B, S, W, sink, rid, lens, pos, pos_slot, slot_row, lru, newest_pos,
                         out, src, dst, counts, mark, held, cur, cand, miss_flat, miss_slot, fresh, 1);
    return translate(g, k, B, S, W, sink, rid, lens, pos, pos_slot, slot_row, lru, newest_pos,
                     out, src, dst, counts, mark, held, cur, cand, miss_flat, miss_slot, fresh, 0);
}

/* One row of positions (from entry `at` of pos, int64 if is64, else int32): 1 if one is not -1 or
   in [0, L); its int32 copy to pos32 and its largest (-1 for none) to *top. `is64` is a constant
   in each of the two copies. */
static inline __attribute__((always_inline)) int check_row(const void *pos, const int is64, int64_t at,
                                                           int64_t k, int64_t L, int32_t *pos32,
                                                           int64_t *top) {
    int bad = 0;
    int64_t largest = -1;
    for (int64_t t = 0; t < k; t++) {
        const int64_t v = is64 ? ((const int64_t *)pos)[at + t] : ((const int32_t *)pos)[at + t];
        bad |= (v < -1) | (v >= L);
        largest = v > largest ? v : largest;
        pos32[t] = (int32_t)v;
    }
    *top = largest;
    return bad;
}

/* A translate's arguments checked in one pass: 0 if valid, else 1 (the caller's tensor code then
   finds and names the offender). Valid: rid in [0, R) and distinct, lens in [1, S], positions -1
   or in [0, lens[i]). Valid, it also writes pos32 (the positions as int32), row_max (each row's
   largest, -1 for none) and facts: [0] the rows with lens <= B (short requests), [1] 1 if a
   lens is below its request's last one (a rollback). pos: [n, k] int64 if is64, else int32.
   seen: R bytes, all 0, and left so. */
int hb_check(int64_t n, int64_t k, int64_t R, int64_t S, int64_t B, const int64_t *rid,
             const int64_t *lens, const void *pos, int is64, const int64_t *last_len,
             int32_t *pos32, int64_t *row_max, int64_t *facts, uint8_t *seen) {
    int bad = 0;
    int64_t i = 0;
    for (; i < n; i++) {
        const int64_t r = rid[i];
        if (r < 0 || r >= R || seen[r]) {
            bad = 1;
            break;
        }
        seen[r] = 1;
    }
    for (int64_t j = 0; j < i; j++)
        seen[rid[j]] = 0;
    if (bad)
        return 1;
    int64_t n_short = 0, rollback = 0;
    for (i = 0; i < n; i++) {
        const int64_t L = lens[i];
        if (L < 1 || L > S)
            return 1;
        n_short += L <= B;
        rollback |= L < last_len[rid[i]];
        int64_t top = -1;
        if (is64 ? check_row(pos, 1, i * k, k, L, pos32 + i * k, &top)
                 : check_row(pos, 0, i * k, k, L, pos32 + i * k, &top))
            return 1;
        row_max[i] = top;
    }
    facts[0] = n_short;
    facts[1] = rollback;
    return 0;
}
