/* quantize.c - mdl_quantize (`kvserve quantize`): a Hugging Face directory
 * or a GGUF file in, a GGUF v3 file in one weight type (or llama.cpp's
 * Q4_K_M / Q5_K_M mix) out, that llama.cpp and kvserve both load.
 *
 * DESIGN. Every matrix is streamed a row at a time: the source row is
 * decoded to f32 (kn_dequant_row of its type, or gguf_tensor_to_f32 for
 * the GGUF types kn_quant lacks: Q4_1, Q5_0, Q5_1), quantized with
 * kn_quant_row into the target type and written; the model is never held
 * in f32. A matrix already in the target type is copied byte for byte (no
 * second rounding), so quantizing a file again to its own type gives the
 * same bytes. Norms, biases and other 1-D tensors are written as F32, as
 * llama.cpp does.
 *
 * The type of each matrix (mdl__quant_tensor_type):
 *   - plain types (f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k): every
 *     matrix in that type (llama-quantize --pure);
 *   - q4_k_m / q5_k_m (llama.cpp's llama_tensor_get_type, simplified):
 *     base q4_k / q5_k, except output.weight (token_embd.weight when the
 *     embeddings are tied) in q6_k, and attn_v.weight and ffn_down.weight
 *     in q6_k for the layers where use_more_bits(i, n) holds:
 *     i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2 (the first and last
 *     eighth of the layers and every third one between). llama.cpp's
 *     further rules (70B and MoE shapes, fused qkv, importance matrices)
 *     are left out;
 *   - a row whose length is not a whole number of the type's blocks (256
 *     for the K types, 32 for q8_0 / q4_0) falls back to q8_0 when it is a
 *     multiple of 32, else f16, with one log line per tensor (llama.cpp
 *     takes q5_0 / q5_1 for some K types; kvserve has no kernel for them).
 *
 * From a GGUF file, every key/value is copied as it is (general.file_type
 * set to the target's LLAMA_FTYPE, general.alignment to 32), tensors keep
 * their names, order and (q/k permuted) row order. From a Hugging Face
 * directory, the model is loaded (mdl_model_load: weights stay mmap'd in
 * their file type) and written the way llama.cpp's convert_hf_to_gguf.py
 * does: <arch>.* hyperparameters, token_embd / blk.N.* / output_norm /
 * output tensor names, q/k rows permuted for llama-style models (not
 * qwen2), llama3 RoPE scaling as a rope_freqs.weight tensor, and the
 * tokenizer as tokenizer.ggml.* ("llama" for SentencePiece-style BPE with
 * scores from the merge ranks, "gpt2" for byte-level BPE with merges).
 *
 * Thread: any; nothing is shared.
 */
#define LOG_MODULE "quantize"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "formats/fmt_util.h"
#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "kernels/cpu/kn_quant.h"
#include "model/model_int.h"
#include "text/tokenizer.h"

static const struct {
    const char *name;
    mdl_quant_t q;
    kn_wtype_t base;
    uint32_t ftype; /* llama.cpp's LLAMA_FTYPE_* */
} k_quants[] = {
    {"f32", MDL_QUANT_F32, KN_W_F32, 0},          {"f16", MDL_QUANT_F16, KN_W_F16, 1},
    {"bf16", MDL_QUANT_BF16, KN_W_BF16, 32},      {"q8_0", MDL_QUANT_Q8_0, KN_W_Q8_0, 7},
    {"q4_0", MDL_QUANT_Q4_0, KN_W_Q4_0, 2},       {"q4_k", MDL_QUANT_Q4_K, KN_W_Q4_K, 14},
    {"q5_k", MDL_QUANT_Q5_K, KN_W_Q5_K, 16},      {"q6_k", MDL_QUANT_Q6_K, KN_W_Q6_K, 18},
    {"q4_k_m", MDL_QUANT_Q4_K_M, KN_W_Q4_K, 15},  {"q5_k_m", MDL_QUANT_Q5_K_M, KN_W_Q5_K, 17},
};
#define N_QUANTS (sizeof(k_quants) / sizeof(k_quants[0]))

int
mdl_quant_parse(const char *s, mdl_quant_t *out)
{
    for (size_t i = 0; s != NULL && i < N_QUANTS; i++) {
        if (strcmp(s, k_quants[i].name) == 0) {
            *out = k_quants[i].q;
            return ST_OK;
        }
    }
    return ST_EINVAL;
}

const char *
mdl_quant_name(mdl_quant_t q)
{
    return (size_t)q < N_QUANTS ? k_quants[q].name : "?";
}

/* The ggml tensor type number of a kn_quant type. */
static uint32_t
ggml_type_of(kn_wtype_t t)
{
    static const uint32_t map[KN_W_NTYPES] = {
        [KN_W_F32] = GGUF_TENSOR_F32,   [KN_W_F16] = GGUF_TENSOR_F16,
        [KN_W_BF16] = GGUF_TENSOR_BF16, [KN_W_Q8_0] = GGUF_TENSOR_Q8_0,
        [KN_W_Q4_0] = GGUF_TENSOR_Q4_0, [KN_W_Q4_K] = GGUF_TENSOR_Q4_K,
        [KN_W_Q5_K] = GGUF_TENSOR_Q5_K, [KN_W_Q6_K] = GGUF_TENSOR_Q6_K,
    };
    return map[t];
}

/* The kn_quant type of a ggml tensor type; KN_W_NTYPES when kn_quant has
 * none (Q4_1, Q5_0, Q5_1: decoded by gguf_tensor_to_f32). */
static kn_wtype_t
kn_type_of(uint32_t ggml)
{
    for (int t = 0; t < KN_W_NTYPES; t++) {
        if (ggml_type_of((kn_wtype_t)t) == ggml) {
            return (kn_wtype_t)t;
        }
    }
    return KN_W_NTYPES;
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and
 * every third layer between them. */
static int
use_more_bits(int64_t i, int64_t n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* Layer number of "blk.N.<suffix>" or -1. */
static int64_t
layer_of(const char *name, const char *suffix)
{
    long long l;
    int off = 0;

    if (sscanf(name, "blk.%lld.%n", &l, &off) != 1 || off == 0 || strcmp(name + off, suffix) != 0) {
        return -1;
    }
    return l;
}

kn_wtype_t
mdl__quant_tensor_type(mdl_quant_t q, const char *name, int64_t cols, int64_t n_layers,
                       int has_output, kn_wtype_t *wanted)
{
    kn_wtype_t t = k_quants[q].base;
    int64_t l;

    if (q == MDL_QUANT_Q4_K_M || q == MDL_QUANT_Q5_K_M) {
        if (strcmp(name, "output.weight") == 0 ||
            (!has_output && strcmp(name, "token_embd.weight") == 0)) {
            t = KN_W_Q6_K;
        } else if (((l = layer_of(name, "attn_v.weight")) >= 0 ||
                    (l = layer_of(name, "ffn_down.weight")) >= 0) &&
                   use_more_bits(l, n_layers)) {
            t = KN_W_Q6_K;
        }
    }
    *wanted = t;
    if (cols % kn_wtype_block_elems(t) != 0) {
        t = cols % 32 == 0 ? KN_W_Q8_0 : KN_W_F16;
    }
    return t;
}

/* ------------------------------------------------------------------ */
/* Output of one matrix, row by row. */

typedef struct qctx {
    mdl_quant_t q;
    const char *out_path;
    gguf_writer_t *w;
    int64_t n_layers;
    int has_output;
    float *row;          /* [cols] scratch */
    unsigned char *qrow; /* [row_bytes] scratch */
    size_t row_cap, qrow_cap;
    uint64_t n_bytes[KN_W_NTYPES]; /* written, by type */
    int64_t n_fallbacks;
} qctx_t;

/* A matrix of the source, decoded one row at a time. */
typedef struct msrc {
    const unsigned char *data;
    size_t row_bytes;
    kn_wtype_t type;           /* KN_W_NTYPES: gguf (below) */
    const gguf_tensor_t *gt;   /* for gguf_tensor_to_f32 rows */
    int64_t rows, cols;
    int64_t permute_heads;     /* > 0: write HF rows in llama.cpp's q/k order */
} msrc_t;

static void
grow(void **p, size_t *cap, size_t n)
{
    if (n > *cap) {
        *p = xrealloc(*p, n);
        *cap = n;
    }
}

/* Source row of stored row p of a q/k matrix (llama.cpp's permute: within
 * a head, HF row s * hd/2 + j is stored at 2j + s). */
static int64_t
permuted_src_row(int64_t p, int64_t n_head, int64_t rows)
{
    int64_t hd, half, i;

    if (n_head <= 0) {
        return p;
    }
    hd = rows / n_head;
    half = hd / 2;
    i = p % hd;
    return p - i + (i % 2) * half + i / 2;
}

static void
src_row_f32(const msrc_t *s, int64_t r, float *dst)
{
    const unsigned char *at = s->data + (size_t)r * s->row_bytes;

    if (s->type != KN_W_NTYPES) {
        kn_dequant_row(s->type, at, dst, s->cols);
    } else {
        gguf_tensor_t row = *s->gt;

        row.n_dims = 1;
        row.dims[0] = (uint64_t)s->cols;
        row.dims[1] = row.dims[2] = row.dims[3] = 1;
        row.data = at;
        row.nbytes = s->row_bytes;
        CHECK(gguf_tensor_to_f32(&row, dst) == ST_OK);
    }
}

/* Declares name (ggml dims {cols, rows, ...}) in the type the recipe
 * gives it; *type out. */
static int
declare_matrix(qctx_t *c, const char *name, uint32_t n_dims, const uint64_t *dims,
               kn_wtype_t *type, char *err, size_t errlen)
{
    int64_t cols = (int64_t)dims[0], rows = 1;
    kn_wtype_t t, wanted;

    for (uint32_t d = 1; d < n_dims; d++) {
        rows *= (int64_t)dims[d];
    }
    t = mdl__quant_tensor_type(c->q, name, cols, c->n_layers, c->has_output, &wanted);
    if (t != wanted) {
        c->n_fallbacks++;
        LOG_INFO("%s: %lld columns are not a multiple of the %s block: %s instead", name,
                 (long long)cols, kn_wtype_name(wanted), kn_wtype_name(t));
    }
    *type = t;
    return gguf_w_add_tensor(c->w, name, ggml_type_of(t), n_dims, dims,
                             (uint64_t)rows * kn_wtype_row_bytes(t, cols), err, errlen);
}

/* Writes the rows of s in type t. */
static int
write_matrix(qctx_t *c, const msrc_t *s, kn_wtype_t t, char *err, size_t errlen)
{
    size_t rb = kn_wtype_row_bytes(t, s->cols);
    int rc = ST_OK;

    grow((void **)&c->row, &c->row_cap, sizeof(float) * (size_t)s->cols);
    grow((void **)&c->qrow, &c->qrow_cap, rb);
    for (int64_t p = 0; p < s->rows && rc == ST_OK; p++) {
        int64_t r = permuted_src_row(p, s->permute_heads, s->rows);

        if (s->type == t) {
            rc = gguf_w_write_data(c->w, s->data + (size_t)r * s->row_bytes, rb, err, errlen);
        } else {
            src_row_f32(s, r, c->row);
            kn_quant_row(t, c->row, c->qrow, s->cols);
            rc = gguf_w_write_data(c->w, c->qrow, rb, err, errlen);
        }
    }
    c->n_bytes[t] += (uint64_t)s->rows * rb;
    return rc;
}

/* ------------------------------------------------------------------ */
/* GGUF in. */

static int
quantize_gguf(qctx_t *c, const char *in, gguf_file_t *g, char *err, size_t errlen)
{
    kn_wtype_t *types = NULL;
    int64_t nt;
    int rc = ST_OK;
    uint32_t u;

    nt = gguf_n_tensors(g);
    c->has_output = gguf_find_tensor(g, "output.weight") != NULL;
    {
        const char *arch;
        size_t al;
        char key[96];

        if (gguf_get_str(g, "general.architecture", &arch, &al) == ST_OK && al < 48) {
            snprintf(key, sizeof(key), "%.*s.block_count", (int)al, arch);
            if (gguf_get_u32(g, key, &u) == ST_OK) {
                c->n_layers = u;
            }
        }
    }
    for (int64_t i = 0; i < gguf_n_keys(g); i++) {
        const void *raw;
        size_t len;

        CHECK(gguf_key_raw(g, i, &raw, &len) == ST_OK);
        gguf_w_set_raw(c->w, gguf_key_name(g, i), gguf_key_type(g, i), raw, len);
    }
    gguf_w_set_u32(c->w, "general.file_type", k_quants[c->q].ftype);
    if (gguf_find_key(g, "general.alignment") >= 0) {
        gguf_w_set_u32(c->w, "general.alignment", GGUF_W_ALIGNMENT);
    }
    if (k_quants[c->q].base != KN_W_F32 && k_quants[c->q].base != KN_W_F16 &&
        k_quants[c->q].base != KN_W_BF16) {
        gguf_w_set_u32(c->w, "general.quantization_version", 2);
    }

    types = xcalloc((size_t)(nt > 0 ? nt : 1), sizeof(*types));
    for (int64_t i = 0; i < nt && rc == ST_OK; i++) {
        const gguf_tensor_t *t = gguf_tensor(g, i);

        if (t->n_dims >= 2) {
            if (!gguf_tensor_convertible(t->type)) {
                fmt_seterr(err, errlen, "%s: tensor '%s' has type %s, which cannot be requantized",
                           in, t->name, gguf_tensor_type_name(t->type));
                rc = ST_EFORMAT;
                break;
            }
            rc = declare_matrix(c, t->name, t->n_dims, t->dims, &types[i], err, errlen);
        } else {
            types[i] = KN_W_F32;
            rc = gguf_w_add_tensor(c->w, t->name, GGUF_TENSOR_F32, t->n_dims, t->dims,
                                   t->dims[0] * 4, err, errlen);
        }
    }
    if (rc == ST_OK) {
        rc = gguf_w_write_header(c->w, err, errlen);
    }
    for (int64_t i = 0; i < nt && rc == ST_OK; i++) {
        const gguf_tensor_t *t = gguf_tensor(g, i);

        if (t->n_dims >= 2) {
            msrc_t s = {.data = t->data, .type = kn_type_of(t->type), .gt = t,
                        .cols = (int64_t)t->dims[0]};

            s.rows = (int64_t)(t->dims[1] * t->dims[2] * t->dims[3]);
            s.row_bytes = (size_t)(t->nbytes / (uint64_t)s.rows);
            rc = write_matrix(c, &s, types[i], err, errlen);
        } else if (t->type == GGUF_TENSOR_F32) {
            rc = gguf_w_write_data(c->w, t->data, (size_t)t->nbytes, err, errlen);
            c->n_bytes[KN_W_F32] += t->nbytes;
        } else {
            float *v = xmalloc(sizeof(float) * (size_t)t->dims[0]);

            if (gguf_tensor_to_f32(t, v) != ST_OK) {
                fmt_seterr(err, errlen, "%s: tensor '%s' has type %s, not convertible to F32", in,
                           t->name, gguf_tensor_type_name(t->type));
                rc = ST_EFORMAT;
            } else {
                rc = gguf_w_write_data(c->w, v, sizeof(float) * (size_t)t->dims[0], err, errlen);
                c->n_bytes[KN_W_F32] += sizeof(float) * t->dims[0];
            }
            free(v);
        }
    }
    free(types);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Hugging Face directory in. */

/* One tensor of the HF output plan: a matrix (w) or an f32 vector (v). */
typedef struct htensor {
    char name[64];
    const kn_weight_t *w;
    const float *v;
    int64_t n;            /* vector length */
    int64_t permute_heads;
    kn_wtype_t type;      /* chosen type (matrices) */
} htensor_t;

typedef struct hplan {
    htensor_t *t;
    int n, cap;
} hplan_t;

static htensor_t *
plan_add(hplan_t *p, const char *name)
{
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 64;
        p->t = xrealloc(p->t, (size_t)p->cap * sizeof(*p->t));
    }
    memset(&p->t[p->n], 0, sizeof(p->t[0]));
    snprintf(p->t[p->n].name, sizeof(p->t[0].name), "%s", name);
    return &p->t[p->n++];
}

static void
plan_mat(hplan_t *p, const char *name, const kn_weight_t *w, int64_t permute_heads)
{
    htensor_t *t = plan_add(p, name);

    t->w = w;
    t->permute_heads = permute_heads;
}

static void
plan_vec(hplan_t *p, const char *name, const float *v, int64_t n, int64_t permute_heads)
{
    htensor_t *t = plan_add(p, name);

    t->v = v;
    t->n = n;
    t->permute_heads = permute_heads;
}

/* llama.cpp's rope_freqs.weight for llama3 scaling: per frequency the
 * divisor of its inverse wavelength ([head_dim / 2]). */
static float *
llama3_rope_freqs(const mdl_config_t *c)
{
    int32_t half = c->head_dim / 2;
    float *out = xmalloc(sizeof(float) * (size_t)half);
    double low_wl = c->rope_orig_max_pos / c->rope_low_freq_factor;
    double high_wl = c->rope_orig_max_pos / c->rope_high_freq_factor;

    for (int32_t i = 0; i < half; i++) {
        double freq = 1.0 / pow(c->rope_theta, 2.0 * i / c->head_dim);
        double wl = 2.0 * M_PI / freq;

        if (wl < high_wl) {
            out[i] = 1.0f;
        } else if (wl > low_wl) {
            out[i] = c->rope_factor;
        } else {
            double smooth = (c->rope_orig_max_pos / wl - c->rope_low_freq_factor) /
                            (c->rope_high_freq_factor - c->rope_low_freq_factor);
            out[i] = (float)(1.0 / ((1.0 - smooth) / c->rope_factor + smooth));
        }
    }
    return out;
}

/* tokenizer.ggml.pre for a byte-level tokenizer.json, from its
 * pre-tokenizer's split pattern (llama.cpp identifies it by hashing the
 * tokenization of a test text; the patterns kvserve knows are enough). */
static const char *
hf_pre_name(const char *dir)
{
    char path[4096], *text = NULL;
    size_t len;
    const char *name = "gpt-2";

    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    if (fmt_read_file(path, (size_t)1 << 30, &text, &len, NULL, 0) != ST_OK) {
        return name;
    }
    /* The patterns as JSON-escaped text in the file. */
    if (strstr(text, "\\\\p{N}{1,3}") != NULL) {
        name = "llama-bpe";
    } else if (strstr(text, "\\\\p{L}+|\\\\p{N}|") != NULL) {
        name = "qwen2";
    } else if (strstr(text, "\"Digits\"") != NULL) {
        name = "smollm";
    }
    free(text);
    return name;
}

static void
set_tokenizer(qctx_t *c, const mdl_model_t *m, const char *dir)
{
    const tok_tokenizer_t *tok = mdl_model_tokenizer(m);
    int32_t n = tok_vocab_size(tok);
    const char **strs = xmalloc(sizeof(*strs) * (size_t)n);
    int32_t *types = xmalloc(sizeof(*types) * (size_t)n);
    int byte_level = tok_is_byte_level(tok);
    const char *tmpl = mdl_model_chat_template(m);

    for (int32_t i = 0; i < n; i++) {
        strs[i] = tok_token_str(tok, i);
        types[i] = tok_token_gguf_type(tok, i);
    }
    gguf_w_set_str(c->w, "tokenizer.ggml.model", byte_level ? "gpt2" : "llama",
                   byte_level ? 4 : 5);
    if (byte_level) {
        const char *pre = hf_pre_name(dir);

        gguf_w_set_str(c->w, "tokenizer.ggml.pre", pre, strlen(pre));
    }
    gguf_w_set_arr_str(c->w, "tokenizer.ggml.tokens", strs, NULL, (uint64_t)n);
    if (!byte_level) {
        float *scores = tok_merge_scores(tok);

        gguf_w_set_arr(c->w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, (uint64_t)n);
        free(scores);
    }
    gguf_w_set_arr(c->w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)n);
    if (byte_level) {
        uint32_t nm = tok_merges(tok, NULL);
        int32_t *pairs = xmalloc(sizeof(*pairs) * 2 * (nm > 0 ? nm : 1));
        char **ms = xmalloc(sizeof(*ms) * (nm > 0 ? nm : 1));

        nm = tok_merges(tok, pairs);
        for (uint32_t i = 0; i < nm; i++) {
            const char *a = tok_token_str(tok, pairs[2 * i]);
            const char *b = tok_token_str(tok, pairs[2 * i + 1]);
            size_t la = strlen(a), lb = strlen(b);

            ms[i] = xmalloc(la + lb + 2);
            memcpy(ms[i], a, la);
            ms[i][la] = ' ';
            memcpy(ms[i] + la + 1, b, lb + 1);
        }
        gguf_w_set_arr_str(c->w, "tokenizer.ggml.merges", (const char *const *)ms, NULL, nm);
        for (uint32_t i = 0; i < nm; i++) {
            free(ms[i]);
        }
        free(ms);
        free(pairs);
    }
    if (tok_bos_id(tok) >= 0) {
        gguf_w_set_u32(c->w, "tokenizer.ggml.bos_token_id", (uint32_t)tok_bos_id(tok));
    }
    if (tok_eos_id(tok) >= 0) {
        gguf_w_set_u32(c->w, "tokenizer.ggml.eos_token_id", (uint32_t)tok_eos_id(tok));
    }
    if (tok_unk_id(tok) >= 0) {
        gguf_w_set_u32(c->w, "tokenizer.ggml.unknown_token_id", (uint32_t)tok_unk_id(tok));
    }
    gguf_w_set_bool(c->w, "tokenizer.ggml.add_bos_token", tok_adds_bos(tok));
    gguf_w_set_bool(c->w, "tokenizer.ggml.add_eos_token", tok_adds_eos(tok));
    if (tmpl != NULL) {
        gguf_w_set_str(c->w, "tokenizer.chat_template", tmpl, strlen(tmpl));
    }
    free(strs);
    free(types);
}

static void
set_hparams(qctx_t *c, const mdl_config_t *cfg, const char *arch, const char *dir)
{
    char key[96];
    const char *base = strrchr(dir, '/');
    size_t bl;

    /* The directory's name, as convert_hf_to_gguf.py names a model. */
    while (base != NULL && base[1] == '\0' && base > dir) {
        const char *p = base - 1;

        while (p > dir && *p != '/') {
            p--;
        }
        base = p;
    }
    base = base == NULL ? dir : (*base == '/' ? base + 1 : base);
    bl = strcspn(base, "/");

#define K(suffix) (snprintf(key, sizeof(key), "%s.%s", arch, (suffix)), key)
    gguf_w_set_str(c->w, "general.architecture", arch, strlen(arch));
    gguf_w_set_str(c->w, "general.name", base, bl);
    gguf_w_set_u32(c->w, "general.file_type", k_quants[c->q].ftype);
    if (k_quants[c->q].base != KN_W_F32 && k_quants[c->q].base != KN_W_F16 &&
        k_quants[c->q].base != KN_W_BF16) {
        gguf_w_set_u32(c->w, "general.quantization_version", 2);
    }
    gguf_w_set_u32(c->w, K("context_length"), (uint32_t)cfg->max_pos);
    gguf_w_set_u32(c->w, K("embedding_length"), (uint32_t)cfg->dim);
    gguf_w_set_u32(c->w, K("block_count"), (uint32_t)cfg->n_layers);
    gguf_w_set_u32(c->w, K("feed_forward_length"), (uint32_t)cfg->ffn_dim);
    gguf_w_set_u32(c->w, K("rope.dimension_count"), (uint32_t)cfg->head_dim);
    gguf_w_set_u32(c->w, K("attention.head_count"), (uint32_t)cfg->n_heads);
    gguf_w_set_u32(c->w, K("attention.head_count_kv"), (uint32_t)cfg->n_kv_heads);
    gguf_w_set_f32(c->w, K("attention.layer_norm_rms_epsilon"), cfg->norm_eps);
    gguf_w_set_f32(c->w, K("rope.freq_base"), cfg->rope_theta);
    if (cfg->head_dim * cfg->n_heads != cfg->dim) {
        gguf_w_set_u32(c->w, K("attention.key_length"), (uint32_t)cfg->head_dim);
        gguf_w_set_u32(c->w, K("attention.value_length"), (uint32_t)cfg->head_dim);
    }
    if (cfg->rope_scaling == MDL_ROPE_LINEAR) {
        gguf_w_set_str(c->w, K("rope.scaling.type"), "linear", 6);
        gguf_w_set_f32(c->w, K("rope.scaling.factor"), cfg->rope_factor);
    }
    if (cfg->sliding_window > 0 && strcmp(arch, "qwen2") != 0) {
        LOG_WARN("%s: sliding_window %d is not written (llama.cpp's llama architecture has no "
                 "such key)", dir, (int)cfg->sliding_window);
    }
    gguf_w_set_u32(c->w, K("vocab_size"), (uint32_t)cfg->vocab_size);
#undef K
}

static int
quantize_hf(qctx_t *c, const char *in, const mdl_model_t *m, char *err, size_t errlen)
{
    const mdl_config_t *cfg;
    hplan_t p = {0};
    float *rope_freqs = NULL;
    const char *arch;
    int64_t pq, pk;
    char nm[64];
    int rc = ST_OK;

    cfg = mdl_model_config(m);
    arch = strcmp(cfg->arch, "qwen2") == 0 ? "qwen2" : "llama";
    pq = strcmp(arch, "llama") == 0 ? cfg->n_heads : 0;
    pk = strcmp(arch, "llama") == 0 ? cfg->n_kv_heads : 0;
    c->n_layers = cfg->n_layers;
    c->has_output = !cfg->tie_embeddings;

    set_hparams(c, cfg, arch, in);
    set_tokenizer(c, m, in);

    /* Tensors in convert_hf_to_gguf.py's names and order. */
    if (cfg->rope_scaling == MDL_ROPE_LLAMA3) {
        rope_freqs = llama3_rope_freqs(cfg);
        plan_vec(&p, "rope_freqs.weight", rope_freqs, cfg->head_dim / 2, 0);
    }
    plan_mat(&p, "token_embd.weight", &m->tok_embd, 0);
    for (int32_t l = 0; l < cfg->n_layers; l++) {
        const mdl_layer_t *L = &m->layers[l];
        int64_t qr = (int64_t)cfg->n_heads * cfg->head_dim;
        int64_t kr = (int64_t)cfg->n_kv_heads * cfg->head_dim;

#define N(s) (snprintf(nm, sizeof(nm), "blk.%d.%s", (int)l, (s)), nm)
        plan_vec(&p, N("attn_norm.weight"), L->attn_norm, cfg->dim, 0);
        plan_mat(&p, N("attn_q.weight"), &L->wq, pq);
        plan_mat(&p, N("attn_k.weight"), &L->wk, pk);
        plan_mat(&p, N("attn_v.weight"), &L->wv, 0);
        if (L->bq != NULL) {
            plan_vec(&p, N("attn_q.bias"), L->bq, qr, pq);
            plan_vec(&p, N("attn_k.bias"), L->bk, kr, pk);
            plan_vec(&p, N("attn_v.bias"), L->bv, kr, 0);
        }
        plan_mat(&p, N("attn_output.weight"), &L->wo, 0);
        plan_vec(&p, N("ffn_norm.weight"), L->ffn_norm, cfg->dim, 0);
        plan_mat(&p, N("ffn_gate.weight"), &L->w_gate, 0);
        plan_mat(&p, N("ffn_up.weight"), &L->w_up, 0);
        plan_mat(&p, N("ffn_down.weight"), &L->w_down, 0);
#undef N
    }
    plan_vec(&p, "output_norm.weight", m->out_norm, cfg->dim, 0);
    if (!cfg->tie_embeddings) {
        plan_mat(&p, "output.weight", &m->lm_head, 0);
    }

    for (int i = 0; i < p.n && rc == ST_OK; i++) {
        htensor_t *t = &p.t[i];

        if (t->w != NULL) {
            uint64_t dims[2] = {(uint64_t)t->w->cols, (uint64_t)t->w->rows};

            rc = declare_matrix(c, t->name, 2, dims, &t->type, err, errlen);
        } else {
            uint64_t dims[1] = {(uint64_t)t->n};

            rc = gguf_w_add_tensor(c->w, t->name, GGUF_TENSOR_F32, 1, dims,
                                   (uint64_t)t->n * 4, err, errlen);
        }
    }
    if (rc == ST_OK) {
        rc = gguf_w_write_header(c->w, err, errlen);
    }
    for (int i = 0; i < p.n && rc == ST_OK; i++) {
        htensor_t *t = &p.t[i];

        if (t->w != NULL) {
            msrc_t s = {.data = t->w->data, .row_bytes = t->w->row_bytes, .type = t->w->type,
                        .rows = t->w->rows, .cols = t->w->cols,
                        .permute_heads = t->permute_heads};

            rc = write_matrix(c, &s, t->type, err, errlen);
        } else {
            for (int64_t r = 0; r < t->n && rc == ST_OK; r++) {
                rc = gguf_w_write_data(c->w, &t->v[permuted_src_row(r, t->permute_heads, t->n)],
                                       sizeof(float), err, errlen);
            }
            c->n_bytes[KN_W_F32] += (uint64_t)t->n * 4;
        }
    }
    free(p.t);
    free(rope_freqs);
    return rc;
}

/* ------------------------------------------------------------------ */

int
mdl_quantize(const char *in, const char *out, mdl_quant_t q, char *err, size_t errlen)
{
    qctx_t c = {.q = q, .out_path = out};
    mdl_model_t *m = NULL;
    gguf_file_t *g = NULL;
    struct stat si, so;
    int is_dir, rc;

    if ((size_t)q >= N_QUANTS) {
        fmt_seterr(err, errlen, "unknown quantization type %d", (int)q);
        return ST_EINVAL;
    }
    if (stat(in, &si) != 0) {
        rc = -errno;
        fmt_seterr(err, errlen, "%s: %s", in, strerror(errno));
        return rc;
    }
    if (stat(out, &so) == 0 && so.st_dev == si.st_dev && so.st_ino == si.st_ino) {
        fmt_seterr(err, errlen, "%s: the output would overwrite the input", out);
        return ST_EINVAL;
    }
    is_dir = S_ISDIR(si.st_mode);
    if (!is_dir) {
        char magic[4] = {0};
        FILE *fp = fopen(in, "rb");
        int ok = fp != NULL && fread(magic, 1, 4, fp) == 4 && memcmp(magic, "GGUF", 4) == 0;

        if (fp != NULL) {
            fclose(fp);
        }
        if (!ok) {
            fmt_seterr(err, errlen, "%s: not a Hugging Face directory or a GGUF file", in);
            return ST_EFORMAT;
        }
    }
    /* The source is opened (and checked) before OUT is touched. */
    if (is_dir) {
        rc = mdl_model_load(in, &m, err, errlen);
    } else {
        char why[256];

        rc = gguf_open(in, &g, why, sizeof(why));
        if (rc != ST_OK) {
            fmt_seterr(err, errlen, "%s", why);
        }
    }
    if (rc == ST_OK) {
        rc = gguf_w_create(out, &c.w, err, errlen);
    }
    if (rc == ST_OK) {
        rc = is_dir ? quantize_hf(&c, in, m, err, errlen)
                    : quantize_gguf(&c, in, g, err, errlen);
    }
    if (rc == ST_OK) {
        rc = gguf_w_finish(c.w, err, errlen);
    }
    gguf_w_destroy(c.w); /* removes OUT unless finished */
    gguf_close(g);
    mdl_model_destroy(m);
    if (rc == ST_OK) {
        char types[256];
        size_t off = 0;
        uint64_t total = 0;

        types[0] = '\0';
        for (int t = 0; t < KN_W_NTYPES && off < sizeof(types); t++) {
            if (c.n_bytes[t] > 0) {
                off += (size_t)snprintf(types + off, sizeof(types) - off, "%s%s %.2f MiB",
                                        off > 0 ? ", " : "", kn_wtype_name((kn_wtype_t)t),
                                        (double)c.n_bytes[t] / (1024.0 * 1024.0));
                total += c.n_bytes[t];
            }
        }
        LOG_INFO("wrote %s (%s): %.2f MiB of tensors (%s), %lld row-length fallbacks", out,
                 mdl_quant_name(q), (double)total / (1024.0 * 1024.0), types,
                 (long long)c.n_fallbacks);
    }
    free(c.row);
    free(c.qrow);
    return rc;
}
