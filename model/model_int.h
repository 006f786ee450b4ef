/* model_int.h - model internals shared by the model/ sources and the backends.
 *
 * Weights are held in f32 on the host (converted at load from F16, BF16 or
 * Q8_0; F32 safetensors are used in place from the mmap). Shapes follow
 * the Hugging Face layout: a linear layer's weight is [out][in], row-major.
 * GGUF q/k weights are un-permuted at load so both formats agree.
 *
 * Thread: immutable after mdl_model_load().
 */
#ifndef MODEL_MODEL_INT_H
#define MODEL_MODEL_INT_H

#include <stddef.h>

#include "model/model.h"

typedef struct mdl_layer {
    const float *attn_norm; /* [dim] */
    const float *wq;        /* [n_heads * head_dim][dim] */
    const float *wk;        /* [n_kv_heads * head_dim][dim] */
    const float *wv;        /* [n_kv_heads * head_dim][dim] */
    const float *bq;        /* [n_heads * head_dim] or NULL */
    const float *bk;        /* [n_kv_heads * head_dim] or NULL */
    const float *bv;        /* [n_kv_heads * head_dim] or NULL */
    const float *wo;        /* [dim][n_heads * head_dim] */
    const float *ffn_norm;  /* [dim] */
    const float *w_gate;    /* [ffn_dim][dim] */
    const float *w_up;      /* [ffn_dim][dim] */
    const float *w_down;    /* [dim][ffn_dim] */
} mdl_layer_t;

struct mdl_model {
    mdl_config_t cfg;
    char *path;             /* as given to mdl_model_load */
    tok_tokenizer_t *tok;
    char *chat_template;    /* NULL when none */
    const float *tok_embd;  /* [vocab][dim] */
    const float *out_norm;  /* [dim] */
    const float *lm_head;   /* [vocab][dim]; == tok_embd when tied */
    mdl_layer_t *layers;    /* [n_layers] */
    /* Storage: mmaps to unmap and f32 buffers to free at destroy. */
    void **maps;
    size_t *map_lens;
    int n_maps;
    float **owned;
    int n_owned;
    size_t weight_bytes;    /* f32 bytes read per token (all weights) */
};

/* The RoPE frequencies of c (theta, scaling), the one mapping of the model
 * config to kernels/cpu's RoPE parameters for every backend.
 *   inv_freq: (head_dim / 2) out */
void mdl_rope_inv_freq(const mdl_config_t *c, float *inv_freq);

#endif /* MODEL_MODEL_INT_H */
