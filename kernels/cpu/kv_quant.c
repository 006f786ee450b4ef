/* kv_quant.c - the compressed paged KV store (kv_quant.h): element codecs,
 * KIVI block quantization, residual slots for blocks being filled, block
 * ops, and paged attention over compressed blocks.
 *
 * Residual slot life (scaled formats):
 *
 *   write at a block with no slot  -> take a slot (steal + flush the least
 *                                     recently written one if none is free;
 *                                     dequantize the block's codes into it
 *                                     unless this is its first row)
 *   write of the block's last row  -> quantize that layer from the slot;
 *                                     after the last layer, free the slot
 *   COPY / SWAP_*                  -> codes copied; the slot (if any) copied
 *                                     to a slot of the destination block
 *   DROP / DROP_SWAP               -> the slot is freed
 *
 * Attention at layer l reads a block's residual rows when it holds a slot
 * whose layer l is not yet quantized, and its codes otherwise.
 */
#define LOG_MODULE "kvq"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "kernels/cpu/kn_int.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/kv_slots.h"
#include "kernels/cpu/kv_tq.h"
#include "kernels/kn_shared.h"

/* kn_kvq_group_params() takes the scaled formats by these numbers. */
_Static_assert(KN_KVQ_FP8 == KN_KQ_FP8 && KN_KVQ_INT8 == KN_KQ_INT8 && KN_KVQ_INT4 == KN_KQ_INT4,
               "kn_kvq_fmt_t and KN_KQ_* number the scaled formats alike");

#define KVQ_CHUNK 16 /* rows of one block read per softmax update */
#define KVQ_GROUP 8  /* query heads per KV head handled at once */

/* ---- element codecs ------------------------------------------------------ */

static inline uint32_t
f2u(float x)
{
    uint32_t u;

    memcpy(&u, &x, 4);
    return u;
}

static inline float
u2f(uint32_t u)
{
    float x;

    memcpy(&x, &u, 4);
    return x;
}

uint16_t
kn_f32_to_f16(float x)
{
    uint32_t u = f2u(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;

    if (a >= 0x7f800000u) { /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0));
    }
    if (a >= 0x477ff000u) { /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (a < 0x38800000u) { /* below 2^-14: subnormal half */
        /* Adding 0.5 makes the FPU round the mantissa at 2^-24 for us. */
        float f = u2f(a) + 0.5f;

        return (uint16_t)(sign | (f2u(f) - 0x3f000000u));
    }
    uint32_t mant_odd = (a >> 13) & 1u;

    a += 0xc8000fffu + mant_odd; /* rebias exponent, round to nearest even */
    return (uint16_t)(sign | (a >> 13));
}

float
kn_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;

    if (em >= 0x7c00u) {
        return u2f(sign | 0x7f800000u | ((uint32_t)(em & 0x3ffu) << 13));
    }
    if (em < 0x400u) { /* zero or subnormal: em * 2^-24 */
        float f = (float)em * 5.9604644775390625e-8f;

        return sign ? -f : f;
    }
    return u2f(sign | ((em << 13) + 0x38000000u));
}

uint16_t
kn_f32_to_bf16(float x)
{
    uint32_t u = f2u(x);

    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float
kn_bf16_to_f32(uint16_t h)
{
    return u2f((uint32_t)h << 16);
}

static float kvq_e4m3_lut[256];
static pthread_once_t kvq_once = PTHREAD_ONCE_INIT;

static float
e4m3_decode(uint8_t v)
{
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float f;

    if (e == 15 && m == 7) {
        return NAN;
    }
    f = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return s ? -f : f;
}

static void
kvq_init_tables(void)
{
    for (int i = 0; i < 256; i++) {
        kvq_e4m3_lut[i] = e4m3_decode((uint8_t)i);
    }
}

float
kn_e4m3_to_f32(uint8_t v)
{
    pthread_once(&kvq_once, kvq_init_tables);
    return kvq_e4m3_lut[v];
}

uint8_t
kn_f32_to_e4m3(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    int e;

    if (isnan(x)) {
        return 0x7f;
    }
    if (a >= 448.0f) {
        return sign | 0x7e;
    }
    if (a < 0.015625f) { /* below 2^-6: subnormal steps of 2^-9 */
        /* nearbyintf rounds half to even; code 8 is the smallest normal. */
        return sign | (uint8_t)nearbyintf(a * 512.0f);
    }
    (void)frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    e -= 1;              /* a = (1 + m/8) * 2^e */
    int m = (int)nearbyintf((ldexpf(a, -e) - 1.0f) * 8.0f);

    if (m == 8) {
        m = 0;
        e++;
    }
    int code = ((e + 7) << 3) | m;

    return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

/* ---- layout -------------------------------------------------------------- */

const char *
kn_kvq_fmt_name(kn_kvq_fmt_t fmt)
{
    static const char *const names[] = {"f32",  "f16",  "bf16", "fp8_e4m3",
                                        "int8", "int4", "tq3",  "tq4"};

    return (unsigned)fmt < 8 ? names[fmt] : "?";
}

int
kn_kvq_tq_bits(kn_kvq_fmt_t fmt)
{
    return fmt == KN_KVQ_TQ3 ? 3 : fmt == KN_KVQ_TQ4 ? 4 : 0;
}

int
kn_kvq_scaled(kn_kvq_fmt_t fmt)
{
    return fmt == KN_KVQ_FP8 || fmt == KN_KVQ_INT8 || fmt == KN_KVQ_INT4;
}

/* f16 values of meta per group: scale, plus a zero point for integers. */
static int
meta_per_group(kn_kvq_fmt_t fmt)
{
    return fmt == KN_KVQ_FP8 ? 1 : (fmt == KN_KVQ_INT8 || fmt == KN_KVQ_INT4) ? 2 : 0;
}

int
kn_kvq_layout_init(kn_kvq_layout_t *out, kn_kvq_fmt_t fmt, int32_t n_kv_heads, int32_t block_size,
                   int32_t head_dim, char *err, size_t errlen)
{
    kn_kvq_layout_t L;
    size_t elems;

    if (n_kv_heads <= 0 || block_size <= 0 || head_dim <= 0 || (unsigned)fmt > KN_KVQ_TQ4) {
        snprintf(err, errlen, "bad KV block shape");
        return ST_EINVAL;
    }
    if (head_dim % 2 != 0) {
        snprintf(err, errlen, "head_dim %d is odd", head_dim);
        return ST_EUNSUPPORTED;
    }
    if (fmt == KN_KVQ_INT4 && head_dim % 8 != 0) {
        snprintf(err, errlen,
                 "int4 KV packs 8 channels per 32-bit word: head_dim %d is not a multiple of 8",
                 head_dim);
        return ST_EUNSUPPORTED;
    }
    if (head_dim > KN_ATTN_MAX_HEAD_DIM) {
        snprintf(err, errlen, "head_dim %d exceeds %d", head_dim, KN_ATTN_MAX_HEAD_DIM);
        return ST_EUNSUPPORTED;
    }
    memset(&L, 0, sizeof(L));
    L.fmt = fmt;
    L.n_kv_heads = n_kv_heads;
    L.block_size = block_size;
    L.head_dim = head_dim;
    elems = (size_t)n_kv_heads * block_size * head_dim;
    switch (fmt) {
    case KN_KVQ_F32:
        L.data_bytes = elems * 4;
        break;
    case KN_KVQ_F16:
    case KN_KVQ_BF16:
        L.data_bytes = elems * 2;
        break;
    case KN_KVQ_FP8:
    case KN_KVQ_INT8:
        L.data_bytes = elems;
        break;
    case KN_KVQ_INT4:
        L.data_bytes = elems / 2;
        break;
    case KN_KVQ_TQ3:
    case KN_KVQ_TQ4: { /* rows of kernels/kn_tq.h, no meta */
        int32_t kr = kn_tq_row_size(kn_kvq_tq_bits(fmt), 0, head_dim, err, errlen);
        int32_t vr = kn_tq_row_size(kn_kvq_tq_bits(fmt), 1, head_dim, err, errlen);

        if (kr == 0) {
            return ST_EUNSUPPORTED;
        }
        L.k_stride = ((size_t)n_kv_heads * block_size * kr + 15) & ~(size_t)15;
        L.v_stride = ((size_t)n_kv_heads * block_size * vr + 15) & ~(size_t)15;
        L.data_bytes = L.k_stride; /* the larger kind's rows */
        *out = L;
        return ST_OK;
    }
    }
    L.k_meta = sizeof(uint16_t) * (size_t)meta_per_group(fmt) * n_kv_heads * head_dim;
    L.v_meta = sizeof(uint16_t) * (size_t)meta_per_group(fmt) * n_kv_heads * block_size;
    L.k_stride = (L.data_bytes + L.k_meta + 15) & ~(size_t)15;
    L.v_stride = (L.data_bytes + L.v_meta + 15) & ~(size_t)15;
    *out = L;
    return ST_OK;
}

/* ---- block quantization ---------------------------------------------------- */

/* Code of element (h, r, d) in a block's data: byte offset (or nibble). */
static inline size_t
el_index(const kn_kvq_layout_t *L, int32_t h, int32_t r, int32_t d)
{
    return (((size_t)h * L->block_size) + r) * L->head_dim + d;
}

static inline void
put_code(const kn_kvq_layout_t *L, uint8_t *data, size_t i, float x, float inv, float zero)
{
    switch (L->fmt) {
    case KN_KVQ_F32:
        memcpy(data + i * 4, &x, 4);
        break;
    case KN_KVQ_F16: {
        uint16_t h = kn_f32_to_f16(x);
        memcpy(data + i * 2, &h, 2);
        break;
    }
    case KN_KVQ_BF16: {
        uint16_t h = kn_f32_to_bf16(x);
        memcpy(data + i * 2, &h, 2);
        break;
    }
    case KN_KVQ_FP8:
        data[i] = kn_f32_to_e4m3(x * inv);
        break;
    case KN_KVQ_INT8: {
        float q = nearbyintf((x - zero) * inv);
        data[i] = (uint8_t)(q < 0.0f ? 0.0f : q > 255.0f ? 255.0f : q);
        break;
    }
    case KN_KVQ_INT4: {
        float q = nearbyintf((x - zero) * inv);
        uint8_t c = (uint8_t)(q < 0.0f ? 0.0f : q > 15.0f ? 15.0f : q);
        /* Row byte d % (hd / 2): channel d in the low nibble when d < hd / 2,
         * in the high nibble otherwise (the two RoPE halves share bytes). */
        size_t half = (size_t)L->head_dim / 2, d = i % (size_t)L->head_dim;
        uint8_t *b = data + (i - d) / 2 + d % half;

        *b = d >= half ? (uint8_t)((*b & 0x0f) | (c << 4)) : (uint8_t)((*b & 0xf0) | c);
        break;
    }
    case KN_KVQ_TQ3:
    case KN_KVQ_TQ4: /* whole rows only (kv_tq.c) */
        break;
    }
}

void
kn_kvq_quantize_block(const kn_kvq_layout_t *L, int kind, const float *src, int32_t n_rows,
                      uint8_t *dst)
{
    const int32_t bs = L->block_size, hd = L->head_dim, nkv = L->n_kv_heads;
    const int mg = meta_per_group(L->fmt);
    uint16_t *meta = (uint16_t *)(dst + L->data_bytes);

    if (n_rows > bs) {
        n_rows = bs;
    }
    if (!kn_kvq_scaled(L->fmt)) {
        for (int32_t h = 0; h < nkv; h++) {
            for (int32_t r = 0; r < bs; r++) {
                for (int32_t d = 0; d < hd; d++) {
                    float x = r < n_rows ? src[el_index(L, h, r, d)] : 0.0f;

                    put_code(L, dst, el_index(L, h, r, d), x, 1.0f, 0.0f);
                }
            }
        }
        return;
    }
    memset(dst, 0, L->data_bytes);
    if (kind == 0) {
        /* Keys: one group per (head, channel) over the block's rows. */
        size_t ng = (size_t)nkv * hd;

        for (int32_t h = 0; h < nkv; h++) {
            for (int32_t d = 0; d < hd; d++) {
                float lo = INFINITY, hi = -INFINITY, inv, zero;
                uint16_t sc_h = 0, z_h = 0;

                for (int32_t r = 0; r < n_rows; r++) {
                    float x = src[el_index(L, h, r, d)];

                    lo = fminf(lo, x);
                    hi = fmaxf(hi, x);
                }
                if (n_rows == 0) {
                    lo = hi = 0.0f;
                }
                kn_kvq_group_params((int32_t)L->fmt, lo, hi, &sc_h, &z_h, &inv, &zero);
                meta[(size_t)h * hd + d] = sc_h;
                if (mg == 2) {
                    meta[ng + (size_t)h * hd + d] = z_h;
                }
                for (int32_t r = 0; r < n_rows; r++) {
                    put_code(L, dst, el_index(L, h, r, d), src[el_index(L, h, r, d)], inv, zero);
                }
            }
        }
    } else {
        /* Values: one group per (head, row) over head_dim. */
        size_t ng = (size_t)nkv * bs;

        for (int32_t h = 0; h < nkv; h++) {
            for (int32_t r = 0; r < bs; r++) {
                float lo = INFINITY, hi = -INFINITY, inv, zero;
                uint16_t sc_h = 0, z_h = 0;
                const float *row = src + el_index(L, h, r, 0);

                if (r < n_rows) {
                    for (int32_t d = 0; d < hd; d++) {
                        lo = fminf(lo, row[d]);
                        hi = fmaxf(hi, row[d]);
                    }
                } else {
                    lo = hi = 0.0f;
                }
                kn_kvq_group_params((int32_t)L->fmt, lo, hi, &sc_h, &z_h, &inv, &zero);
                meta[(size_t)h * bs + r] = sc_h;
                if (mg == 2) {
                    meta[ng + (size_t)h * bs + r] = z_h;
                }
                if (r < n_rows) {
                    for (int32_t d = 0; d < hd; d++) {
                        put_code(L, dst, el_index(L, h, r, d), row[d], inv, zero);
                    }
                }
            }
        }
    }
}

/* Hot path: n rows of head h into out (n, hd). Written for the vectorizer:
 * per-row or per-channel scale and zero are loaded once, the inner loop is
 * a multiply-add over codes. */
void
kn_kvq_dequant_rows(const kn_kvq_layout_t *L, int kind, const uint8_t *blk, int32_t h, int32_t r0,
                    int32_t n, float *out)
{
    const int32_t bs = L->block_size, hd = L->head_dim;
    const uint16_t *meta = (const uint16_t *)(blk + L->data_bytes);
    const int mg = meta_per_group(L->fmt);
    float sc[KN_ATTN_MAX_HEAD_DIM], zr[KN_ATTN_MAX_HEAD_DIM];

    switch (L->fmt) {
    case KN_KVQ_F32:
        memcpy(out, blk + el_index(L, h, r0, 0) * 4, sizeof(float) * (size_t)n * hd);
        return;
    case KN_KVQ_F16: {
        const uint16_t *p = (const uint16_t *)blk + el_index(L, h, r0, 0);

        for (size_t i = 0; i < (size_t)n * hd; i++) {
            out[i] = kn_f16_to_f32(p[i]);
        }
        return;
    }
    case KN_KVQ_BF16: {
        const uint16_t *p = (const uint16_t *)blk + el_index(L, h, r0, 0);

#pragma omp simd
        for (size_t i = 0; i < (size_t)n * hd; i++) {
            out[i] = u2f((uint32_t)p[i] << 16);
        }
        return;
    }
    default:
        break;
    }
    pthread_once(&kvq_once, kvq_init_tables);
    if (kind == 0) {
        size_t ng = (size_t)L->n_kv_heads * hd;

        for (int32_t d = 0; d < hd; d++) {
            sc[d] = kn_f16_to_f32(meta[(size_t)h * hd + d]);
            zr[d] = mg == 2 ? kn_f16_to_f32(meta[ng + (size_t)h * hd + d]) : 0.0f;
        }
    } else {
        size_t ng = (size_t)L->n_kv_heads * bs;

        for (int32_t r = 0; r < n; r++) {
            sc[r] = kn_f16_to_f32(meta[(size_t)h * bs + r0 + r]);
            zr[r] = mg == 2 ? kn_f16_to_f32(meta[ng + (size_t)h * bs + r0 + r]) : 0.0f;
        }
    }
    for (int32_t r = 0; r < n; r++) {
        float *o = out + (size_t)r * hd;
        size_t base = el_index(L, h, r0 + r, 0);

        if (L->fmt == KN_KVQ_INT4) {
            const uint8_t *c = blk + base / 2;
            const int32_t hh = hd / 2;

            if (kind == 0) {
#pragma omp simd
                for (int32_t i = 0; i < hh; i++) {
                    o[i] = (float)(c[i] & 15) * sc[i] + zr[i];
                    o[i + hh] = (float)(c[i] >> 4) * sc[i + hh] + zr[i + hh];
                }
            } else {
                float s = sc[r], z = zr[r];

#pragma omp simd
                for (int32_t i = 0; i < hh; i++) {
                    o[i] = (float)(c[i] & 15) * s + z;
                    o[i + hh] = (float)(c[i] >> 4) * s + z;
                }
            }
        } else if (L->fmt == KN_KVQ_INT8) {
            const uint8_t *c = blk + base;

            if (kind == 0) {
#pragma omp simd
                for (int32_t d = 0; d < hd; d++) {
                    o[d] = (float)c[d] * sc[d] + zr[d];
                }
            } else {
                float s = sc[r], z = zr[r];

#pragma omp simd
                for (int32_t d = 0; d < hd; d++) {
                    o[d] = (float)c[d] * s + z;
                }
            }
        } else { /* fp8 */
            const uint8_t *c = blk + base;

            if (kind == 0) {
                for (int32_t d = 0; d < hd; d++) {
                    o[d] = kvq_e4m3_lut[c[d]] * sc[d];
                }
            } else {
                float s = sc[r];

                for (int32_t d = 0; d < hd; d++) {
                    o[d] = kvq_e4m3_lut[c[d]] * s;
                }
            }
        }
    }
}

/* ---- the store --------------------------------------------------------------- */

enum { KVQ_DEV = 0, KVQ_SWAP = 1 };

typedef struct kvq_tier {
    uint8_t *pool;  /* [n_layers][2][n_blocks][stride of the kind] */
    size_t len;     /* bytes mapped */
    int32_t n_blocks;
    int32_t *shift;   /* [n_blocks] pending key re-rotation of quantized codes */
    uint8_t *qv;      /* [n_blocks] codes hold quantized rows (re-take dequantizes) */
    /* Residual slots: each [n_layers][2][n_kv][bs][hd] f32. */
    float *res;
    size_t res_len;
    kn_kvslots_t sl;  /* which slot holds which block (no slots: unscaled) */
    int32_t *slot_nq; /* [sl.n_slots] layers quantized since the block filled */
} kvq_tier_t;

struct kn_kvq_store {
    kn_kvq_layout_t L;
    int32_t n_layers;
    size_t slot_floats; /* one slot */
    size_t lk_floats;   /* one layer and kind of a slot: n_kv * bs * hd */
    kvq_tier_t tier[2];
    float *inv_freq; /* (hd / 2) for SHIFT, NULL until set */
    kn_tq_t *tq;     /* tq formats: rotations and sketches, else NULL */
    uint64_t stamp;
    kn_kvq_stats_t st;
};

static void *
kvq_map(size_t len)
{
    /* MAP_POPULATE: committed at creation, not page by page under load. */
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                   -1, 0);

    return p == MAP_FAILED ? NULL : p;
}

static void
tier_fini(kvq_tier_t *t)
{
    if (t->pool != NULL) {
        munmap(t->pool, t->len);
    }
    if (t->res != NULL) {
        munmap(t->res, t->res_len);
    }
    kn_kvslots_fini(&t->sl);
    free(t->shift);
    free(t->qv);
    free(t->slot_nq);
}

void
kn_kvq_store_destroy(kn_kvq_store_t *st)
{
    if (st == NULL) {
        return;
    }
    tier_fini(&st->tier[0]);
    tier_fini(&st->tier[1]);
    free(st->inv_freq);
    kn_tq_destroy(st->tq);
    free(st);
}

static int
tier_init(kn_kvq_store_t *st, kvq_tier_t *t, int32_t n_blocks, int32_t n_slots, char *err,
          size_t errlen)
{
    const kn_kvq_layout_t *L = &st->L;

    t->n_blocks = n_blocks;
    if (n_blocks == 0) {
        return ST_OK;
    }
    t->len = (size_t)st->n_layers * (size_t)n_blocks * (L->k_stride + L->v_stride);
    t->pool = kvq_map(t->len);
    if (t->pool == NULL) {
        snprintf(err, errlen, "cannot map a %zu MiB KV pool", t->len >> 20);
        return ST_ENOMEM;
    }
    t->qv = xcalloc((size_t)n_blocks, 1);
    t->shift = xcalloc((size_t)n_blocks, sizeof(int32_t));
    if (!kn_kvq_scaled(L->fmt)) {
        kn_kvslots_init(&t->sl, n_blocks, 0); /* every block: no slot */
        return ST_OK;
    }
    n_slots = n_slots < n_blocks ? n_slots : n_blocks;
    if (n_slots < 1) {
        n_slots = 1;
    }
    t->res_len = sizeof(float) * st->slot_floats * (size_t)n_slots;
    t->res = kvq_map(t->res_len);
    if (t->res == NULL) {
        snprintf(err, errlen, "cannot map %zu MiB of KV residual slots", t->res_len >> 20);
        return ST_ENOMEM;
    }
    kn_kvslots_init(&t->sl, n_blocks, n_slots);
    t->slot_nq = xcalloc((size_t)n_slots, sizeof(int32_t));
    return ST_OK;
}

int
kn_kvq_store_create(const kn_kvq_layout_t *L, int32_t n_layers, int32_t num_blocks,
                    int32_t swap_blocks, int32_t res_slots, kn_kvq_store_t **out, char *err,
                    size_t errlen)
{
    kn_kvq_store_t *st;
    int rc;

    if (n_layers <= 0 || num_blocks < 1 || swap_blocks < 0) {
        snprintf(err, errlen, "bad KV store shape");
        return ST_EINVAL;
    }
    pthread_once(&kvq_once, kvq_init_tables);
    st = xcalloc(1, sizeof(*st));
    st->L = *L;
    st->n_layers = n_layers;
    st->lk_floats = (size_t)L->n_kv_heads * L->block_size * L->head_dim;
    st->slot_floats = 2 * (size_t)n_layers * st->lk_floats;
    if (kn_kvq_tq_bits(L->fmt) != 0) {
        st->tq = kn_tq_create_at(kn_kvq_tq_bits(L->fmt), n_layers, L->n_kv_heads, L->head0,
                                 L->head_dim);
    }
    rc = tier_init(st, &st->tier[KVQ_DEV], num_blocks, res_slots, err, errlen);
    if (rc == ST_OK) {
        rc = tier_init(st, &st->tier[KVQ_SWAP], swap_blocks, res_slots, err, errlen);
    }
    if (rc != ST_OK) {
        kn_kvq_store_destroy(st);
        return rc;
    }
    st->st.slots_dev = st->tier[KVQ_DEV].sl.n_slots;
    st->st.slots_swap = st->tier[KVQ_SWAP].sl.n_slots;
    *out = st;
    return ST_OK;
}

const kn_kvq_layout_t *
kn_kvq_store_layout(const kn_kvq_store_t *st)
{
    return &st->L;
}

void
kn_kvq_store_set_rope(kn_kvq_store_t *st, const float *inv_freq)
{
    size_t half = (size_t)st->L.head_dim / 2;

    if (st->inv_freq == NULL) {
        st->inv_freq = xmalloc(sizeof(float) * half);
    }
    memcpy(st->inv_freq, inv_freq, sizeof(float) * half);
}

void
kn_kvq_rotate_rows(float *rows, int32_t n, int32_t head_dim, const float *inv_freq, int32_t delta)
{
    const int32_t half = head_dim / 2;
    float cs[KN_ATTN_MAX_HEAD_DIM / 2], sn[KN_ATTN_MAX_HEAD_DIM / 2];

    if (delta == 0) {
        return;
    }
    for (int32_t i = 0; i < half; i++) {
        double ang = -(double)delta * (double)inv_freq[i];

        cs[i] = (float)cos(ang);
        sn[i] = (float)sin(ang);
    }
    for (int32_t r = 0; r < n; r++) {
        float *x = rows + (size_t)r * head_dim;

        for (int32_t i = 0; i < half; i++) {
            float a = x[i], b = x[i + half];

            x[i] = a * cs[i] - b * sn[i];
            x[i + half] = b * cs[i] + a * sn[i];
        }
    }
}

size_t
kn_kvq_store_bytes(const kn_kvq_store_t *st, size_t *swap_bytes, size_t *res_bytes)
{
    if (swap_bytes != NULL) {
        *swap_bytes = st->tier[KVQ_SWAP].len;
    }
    if (res_bytes != NULL) {
        *res_bytes = st->tier[KVQ_DEV].res_len + st->tier[KVQ_SWAP].res_len;
    }
    return st->tier[KVQ_DEV].len;
}

void
kn_kvq_store_stats(const kn_kvq_store_t *st, kn_kvq_stats_t *out)
{
    *out = st->st;
    out->slots_dev_used = st->tier[KVQ_DEV].sl.n_slots - st->tier[KVQ_DEV].sl.n_free;
    out->slots_swap_used = st->tier[KVQ_SWAP].sl.n_slots - st->tier[KVQ_SWAP].sl.n_free;
}

static inline uint8_t *
blk_at(const kn_kvq_store_t *st, const kvq_tier_t *t, int32_t layer, int kind, int32_t blk)
{
    const kn_kvq_layout_t *L = &st->L;
    size_t layer_bytes = (size_t)t->n_blocks * (L->k_stride + L->v_stride);
    uint8_t *base = t->pool + (size_t)layer * layer_bytes;

    if (kind == 0) {
        return base + (size_t)blk * L->k_stride;
    }
    return base + (size_t)t->n_blocks * L->k_stride + (size_t)blk * L->v_stride;
}

static inline float *
slot_at(const kn_kvq_store_t *st, const kvq_tier_t *t, int32_t slot, int32_t layer, int kind)
{
    return t->res + (size_t)slot * st->slot_floats + ((size_t)layer * 2 + kind) * st->lk_floats;
}

/* Bytes of one tq row of kind. */
static inline size_t
tq_row(const kn_kvq_layout_t *L, int kind)
{
    return (size_t)kn_tq_row_size(kn_kvq_tq_bits(L->fmt), kind, L->head_dim, NULL, 0);
}

/* Decodes rows [r0, r0 + n) of head h of a tq block into out (n, hd). */
static void
tq_read(const kn_kvq_store_t *st, int32_t layer, int kind, const uint8_t *blk, int32_t h,
        int32_t r0, int32_t n, float *out)
{
    const kn_kvq_layout_t *L = &st->L;

    for (int32_t r = 0; r < n; r++) {
        kn_tq_decode(st->tq, layer, h, kind, blk + ((size_t)h * L->block_size + r0 + r) *
                     tq_row(L, kind), out + (size_t)r * L->head_dim);
    }
}

const uint8_t *
kn_kvq_block_ptr(const kn_kvq_store_t *st, int tier, int32_t layer, int kind, int32_t block)
{
    return blk_at(st, &st->tier[tier], layer, kind, block);
}


/* The block's slot if it still holds rows not yet in codes, else -1 (a
 * slot kept only for this step's own-block queries counts as gone). */
static int32_t
slot_live(const kn_kvq_store_t *st, const kvq_tier_t *t, int32_t blk)
{
    int32_t s = t->sl.slot_of[blk];

    return s >= 0 && t->slot_nq[s] < st->n_layers ? s : -1;
}

int
kn_kvq_block_is_residual(const kn_kvq_store_t *st, int tier, int32_t block)
{
    return slot_live(st, &st->tier[tier], block) >= 0;
}

/* Quantizes every layer of the slot's rows into its block, frees the slot. */
static void
slot_flush(kn_kvq_store_t *st, kvq_tier_t *t, int32_t s)
{
    int32_t blk = t->sl.slot_blk[s];

    for (int32_t l = 0; l < st->n_layers; l++) {
        for (int kind = 0; kind < 2; kind++) {
            kn_kvq_quantize_block(&st->L, kind, slot_at(st, t, s, l, kind),
                                  t->sl.slot_fill[s], blk_at(st, t, l, kind, blk));
        }
    }
    t->qv[blk] = 1;
    t->shift[blk] = 0; /* residual rows were rotated in place */
    kn_kvslots_release(&t->sl, blk);
}

void
kn_kvq_end_step(kn_kvq_store_t *st)
{
    for (int tier = 0; tier < 2; tier++) {
        kvq_tier_t *t = &st->tier[tier];

        for (int32_t i = 0; i < t->sl.n_slots; i++) {
            if (t->sl.slot_blk[i] >= 0 && t->slot_nq[i] >= st->n_layers) {
                kn_kvslots_release(&t->sl, t->sl.slot_blk[i]);
            }
        }
    }
}

/* A slot for blk, flushing the least recently written other slot when
 * none is free. The slot's contents are undefined. */
static int32_t
slot_take(kn_kvq_store_t *st, kvq_tier_t *t, int32_t blk, int32_t avoid)
{
    int32_t s;

    if (t->sl.n_free == 0) {
        kn_kvq_end_step(st); /* slots of blocks quantized this step first */
    }
    if (t->sl.n_free == 0) {
        int32_t victim = kn_kvslots_lru(&t->sl, avoid, UINT64_MAX);

        CHECK(victim >= 0);
        slot_flush(st, t, victim);
        st->st.flushed++;
        LOG_DEBUG("residual slots full: block %d quantized early", t->sl.slot_blk[victim]);
    }
    s = kn_kvslots_take(&t->sl, blk, ++st->stamp);
    t->slot_nq[s] = 0;
    return s;
}

/* A write into blk needs a slot; a block already holding codes starts
 * from them (all rows, every layer). */
static int32_t
slot_for_write(kn_kvq_store_t *st, kvq_tier_t *t, int32_t blk, int32_t layer, int32_t off)
{
    const kn_kvq_layout_t *L = &st->L;
    int32_t s = t->sl.slot_of[blk];

    if (s >= 0) {
        return s;
    }
    s = slot_take(st, t, blk, -1);
    if (t->qv[blk] && (off > 0 || layer > 0)) {
        st->st.requantized++;
        for (int32_t l = 0; l < st->n_layers; l++) {
            for (int kind = 0; kind < 2; kind++) {
                float *dst = slot_at(st, t, s, l, kind);

                for (int32_t h = 0; h < L->n_kv_heads; h++) {
                    float *rows = dst + (size_t)h * L->block_size * L->head_dim;

                    kn_kvq_dequant_rows(L, kind, blk_at(st, t, l, kind, blk), h, 0, L->block_size,
                                        rows);
                    if (kind == 0 && t->shift[blk] != 0) {
                        kn_kvq_rotate_rows(rows, L->block_size, L->head_dim, st->inv_freq,
                                           t->shift[blk]);
                    }
                }
            }
        }
        t->sl.slot_fill[s] = off;
    }
    t->qv[blk] = 0;
    t->shift[blk] = 0;
    return s;
}

void
kn_kvq_write(kn_kvq_store_t *st, int32_t layer, const float *k, const float *v,
             const int32_t *slot, int32_t n_tok)
{
    const kn_kvq_layout_t *L = &st->L;
    const int32_t bs = L->block_size, hd = L->head_dim, nkv = L->n_kv_heads;
    kvq_tier_t *t = &st->tier[KVQ_DEV];

    for (int32_t i = 0; i < n_tok; i++) {
        if (slot[i] < 0) {
            continue;
        }
        int32_t blk = slot[i] / bs, off = slot[i] % bs;
        const float *kr = k + (size_t)i * nkv * hd, *vr = v + (size_t)i * nkv * hd;

        if (st->tq != NULL) {
            uint8_t *kb = blk_at(st, t, layer, 0, blk), *vb = blk_at(st, t, layer, 1, blk);

            for (int32_t h = 0; h < nkv; h++) {
                kn_tq_encode(st->tq, layer, h, 0, kr + (size_t)h * hd,
                             kb + ((size_t)h * bs + off) * tq_row(L, 0));
                kn_tq_encode(st->tq, layer, h, 1, vr + (size_t)h * hd,
                             vb + ((size_t)h * bs + off) * tq_row(L, 1));
            }
            continue;
        }
        if (!kn_kvq_scaled(L->fmt)) {
            uint8_t *kb = blk_at(st, t, layer, 0, blk), *vb = blk_at(st, t, layer, 1, blk);

            for (int32_t h = 0; h < nkv; h++) {
                for (int32_t d = 0; d < hd; d++) {
                    put_code(L, kb, el_index(L, h, off, d), kr[(size_t)h * hd + d], 1.0f, 0.0f);
                    put_code(L, vb, el_index(L, h, off, d), vr[(size_t)h * hd + d], 1.0f, 0.0f);
                }
            }
            continue;
        }
        int32_t s = slot_for_write(st, t, blk, layer, off);
        float *ks = slot_at(st, t, s, layer, 0), *vs = slot_at(st, t, s, layer, 1);

        for (int32_t h = 0; h < nkv; h++) {
            memcpy(ks + el_index(L, h, off, 0), kr + (size_t)h * hd, sizeof(float) * (size_t)hd);
            memcpy(vs + el_index(L, h, off, 0), vr + (size_t)h * hd, sizeof(float) * (size_t)hd);
        }
        if (off + 1 > t->sl.slot_fill[s]) {
            t->sl.slot_fill[s] = off + 1;
        }
        t->sl.slot_used[s] = ++st->stamp;
        if (off == bs - 1) {
            /* The block is full at this layer: quantize it once. */
            kn_kvq_quantize_block(L, 0, ks, bs, blk_at(st, t, layer, 0, blk));
            kn_kvq_quantize_block(L, 1, vs, bs, blk_at(st, t, layer, 1, blk));
            t->slot_nq[s] = layer + 1;
            if (layer == st->n_layers - 1) {
                /* Every layer has codes now; the rows stay readable for
                 * the queries of this block until kn_kvq_end_step(). */
                t->qv[blk] = 1;
                st->st.quantized++;
            }
        }
    }
}

/* The attention task, once per ISA (kv_quant_attn.inc). Clang ignores
 * "#pragma GCC target": it gets the target through "#pragma clang attribute"
 * (as kn_simd.c). */
#define KVQ_SFX(name) name##_generic
#define KVQ_VW 4 /* f32 lanes per vector */
#include "kernels/cpu/kv_quant_attn.inc"
#undef KVQ_SFX
#undef KVQ_VW

#if defined(__x86_64__) || defined(__i386__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#define KVQ_SFX(name) name##_avx2
#define KVQ_VW 8
#include "kernels/cpu/kv_quant_attn.inc"
#undef KVQ_SFX
#undef KVQ_VW
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma")
#endif
#define KVQ_SFX(name) name##_avx512
#define KVQ_VW 16
#include "kernels/cpu/kv_quant_attn.inc"
#undef KVQ_SFX
#undef KVQ_VW
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#define KVQ_HAVE_X86 1
#else
#define KVQ_HAVE_X86 0
#endif

void
kn_kvq_read_rows(const kn_kvq_store_t *st, int32_t layer, int kind, int32_t block, int32_t h,
                 int32_t r0, int32_t n, float *out)
{
    const kvq_tier_t *t = &st->tier[KVQ_DEV];
    int32_t s = t->sl.slot_of[block];

    if (s >= 0 && t->slot_nq[s] <= layer) { /* residual rows */
        memcpy(out, slot_at(st, t, s, layer, kind) + el_index(&st->L, h, r0, 0),
               sizeof(float) * (size_t)n * st->L.head_dim);
        return;
    }
    if (st->tq != NULL) {
        tq_read(st, layer, kind, blk_at(st, t, layer, kind, block), h, r0, n, out);
        return;
    }
    kn_kvq_dequant_rows(&st->L, kind, blk_at(st, t, layer, kind, block), h, r0, n, out);
    if (kind == 0 && t->shift[block] != 0) {
        kn_kvq_rotate_rows(out, n, st->L.head_dim, st->inv_freq, t->shift[block]);
    }
}

/* ---- ops ------------------------------------------------------------------------ */

/* SHIFT of one device block by delta positions (see kn_kvq_ops). */
static void
shift_block(kn_kvq_store_t *st, int32_t blk, int32_t delta)
{
    const kn_kvq_layout_t *L = &st->L;
    kvq_tier_t *t = &st->tier[KVQ_DEV];
    const int32_t bs = L->block_size, hd = L->head_dim;
    float rows[64 * KN_ATTN_MAX_HEAD_DIM];
    int32_t s = slot_live(st, t, blk);

    if (delta == 0) {
        return;
    }
    if (s < 0) {
        kn_kvslots_release(&t->sl, blk); /* a finished block's slot: its codes rule */
    }
    if (kn_kvq_scaled(L->fmt) && s < 0) {
        t->shift[blk] += delta; /* codes stay; reads rotate */
        return;
    }
    for (int32_t l = 0; l < st->n_layers; l++) {
        for (int32_t h = 0; h < L->n_kv_heads; h++) {
            if (s >= 0) {
                float *k = slot_at(st, t, s, l, 0) + el_index(L, h, 0, 0);

                kn_kvq_rotate_rows(k, t->sl.slot_fill[s], hd, st->inv_freq, delta);
                continue;
            }
            /* f32 / f16 / bf16: rotate the stored rows (re-rounded to the
             * format), 64 rows at a time; tq re-encodes them. */
            uint8_t *kb = blk_at(st, t, l, 0, blk);

            if (st->tq != NULL) {
                for (int32_t r = 0; r < bs; r++) {
                    uint8_t *row = kb + ((size_t)h * bs + r) * tq_row(L, 0);

                    kn_tq_decode(st->tq, l, h, 0, row, rows);
                    kn_kvq_rotate_rows(rows, 1, hd, st->inv_freq, delta);
                    kn_tq_encode(st->tq, l, h, 0, rows, row);
                }
                st->st.requantized += h == 0 && l == 0;
                continue;
            }

            for (int32_t r0 = 0; r0 < bs; r0 += 64) {
                int32_t n = bs - r0 < 64 ? bs - r0 : 64;

                kn_kvq_dequant_rows(L, 0, kb, h, r0, n, rows);
                kn_kvq_rotate_rows(rows, n, hd, st->inv_freq, delta);
                for (int32_t r = 0; r < n; r++) {
                    for (int32_t d = 0; d < hd; d++) {
                        put_code(L, kb, el_index(L, h, r0 + r, d), rows[(size_t)r * hd + d], 1.0f,
                                 0.0f);
                    }
                }
            }
        }
    }
}

static void
copy_block(kn_kvq_store_t *st, kvq_tier_t *ts, int32_t src, kvq_tier_t *td, int32_t dst)
{
    const kn_kvq_layout_t *L = &st->L;

    for (int32_t l = 0; l < st->n_layers; l++) {
        memmove(blk_at(st, td, l, 0, dst), blk_at(st, ts, l, 0, src), L->k_stride);
        memmove(blk_at(st, td, l, 1, dst), blk_at(st, ts, l, 1, src), L->v_stride);
    }
    td->qv[dst] = ts->qv[src];
    td->shift[dst] = ts->shift[src];
    if (!kn_kvq_scaled(L->fmt)) {
        return;
    }
    int32_t ss = slot_live(st, ts, src);

    if (ss < 0) {
        kn_kvslots_release(&td->sl, dst);
        return;
    }
    int32_t ds = td->sl.slot_of[dst];

    if (ds < 0) {
        ds = slot_take(st, td, dst, td == ts ? ss : -1);
        ss = ts->sl.slot_of[src]; /* unchanged: avoid kept it */
    }
    memcpy(td->res + (size_t)ds * st->slot_floats, ts->res + (size_t)ss * st->slot_floats,
           sizeof(float) * st->slot_floats);
    td->sl.slot_fill[ds] = ts->sl.slot_fill[ss];
    td->slot_nq[ds] = ts->slot_nq[ss];
}

int
kn_kvq_ops(kn_kvq_store_t *st, const kv_op_t *ops, int32_t n_ops)
{
    kvq_tier_t *dev = &st->tier[KVQ_DEV], *swp = &st->tier[KVQ_SWAP];

    for (int32_t i = 0; i < n_ops; i++) {
        const kv_op_t *o = &ops[i];

        switch (o->kind) {
        case KV_OP_COPY:
            copy_block(st, dev, o->src, dev, o->dst);
            break;
        case KV_OP_SWAP_OUT:
            if (swp->n_blocks == 0) {
                return ST_EINVAL;
            }
            copy_block(st, dev, o->src, swp, o->dst);
            break;
        case KV_OP_SWAP_IN:
            if (swp->n_blocks == 0) {
                return ST_EINVAL;
            }
            copy_block(st, swp, o->src, dev, o->dst);
            break;
        case KV_OP_DROP:
            kn_kvslots_release(&dev->sl, o->src);
            dev->qv[o->src] = 0;
            dev->shift[o->src] = 0;
            break;
        case KV_OP_SHIFT:
            if (st->inv_freq == NULL || o->dst < 0) {
                return ST_EINVAL;
            }
            shift_block(st, o->src, o->dst);
            break;
        case KV_OP_DROP_SWAP:
            if (swp->n_blocks == 0) {
                return ST_EINVAL;
            }
            kn_kvslots_release(&swp->sl, o->src);
            swp->qv[o->src] = 0;
            swp->shift[o->src] = 0;
            break;
        default:
            return ST_EINVAL;
        }
    }
    return ST_OK;
}

/* ---- attention ------------------------------------------------------------------ */

typedef struct kvq_attn_job {
    const kn_kvq_store_t *st;
    int32_t layer;
    const kn_attn_args_t *a;
} kvq_attn_job_t;

static void
kvq_attn_chunk(void *arg, int i, int n_tasks)
{
    const kvq_attn_job_t *j = arg;
    const kn_attn_args_t *a = j->a;
    int32_t t = a->n_tok - 1 - i / a->n_kv_heads;
    int32_t s = kn_seq_of(a->query_start, a->n_seqs, t);

    (void)n_tasks;
    if (j->st->tq != NULL) {
        const kn_kvq_store_t *st = j->st;
        const kvq_tier_t *tr = &st->tier[KVQ_DEV];

        kn__tq_attn_task(st->tq, j->layer, blk_at(st, tr, j->layer, 0, 0), st->L.k_stride,
                         blk_at(st, tr, j->layer, 1, 0), st->L.v_stride, a, t, s,
                         i % a->n_kv_heads);
        return;
    }
#if KVQ_HAVE_X86
    if (kn_cpu_isa() >= KN_ISA_AVX512) {
        kvq_attn_task_avx512(j->st, j->layer, a, t, s, i % a->n_kv_heads);
        return;
    }
    if (kn_cpu_isa() == KN_ISA_AVX2) {
        kvq_attn_task_avx2(j->st, j->layer, a, t, s, i % a->n_kv_heads);
        return;
    }
#endif
    kvq_attn_task_generic(j->st, j->layer, a, t, s, i % a->n_kv_heads);
}

void
kn_kvq_attention(const kn_kvq_store_t *st, int32_t layer, const kn_attn_args_t *a)
{
    kvq_attn_job_t j = {.st = st, .layer = layer, .a = a};
    int32_t n_tasks = a->n_tok * a->n_kv_heads;
    long work = 0;

    for (int32_t s = 0; s < a->n_seqs; s++) {
        work += (long)(a->query_start[s + 1] - a->query_start[s]) * a->context_len[s];
    }
    work *= (long)a->n_heads * a->head_dim;
    if (work < (1L << 16) || kn_cpu_threads() <= 1 || n_tasks < 2) {
        for (int32_t i = 0; i < n_tasks; i++) {
            kvq_attn_chunk(&j, i, n_tasks);
        }
        return;
    }
    kn__pool_run(kn_cpu_threads(), n_tasks, kvq_attn_chunk, &j);
}
