/* kn_cpu.h - CPU kernels for the Llama forward pass.
 *
 * Every kernel has two implementations with one contract:
 *   kn_cpu_<op>()      the fast path: OpenBLAS for GEMMs of many tokens
 *                      (own GEMV and few-row GEMM below that), SIMD code
 *                      chosen at run time from cpuid (generic C, AVX2+FMA or
 *                      AVX-512, compiled with target attributes, never
 *                      -march=native) and the kernel thread team (kn_pool.c)
 *                      once the work is large enough to pay for a fork;
 *   kn_cpu_<op>_ref()  a naive scalar reference (double accumulators where
 *                      it matters) that the tests compare the fast path to.
 *
 * All tensors are f32, row-major, host memory, caller-allocated; shapes
 * are given per function as (rows, cols). Fast kernels allocate nothing;
 * the reference attention allocates its score buffer (test use only).
 *
 * KV cache layout of one layer (DESIGN.md section 4), for K and for V:
 *   cache[block][kv_head][block_size][head_dim]
 * A token's physical slot is block * block_size + offset.
 *
 * RoPE is the Hugging Face Llama "rotate_half" (NeoX) form: dimension i is
 * paired with i + head_dim/2 and both use inv_freq[i].
 *
 * Thread: kn_cpu_init() and kn_cpu_set_isa() at start-up (not concurrently
 * with kernels); kernels may be called from any thread (one caller at a
 * time per output buffer). The thread team runs one region at a time: a
 * second thread calling kernels concurrently runs its share alone.
 */
#ifndef KERNELS_CPU_KN_CPU_H
#define KERNELS_CPU_KN_CPU_H

#include <stddef.h>
#include <stdint.h>

typedef enum kn_isa {
    KN_ISA_GENERIC = 0,
    KN_ISA_AVX2,   /* AVX2 + FMA */
    KN_ISA_AVX512, /* AVX-512 F/BW/VL + FMA */
    /* AVX-512 F/BW/VL + VNNI + BF16 (Cooper Lake, Sapphire Rapids, Zen 4):
     * the weight kernels (kn_quant.h) use vpdpbusd and vdpbf16ps here; the
     * f32 kernels run their AVX-512 code. */
    KN_ISA_AVX512_VNNI,
} kn_isa_t;

/* Detects the best ISA (once), selects it, sets the thread count used by
 * the kernels (n_threads <= 0: one per physical core the process may run
 * on, kn_cpus.c) and puts OpenBLAS in single-threaded mode: kernels split
 * GEMMs over their own thread team so that two thread pools never compete
 * for the cores. Idempotent. */
void kn_cpu_init(int n_threads);
/* Threads the kernels use (after kn_cpu_init). */
int kn_cpu_threads(void);
/* The best ISA this CPU supports and the one in use. */
kn_isa_t kn_cpu_isa_best(void);
kn_isa_t kn_cpu_isa(void);
/* Forces an ISA (tests compare each against the reference).
 * ST_EUNSUPPORTED when the CPU lacks it; nothing changes then. */
int kn_cpu_set_isa(kn_isa_t isa);
const char *kn_isa_name(kn_isa_t isa);

/* y = x @ w^T (+ bias) (+ y when accumulate).
 *   x:    (n_tok, d_in)
 *   w:    (d_out, d_in)   Hugging Face linear layout
 *   bias: (d_out) or NULL
 *   y:    (n_tok, d_out)  must not alias x or w
 * accumulate != 0 adds into y (fused residual add). */
void kn_cpu_matmul(const float *x, const float *w, const float *bias, float *y, int32_t n_tok,
                   int32_t d_in, int32_t d_out, int accumulate);
void kn_cpu_matmul_ref(const float *x, const float *w, const float *bias, float *y, int32_t n_tok,
                       int32_t d_in, int32_t d_out, int accumulate);

/* y = x / sqrt(mean(x^2) + eps) * w, per row.
 *   x, y: (n_tok, dim), y may equal x;  w: (dim) */
void kn_cpu_rmsnorm(const float *x, const float *w, float *y, int32_t n_tok, int32_t dim,
                    float eps);
void kn_cpu_rmsnorm_ref(const float *x, const float *w, float *y, int32_t n_tok, int32_t dim,
                        float eps);

/* RoPE frequency table.
 *   inv_freq: (head_dim / 2) out
 * scaling: KN_ROPE_NONE uses theta^(-2i/d); LINEAR divides by factor;
 * LLAMA3 applies Llama 3.1's wavelength-banded scaling (factor,
 * low_freq_factor, high_freq_factor, orig_max_pos). */
typedef enum kn_rope_scaling {
    KN_ROPE_NONE = 0,
    KN_ROPE_LINEAR,
    KN_ROPE_LLAMA3,
} kn_rope_scaling_t;

typedef struct kn_rope_params {
    int32_t head_dim;
    float theta;
    kn_rope_scaling_t scaling;
    float factor;
    float low_freq_factor;
    float high_freq_factor;
    int32_t orig_max_pos;
} kn_rope_params_t;

void kn_cpu_rope_inv_freq(const kn_rope_params_t *p, float *inv_freq);

/* cos/sin of pos * inv_freq, once per step for all layers.
 *   pos: (n_tok)  inv_freq: (half)  cos, sin: (n_tok, half) out */
void kn_cpu_rope_table(const int32_t *pos, int32_t n_tok, const float *inv_freq, int32_t half,
                       float *cos_t, float *sin_t);
/* Rotates x in place with a table from kn_cpu_rope_table().
 *   x: (n_tok, n_heads * head_dim) */
void kn_cpu_rope(float *x, int32_t n_tok, int32_t n_heads, int32_t head_dim, const float *cos_t,
                 const float *sin_t);
/* Reference: computes the angles from pos and inv_freq itself (double). */
void kn_cpu_rope_ref(float *x, const int32_t *pos, int32_t n_tok, int32_t n_heads, int32_t head_dim,
                     const float *inv_freq);

/* Writes each new token's K and V into its cache slot.
 *   k, v:        (n_tok, n_kv_heads * head_dim)
 *   slot:        (n_tok) block * block_size + offset; negative: skipped
 *   k/v_cache:   [block][n_kv_heads][block_size][head_dim] of one layer */
void kn_cpu_kv_write(float *k_cache, float *v_cache, const float *k, const float *v,
                     const int32_t *slot, int32_t n_tok, int32_t n_kv_heads, int32_t block_size,
                     int32_t head_dim);
void kn_cpu_kv_write_ref(float *k_cache, float *v_cache, const float *k, const float *v,
                         const int32_t *slot, int32_t n_tok, int32_t n_kv_heads, int32_t block_size,
                         int32_t head_dim);

/* Paged causal attention over a varlen batch.
 * Sequence s owns tokens [query_start[s], query_start[s+1]); after this
 * step its KV length is context_len[s], so its new tokens sit at context
 * indices context_len[s] - n_new .. context_len[s] - 1 and token t attends
 * to context indices 0..ctx(t) (and, with sliding_window > 0, only to the
 * last sliding_window of them). Query head h reads KV head
 * h / (n_heads / n_kv_heads) (GQA/MQA). Softmax in f32 with the running
 * maximum (online), scores scaled by scale. */
typedef struct kn_attn_args {
    float *out;           /* (n_tok, n_heads * head_dim) */
    const float *q;       /* (n_tok, n_heads * head_dim), RoPE applied */
    const float *k_cache; /* one layer, layout above */
    const float *v_cache;
    const int32_t *query_start;  /* (n_seqs + 1) */
    const int32_t *context_len;  /* (n_seqs) */
    const int32_t *block_tables; /* (n_seqs, max_blocks), or rows named by table_rows */
    int32_t max_blocks;
    int32_t n_seqs;
    int32_t n_tok;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim; /* <= KN_ATTN_MAX_HEAD_DIM */
    int32_t block_size;
    int32_t sliding_window; /* 0: full */
    float scale;
    /* (n_seqs) the row of block_tables each sequence reads (persistent
     * rows, model.h mdl_batch_t); NULL: row s. */
    const int32_t *table_rows;
} kn_attn_args_t;

/* Sequence s's block-table row in a. */
static inline const int32_t *
kn_attn_table(const kn_attn_args_t *a, int32_t s)
{
    return a->block_tables +
           (size_t)(a->table_rows != NULL ? a->table_rows[s] : s) * (size_t)a->max_blocks;
}

#define KN_ATTN_MAX_HEAD_DIM 256

void kn_cpu_attention(const kn_attn_args_t *a);
void kn_cpu_attention_ref(const kn_attn_args_t *a);

/* out = silu(gate) * up, elementwise over n; out may equal gate. */
void kn_cpu_silu_mul(const float *gate, const float *up, float *out, size_t n);
void kn_cpu_silu_mul_ref(const float *gate, const float *up, float *out, size_t n);

/* out[t] = table[tokens[t]]:  table (vocab, dim), out (n_tok, dim).
 * Token ids must be in range (the runtime validates them). */
void kn_cpu_embed(const float *table, const int32_t *tokens, int32_t n_tok, int32_t dim,
                  float *out);
void kn_cpu_embed_ref(const float *table, const int32_t *tokens, int32_t n_tok, int32_t dim,
                      float *out);

/* x += y over n. */
void kn_cpu_add(float *x, const float *y, size_t n);
void kn_cpu_add_ref(float *x, const float *y, size_t n);

#endif /* KERNELS_CPU_KN_CPU_H */
