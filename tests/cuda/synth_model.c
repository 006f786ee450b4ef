/* synth_model.c - small synthetic Llama models for the TP and emulated
 * device tests (see synth_model.h).
 *
 * DESIGN. The weights are one f32 allocation carved in the order of
 * model_int.h's fields; the scales (1.0 for embeddings and norms, 0.3 for
 * the lm head and q/k/v, 0.2 for the rest) keep 2-layer logits in a range
 * where f16 and bf16 device paths stay comparable with the CPU's f32.
 *
 * Thread: tests only, one thread.
 */
#include "tests/cuda/synth_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xmalloc.h"

uint64_t synth_rs;

uint32_t
synth_rnd(void)
{
    synth_rs ^= synth_rs << 13;
    synth_rs ^= synth_rs >> 7;
    synth_rs ^= synth_rs << 17;
    return (uint32_t)(synth_rs >> 32);
}

/* n floats in [-scale, scale) at *p; advances *p. */
static float *
synth_take(float **p, size_t n, float scale)
{
    float *r = *p;

    for (size_t i = 0; i < n; i++) {
        r[i] = ((float)(synth_rnd() & 0xffff) / 65536.0f * 2.0f - 1.0f) * scale;
    }
    *p += n;
    return r;
}

void
synth_init_shape(synth_t *s, int32_t n_heads, int32_t n_kv, int bias, int32_t head_dim, int32_t dim,
                 int32_t ffn_dim, uint64_t seed)
{
    mdl_config_t *c = &s->m.cfg;
    float *p;

    memset(s, 0, sizeof(*s));
    synth_rs = seed;
    snprintf(c->arch, sizeof(c->arch), "llama");
    c->vocab_size = 97;
    c->head_dim = head_dim;
    c->n_heads = n_heads;
    c->n_kv_heads = n_kv;
    c->dim = dim;
    c->n_layers = 2;
    c->ffn_dim = ffn_dim;
    c->max_pos = 128;
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->qkv_bias = bias;
    c->bos_id = 1;
    int32_t qd = n_heads * c->head_dim, kvd = n_kv * c->head_dim;
    size_t total = (size_t)c->vocab_size * c->dim * 2 + c->dim +
                   (size_t)c->n_layers *
                       ((size_t)qd * c->dim + 2 * (size_t)kvd * c->dim + qd + 2 * kvd +
                        (size_t)c->dim * qd + 2 * (size_t)c->dim + 3 * (size_t)c->ffn_dim * c->dim);

    s->buf = xmalloc(sizeof(float) * total);
    p = s->buf;
    s->m.tok_embd =
        mdl_weight_f32(synth_take(&p, (size_t)c->vocab_size * c->dim, 1.0f), c->vocab_size, c->dim);
    s->m.lm_head =
        mdl_weight_f32(synth_take(&p, (size_t)c->vocab_size * c->dim, 0.3f), c->vocab_size, c->dim);
    s->m.out_norm = synth_take(&p, (size_t)c->dim, 1.0f);
    s->m.layers = xcalloc((size_t)c->n_layers, sizeof(mdl_layer_t));
    for (int32_t l = 0; l < c->n_layers; l++) {
        mdl_layer_t *L = &s->m.layers[l];

        L->attn_norm = synth_take(&p, (size_t)c->dim, 1.0f);
        L->ffn_norm = synth_take(&p, (size_t)c->dim, 1.0f);
        L->wq = mdl_weight_f32(synth_take(&p, (size_t)qd * c->dim, 0.3f), qd, c->dim);
        L->wk = mdl_weight_f32(synth_take(&p, (size_t)kvd * c->dim, 0.3f), kvd, c->dim);
        L->wv = mdl_weight_f32(synth_take(&p, (size_t)kvd * c->dim, 0.3f), kvd, c->dim);
        L->bq = synth_take(&p, (size_t)qd, 0.2f);
        L->bk = synth_take(&p, (size_t)kvd, 0.2f);
        L->bv = synth_take(&p, (size_t)kvd, 0.2f);
        if (!bias) {
            L->bq = L->bk = L->bv = NULL;
        }
        L->wo = mdl_weight_f32(synth_take(&p, (size_t)c->dim * qd, 0.2f), c->dim, qd);
        L->w_gate =
            mdl_weight_f32(synth_take(&p, (size_t)c->ffn_dim * c->dim, 0.2f), c->ffn_dim, c->dim);
        L->w_up =
            mdl_weight_f32(synth_take(&p, (size_t)c->ffn_dim * c->dim, 0.2f), c->ffn_dim, c->dim);
        L->w_down =
            mdl_weight_f32(synth_take(&p, (size_t)c->dim * c->ffn_dim, 0.2f), c->dim, c->ffn_dim);
    }
}

void
synth_fini(synth_t *s)
{
    free(s->m.layers);
    free(s->buf);
    s->m.layers = NULL;
    s->buf = NULL;
}
