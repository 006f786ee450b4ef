/* kn_ref.c - naive reference versions of the CPU kernels.
 *
 * Written for obviousness, not speed: scalar loops, double accumulators,
 * a two-pass softmax over the whole context. The tests hold every fast
 * kernel to these. The reference attention allocates its score buffer.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/xmalloc.h"
#include "kernels/cpu/kn_cpu.h"

void
kn_cpu_matmul_ref(const float *x, const float *w, const float *bias, float *y, int32_t n_tok,
                  int32_t d_in, int32_t d_out, int accumulate)
{
    for (int32_t t = 0; t < n_tok; t++) {
        for (int32_t o = 0; o < d_out; o++) {
            double acc = 0.0;

            for (int32_t i = 0; i < d_in; i++) {
                acc += (double)x[(size_t)t * d_in + i] * (double)w[(size_t)o * d_in + i];
            }
            if (bias != NULL) {
                acc += bias[o];
            }
            if (accumulate) {
                acc += y[(size_t)t * d_out + o];
            }
            y[(size_t)t * d_out + o] = (float)acc;
        }
    }
}

void
kn_cpu_rmsnorm_ref(const float *x, const float *w, float *y, int32_t n_tok, int32_t dim, float eps)
{
    for (int32_t t = 0; t < n_tok; t++) {
        const float *xr = x + (size_t)t * dim;
        float *yr = y + (size_t)t * dim;
        double ss = 0.0;

        for (int32_t i = 0; i < dim; i++) {
            ss += (double)xr[i] * xr[i];
        }
        double inv = 1.0 / sqrt(ss / dim + eps);
        for (int32_t i = 0; i < dim; i++) {
            yr[i] = (float)(xr[i] * inv * w[i]);
        }
    }
}

void
kn_cpu_rope_ref(float *x, const int32_t *pos, int32_t n_tok, int32_t n_heads, int32_t head_dim,
                const float *inv_freq)
{
    int32_t half = head_dim / 2;

    for (int32_t t = 0; t < n_tok; t++) {
        for (int32_t h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;

            for (int32_t i = 0; i < half; i++) {
                double ang = (double)pos[t] * (double)inv_freq[i];
                double c = cos(ang), s = sin(ang);
                double a = v[i], b = v[i + half];

                /* rotate_half: (a, b) -> (a cos - b sin, b cos + a sin) */
                v[i] = (float)(a * c - b * s);
                v[i + half] = (float)(b * c + a * s);
            }
        }
    }
}

void
kn_cpu_kv_write_ref(float *k_cache, float *v_cache, const float *k, const float *v,
                    const int32_t *slot, int32_t n_tok, int32_t n_kv_heads, int32_t block_size,
                    int32_t head_dim)
{
    for (int32_t t = 0; t < n_tok; t++) {
        if (slot[t] < 0) {
            continue;
        }
        int32_t blk = slot[t] / block_size, off = slot[t] % block_size;

        for (int32_t h = 0; h < n_kv_heads; h++) {
            for (int32_t d = 0; d < head_dim; d++) {
                size_t dst = (((size_t)blk * n_kv_heads + h) * block_size + off) * head_dim + d;
                size_t src = ((size_t)t * n_kv_heads + h) * head_dim + d;

                k_cache[dst] = k[src];
                v_cache[dst] = v[src];
            }
        }
    }
}

/* Address of context index j of seq s, KV head h, in a paged cache. */
static const float *
ref_kv_at(const kn_attn_args_t *a, const float *cache, int32_t s, int32_t j, int32_t h)
{
    int32_t blk = kn_attn_table(a, s)[j / a->block_size];
    int32_t off = j % a->block_size;

    return cache + (((size_t)blk * a->n_kv_heads + h) * a->block_size + off) * a->head_dim;
}

void
kn_cpu_attention_ref(const kn_attn_args_t *a)
{
    int32_t group = a->n_heads / a->n_kv_heads;
    int32_t max_ctx = 1;

    for (int32_t s = 0; s < a->n_seqs; s++) {
        if (a->context_len[s] > max_ctx) {
            max_ctx = a->context_len[s];
        }
    }
    double *score = xmalloc(sizeof(double) * (size_t)max_ctx);

    for (int32_t s = 0; s < a->n_seqs; s++) {
        int32_t q0 = a->query_start[s], q1 = a->query_start[s + 1];
        int32_t first = a->context_len[s] - (q1 - q0);

        for (int32_t t = q0; t < q1; t++) {
            int32_t ctx = first + (t - q0); /* this token's context index */
            int32_t lo = 0;

            if (a->sliding_window > 0 && ctx - a->sliding_window + 1 > 0) {
                lo = ctx - a->sliding_window + 1;
            }
            for (int32_t h = 0; h < a->n_heads; h++) {
                const float *qv = a->q + ((size_t)t * a->n_heads + h) * a->head_dim;
                float *ov = a->out + ((size_t)t * a->n_heads + h) * a->head_dim;
                int32_t kh = h / group;
                double mx = -INFINITY, sum = 0.0;

                for (int32_t j = lo; j <= ctx; j++) {
                    const float *kv = ref_kv_at(a, a->k_cache, s, j, kh);
                    double d = 0.0;

                    for (int32_t i = 0; i < a->head_dim; i++) {
                        d += (double)qv[i] * kv[i];
                    }
                    score[j] = d * a->scale;
                    if (score[j] > mx) {
                        mx = score[j];
                    }
                }
                for (int32_t j = lo; j <= ctx; j++) {
                    score[j] = exp(score[j] - mx);
                    sum += score[j];
                }
                for (int32_t i = 0; i < a->head_dim; i++) {
                    double acc = 0.0;

                    for (int32_t j = lo; j <= ctx; j++) {
                        acc += score[j] * ref_kv_at(a, a->v_cache, s, j, kh)[i];
                    }
                    ov[i] = (float)(acc / sum);
                }
            }
        }
    }
    free(score);
}

void
kn_cpu_silu_mul_ref(const float *gate, const float *up, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double g = gate[i];

        out[i] = (float)(g / (1.0 + exp(-g)) * up[i]);
    }
}

void
kn_cpu_embed_ref(const float *table, const int32_t *tokens, int32_t n_tok, int32_t dim, float *out)
{
    for (int32_t t = 0; t < n_tok; t++) {
        for (int32_t i = 0; i < dim; i++) {
            out[(size_t)t * dim + i] = table[(size_t)tokens[t] * dim + i];
        }
    }
}

void
kn_cpu_add_ref(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        x[i] += y[i];
    }
}
