/* model_int.h - model internals shared by the model/ sources and the backends.
 *
 * Weights stay in their file's type (kernels/cpu/kn_quant.h): a matrix is
 * a kn_weight_t pointing into the mmap'd file (F32, F16, BF16, Q8_0, Q4_0,
 * Q4_K, Q5_K, Q6_K), so the file's pages are the weights. Owned copies are
 * made only for GGUF q/k matrices (their rows un-permuted, same type; the
 * file's pages of those tensors are dropped), for types without a native
 * kernel (Q4_1, Q5_0, Q5_1: converted once to Q8_0) and for tensors not
 * aligned for their type. Norms and biases are small f32 vectors.
 * Shapes follow the Hugging Face layout: a linear layer's weight is
 * [out][in], row-major. GGUF q/k rows are un-permuted at load so both
 * formats agree.
 *
 * Thread: immutable after mdl_model_load().
 */
#ifndef MODEL_MODEL_INT_H
#define MODEL_MODEL_INT_H

#include <stddef.h>

#include "kernels/cpu/kn_quant.h"
#include "model/model.h"

typedef struct mdl_layer {
    const float *attn_norm; /* [dim] */
    kn_weight_t wq;         /* [n_heads * head_dim][dim] */
    kn_weight_t wk;         /* [n_kv_heads * head_dim][dim] */
    kn_weight_t wv;         /* [n_kv_heads * head_dim][dim] */
    const float *bq;        /* [n_heads * head_dim] or NULL */
    const float *bk;        /* [n_kv_heads * head_dim] or NULL */
    const float *bv;        /* [n_kv_heads * head_dim] or NULL */
    kn_weight_t wo;         /* [dim][n_heads * head_dim] */
    const float *ffn_norm;  /* [dim] */
    kn_weight_t w_gate;     /* [ffn_dim][dim] */
    kn_weight_t w_up;       /* [ffn_dim][dim] */
    kn_weight_t w_down;     /* [dim][ffn_dim] */
} mdl_layer_t;

struct mdl_model {
    mdl_config_t cfg;
    char *path;             /* as given to mdl_model_load */
    tok_tokenizer_t *tok;
    char *chat_template;    /* NULL when none */
    kn_weight_t tok_embd;   /* [vocab][dim] */
    const float *out_norm;  /* [dim] */
    kn_weight_t lm_head;    /* [vocab][dim]; == tok_embd when tied */
    mdl_layer_t *layers;    /* [n_layers] */
    /* Storage: mmaps to unmap and buffers to free at destroy. */
    void **maps;
    size_t *map_lens;
    int n_maps;
    void **owned;
    int n_owned;
    size_t weight_bytes;    /* bytes read per token (every weight but the embedding lookup) */
    size_t type_bytes[KN_W_NTYPES]; /* bytes of the matrices by type (embedding included) */
};

/* Drops the whole pages of [p, p + len) of a file mapping from memory
 * (they are re-read if touched again): the loader or the CPU backend's
 * repack (model/cpu_repack.c) copied them. model.c. */
void mdl__drop_pages(const void *p, size_t len);

/* An f32 (rows, cols) matrix as a weight (tests and synthetic models). */
static inline kn_weight_t
mdl_weight_f32(const float *w, int32_t rows, int32_t cols)
{
    kn_weight_t v = {KN_W_F32, w, sizeof(float) * (size_t)cols, rows, cols};

    return v;
}

/* The type mdl_quantize writes the matrix name (GGUF name, cols per row)
 * in for q, in a model of n_layers layers with (has_output) or without an
 * output.weight; *wanted is the type before the row-length fallback
 * (model/quantize.c). */
kn_wtype_t mdl__quant_tensor_type(mdl_quant_t q, const char *name, int64_t cols, int64_t n_layers,
                                  int has_output, kn_wtype_t *wanted);

/* The RoPE frequencies of c (theta, scaling), the one mapping of the model
 * config to kernels/cpu's RoPE parameters for every backend.
 *   inv_freq: (head_dim / 2) out */
void mdl_rope_inv_freq(const mdl_config_t *c, float *inv_freq);

#endif /* MODEL_MODEL_INT_H */
