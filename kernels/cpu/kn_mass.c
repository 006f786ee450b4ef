/* kn_mass.c - accumulated attention mass (kernels/cpu/kn_mass.h).
 */
#include <math.h>
#include <stddef.h>

#include "kernels/cpu/kn_int.h"
#include "kernels/cpu/kn_mass.h"

/* The key row of context index j of sequence s, and its slot. */
static const float *
mass_key(const kn_attn_args_t *a, int32_t s, int32_t j, int32_t kh, int32_t *slot)
{
    int32_t blk = kn_attn_table(a, s)[j / a->block_size];
    int32_t off = j % a->block_size;

    *slot = blk * a->block_size + off;
    return a->k_cache + (((size_t)blk * a->n_kv_heads + kh) * a->block_size + off) * a->head_dim;
}

static float
mass_dot(const float *x, const float *y, int32_t n)
{
    float d = 0.0f;

    for (int32_t i = 0; i < n; i++) {
        d += x[i] * y[i];
    }
    return d;
}

/* Causal range [*lo, hi] of token t of sequence s. */
static int32_t
mass_range(const kn_attn_args_t *a, int32_t s, int32_t t, int32_t *lo)
{
    int32_t n_new = a->query_start[s + 1] - a->query_start[s];
    int32_t hi = a->context_len[s] - n_new + (t - a->query_start[s]);

    *lo = a->sliding_window > 0 && hi - a->sliding_window + 1 > 0 ? hi - a->sliding_window + 1 : 0;
    return hi;
}

typedef struct mass_job {
    const kn_attn_args_t *a;
    const uint8_t *row_on;
    float *acc;
} mass_job_t;

/* Every accumulating row for KV head kh. */
static void
mass_head(void *arg, int kh, int n_tasks)
{
    const mass_job_t *jb = arg;
    const kn_attn_args_t *a = jb->a;
    const int32_t group = a->n_heads / a->n_kv_heads, hd = a->head_dim;

    (void)n_tasks;
    for (int32_t s = 0; s < a->n_seqs; s++) {
        for (int32_t t = a->query_start[s]; t < a->query_start[s + 1]; t++) {
            int32_t lo, hi, slot;

            if (!jb->row_on[t]) {
                continue;
            }
            hi = mass_range(a, s, t, &lo);
            for (int32_t h = kh * group; h < (kh + 1) * group; h++) {
                const float *q = a->q + ((size_t)t * a->n_heads + h) * hd;
                float mx = -INFINITY, sum = 0.0f, inv;

                for (int32_t j = lo; j <= hi; j++) {
                    float x = a->scale * mass_dot(q, mass_key(a, s, j, kh, &slot), hd);
                    if (x > mx) {
                        sum = sum * expf(mx - x) + 1.0f;
                        mx = x;
                    } else {
                        sum += expf(x - mx);
                    }
                }
                inv = 1.0f / sum;
                for (int32_t j = lo; j <= hi; j++) {
                    float x = a->scale * mass_dot(q, mass_key(a, s, j, kh, &slot), hd);
                    jb->acc[(size_t)slot * a->n_kv_heads + kh] += expf(x - mx) * inv;
                }
            }
        }
    }
}

void
kn_cpu_attn_mass(const kn_attn_args_t *a, const uint8_t *row_on, float *acc)
{
    mass_job_t jb = {.a = a, .row_on = row_on, .acc = acc};
    long work = 0;

    for (int32_t s = 0; s < a->n_seqs; s++) {
        for (int32_t t = a->query_start[s]; t < a->query_start[s + 1]; t++) {
            work += row_on[t] ? (long)a->context_len[s] : 0;
        }
    }
    if (work == 0) {
        return;
    }
    work *= 2L * a->n_heads * a->head_dim;
    /* A team only pays off past ~a million multiply-adds. */
    int team = work >= (1L << 20) ? kn_cpu_threads() : 1;

    team = team < a->n_kv_heads ? team : a->n_kv_heads;
    kn__pool_run(team, a->n_kv_heads, mass_head, &jb);
}

void
kn_cpu_attn_mass_ref(const kn_attn_args_t *a, const uint8_t *row_on, float *acc)
{
    const int32_t group = a->n_heads / a->n_kv_heads, hd = a->head_dim;

    for (int32_t s = 0; s < a->n_seqs; s++) {
        for (int32_t t = a->query_start[s]; t < a->query_start[s + 1]; t++) {
            int32_t lo, hi, slot;

            if (!row_on[t]) {
                continue;
            }
            hi = mass_range(a, s, t, &lo);
            for (int32_t h = 0; h < a->n_heads; h++) {
                const float *q = a->q + ((size_t)t * a->n_heads + h) * hd;
                int32_t kh = h / group;
                double mx = -INFINITY, sum = 0.0;

                for (int32_t j = lo; j <= hi; j++) {
                    const float *k = mass_key(a, s, j, kh, &slot);
                    double x = 0.0;
                    for (int32_t i = 0; i < hd; i++) {
                        x += (double)q[i] * k[i];
                    }
                    x *= a->scale;
                    mx = x > mx ? x : mx;
                }
                for (int32_t j = lo; j <= hi; j++) {
                    const float *k = mass_key(a, s, j, kh, &slot);
                    double x = 0.0;
                    for (int32_t i = 0; i < hd; i++) {
                        x += (double)q[i] * k[i];
                    }
                    sum += exp(x * a->scale - mx);
                }
                for (int32_t j = lo; j <= hi; j++) {
                    const float *k = mass_key(a, s, j, kh, &slot);
                    double x = 0.0;
                    for (int32_t i = 0; i < hd; i++) {
                        x += (double)q[i] * k[i];
                    }
                    acc[(size_t)slot * a->n_kv_heads + kh] += (float)(exp(x * a->scale - mx) / sum);
                }
            }
        }
    }
}
