/* kn_bf16m.c - the bf16 forms of the activations that BF16 weights read
 * (kn_act_t bh / bl / br), and the reference of --matmul-precision medium.
 *
 * DESIGN. High precision (the default) multiplies BF16 weights by the f32
 * activations (the FMA tile) or, on AVX512-BF16 for rows up to
 * KN_BF16_DP_COLS, by the two-term split x = bh + bl with vdpbf16ps: f32
 * accuracy. Medium (kn_act_t bf16_medium, `--matmul-precision medium`)
 * rounds each activation to one bf16 term, bh = bf16(x) (nearest even), as
 * llama.cpp and vLLM's bfloat16 do: one vdpbf16ps per 32 columns instead
 * of two. Every ISA level honours it, so results agree across levels: the
 * levels without AVX512-BF16 run their FMA tile on br, the same rounded
 * values as f32, where each product bf16 x bf16 (8-bit significands) is
 * exact in f32, as it is inside vdpbf16ps. What separates two levels is
 * then the order and f32 rounding of the sums, and vdpbf16ps's flushing
 * of subnormal inputs and results (kn_matmul_w_ref_medium's contract).
 * The cost in accuracy: up to 2^-9 relative per activation, 0.03-0.14 in
 * log-prob on issue 13's fidelity files (tests/reference/
 * compare_bf16_medium.py bounds it against the numpy reference rounding
 * the same way).
 * Medium on AVX512-BF16 takes the vdpbf16ps tile at every width
 * (KN_BF16M_DP_COLS). bench_quant type=bf16, one thread, CPU ms per call,
 * medium against high, interleaved on the shared 2-core Zen 4 of issue
 * 13 (2026-11): at 32 tokens 2048x2048 1.69-1.72 / 2.97-3.04 (1.75x),
 * 8192x2048 6.63-6.69 / 11.06-11.14 (1.67x), and 2048x8192 (where high
 * runs the FMA tile) 6.96-6.97 / 13.18-13.54 (1.9x); at 8 tokens 1.4-1.8x;
 * at one token equal (memory-bound).
 *
 * Thread: kn__act_bf16_for runs on the caller before a product's region
 * (the tokens split over the team from 2^15 elements); the reference is
 * single-threaded.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/xmalloc.h"
#include "kernels/cpu/kn_quant_int.h"
#include "kernels/cpu/kv_quant.h"

/* Token t's two-term form (kn_quant.h: bh, bl). An infinite or NaN x
 * keeps bl = 0 (x - bh would be NaN). */
static void
act_two_tok(kn_act_t *a, int32_t t)
{
    const float *x = a->x + (size_t)t * a->d_in;
    uint16_t *bh = a->bh + (size_t)t * a->d_pad, *bl = a->bl + (size_t)t * a->d_pad;

    for (int32_t i = 0; i < a->d_in; i++) {
        uint16_t h = kn_f32_to_bf16(x[i]);
        float hf = kn_bf16_to_f32(h);

        bh[i] = h;
        bl[i] = isfinite(hf) ? kn_f32_to_bf16(x[i] - hf) : 0;
    }
    memset(bh + a->d_in, 0, sizeof(uint16_t) * (size_t)(a->d_pad - a->d_in));
    memset(bl + a->d_in, 0, sizeof(uint16_t) * (size_t)(a->d_pad - a->d_in));
}

/* Token t's one-term form: bh = bf16(x) alone. */
static void
act_one_tok(kn_act_t *a, int32_t t)
{
    const float *x = a->x + (size_t)t * a->d_in;
    uint16_t *bh = a->bh + (size_t)t * a->d_pad;

    for (int32_t i = 0; i < a->d_in; i++) {
        bh[i] = kn_f32_to_bf16(x[i]);
    }
    memset(bh + a->d_in, 0, sizeof(uint16_t) * (size_t)(a->d_pad - a->d_in));
}

/* Token t's rounded values as f32: br = bf16(x). */
static void
act_f32_tok(kn_act_t *a, int32_t t)
{
    const float *x = a->x + (size_t)t * a->d_in;
    float *br = a->br + (size_t)t * a->d_pad;

    for (int32_t i = 0; i < a->d_in; i++) {
        br[i] = kn_bf16_to_f32(kn_f32_to_bf16(x[i]));
    }
    memset(br + a->d_in, 0, sizeof(float) * (size_t)(a->d_pad - a->d_in));
}

void
kn__act_bf16_for(kn_act_t *a, int dp)
{
    int want = 0;
    void (*tok)(kn_act_t *, int32_t) = NULL;

    if (a->bf16_medium) {
        if (dp && a->d_in <= KN_BF16M_DP_COLS) {
            want = KN_BF16_ONE;
            tok = act_one_tok;
        } else {
            want = KN_BF16_F32;
            tok = act_f32_tok;
        }
    } else if (dp && a->d_in <= KN_BF16_DP_COLS) {
        want = KN_BF16_TWO;
        tok = act_two_tok;
    }
    /* The two-term form holds the one-term one (the same bh). */
    if (want == 0 || a->have_bf16 == want || (want == KN_BF16_ONE && a->have_bf16 == KN_BF16_TWO)) {
        return;
    }
    kn__act_tokens(a, tok);
    a->have_bf16 = want;
}

/* v with a subnormal made zero: vdpbf16ps reads its inputs so (DAZ). */
static inline double
daz(float v)
{
    return fabsf(v) < FLT_MIN ? 0.0 : (double)v;
}

void
kn_matmul_w_ref_medium(const float *x, int32_t n_tok, const kn_weight_t *w, const float *bias,
                       float *y, int accumulate)
{
    if (w->type != KN_W_BF16) {
        kn_matmul_w_ref(x, n_tok, w, bias, y, accumulate);
        return;
    }
    int32_t d_in = w->cols, d_out = w->rows;
    float *wrow = xmalloc(sizeof(float) * (size_t)d_in);
    double *xr = xmalloc(sizeof(double) * (size_t)n_tok * (size_t)d_in);

    for (size_t i = 0; i < (size_t)n_tok * (size_t)d_in; i++) {
        xr[i] = daz(kn_bf16_to_f32(kn_f32_to_bf16(x[i])));
    }
    for (int32_t o = 0; o < d_out; o++) {
        kn_dequant_row(KN_W_BF16, (const uint8_t *)w->data + (size_t)o * w->row_bytes, wrow, d_in);
        for (int32_t t = 0; t < n_tok; t++) {
            const double *xt = xr + (size_t)t * d_in;
            double acc = 0.0;

            for (int32_t i = 0; i < d_in; i++) {
                acc += daz(wrow[i]) * xt[i]; /* exact: 8-bit x 8-bit significands */
            }
            float *yp = y + (size_t)t * d_out + o;
            double base = (accumulate ? (double)*yp : 0.0) + (bias != NULL ? bias[o] : 0.0);

            *yp = (float)(base + acc);
        }
    }
    free(xr);
    free(wrow);
}
