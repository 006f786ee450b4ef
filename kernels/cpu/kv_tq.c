/* kv_tq.c - tq3 / tq4 rows of the compressed KV store (kv_tq.h): the
 * seeded rotations and sketches, row encode / decode, and the attention
 * task over tq blocks.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xmalloc.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/kv_tq.h"
#include "kernels/kn_tq.h"

#define TQ_GROUP 8  /* query heads of a KV head handled at once */
#define TQ_CHUNK 16 /* rows per softmax update */
#define TQ_SEED 0x7a51c0de2b9e3779ull

struct kn_tq {
    int bits;
    int32_t n_layers, n_kv, hd;
    float *sg; /* [n_layers][n_kv][hd] +-1 */
    float *S;  /* [n_layers][n_kv][hd][hd] sqrt(hd) x Haar orthogonal */
};

/* Bit plane bytes to codes, eight coordinates at a time: tq_spread[b]
 * has bit j of b in byte j; tq_pm1[b][j] is bit j of b as +-1. */
static uint64_t tq_spread[256];
static float tq_pm1[256][8];
static pthread_once_t tq_once = PTHREAD_ONCE_INIT;

static void
tq_init_luts(void)
{
    for (int b = 0; b < 256; b++) {
        for (int j = 0; j < 8; j++) {
            tq_spread[b] |= (uint64_t)((b >> j) & 1) << (8 * j);
            tq_pm1[b][j] = (b >> j) & 1 ? 1.0f : -1.0f;
        }
    }
}

static uint64_t
splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double
unif(uint64_t *s) /* (0, 1) */
{
    return ((double)(splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* S = sqrt(hd) Q, Q Haar orthogonal: Gram-Schmidt (twice, in double) of
 * the rows of a Gaussian matrix. */
static void
tq_sketch(uint64_t *s, int32_t hd, float *S)
{
    double *G = xmalloc(sizeof(double) * (size_t)hd * hd);

    for (size_t i = 0; i < (size_t)hd * hd; i += 2) { /* hd is even */
        double r = sqrt(-2.0 * log(unif(s))), th = 6.283185307179586 * unif(s);

        G[i] = r * cos(th);
        G[i + 1] = r * sin(th);
    }
    for (int32_t i = 0; i < hd; i++) {
        double *gi = G + (size_t)i * hd, nn = 0.0;

        for (int pass = 0; pass < 2; pass++) {
            for (int32_t j = 0; j < i; j++) {
                const double *gj = G + (size_t)j * hd;
                double d = 0.0;

                for (int32_t c = 0; c < hd; c++) {
                    d += gi[c] * gj[c];
                }
                for (int32_t c = 0; c < hd; c++) {
                    gi[c] -= d * gj[c];
                }
            }
        }
        for (int32_t c = 0; c < hd; c++) {
            nn += gi[c] * gi[c];
        }
        nn = 1.0 / sqrt(nn);
        for (int32_t c = 0; c < hd; c++) {
            gi[c] *= nn;
            S[(size_t)i * hd + c] = (float)(gi[c] * sqrt((double)hd));
        }
    }
    free(G);
}

int32_t
kn_tq_row_size(int bits, int kind, int32_t head_dim, char *err, size_t errlen)
{
    if (kn_tq_dim_index(head_dim) < 0) {
        snprintf(err, errlen,
                 "tq KV rotates with a Hadamard transform: head_dim %d is not a power of two "
                 "in 16 .. 256",
                 head_dim);
        return 0;
    }
    return kn_tq_row_bytes(bits, kind, head_dim);
}

kn_tq_t *
kn_tq_create(int bits, int32_t n_layers, int32_t n_kv, int32_t head_dim)
{
    return kn_tq_create_at(bits, n_layers, n_kv, 0, head_dim);
}

kn_tq_t *
kn_tq_create_at(int bits, int32_t n_layers, int32_t n_kv, int32_t head0, int32_t head_dim)
{
    kn_tq_t *tq = xcalloc(1, sizeof(*tq));
    size_t hd = (size_t)head_dim;

    pthread_once(&tq_once, tq_init_luts);
    tq->bits = bits;
    tq->n_layers = n_layers;
    tq->n_kv = n_kv;
    tq->hd = head_dim;
    tq->sg = xmalloc(sizeof(float) * (size_t)n_layers * n_kv * hd);
    tq->S = xmalloc(sizeof(float) * (size_t)n_layers * n_kv * hd * hd);
    for (int32_t l = 0; l < n_layers; l++) {
        for (int32_t h = 0; h < n_kv; h++) {
            size_t lh = (size_t)l * n_kv + h;
            uint64_t s = TQ_SEED ^ ((uint64_t)l << 32) ^ ((uint64_t)(head0 + h) << 8);
            float *sg = tq->sg + lh * hd, *S = tq->S + lh * hd * hd;

            for (size_t c = 0; c < hd; c++) {
                sg[c] = (splitmix64(&s) >> 63) ? -1.0f : 1.0f;
            }
            tq_sketch(&s, head_dim, S);
        }
    }
    return tq;
}

void
kn_tq_destroy(kn_tq_t *tq)
{
    if (tq == NULL) {
        return;
    }
    free(tq->sg);
    free(tq->S);
    free(tq);
}

static inline const float *
tq_sg(const kn_tq_t *tq, int32_t layer, int32_t h)
{
    return tq->sg + ((size_t)layer * tq->n_kv + h) * tq->hd;
}

static inline const float *
tq_S(const kn_tq_t *tq, int32_t layer, int32_t h)
{
    return tq->S + ((size_t)layer * tq->n_kv + h) * tq->hd * tq->hd;
}

const float *
kn_tq_layer_signs(const kn_tq_t *tq, int32_t layer)
{
    return tq_sg(tq, layer, 0);
}

const float *
kn_tq_layer_sketch(const kn_tq_t *tq, int32_t layer)
{
    return tq_S(tq, layer, 0);
}

void
kn_tq_rotate(const kn_tq_t *tq, int32_t layer, int32_t h, const float *x, float *out)
{
    const float *sg = tq_sg(tq, layer, h);
    float k = 1.0f / sqrtf((float)tq->hd);

    for (int32_t c = 0; c < tq->hd; c++) {
        out[c] = x[c] * sg[c];
    }
    kn_tq_fwht(out, tq->hd);
    for (int32_t c = 0; c < tq->hd; c++) {
        out[c] *= k;
    }
}

void
kn_tq_unrotate(const kn_tq_t *tq, int32_t layer, int32_t h, const float *x, float *out)
{
    const float *sg = tq_sg(tq, layer, h);
    float k = 1.0f / sqrtf((float)tq->hd);

    if (out != x) {
        memcpy(out, x, sizeof(float) * (size_t)tq->hd);
    }
    kn_tq_fwht(out, tq->hd);
    for (int32_t c = 0; c < tq->hd; c++) {
        out[c] *= k * sg[c];
    }
}

void
kn_tq_encode(const kn_tq_t *tq, int32_t layer, int32_t h, int kind, const float *x, uint8_t *row)
{
    kn_tq_encode_row(tq->hd, tq->bits, kind, tq_sg(tq, layer, h), tq_S(tq, layer, h), x, row);
}

void
kn_tq_decode(const kn_tq_t *tq, int32_t layer, int32_t h, int kind, const uint8_t *row,
             float *out)
{
    kn_tq_decode_row(tq->hd, tq->bits, kind, tq_sg(tq, layer, h), tq_S(tq, layer, h), row, out);
}

/* qz = H D q and, for sketched keys (tq4), sq = S qz of one query head. */
static void
tq_query(const kn_tq_t *tq, int32_t layer, int32_t h, const float *q, float *qz, float *sq)
{
    const int32_t hd = tq->hd;
    const float *sg = tq_sg(tq, layer, h), *S = tq_S(tq, layer, h);

    for (int32_t c = 0; c < hd; c++) {
        qz[c] = q[c] * sg[c];
    }
    kn_tq_fwht(qz, hd);
    for (int32_t i = 0; i < hd && kn_tq_fmt(tq->bits, 0, hd).sketch; i++) {
        const float *Si = S + (size_t)i * hd;
        float d = 0.0f;

        for (int32_t c = 0; c < hd; c++) {
            d += Si[c] * qz[c];
        }
        sq[i] = d;
    }
}

float
kn_tq_key_score(const kn_tq_t *tq, int32_t layer, int32_t h, const float *q, const uint8_t *row)
{
    float qz[KN_TQ_MAX_DIM], sq[KN_TQ_MAX_DIM];

    tq_query(tq, layer, h, q, qz, sq);
    return kn_tq_key_dot(tq->hd, tq->bits, row, qz, sq);
}

/* Codebook values of a row's codes (and, for sketched keys, its signs as
 * +-1): per byte of the planes one table load per plane gives eight
 * codes; coordinates below f->nx take the extra plane's bit and the
 * wider codebook. */
static inline void
tq_unpack(const uint8_t *row, const kn_tq_fmt_t *f, int di, float *val, float *sgn)
{
    const int32_t pb = f->pb;
    const float *lo = KN_TQ_CB[di][f->nfull - 1], *hi = KN_TQ_CB[di][f->nfull];

    for (int32_t i = 0; i < pb; i++) {
        uint64_t codes = 0;
        float *v = val + 8 * i;
        const float *cb = lo;

        for (int p = 0; p < f->nfull; p++) {
            codes |= tq_spread[row[p * pb + i]] << p;
        }
        if (8 * i < f->nx) {
            codes |= tq_spread[row[f->nfull * pb + i]] << f->nfull;
            cb = hi;
        }
        for (int j = 0; j < 8; j++) {
            v[j] = cb[(codes >> (8 * j)) & 0xff];
        }
    }
    if (sgn != NULL && f->sketch) {
        for (int32_t i = 0; i < pb; i++) {
            memcpy(sgn + 8 * i, tq_pm1[row[f->nfull * pb + i]], sizeof(tq_pm1[0]));
        }
    }
}

void
kn__tq_attn_task(const kn_tq_t *tq, int32_t layer, const uint8_t *kbase, size_t kstride,
                 const uint8_t *vbase, size_t vstride, const kn_attn_args_t *a, int32_t t,
                 int32_t s, int32_t kh)
{
    const int32_t hd = a->head_dim, bs = a->block_size, bits = tq->bits;
    const int32_t group = a->n_heads / a->n_kv_heads;
    const int32_t n_new = a->query_start[s + 1] - a->query_start[s];
    const int32_t ctx = a->context_len[s] - n_new + (t - a->query_start[s]);
    const int32_t *bt = kn_attn_table(a, s);
    const kn_tq_fmt_t kf = kn_tq_fmt(bits, 0, hd), vf = kn_tq_fmt(bits, 1, hd);
    const int32_t krow = kf.bytes, vrow = vf.bytes;
    const int di = kn_tq_dim_index(hd);
    const float qjl = KN_TQ_QJL[di];
    int32_t lo = 0;

    if (a->sliding_window > 0 && ctx - a->sliding_window + 1 > 0) {
        lo = ctx - a->sliding_window + 1;
    }
    for (int32_t g0 = 0; g0 < group; g0 += TQ_GROUP) {
        int32_t ng = group - g0 < TQ_GROUP ? group - g0 : TQ_GROUP;
        float m[TQ_GROUP], l[TQ_GROUP];
        float sc[TQ_GROUP][TQ_CHUNK], wn[TQ_CHUNK];
        float acc[TQ_GROUP][KN_TQ_MAX_DIM] __attribute__((aligned(64)));
        float qz[TQ_GROUP][KN_TQ_MAX_DIM] __attribute__((aligned(64)));
        float sq[TQ_GROUP][KN_TQ_MAX_DIM] __attribute__((aligned(64)));
        float val[KN_TQ_MAX_DIM] __attribute__((aligned(64)));
        float sgn[KN_TQ_MAX_DIM] __attribute__((aligned(64)));
        const float *qg = a->q + ((size_t)t * a->n_heads + (size_t)kh * group + g0) * hd;

        for (int32_t g = 0; g < ng; g++) {
            m[g] = -INFINITY;
            l[g] = 0.0f;
            memset(acc[g], 0, sizeof(float) * (size_t)hd);
            tq_query(tq, layer, kh, qg + (size_t)g * hd, qz[g], sq[g]);
        }
        for (int32_t j = lo; j <= ctx;) {
            int32_t blk = bt[j / bs], off = j % bs;
            int32_t n = bs - off;

            if (n > ctx - j + 1) {
                n = ctx - j + 1;
            }
            if (n > TQ_CHUNK) {
                n = TQ_CHUNK;
            }
            const uint8_t *kr = kbase + (size_t)blk * kstride + ((size_t)kh * bs + off) * krow;
            const uint8_t *vr = vbase + (size_t)blk * vstride + ((size_t)kh * bs + off) * vrow;

            for (int32_t jj = 0; jj < n; jj++, kr += krow) {
                float kn = kn_tq_scale(kr, &kf, 0) / (float)hd;

                tq_unpack(kr, &kf, di, val, sgn);
                for (int32_t g = 0; g < ng; g++) {
                    const float *restrict qv = qz[g];
                    float d1 = 0.0f;

#pragma omp simd reduction(+ : d1)
                    for (int32_t c = 0; c < hd; c++) {
                        d1 += qv[c] * val[c];
                    }
                    sc[g][jj] = kn * d1;
                }
                if (kf.sketch) {
                    float kq = qjl * kn_tq_kres(kr, &kf, hd);

                    for (int32_t g = 0; g < ng; g++) {
                        const float *restrict sv = sq[g];
                        float d2 = 0.0f;

#pragma omp simd reduction(+ : d2)
                        for (int32_t c = 0; c < hd; c++) {
                            d2 += sv[c] * sgn[c];
                        }
                        sc[g][jj] += kn * kq * d2;
                    }
                }
                for (int32_t g = 0; g < ng; g++) {
                    sc[g][jj] *= a->scale;
                }
            }
            for (int32_t g = 0; g < ng; g++) {
                float mx = m[g], sum = 0.0f;

                for (int32_t jj = 0; jj < n; jj++) {
                    mx = sc[g][jj] > mx ? sc[g][jj] : mx;
                }
                if (mx > m[g]) {
                    float corr = expf(m[g] - mx);

                    l[g] *= corr;
                    for (int32_t i = 0; i < hd; i++) {
                        acc[g][i] *= corr;
                    }
                    m[g] = mx;
                }
                for (int32_t jj = 0; jj < n; jj++) {
                    sc[g][jj] = expf(sc[g][jj] - mx);
                    sum += sc[g][jj];
                }
                l[g] += sum;
            }
            for (int32_t jj = 0; jj < n; jj++, vr += vrow) {
                wn[jj] = kn_tq_scale(vr, &vf, 1);
                tq_unpack(vr, &vf, di, val, NULL);
                for (int32_t g = 0; g < ng; g++) {
                    float *restrict ac = acc[g];
                    const float w = sc[g][jj] * wn[jj];

#pragma omp simd
                    for (int32_t i = 0; i < hd; i++) {
                        ac[i] += w * val[i];
                    }
                }
            }
            j += n;
        }
        for (int32_t g = 0; g < ng; g++) {
            float *o = a->out + ((size_t)t * a->n_heads + (size_t)kh * group + g0 + g) * hd;
            const float *sg = tq_sg(tq, layer, kh);
            float k = 1.0f / (l[g] * (float)hd);

            kn_tq_fwht(acc[g], hd);
            for (int32_t i = 0; i < hd; i++) {
                o[i] = acc[g][i] * k * sg[i];
            }
        }
    }
}
