/* model.h - Llama-family model: configuration, loading, and the forward
 * pass over a backend with a paged KV pool.
 *
 * A model (weights mmapped read-only in their file's types, config,
 * tokenizer, chat template) is immutable after mdl_model_load() and may be
 * shared between threads. A
 * runtime binds a model to a backend ("cpu" or "cuda"), owns the KV pool
 * bytes (layout per layer [block][kv_head][block_size][head_dim] for K and
 * for V), the CPU swap tier and every scratch buffer, all allocated at
 * creation: mdl_forward() allocates nothing.
 *
 * Thread: mdl_model_* any thread after load; mdl_runtime_* and
 * mdl_forward engine thread only.
 */
#ifndef MODEL_MODEL_H
#define MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/kvop.h"
#include "kernels/cpu/kn_quant.h"

typedef struct tok_tokenizer tok_tokenizer_t;

typedef enum mdl_rope_scaling {
    MDL_ROPE_NONE = 0,
    MDL_ROPE_LINEAR,
    MDL_ROPE_LLAMA3,
} mdl_rope_scaling_t;

#define MDL_MAX_EOS 8

typedef struct mdl_config {
    char arch[32];         /* "llama", "mistral", "qwen2" */
    int32_t vocab_size;
    int32_t dim;           /* hidden size */
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;      /* dim / n_heads unless config says otherwise */
    int32_t ffn_dim;       /* intermediate size */
    int32_t max_pos;       /* max_position_embeddings: the context length */
    float norm_eps;
    float rope_theta;
    mdl_rope_scaling_t rope_scaling;
    float rope_factor;
    float rope_low_freq_factor;   /* llama3 */
    float rope_high_freq_factor;  /* llama3 */
    int32_t rope_orig_max_pos;    /* llama3 */
    int tie_embeddings;
    int qkv_bias;                 /* Qwen2 */
    int32_t sliding_window;       /* 0: full attention */
    int32_t bos_id;               /* -1 when none */
    int32_t eos_ids[MDL_MAX_EOS]; /* from config.json / generation_config.json */
    int32_t n_eos;
} mdl_config_t;

typedef struct mdl_model mdl_model_t;

/* The type weight matrices are kept in (--dtype, vLLM's name): AUTO keeps
 * the file's type; the others convert every matrix once at load. */
typedef enum mdl_dtype {
    MDL_DTYPE_AUTO = 0,
    MDL_DTYPE_F32,
    MDL_DTYPE_BF16,
    MDL_DTYPE_F16,
} mdl_dtype_t;

/* "auto", "f32" (or "float32"), "bf16" ("bfloat16"), "f16" ("float16",
 * "half") <-> dtype. parse: ST_EINVAL for anything else. */
int mdl_dtype_parse(const char *s, mdl_dtype_t *out);
const char *mdl_dtype_name(mdl_dtype_t d);

/* How BF16 weights multiply their activations on the CPU backend
 * (--matmul-precision, PyTorch's torch.set_float32_matmul_precision
 * names): HIGH keeps f32 accuracy (the activations as f32, or a two-term
 * bf16 split of them with vdpbf16ps: within 2^-18); MEDIUM rounds each
 * activation to one bf16 term (nearest even; up to 2^-9 relative), as
 * llama.cpp and vLLM's bfloat16 do, for about twice the products per
 * instruction on AVX512-BF16. Other weight types, and the cuda backend,
 * ignore it. */
typedef enum mdl_matmul_prec {
    MDL_MATMUL_HIGH = 0,
    MDL_MATMUL_MEDIUM,
} mdl_matmul_prec_t;

/* "high", "medium" <-> precision. parse: ST_EINVAL for anything else. */
int mdl_matmul_prec_parse(const char *s, mdl_matmul_prec_t *out);
const char *mdl_matmul_prec_name(mdl_matmul_prec_t p);

typedef struct mdl_load_opts {
    mdl_dtype_t dtype;
} mdl_load_opts_t;

/* path: a Hugging Face directory or a .gguf file. On failure returns a
 * negative ST_* and writes a one-line reason naming the file into err.
 * opts may be NULL (defaults). */
int mdl_model_load_opts(const char *path, const mdl_load_opts_t *opts, mdl_model_t **out,
                        char *err, size_t errlen);
/* mdl_model_load_opts() with the defaults. */
int mdl_model_load(const char *path, mdl_model_t **out, char *err, size_t errlen);
void mdl_model_destroy(mdl_model_t *m);
const mdl_config_t *mdl_model_config(const mdl_model_t *m);
/* Borrowed, lives as long as the model. */
const tok_tokenizer_t *mdl_model_tokenizer(const mdl_model_t *m);
/* The chat template source, or NULL when the model has none. */
const char *mdl_model_chat_template(const mdl_model_t *m);
/* Bytes of weights read per forward token (for the roofline figure). */
size_t mdl_model_weight_bytes(const mdl_model_t *m);
/* "q4_k 380.2 MiB, q6_k 102.5 MiB, f32 0.1 MiB": the matrices' bytes by
 * storage type (the embedding included), into buf (truncated to len). */
void mdl_model_weight_types(const mdl_model_t *m, char *buf, size_t len);
/* The weight type holding most of m's matrix bytes (the embedding
 * included), e.g. KN_W_Q4_K for a Q4_K_M file. */
kn_wtype_t mdl_model_bulk_wtype(const mdl_model_t *m);

/* ST_OK when b has a's vocabulary: the same vocab_size and tokenizer size
 * and the same bytes for every token id (a draft model for speculative
 * decoding, scheduler/spec_draft.h). ST_EINVAL with the first difference
 * in err otherwise. model/vocab_match.c. */
int mdl_model_vocab_match(const mdl_model_t *a, const mdl_model_t *b, char *err, size_t errlen);

/* Output types of mdl_quantize (`kvserve quantize --type`). */
typedef enum mdl_quant {
    MDL_QUANT_F32 = 0,
    MDL_QUANT_F16,
    MDL_QUANT_BF16,
    MDL_QUANT_Q8_0,
    MDL_QUANT_Q4_0,
    MDL_QUANT_Q4_K,
    MDL_QUANT_Q5_K,
    MDL_QUANT_Q6_K,
    MDL_QUANT_Q4_K_M, /* llama.cpp's mix: q4_k, with q6_k for output and some attn_v / ffn_down */
    MDL_QUANT_Q5_K_M, /* the same with q5_k */
} mdl_quant_t;

/* "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_k_m",
 * "q5_k_m" <-> type. parse: ST_EINVAL for anything else. */
int mdl_quant_parse(const char *s, mdl_quant_t *out);
const char *mdl_quant_name(mdl_quant_t q);
/* Writes the model at in (a Hugging Face directory or a GGUF file) to out
 * as a GGUF v3 file that llama.cpp and mdl_model_load read, its matrices
 * in type q (model/quantize.c documents the rules), streaming row by row.
 * On failure returns a negative ST_* or -errno with a one-line reason
 * naming the file in err, and leaves no file at out. Thread: any. */
int mdl_quantize(const char *in, const char *out, mdl_quant_t q, char *err, size_t errlen);

/* A run of block-table entries written since the previous step:
 * entries [first, first + count) of persistent row `row` (mdl_batch_t). */
typedef struct mdl_table_run {
    int32_t row, first, count;
} mdl_table_run_t;

/* One step: a flattened varlen batch mixing prefill chunks and decodes
 * (DESIGN.md section 3). All arrays are host memory owned by the caller. */
typedef struct mdl_batch {
    int32_t n_tokens;            /* new tokens this step, all sequences */
    const int32_t *tokens;       /* [n_tokens] */
    const int32_t *positions;    /* [n_tokens] */
    const int32_t *slot_mapping; /* [n_tokens] block * block_size + offset */
    int32_t n_seqs;
    const int32_t *query_start;  /* [n_seqs + 1] offsets into tokens */
    const int32_t *context_len;  /* [n_seqs] KV length after this step */
    const int32_t *block_tables; /* [n_seqs][max_blocks] physical block ids */
    int32_t max_blocks;
    const int32_t *logits_rows;  /* [n_logits] token rows that need logits */
    int32_t n_logits;
    /* Embeddings (issue 14): token rows whose final hidden state (after
     * the final norm, before the LM head) is wanted, read with
     * mdl_runtime_hidden() after the forward. NULL / 0: none. */
    const int32_t *hidden_rows; /* [n_hidden], each in 0 .. n_tokens-1 */
    int32_t n_hidden;
    /* H2O / SnapKV (issue 18): nonzero mass_rows[t] adds row t's attention
     * probabilities to the accumulated mass of the keys it reads (runtime
     * created with kv_mass). NULL: no row does. */
    const uint8_t *mass_rows; /* [n_tokens] */
    /* Persistent block tables (issue 15). NULL table_rows: block_tables is
     * [n_seqs][max_blocks], laid out for this step. Otherwise sequence s
     * reads row table_rows[s] (in 0 .. max_num_seqs-1) of block_tables, a
     * [max_num_seqs][max_blocks] array whose rows persist from step to
     * step in the caller's memory: only the table_dirty runs were written
     * since the previous step (the runtime checks those entries; the
     * caller changes no other entry), and a row's entries past what its
     * context_len covers are never read. */
    const int32_t *table_rows;           /* [n_seqs] */
    const mdl_table_run_t *table_dirty;  /* [n_table_dirty] */
    int32_t n_table_dirty;
} mdl_batch_t;

/* Sequence s's block-table row in b (either layout). */
static inline const int32_t *
mdl_batch_table(const mdl_batch_t *b, int32_t s)
{
    return b->block_tables + (size_t)(b->table_rows != NULL ? b->table_rows[s] : s) *
                                 (size_t)b->max_blocks;
}

typedef enum mdl_kv_dtype {
    MDL_KV_AUTO = 0,
    MDL_KV_F32,
    MDL_KV_F16,
    MDL_KV_BF16,
    MDL_KV_FP8_E4M3,
    MDL_KV_INT8,
    MDL_KV_INT4,
    MDL_KV_TQ3, /* TurboQuant-style rotated codes, 3 / 4 bits (kernels/cpu/kv_tq.h) */
    MDL_KV_TQ4,
} mdl_kv_dtype_t;

typedef struct mdl_runtime_config {
    const char *device;             /* "cpu" (default) or "cuda" */
    int32_t tp_size;                /* tensor-parallel ranks, >= 1 */
    int32_t n_threads;              /* CPU threads per rank; 0 = all cores */
    int32_t block_size;             /* tokens per KV block */
    int32_t num_blocks;             /* device tier, including null block 0 */
    int32_t swap_blocks;            /* CPU tier */
    int32_t max_num_batched_tokens; /* sizes activation buffers */
    int32_t max_num_seqs;
    int32_t max_blocks_per_seq;
    mdl_kv_dtype_t kv_dtype;
    /* cuda: share of each device's memory that weights, activations and the
     * KV pool may use (--gpu-memory-utilization); 0 means 0.9. */
    float gpu_memory_utilization;
    /* cuda: device bytes kept out of the KV pool besides weights and
     * activations (the CUDA context, cuBLAS, other processes), as serve
     * measured them (mdl_device_memory's in_use + MDL_DEV_HEADROOM_BYTES);
     * the larger of this and MDL_DEV_RESERVE_BYTES is used. */
    size_t dev_reserve_bytes;
    /* H2O / SnapKV (model/kv_policy.h): keep each cached token's attention
     * mass per layer and KV head (mdl_runtime_kv_mass), and take
     * KV_OP_COPY_SLOT. cpu backend with an f32 KV cache, cuda with f16 /
     * bf16 (mdl_kv_mass_fits). */
    int kv_mass;
    /* cuda: nonzero runs decode and verification steps (see spec_k; 16-bit
     * KV) as CUDA graphs captured per token-count bucket (model/dev_graph.c);
     * 0 runs every step eagerly (--enforce-eager). */
    int cuda_graphs;
    /* Speculative decoding's k (scheduler/spec.h), 0 without it. A step
     * whose sequences each have 1 .. 1 + spec_k new tokens (verification
     * rows beside plain decodes; with spec_k 0, a decode step) runs on
     * cuda with the per-token attention kernel, and as a graph when
     * cuda_graphs is set; longer rows (prefill chunks) run eagerly with
     * the query-tile kernel. */
    int32_t spec_k;
    /* BF16 weights on the cpu backend (--matmul-precision; 0: HIGH). */
    mdl_matmul_prec_t matmul_precision;
} mdl_runtime_config_t;

typedef struct mdl_runtime mdl_runtime_t;

int mdl_runtime_create(const mdl_model_t *m, const mdl_runtime_config_t *cfg, mdl_runtime_t **out,
                       char *err, size_t errlen);
void mdl_runtime_destroy(mdl_runtime_t *rt);

/* Bytes of one KV block over all layers, K and V, in the cache dtype,
 * scales and zero points included (for sizing --kv-cache-memory into a
 * block count before creation). 0 when the dtype cannot hold this model's
 * heads (e.g. int4 with head_dim % 8 != 0). AUTO counts as f32. */
size_t mdl_kv_block_bytes(const mdl_config_t *c, int32_t block_size, mdl_kv_dtype_t dtype);
/* Bytes of the full-precision residual slots (blocks being filled) a CPU
 * runtime with this dtype, max_num_seqs and max_num_batched_tokens maps per
 * tier (address space; pages are touched as blocks fill); 0 for f32 / f16 /
 * bf16. */
size_t mdl_kv_residual_bytes(const mdl_config_t *c, int32_t block_size, mdl_kv_dtype_t dtype,
                             int32_t max_num_seqs, int32_t max_num_batched_tokens);

/* Fixed share of each device the CUDA backend keeps out of the KV pool:
 * the CUDA context, the cuBLAS workspace (32 MiB), NCCL buffers. */
#define MDL_DEV_RESERVE_BYTES ((size_t)512 << 20)
/* What a rank allocates after the memory query besides weights,
 * activations and the KV pool: the cuBLAS handle and its 32 MiB workspace,
 * the allocator's own pages. */
#define MDL_DEV_HEADROOM_BYTES ((size_t)128 << 20)
/* Device allocations are counted in whole pages of this size. */
#define MDL_DEV_ALLOC_GRAIN ((size_t)2 << 20)

/* What --gpu-memory-utilization leaves for the KV pool on each rank. */
typedef struct mdl_kv_budget {
    int32_t num_blocks;   /* blocks that fit on every rank (at most INT32_MAX) */
    size_t budget_bytes;  /* device_bytes * utilization */
    size_t weight_bytes;  /* 16-bit weight shards of the largest rank (rank 0: LM head) */
    size_t act_bytes;     /* its activations for the largest step */
    size_t reserve_bytes; /* max(MDL_DEV_RESERVE_BYTES, rc->dev_reserve_bytes) */
    size_t block_bytes;   /* one block on one rank: all layers, K and V, its KV heads */
} mdl_kv_budget_t;

/* Sizes the CUDA backend's KV pool (DESIGN.md section 6, model/tp.h):
 *   num_blocks = floor((device_bytes * rc->gpu_memory_utilization
 *                       - weights - activations - MDL_DEV_RESERVE_BYTES)
 *                      / block_bytes), minimized over the rc->tp_size ranks,
 * with weights and activations as model/dev_fwd.c allocates them for
 * rc->max_num_batched_tokens rows and rc->max_num_seqs sequences (each
 * allocation rounded up to MDL_DEV_ALLOC_GRAIN), 16-bit weights and KV.
 * device_bytes is one device's total memory (the smallest of the ranks').
 * Pure: no device is touched, so it runs anywhere.
 * Errors: ST_EINVAL (utilization outside (0, 1], non-positive shapes),
 * the status of mdl_tp_shard() when the model cannot be split, ST_ENOMEM
 * when fewer than 2 blocks fit; each with a one-line reason and the
 * figures in err. out is filled as far as it was computed. */
int mdl_kv_blocks_for_budget(const mdl_config_t *c, const mdl_runtime_config_t *rc,
                             size_t device_bytes, mdl_kv_budget_t *out, char *err, size_t errlen);
/* The smallest total memory (cudaMemGetInfo) of devices 0 .. n_devices-1
 * of `device`, and in *in_use_bytes (may be NULL) the most any of them has
 * in use once this process's context exists on it (the context itself and
 * other processes' memory). ST_ENODEV with the reason in err when the build has no
 * such backend, there are fewer devices or the query fails; ST_EINVAL for
 * "cpu". Thread: before the runtime exists (it selects each device). */
int mdl_device_memory(const char *device, int32_t n_devices, size_t *total_bytes,
                      size_t *in_use_bytes, char *err, size_t errlen);
/* "auto", "f32", "f16", "bf16", "fp8_e4m3", "int8", "int4", "tq3", "tq4"
 * <-> dtype.
 * parse: ST_EINVAL for anything else. */
int mdl_kv_dtype_parse(const char *s, mdl_kv_dtype_t *out);
const char *mdl_kv_dtype_name(mdl_kv_dtype_t d);

/* Runs queued block copy / swap operations, in order. */
int mdl_runtime_kv_ops(mdl_runtime_t *rt, const kv_op_t *ops, int32_t n_ops);
/* The accumulated attention mass of device slots slots[0..n) (a runtime
 * created with kv_mass): out[i][layer][kv_head], n * n_layers * n_kv_heads
 * floats, the sum since each slot was written (or moved with its token) of
 * the probabilities its key got from the mass rows of every forward, per
 * layer and KV head (query heads of a group summed). Plain numbers for the
 * scheduler's eviction policy, like the logits. ST_EINVAL for a slot out of
 * range; ST_EUNSUPPORTED without kv_mass. */
int mdl_runtime_kv_mass(mdl_runtime_t *rt, const int32_t *slots, int32_t n, float *out);
/* Whether a runtime on device (NULL: cpu) with KV dtype dt can keep the
 * attention mass of H2O / SnapKV (kv_mass): cpu with f32 (or auto), cuda
 * and the test backends named cuda-* with f16 / bf16 (auto on cuda: bf16).
 * Quantized caches cannot: a compaction moves single tokens between
 * blocks whose codes share scales. */
int mdl_kv_mass_fits(const char *device, mdl_kv_dtype_t dt);
/* Floats per slot that mdl_runtime_kv_mass writes (n_layers * n_kv_heads),
 * 0 for a runtime without kv_mass. */
int32_t mdl_runtime_kv_mass_heads(const mdl_runtime_t *rt);

/* Forward pass. On ST_OK *logits points at [b->n_logits][vocab] f32 host
 * rows in the order of b->logits_rows, owned by the runtime and valid
 * until the next call; the caller may overwrite them (the engine samples
 * in place), the runtime never reads them back. Per layer, every new token's K/V is written through
 * slot_mapping before any attention reads through block_tables. */
int mdl_forward(mdl_runtime_t *rt, const mdl_batch_t *b, const float **logits);
/* After an ST_OK mdl_forward whose batch had n_hidden > 0: its hidden rows
 * as [n_hidden][dim] f32 host rows in the order of b->hidden_rows, owned by
 * the runtime and valid until the next forward. A backend that cannot give
 * them (CUDA today) refuses such a batch in mdl_forward with
 * ST_EUNSUPPORTED; mdl_runtime_has_hidden() says which. */
const float *mdl_runtime_hidden(const mdl_runtime_t *rt);
int mdl_runtime_has_hidden(const mdl_runtime_t *rt);

#endif /* MODEL_MODEL_H */
