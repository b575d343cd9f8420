/* dequantize_kv_fp8 on the CPU in one pass over each 656-byte FP8 row (kernels_bridge/fp8.py).

   The same bits as fp8.py's exponent path, element by element: an e4m3 byte's sign and 7
   magnitude bits moved into a float's sign, low exponent and top mantissa bits read as the
   code's value times 2**-120; times 2**(e + 120) for the tile's scale 2**e gives code * 2**e,
   rounded once (round to nearest even into bf16). Rows it cannot take so, a scale that is not a
   power of two 2**e with -126 <= e <= 7 or a NaN code (none in a cache the quantizer wrote),
   stop it: it returns how many rows it wrote, and fp8.py's tensor code does the rest. The
   caller checks that denormals are not flushed, which the bit trick needs. */
#include <stdint.h>
#include <string.h>

#define D_NOPE 512
#define SCALES_AT 512
#define ROPE_AT 528
#define D_ROPE 64
#define D_QK 576

/* A code's sign and 7 magnitude bits in a float's bits: sign-extended times 16 (the sign fills the
   bits above), then only the sign and those 7 bits kept, in the top half of the float. */
static inline float code_bits(int8_t code) {
    const uint32_t bits = ((uint32_t)(uint16_t)((int16_t)code * 16) & 0x87F0u) << 16;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static void unpack_tile_f32(const int8_t *codes, float factor, uint32_t *out) {
    for (int c = 0; c < 128; c++) {
        const float product = code_bits(codes[c]) * factor;
        memcpy(out + c, &product, sizeof product);
    }
}

static void unpack_tile_bf16(const int8_t *codes, float factor, uint16_t *out) {
    for (int c = 0; c < 128; c++) {
        const float product = code_bits(codes[c]) * factor;
        uint32_t u;
        memcpy(&u, &product, sizeof u);
        out[c] = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);  /* round to nearest even */
    }
}

/* x86-64: compiled twice, for AVX2 and for the baseline, the loader picking the one the CPU runs
   (AVX2 vectors hold twice the floats) */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__GLIBC__)  /* clones need glibc's ifunc */
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* rows: n rows of 656 bytes, row_stride bytes apart; out: [n, 576] bf16 (out_f32 == 0) or
   float32, contiguous. */
VECTOR_CLONES int64_t hb_unpack_fp8(int64_t n, const uint8_t *rows, int64_t row_stride, void *out, int out_f32) {
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *row = rows + i * row_stride;
        uint32_t scale[4];
        memcpy(scale, row + SCALES_AT, sizeof scale);
        for (int t = 0; t < 4; t++) {
            const uint32_t magnitude = scale[t] & 0x7FFFFFFFu;
            if (magnitude < (1u << 23) || magnitude > ((127u + 7u) << 23) || (magnitude & 0x7FFFFFu))
                return i;
        }
        int nan = 0;
        for (int c = 0; c < D_NOPE; c++)
            nan |= (row[c] & 0x7F) == 0x7F;
        if (nan)
            return i;
        for (int t = 0; t < 4; t++) {
            const uint32_t factor_bits = scale[t] + (120u << 23);  /* 2**(e + 120), sign kept */
            float factor;
            memcpy(&factor, &factor_bits, sizeof factor);
            const int8_t *codes = (const int8_t *)row + t * 128;
            if (out_f32)  /* two loops, each without a branch inside, so that both vectorise */
                unpack_tile_f32(codes, factor, (uint32_t *)out + i * D_QK + t * 128);
            else
                unpack_tile_bf16(codes, factor, (uint16_t *)out + i * D_QK + t * 128);
        }
        if (out_f32) {  /* the bf16 RoPE dims, widened */
            uint16_t rope[D_ROPE];
            memcpy(rope, row + ROPE_AT, sizeof rope);
            for (int c = 0; c < D_ROPE; c++)
                ((uint32_t *)out)[i * D_QK + D_NOPE + c] = (uint32_t)rope[c] << 16;
        } else {
            memcpy((uint16_t *)out + i * D_QK + D_NOPE, row + ROPE_AT, D_ROPE * 2);
        }
    }
    return n;
}
