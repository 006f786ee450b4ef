/* model.c - mdl_model_load for a Hugging Face directory or a GGUF file:
 * configuration, weights in the layout of model_int.h, tokenizer, chat
 * template; destroy and accessors.
 *
 * Weights stay in their file's type: a matrix is a kn_weight_t pointing
 * into the mapping (F32, F16, BF16 from either format; Q8_0, Q4_0, Q4_K,
 * Q5_K, Q6_K from GGUF). Copies are made only where the file's bytes
 * cannot be used as they are: GGUF q/k matrices (rows un-permuted, same
 * type, and the file's pages of the tensor dropped from memory), Q4_1,
 * Q5_0 and Q5_1 (converted once, row by row, to Q8_0, with a log line),
 * and tensors not aligned for their element type. Norms and biases are
 * converted to f32 (a few KiB). No f32 copy of a matrix is made at any
 * point. A mapping that no weight points into after loading is unmapped
 * at once.
 *
 * llama.cpp's converter permutes the rows of q and k (for llama-style
 * models, not qwen2) so that RoPE pairs adjacent elements: within each
 * head, HF row s*hd/2 + j is stored at row 2j + s. We undo that here, so
 * both formats give identical weights to the forward pass.
 */
#define LOG_MODULE "model"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "formats/fmt_util.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "kernels/cpu/kn_quant.h"
#include "model/loader_int.h"
#include "model/model_int.h"
#include "text/tokenizer.h"

#define INDEX_MAX_BYTES (64u << 20)
#define TOKCFG_MAX_BYTES (64u << 20)
#define MAX_SHARDS 1024

/* Where weights come from while loading. */
typedef struct wsrc {
    mdl_model_t *m;
    const char *path;   /* for messages */
    sft_file_t **shards; /* HF */
    char **shard_names;
    int *shard_map; /* shard -> index in m->maps */
    int n_shards;
    gguf_file_t *g; /* GGUF */
    int permute_qk;
    kn_wtype_t force;   /* --dtype: the type of every matrix; KN_W_NTYPES: the file's */
    int said_convert[32]; /* a GGUF type's conversion was logged */
    int *map_used; /* per m->maps entry: a weight points into it */
} wsrc_t;

void
mdl__unpermute_rows(float *w, int64_t n_head, int64_t head_dim, int64_t cols)
{
    int64_t half = head_dim / 2;
    float *tmp = xmalloc((size_t)(head_dim * cols) * sizeof(float));

    for (int64_t h = 0; h < n_head; h++) {
        float *base = w + h * head_dim * cols;

        memcpy(tmp, base, (size_t)(head_dim * cols) * sizeof(float));
        for (int64_t j = 0; j < half; j++) {
            for (int64_t s = 0; s < 2; s++) {
                memcpy(base + (s * half + j) * cols, tmp + (2 * j + s) * cols,
                       (size_t)cols * sizeof(float));
            }
        }
    }
    free(tmp);
}

static int
add_map(mdl_model_t *m, void *data, size_t len)
{
    m->maps = xrealloc(m->maps, (size_t)(m->n_maps + 1) * sizeof(*m->maps));
    m->map_lens = xrealloc(m->map_lens, (size_t)(m->n_maps + 1) * sizeof(*m->map_lens));
    m->maps[m->n_maps] = data;
    m->map_lens[m->n_maps] = len;
    return m->n_maps++;
}

/* A checked large allocation of n elements of size bytes, remembered for
 * destroy; NULL when out of memory. */
static void *
alloc_owned(mdl_model_t *m, uint64_t n, size_t size)
{
    void *p;

    if (n > SIZE_MAX / size) {
        return NULL;
    }
    p = malloc((size_t)n * size);
    if (p == NULL) {
        return NULL;
    }
    m->owned = xrealloc(m->owned, (size_t)(m->n_owned + 1) * sizeof(*m->owned));
    m->owned[m->n_owned++] = p;
    return p;
}

static void
shape_str(char *buf, size_t cap, const uint64_t *dims, uint32_t n, int reverse)
{
    size_t off = 0;

    off += (size_t)snprintf(buf, cap, "[");
    for (uint32_t i = 0; i < n && off < cap; i++) {
        uint64_t d = reverse ? dims[n - 1 - i] : dims[i];
        off +=
            (size_t)snprintf(buf + off, cap - off, "%s%llu", i ? ", " : "", (unsigned long long)d);
    }
    if (off < cap) {
        snprintf(buf + off, cap - off, "]");
    }
}

/* The safetensors tensor hf_name of shape (rows, cols) (cols == 0: a
 * vector of rows) in F32, F16 or BF16, and its shard. ST_ENOENT when
 * absent, ST_EFORMAT for another shape or dtype; err names the shard. */
static int
find_sft(wsrc_t *ws, const char *hf_name, int64_t rows, int64_t cols, const sft_tensor_t **out,
         int *shard, char *err, size_t errlen)
{
    uint64_t wd[2] = {(uint64_t)rows, (uint64_t)cols};
    char got[96], want[96];
    const sft_tensor_t *t = NULL;

    for (int i = 0; i < ws->n_shards && t == NULL; i++) {
        t = sft_find(ws->shards[i], hf_name);
        *shard = i;
    }
    if (t == NULL) {
        fmt_seterr(err, errlen, "%s: missing tensor '%s'", ws->path, hf_name);
        return ST_ENOENT;
    }
    if (t->n_dims != (cols > 0 ? 2u : 1u) || t->dims[0] != (uint64_t)rows ||
        (cols > 0 && t->dims[1] != (uint64_t)cols)) {
        shape_str(want, sizeof(want), wd, cols > 0 ? 2 : 1, 0);
        shape_str(got, sizeof(got), t->dims, t->n_dims, 0);
        fmt_seterr(err, errlen, "%s: tensor '%s' has shape %s, expected %s",
                   ws->shard_names[*shard], hf_name, got, want);
        return ST_EFORMAT;
    }
    if (t->dtype != SFT_DTYPE_F32 && t->dtype != SFT_DTYPE_F16 && t->dtype != SFT_DTYPE_BF16) {
        fmt_seterr(err, errlen, "%s: tensor '%s' has dtype %s; F32, F16 or BF16 expected",
                   ws->shard_names[*shard], hf_name, sft_dtype_name(t->dtype));
        return ST_EFORMAT;
    }
    *out = t;
    return ST_OK;
}

/* The GGUF tensor gg_name of shape (rows, cols) (cols == 0: a vector) in a
 * type kvserve reads. ST_ENOENT when absent, ST_EFORMAT otherwise. */
static int
find_gguf(wsrc_t *ws, const char *gg_name, int64_t rows, int64_t cols, const gguf_tensor_t **out,
          char *err, size_t errlen)
{
    uint64_t wd[2] = {(uint64_t)rows, (uint64_t)cols};
    char got[96], want[96];
    const gguf_tensor_t *t = gguf_find_tensor(ws->g, gg_name);

    if (t == NULL) {
        fmt_seterr(err, errlen, "%s: missing tensor '%s'", ws->path, gg_name);
        return ST_ENOENT;
    }
    if (t->n_dims != (cols > 0 ? 2u : 1u) ||
        (cols > 0 ? (t->dims[0] != (uint64_t)cols || t->dims[1] != (uint64_t)rows)
                  : t->dims[0] != (uint64_t)rows)) {
        shape_str(want, sizeof(want), wd, cols > 0 ? 2 : 1, 0);
        shape_str(got, sizeof(got), t->dims, t->n_dims, 1);
        fmt_seterr(err, errlen, "%s: tensor '%s' has shape %s, expected %s", ws->path, gg_name,
                   got, want);
        return ST_EFORMAT;
    }
    if (!gguf_tensor_convertible(t->type)) {
        fmt_seterr(err, errlen,
                   "%s: tensor '%s' has type %s; F32, F16, BF16, Q8_0, Q4_0, Q4_1, "
                   "Q5_0, Q5_1, Q4_K, Q5_K or Q6_K expected",
                   ws->path, gg_name, gguf_tensor_type_name(t->type));
        return ST_EFORMAT;
    }
    *out = t;
    return ST_OK;
}

/* One weight of rows x cols (cols == 0: a vector of rows). permute_heads
 * > 0 undoes llama.cpp's q/k permutation for that many heads (GGUF).
 * ST_ENOENT (with err set) when absent. */
static int
load_weight(wsrc_t *ws, const char *hf_name, const char *gg_name, int64_t rows, int64_t cols,
            int64_t permute_heads, const float **out, char *err, size_t errlen)
{
    uint64_t n = (uint64_t)rows * (uint64_t)(cols > 0 ? cols : 1);
    float *dst;
    int rc;

    if (ws->g == NULL) {
        const sft_tensor_t *t = NULL;
        int shard = -1;

        rc = find_sft(ws, hf_name, rows, cols, &t, &shard, err, errlen);
        if (rc != ST_OK) {
            return rc;
        }
        if (t->dtype == SFT_DTYPE_F32 && ((uintptr_t)t->data % sizeof(float)) == 0) {
            ws->map_used[ws->shard_map[shard]] = 1;
            *out = t->data;
            return ST_OK;
        }
        dst = alloc_owned(ws->m, n, sizeof(float));
        if (dst == NULL) {
            fmt_seterr(err, errlen, "%s: out of memory for '%s'", ws->path, hf_name);
            return ST_ENOMEM;
        }
        rc = sft_to_f32(t->dtype, t->data, n, dst);
        CHECK(rc == ST_OK);
        *out = dst;
        return ST_OK;
    } else {
        const gguf_tensor_t *t = NULL;

        rc = find_gguf(ws, gg_name, rows, cols, &t, err, errlen);
        if (rc != ST_OK) {
            return rc;
        }
        if (t->type == GGUF_TENSOR_F32 && permute_heads == 0 &&
            ((uintptr_t)t->data % sizeof(float)) == 0) {
            ws->map_used[0] = 1;
            *out = t->data;
            return ST_OK;
        }
        dst = alloc_owned(ws->m, n, sizeof(float));
        if (dst == NULL) {
            fmt_seterr(err, errlen, "%s: out of memory for '%s'", ws->path, gg_name);
            return ST_ENOMEM;
        }
        rc = gguf_tensor_to_f32(t, dst);
        CHECK(rc == ST_OK);
        if (permute_heads > 0) {
            mdl__unpermute_rows(dst, permute_heads, rows / permute_heads, cols > 0 ? cols : 1);
        }
        *out = dst;
        return ST_OK;
    }
}

/* The kn_quant.h type a GGUF tensor type is kept in: itself where a
 * kernel reads it, else Q8_0 (Q4_1, Q5_0, Q5_1: converted at load). */
static kn_wtype_t
gguf_native(uint32_t type, int *convert)
{
    *convert = 0;
    switch (type) {
    case GGUF_TENSOR_F32:
        return KN_W_F32;
    case GGUF_TENSOR_F16:
        return KN_W_F16;
    case GGUF_TENSOR_BF16:
        return KN_W_BF16;
    case GGUF_TENSOR_Q8_0:
        return KN_W_Q8_0;
    case GGUF_TENSOR_Q4_0:
        return KN_W_Q4_0;
    case GGUF_TENSOR_Q4_K:
        return KN_W_Q4_K;
    case GGUF_TENSOR_Q5_K:
        return KN_W_Q5_K;
    case GGUF_TENSOR_Q6_K:
        return KN_W_Q6_K;
    default:
        *convert = 1;
        return KN_W_Q8_0;
    }
}

/* Source row of destination row r of a q/k matrix of n_head heads stored
 * permuted by llama.cpp (r itself when n_head is 0). */
static int64_t
unpermuted_row(int64_t r, int64_t n_head, int64_t rows)
{
    int64_t hd, half, h, i;

    if (n_head <= 0) {
        return r;
    }
    hd = rows / n_head;
    half = hd / 2;
    h = r / hd;
    i = r % hd; /* = s * half + j, stored at 2j + s */
    return h * hd + 2 * (i % half) + i / half;
}

void
mdl__drop_pages(const void *p, size_t len)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + pg - 1) & ~(pg - 1), hi = ((uintptr_t)p + len) & ~(pg - 1);

    if (hi > lo) {
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
    }
}

/* One (rows, cols) matrix in its file's type (see the file comment).
 * permute_heads > 0 undoes llama.cpp's q/k permutation for that many
 * heads (GGUF). ST_ENOENT (with err set) when absent; ST_EFORMAT for a
 * shape, type or row length the kernels cannot take; ST_ENOMEM. */
static int
load_matrix(wsrc_t *ws, const char *hf_name, const char *gg_name, int64_t rows, int64_t cols,
            int64_t permute_heads, kn_weight_t *out, char *err, size_t errlen)
{
    mdl_model_t *m = ws->m;
    const char *file = ws->path, *name;
    const unsigned char *src;
    size_t src_row_bytes, row_bytes, align;
    kn_wtype_t type;
    int map, rc, convert = 0;
    const gguf_tensor_t *gt = NULL;

    if (ws->g == NULL) {
        const sft_tensor_t *t = NULL;
        int shard = -1;

        name = hf_name;
        rc = find_sft(ws, hf_name, rows, cols, &t, &shard, err, errlen);
        if (rc != ST_OK) {
            return rc;
        }
        file = ws->shard_names[shard];
        type = t->dtype == SFT_DTYPE_F32   ? KN_W_F32
               : t->dtype == SFT_DTYPE_F16 ? KN_W_F16
                                           : KN_W_BF16;
        src = t->data;
        src_row_bytes = kn_wtype_row_bytes(type, cols);
        map = ws->shard_map[shard];
    } else {
        name = gg_name;
        rc = find_gguf(ws, gg_name, rows, cols, &gt, err, errlen);
        if (rc != ST_OK) {
            return rc;
        }
        type = gguf_native(gt->type, &convert);
        src = gt->data;
        src_row_bytes = (size_t)(gt->nbytes / (uint64_t)rows);
        map = 0;
    }
    kn_wtype_t from = type; /* the decoded form of a row: file type, or f32 (convert) */

    if (convert) {
        from = KN_W_NTYPES;
    }
    if (ws->force != KN_W_NTYPES && ws->force != type) {
        type = ws->force;
        convert = 1;
    }
    row_bytes = kn_wtype_row_bytes(type, cols);
    if (row_bytes == 0) {
        fmt_seterr(err, errlen, "%s: tensor '%s' has %lld columns, not a multiple of the %s block",
                    file, name, (long long)cols, kn_wtype_name(type));
        return ST_EFORMAT;
    }
    align = type == KN_W_F32 ? 4 : 2;

    out->type = type;
    out->rows = (int32_t)rows;
    out->cols = (int32_t)cols;
    out->row_bytes = row_bytes;
    m->type_bytes[type] += (size_t)rows * row_bytes;
    if (!convert && permute_heads == 0 && (uintptr_t)src % align == 0) {
        ws->map_used[map] = 1; /* the file's bytes as they are */
        out->data = src;
        return ST_OK;
    }

    unsigned char *dst = alloc_owned(m, (uint64_t)rows, row_bytes);
    float *tmp = NULL;

    if (dst == NULL) {
        fmt_seterr(err, errlen, "%s: out of memory for '%s'", ws->path, name);
        return ST_ENOMEM;
    }
    if (convert) {
        if (from == KN_W_NTYPES && ws->force == KN_W_NTYPES && gt->type < 32 &&
            !ws->said_convert[gt->type]) {
            ws->said_convert[gt->type] = 1;
            LOG_INFO("%s: %s tensors are converted to q8_0 at load (no native kernel)", ws->path,
                     gguf_tensor_type_name(gt->type));
        }
        tmp = xmalloc(sizeof(float) * (size_t)cols);
    }
    for (int64_t r = 0; r < rows; r++) {
        const unsigned char *at = src + (size_t)unpermuted_row(r, permute_heads, rows) *
                                            src_row_bytes;

        if (convert && from == KN_W_NTYPES) {
            gguf_tensor_t row = *gt;

            row.dims[0] = (uint64_t)cols;
            row.dims[1] = row.dims[2] = row.dims[3] = 1;
            row.data = at;
            row.nbytes = src_row_bytes;
            CHECK(gguf_tensor_to_f32(&row, tmp) == ST_OK);
            kn_quant_row(type, tmp, dst + (size_t)r * row_bytes, cols);
        } else if (convert) {
            kn_dequant_row(from, at, tmp, cols);
            kn_quant_row(type, tmp, dst + (size_t)r * row_bytes, cols);
        } else {
            memcpy(dst + (size_t)r * row_bytes, at, row_bytes);
        }
    }
    free(tmp);
    mdl__drop_pages(src, src_row_bytes * (size_t)rows);
    out->data = dst;
    return ST_OK;
}

/* Bytes of a weight's rows. */
static size_t
weight_size(const kn_weight_t *w)
{
    return (size_t)w->rows * w->row_bytes;
}

static int
load_weights(wsrc_t *ws, char *err, size_t errlen)
{
    mdl_model_t *m = ws->m;
    const mdl_config_t *c = &m->cfg;
    int64_t q_rows = (int64_t)c->n_heads * c->head_dim;
    int64_t kv_rows = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t pq = ws->permute_qk ? c->n_heads : 0, pk = ws->permute_qk ? c->n_kv_heads : 0;
    char hn[160], gn[160];
    size_t per_layer;
    int rc;

/* V: a vector as f32; M: a matrix in its file's type. */
#define V(field, hf, gg, rows, perm)                                                               \
    do {                                                                                           \
        rc = load_weight(ws, (hf), (gg), (rows), 0, (perm), &(field), err, errlen);                \
        if (rc != ST_OK) {                                                                         \
            return rc == ST_ENOENT ? ST_EFORMAT : rc;                                              \
        }                                                                                          \
    } while (0)
#define M(field, hf, gg, rows, cols, perm)                                                         \
    do {                                                                                           \
        rc = load_matrix(ws, (hf), (gg), (rows), (cols), (perm), &(field), err, errlen);           \
        if (rc != ST_OK) {                                                                         \
            return rc == ST_ENOENT ? ST_EFORMAT : rc;                                              \
        }                                                                                          \
    } while (0)

    M(m->tok_embd, "model.embed_tokens.weight", "token_embd.weight", c->vocab_size, c->dim, 0);
    V(m->out_norm, "model.norm.weight", "output_norm.weight", c->dim, 0);
    if (c->tie_embeddings) {
        m->lm_head = m->tok_embd;
    } else {
        M(m->lm_head, "lm_head.weight", "output.weight", c->vocab_size, c->dim, 0);
    }
    m->layers = xcalloc((size_t)c->n_layers, sizeof(*m->layers));
    for (int32_t l = 0; l < c->n_layers; l++) {
        mdl_layer_t *L = &m->layers[l];

#define NAMES(hsuf, gsuf)                                                                          \
    do {                                                                                           \
        snprintf(hn, sizeof(hn), "model.layers.%d.%s", (int)l, (hsuf));                            \
        snprintf(gn, sizeof(gn), "blk.%d.%s", (int)l, (gsuf));                                     \
    } while (0)
#define LV(field, hsuf, gsuf, rows, perm)                                                          \
    do {                                                                                           \
        NAMES(hsuf, gsuf);                                                                         \
        V(field, hn, gn, rows, perm);                                                              \
    } while (0)
#define LM(field, hsuf, gsuf, rows, cols, perm)                                                    \
    do {                                                                                           \
        NAMES(hsuf, gsuf);                                                                         \
        M(field, hn, gn, rows, cols, perm);                                                        \
    } while (0)

        LV(L->attn_norm, "input_layernorm.weight", "attn_norm.weight", c->dim, 0);
        LM(L->wq, "self_attn.q_proj.weight", "attn_q.weight", q_rows, c->dim, pq);
        LM(L->wk, "self_attn.k_proj.weight", "attn_k.weight", kv_rows, c->dim, pk);
        LM(L->wv, "self_attn.v_proj.weight", "attn_v.weight", kv_rows, c->dim, 0);
        if (c->qkv_bias) {
            LV(L->bq, "self_attn.q_proj.bias", "attn_q.bias", q_rows, pq);
            LV(L->bk, "self_attn.k_proj.bias", "attn_k.bias", kv_rows, pk);
            LV(L->bv, "self_attn.v_proj.bias", "attn_v.bias", kv_rows, 0);
        }
        LM(L->wo, "self_attn.o_proj.weight", "attn_output.weight", c->dim, q_rows, 0);
        LV(L->ffn_norm, "post_attention_layernorm.weight", "ffn_norm.weight", c->dim, 0);
        LM(L->w_gate, "mlp.gate_proj.weight", "ffn_gate.weight", c->ffn_dim, c->dim, 0);
        LM(L->w_up, "mlp.up_proj.weight", "ffn_up.weight", c->ffn_dim, c->dim, 0);
        LM(L->w_down, "mlp.down_proj.weight", "ffn_down.weight", c->dim, c->ffn_dim, 0);
#undef LV
#undef LM
#undef NAMES
    }
#undef V
#undef M

    /* Bytes read per token: every weight but the embedding (a lookup). */
    per_layer = sizeof(float) * (size_t)c->dim * 2;
    if (c->qkv_bias) {
        per_layer += sizeof(float) * (size_t)(q_rows + 2 * kv_rows);
    }
    m->weight_bytes = per_layer * (size_t)c->n_layers + sizeof(float) * (size_t)c->dim +
                      weight_size(&m->lm_head);
    for (int32_t l = 0; l < c->n_layers; l++) {
        const mdl_layer_t *L = &m->layers[l];

        m->weight_bytes += weight_size(&L->wq) + weight_size(&L->wk) + weight_size(&L->wv) +
                           weight_size(&L->wo) + weight_size(&L->w_gate) +
                           weight_size(&L->w_up) + weight_size(&L->w_down);
    }
    return ST_OK;
}

/* Unmaps every mapping no weight points into. */
static void
drop_unused_maps(wsrc_t *ws)
{
    mdl_model_t *m = ws->m;

    for (int i = 0; i < m->n_maps; i++) {
        if (!ws->map_used[i] && m->maps[i] != NULL) {
            fmt_unmap(m->maps[i], m->map_lens[i]);
            m->maps[i] = NULL;
            m->map_lens[i] = 0;
        }
    }
}

/* Shard file names from model.safetensors.index.json's weight_map. */
static int
read_index(const char *dir, char ***names, int *n_names, char *err, size_t errlen)
{
    char path[4096];
    char *text = NULL;
    size_t len;
    cJSON *root = NULL;
    const cJSON *wm, *e;
    char **v = NULL;
    int n = 0, rc;

    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    rc = fmt_read_file(path, INDEX_MAX_BYTES, &text, &len, err, errlen);
    if (rc != ST_OK) {
        return rc;
    }
    root = cJSON_ParseWithLength(text, len);
    wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (root == NULL || !cJSON_IsObject(wm)) {
        fmt_seterr(err, errlen, "%s: not valid JSON with a weight_map object", path);
        rc = ST_EFORMAT;
        goto fail;
    }
    cJSON_ArrayForEach(e, wm)
    {
        const char *f;
        size_t fl;
        int seen = 0;

        if (!cJSON_IsString(e)) {
            fmt_seterr(err, errlen, "%s: weight_map value of '%s' is not a string", path,
                       e->string ? e->string : "?");
            rc = ST_EFORMAT;
            goto fail;
        }
        f = e->valuestring;
        fl = strlen(f);
        if (fl == 0 || strchr(f, '/') != NULL || f[0] == '.' || fl < 12 ||
            strcmp(f + fl - 12, ".safetensors") != 0) {
            fmt_seterr(err, errlen, "%s: bad shard file name '%.64s'", path, f);
            rc = ST_EFORMAT;
            goto fail;
        }
        for (int i = 0; i < n && !seen; i++) {
            seen = strcmp(v[i], f) == 0;
        }
        if (!seen) {
            if (n == MAX_SHARDS) {
                fmt_seterr(err, errlen, "%s: more than %d shards", path, MAX_SHARDS);
                rc = ST_EFORMAT;
                goto fail;
            }
            v = xrealloc(v, (size_t)(n + 1) * sizeof(*v));
            v[n++] = xstrdup(f);
        }
    }
    if (n == 0) {
        fmt_seterr(err, errlen, "%s: empty weight_map", path);
        rc = ST_EFORMAT;
        goto fail;
    }
    cJSON_Delete(root);
    free(text);
    *names = v;
    *n_names = n;
    return ST_OK;

fail:
    for (int i = 0; i < n; i++) {
        free(v[i]);
    }
    free(v);
    cJSON_Delete(root);
    free(text);
    return rc;
}

static int
file_exists(const char *path)
{
    struct stat sb;

    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The chat template of tokenizer_config.json: a string, or a list of
 * {name, template} of which "default" (else the first) is taken; then
 * chat_template.jinja. NULL when there is none. */
static char *
hf_chat_template(const char *dir)
{
    char path[4096], *text = NULL, *out = NULL;
    size_t len;
    cJSON *root;
    const cJSON *ct, *e;

    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    if (fmt_read_file(path, TOKCFG_MAX_BYTES, &text, &len, NULL, 0) == ST_OK) {
        root = cJSON_ParseWithLength(text, len);
        ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
        if (cJSON_IsString(ct)) {
            out = xstrdup(ct->valuestring);
        } else if (cJSON_IsArray(ct)) {
            cJSON_ArrayForEach(e, ct)
            {
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
                const cJSON *tp = cJSON_GetObjectItemCaseSensitive(e, "template");
                int is_default = cJSON_IsString(nm) && strcmp(nm->valuestring, "default") == 0;

                if (cJSON_IsString(tp) && (out == NULL || is_default)) {
                    free(out);
                    out = xstrdup(tp->valuestring);
                }
            }
        }
        cJSON_Delete(root);
        free(text);
    }
    if (out == NULL) {
        snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
        if (fmt_read_file(path, TOKCFG_MAX_BYTES, &text, &len, NULL, 0) == ST_OK) {
            out = text;
        }
    }
    return out;
}

/* EOS/BOS from the tokenizer when the config has none, and the vocabulary
 * must fit the embedding rows. */
static int
check_tokenizer(mdl_model_t *m, char *err, size_t errlen)
{
    int32_t nv = tok_vocab_size(m->tok);

    if (nv > m->cfg.vocab_size) {
        fmt_seterr(err, errlen, "%s: tokenizer has %d tokens but the model's vocab_size is %d",
                   m->path, nv, m->cfg.vocab_size);
        return ST_EFORMAT;
    }
    if (m->cfg.n_eos == 0 && tok_eos_id(m->tok) >= 0) {
        m->cfg.eos_ids[m->cfg.n_eos++] = tok_eos_id(m->tok);
    }
    if (m->cfg.bos_id < 0) {
        m->cfg.bos_id = tok_bos_id(m->tok);
    }
    return ST_OK;
}

static int
load_hf(mdl_model_t *m, const char *dir, kn_wtype_t force, char *err, size_t errlen)
{
    wsrc_t ws = {.m = m, .path = dir, .force = force};
    char path[4096], cfgpath[4096];
    char **names = NULL;
    int n_names = 0, rc;

    rc = mdl__config_load_hf(dir, &m->cfg, err, errlen);
    if (rc != ST_OK) {
        return rc;
    }

    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    if (file_exists(path)) {
        rc = read_index(dir, &names, &n_names, err, errlen);
        if (rc != ST_OK) {
            return rc;
        }
    } else {
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        if (!file_exists(path)) {
            fmt_seterr(err, errlen, "%s: no model.safetensors or model.safetensors.index.json",
                       dir);
            return ST_ENOENT;
        }
        names = xmalloc(sizeof(*names));
        names[0] = xstrdup("model.safetensors");
        n_names = 1;
    }

    ws.shards = xcalloc((size_t)n_names, sizeof(*ws.shards));
    ws.shard_names = xcalloc((size_t)n_names, sizeof(*ws.shard_names));
    ws.shard_map = xcalloc((size_t)n_names, sizeof(*ws.shard_map));
    ws.map_used = xcalloc((size_t)n_names, sizeof(*ws.map_used));
    for (int i = 0; i < n_names; i++) {
        void *data;
        size_t len;
        char why[256];

        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        ws.shard_names[i] = xstrdup(path);
        rc = fmt_map_file(path, &data, &len, err, errlen);
        if (rc != ST_OK) {
            goto out;
        }
        ws.shard_map[i] = add_map(m, data, len);
        rc = sft_parse_header(data, len, &ws.shards[i], why, sizeof(why));
        if (rc != ST_OK) {
            fmt_seterr(err, errlen, "%s: %s", path, why);
            goto out;
        }
        ws.n_shards = i + 1;
    }

    rc = load_weights(&ws, err, errlen);
    if (rc != ST_OK) {
        goto out;
    }
    drop_unused_maps(&ws);

    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    snprintf(cfgpath, sizeof(cfgpath), "%s/tokenizer_config.json", dir);
    rc = tok_load_hf(path, file_exists(cfgpath) ? cfgpath : NULL, &m->tok, err, errlen);
    if (rc != ST_OK) {
        goto out;
    }
    rc = check_tokenizer(m, err, errlen);
    if (rc != ST_OK) {
        goto out;
    }
    m->chat_template = hf_chat_template(dir);

out:
    for (int i = 0; i < n_names; i++) {
        free(names[i]);
        free(ws.shard_names[i]);
        sft_close(ws.shards[i]);
    }
    free(names);
    free(ws.shards);
    free(ws.shard_names);
    free(ws.shard_map);
    free(ws.map_used);
    return rc;
}

static int
load_gguf(mdl_model_t *m, const char *file, kn_wtype_t force, char *err, size_t errlen)
{
    wsrc_t ws = {.m = m, .path = file, .force = force};
    int used = 0;
    void *data;
    size_t len;
    const char *s;
    size_t sl;
    char why[256];
    int rc;

    rc = fmt_map_file(file, &data, &len, err, errlen);
    if (rc != ST_OK) {
        return rc;
    }
    add_map(m, data, len);
    ws.map_used = &used;
    rc = gguf_parse(data, len, &ws.g, why, sizeof(why));
    if (rc != ST_OK) {
        fmt_seterr(err, errlen, "%s: %s", file, why);
        return rc;
    }
    rc = mdl__config_from_gguf(ws.g, &m->cfg, why, sizeof(why));
    if (rc != ST_OK) {
        fmt_seterr(err, errlen, "%s: %s", file, why);
        goto out;
    }
    /* llama.cpp permutes q/k for llama-style models; qwen2 is stored as is. */
    ws.permute_qk = strcmp(m->cfg.arch, "qwen2") != 0;

    rc = load_weights(&ws, err, errlen);
    if (rc != ST_OK) {
        goto out;
    }
    rc = tok_load_gguf(ws.g, &m->tok, why, sizeof(why));
    if (rc != ST_OK) {
        fmt_seterr(err, errlen, "%s: %s", file, why);
        goto out;
    }
    rc = check_tokenizer(m, err, errlen);
    if (rc != ST_OK) {
        goto out;
    }
    if (gguf_get_str(ws.g, "tokenizer.chat_template", &s, &sl) == ST_OK) {
        m->chat_template = xstrndup(s, sl);
    }
    drop_unused_maps(&ws);

out:
    gguf_close(ws.g);
    return rc;
}

int
mdl_dtype_parse(const char *s, mdl_dtype_t *out)
{
    static const struct {
        const char *name;
        mdl_dtype_t d;
    } names[] = {
        {"auto", MDL_DTYPE_AUTO},   {"f32", MDL_DTYPE_F32},       {"float32", MDL_DTYPE_F32},
        {"bf16", MDL_DTYPE_BF16},   {"bfloat16", MDL_DTYPE_BF16}, {"f16", MDL_DTYPE_F16},
        {"float16", MDL_DTYPE_F16}, {"half", MDL_DTYPE_F16},
    };

    for (size_t i = 0; s != NULL && i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].d;
            return ST_OK;
        }
    }
    return ST_EINVAL;
}

const char *
mdl_dtype_name(mdl_dtype_t d)
{
    switch (d) {
    case MDL_DTYPE_F32:
        return "f32";
    case MDL_DTYPE_BF16:
        return "bf16";
    case MDL_DTYPE_F16:
        return "f16";
    default:
        return "auto";
    }
}

int
mdl_matmul_prec_parse(const char *s, mdl_matmul_prec_t *out)
{
    if (s != NULL && strcmp(s, "high") == 0) {
        *out = MDL_MATMUL_HIGH;
    } else if (s != NULL && strcmp(s, "medium") == 0) {
        *out = MDL_MATMUL_MEDIUM;
    } else {
        return ST_EINVAL;
    }
    return ST_OK;
}

const char *
mdl_matmul_prec_name(mdl_matmul_prec_t p)
{
    return p == MDL_MATMUL_MEDIUM ? "medium" : "high";
}

int
mdl_model_load(const char *path, mdl_model_t **out, char *err, size_t errlen)
{
    return mdl_model_load_opts(path, NULL, out, err, errlen);
}

int
mdl_model_load_opts(const char *path, const mdl_load_opts_t *opts, mdl_model_t **out, char *err,
                    size_t errlen)
{
    mdl_dtype_t dt = opts != NULL ? opts->dtype : MDL_DTYPE_AUTO;
    kn_wtype_t force = dt == MDL_DTYPE_F32    ? KN_W_F32
                       : dt == MDL_DTYPE_BF16 ? KN_W_BF16
                       : dt == MDL_DTYPE_F16  ? KN_W_F16
                                              : KN_W_NTYPES;
    mdl_model_t *m;
    struct stat sb;
    uint64_t t0 = now_ns();
    int rc;

    if (stat(path, &sb) != 0) {
        rc = -errno;
        fmt_seterr(err, errlen, "%s: %s", path, strerror(errno));
        return rc;
    }
    m = xcalloc(1, sizeof(*m));
    m->path = xstrdup(path);
    if (S_ISDIR(sb.st_mode)) {
        rc = load_hf(m, path, force, err, errlen);
    } else if (S_ISREG(sb.st_mode)) {
        char magic[4] = {0};
        FILE *fp = fopen(path, "rb");

        if (fp == NULL || fread(magic, 1, 4, fp) != 4 || memcmp(magic, "GGUF", 4) != 0) {
            fmt_seterr(err, errlen,
                       "%s: not a Hugging Face directory or a GGUF file (bad "
                       "magic)",
                       path);
            rc = ST_EFORMAT;
        } else {
            rc = load_gguf(m, path, force, err, errlen);
        }
        if (fp != NULL) {
            fclose(fp);
        }
    } else {
        fmt_seterr(err, errlen, "%s: not a directory or a regular file", path);
        rc = ST_EINVAL;
    }
    if (rc != ST_OK) {
        mdl_model_destroy(m);
        return rc;
    }
    char types[256];

    mdl_model_weight_types(m, types, sizeof(types));
    LOG_INFO("loaded %s: %s, %d layers, dim %d, %d/%d heads, vocab %d, %.1f MB of weights read "
             "per token in %.2f s; weights by type: %s",
             path, m->cfg.arch, m->cfg.n_layers, m->cfg.dim, m->cfg.n_heads, m->cfg.n_kv_heads,
             m->cfg.vocab_size, (double)m->weight_bytes / 1e6, (double)(now_ns() - t0) / 1e9,
             types);
    *out = m;
    return ST_OK;
}

void
mdl_model_destroy(mdl_model_t *m)
{
    if (m == NULL) {
        return;
    }
    if (m->tok != NULL) {
        tok_destroy(m->tok);
    }
    for (int i = 0; i < m->n_owned; i++) {
        free(m->owned[i]);
    }
    free(m->owned);
    for (int i = 0; i < m->n_maps; i++) {
        fmt_unmap(m->maps[i], m->map_lens[i]);
    }
    free(m->maps);
    free(m->map_lens);
    free(m->layers);
    free(m->chat_template);
    free(m->path);
    free(m);
}

const mdl_config_t *
mdl_model_config(const mdl_model_t *m)
{
    return &m->cfg;
}

const tok_tokenizer_t *
mdl_model_tokenizer(const mdl_model_t *m)
{
    return m->tok;
}

const char *
mdl_model_chat_template(const mdl_model_t *m)
{
    return m->chat_template;
}

size_t
mdl_model_weight_bytes(const mdl_model_t *m)
{
    return m->weight_bytes;
}

kn_wtype_t
mdl_model_bulk_wtype(const mdl_model_t *m)
{
    kn_wtype_t best = KN_W_F32;

    for (int t = 0; t < KN_W_NTYPES; t++) {
        if (m->type_bytes[t] > m->type_bytes[best]) {
            best = (kn_wtype_t)t;
        }
    }
    return best;
}

void
mdl_model_weight_types(const mdl_model_t *m, char *buf, size_t len)
{
    size_t off = 0;

    buf[0] = '\0';
    for (int t = 0; t < KN_W_NTYPES && off < len; t++) {
        if (m->type_bytes[t] > 0) {
            off += (size_t)snprintf(buf + off, len - off, "%s%s %.1f MiB", off > 0 ? ", " : "",
                                    kn_wtype_name((kn_wtype_t)t),
                                    (double)m->type_bytes[t] / (1024.0 * 1024.0));
        }
    }
}
