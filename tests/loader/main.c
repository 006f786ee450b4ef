/* main.c - runs the loader suites, and the helpers they share. */
#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "loader_test.h"

const char *
lt_src(const char *rel)
{
    static char bufs[8][4096];
    static int next;
    const char *root = getenv("KVSERVE_SOURCE_DIR");
    char *b = bufs[next++ % 8];

    ck_assert_msg(root != NULL, "KVSERVE_SOURCE_DIR is not set (run through meson test)");
    snprintf(b, sizeof(bufs[0]), "%s/%s", root, rel);
    return b;
}

char *
lt_mkdtemp(const char *tag)
{
    const char *tmp = getenv("TMPDIR");
    char *p = malloc(4096);

    snprintf(p, 4096, "%s/kvs-%s-XXXXXX", tmp != NULL ? tmp : "/tmp", tag);
    ck_assert_ptr_nonnull(mkdtemp(p));
    return p;
}

static int
rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void
lt_rmtree(const char *path)
{
    if (path != NULL) {
        nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    }
}

unsigned char *
lt_read(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    unsigned char *buf;
    long n;

    ck_assert_msg(fp != NULL, "open %s: %s", path, strerror(errno));
    fseek(fp, 0, SEEK_END);
    n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

void
lt_write(const char *path, const void *data, size_t len)
{
    FILE *fp = fopen(path, "wb");

    ck_assert_msg(fp != NULL, "create %s: %s", path, strerror(errno));
    ck_assert_uint_eq(fwrite(data, 1, len, fp), len);
    ck_assert_int_eq(fclose(fp), 0);
}

int
lt_make_model(const char *args)
{
    const char *py = getenv("KVSERVE_PYTHON");
    char cmd[8192];

    snprintf(cmd, sizeof(cmd), "'%s' '%s' %s", py != NULL ? py : "/usr/bin/python3",
             lt_src("tools/make_random_model.py"), args);
    return system(cmd);
}

static double
tol_of(lt_tol_t tol, const float *a, size_t i, size_t n)
{
    switch (tol) {
    case LT_EXACT:
        return 0.0;
    case LT_BF16:
        return fabs(a[i]) / 256.0 + 1e-30;
    case LT_F16:
        return fabs(a[i]) / 1024.0 + 6e-8;
    case LT_Q4:
    case LT_Q5:
    case LT_Q6:
        return 0.0;
    case LT_Q8_0: {
        size_t b = i / 32 * 32;
        double amax = 0;

        for (size_t k = b; k < b + 32 && k < n; k++) {
            amax = fmax(amax, fabs(a[k]));
        }
        return amax * (0.5 / 127.0 + 1.0 / 1024.0) + 1e-7;
    }
    }
    return 0.0;
}

static void
cmp_arr(const char *what, int layer, const float *a, const float *b, size_t n, lt_tol_t tol)
{
    if (a == NULL || b == NULL) {
        ck_assert_msg(a == b, "%s (layer %d): present in one model only", what, layer);
        return;
    }
    if (tol >= LT_Q4) {
        static const double lim[3][2] = {{0.12, 0.15}, {0.06, 0.08}, {0.03, 0.03}};
        double e2 = 0, s2 = 0, emax = 0, amax = 0;

        for (size_t i = 0; i < n; i++) {
            double d = (double)a[i] - (double)b[i];

            e2 += d * d;
            s2 += (double)a[i] * (double)a[i];
            emax = fmax(emax, fabs(d));
            amax = fmax(amax, fabs((double)a[i]));
        }
        ck_assert_msg(sqrt(e2) <= lim[tol - LT_Q4][0] * sqrt(s2) &&
                          emax <= lim[tol - LT_Q4][1] * amax,
                      "%s (layer %d): rms error %.4g of rms %.4g, max error %.4g of max %.4g", what,
                      layer, sqrt(e2 / (double)n), sqrt(s2 / (double)n), emax, amax);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);

        /* ck_assert marks a point per call (a pipe write): test first. */
        if (!(d <= tol_of(tol, a, i, n))) {
            ck_abort_msg("%s (layer %d) element %zu: %.9g vs %.9g", what, layer, i, (double)a[i],
                         (double)b[i]);
        }
    }
}

/* cmp_arr() over two weights dequantized to f32 (kernels/cpu/kn_quant.h). */
static void
cmp_w(const char *what, int layer, const kn_weight_t *a, const kn_weight_t *b, lt_tol_t tol)
{
    size_t n = (size_t)a->rows * (size_t)a->cols;
    float *fa = xmalloc(sizeof(float) * n), *fb = xmalloc(sizeof(float) * n);

    ck_assert_int_eq(a->rows, b->rows);
    ck_assert_int_eq(a->cols, b->cols);
    for (int32_t r = 0; r < a->rows; r++) {
        kn_dequant_row(a->type, (const char *)a->data + (size_t)r * a->row_bytes,
                       fa + (size_t)r * a->cols, a->cols);
        kn_dequant_row(b->type, (const char *)b->data + (size_t)r * b->row_bytes,
                       fb + (size_t)r * b->cols, b->cols);
    }
    cmp_arr(what, layer, fa, fb, n, tol);
    free(fa);
    free(fb);
}

void
lt_compare_models(const mdl_model_t *a, const mdl_model_t *b, lt_tol_t tol, lt_tol_t vec_tol)
{
    const mdl_config_t *c = &a->cfg, *d = &b->cfg;
    size_t D, Q, K;

    ck_assert_int_eq(c->vocab_size, d->vocab_size);
    ck_assert_int_eq(c->dim, d->dim);
    ck_assert_int_eq(c->n_layers, d->n_layers);
    ck_assert_int_eq(c->n_heads, d->n_heads);
    ck_assert_int_eq(c->n_kv_heads, d->n_kv_heads);
    ck_assert_int_eq(c->head_dim, d->head_dim);
    ck_assert_int_eq(c->ffn_dim, d->ffn_dim);
    ck_assert_int_eq(c->tie_embeddings, d->tie_embeddings);
    ck_assert_int_eq(c->qkv_bias, d->qkv_bias);
    ck_assert_int_eq(c->max_pos, d->max_pos);
    ck_assert(fabsf(c->norm_eps - d->norm_eps) <= 1e-9f);
    ck_assert(c->rope_theta == d->rope_theta);
    /* Bytes read per token are the storage types' (the same types: the same bytes). */
    if (memcmp(a->type_bytes, b->type_bytes, sizeof(a->type_bytes)) == 0) {
        ck_assert_uint_eq(mdl_model_weight_bytes(a), mdl_model_weight_bytes(b));
    }
    D = (size_t)c->dim;
    Q = (size_t)c->n_heads * (size_t)c->head_dim;
    K = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    cmp_w("tok_embd", -1, &a->tok_embd, &b->tok_embd, tol);
    cmp_w("lm_head", -1, &a->lm_head, &b->lm_head, tol);
    cmp_arr("out_norm", -1, a->out_norm, b->out_norm, D, vec_tol);
    for (int l = 0; l < c->n_layers; l++) {
        const mdl_layer_t *p = &a->layers[l], *q = &b->layers[l];

        cmp_arr("attn_norm", l, p->attn_norm, q->attn_norm, D, vec_tol);
        cmp_w("wq", l, &p->wq, &q->wq, tol);
        cmp_w("wk", l, &p->wk, &q->wk, tol);
        cmp_w("wv", l, &p->wv, &q->wv, tol);
        cmp_arr("bq", l, p->bq, q->bq, Q, vec_tol);
        cmp_arr("bk", l, p->bk, q->bk, K, vec_tol);
        cmp_arr("bv", l, p->bv, q->bv, K, vec_tol);
        cmp_w("wo", l, &p->wo, &q->wo, tol);
        cmp_arr("ffn_norm", l, p->ffn_norm, q->ffn_norm, D, vec_tol);
        cmp_w("w_gate", l, &p->w_gate, &q->w_gate, tol);
        cmp_w("w_up", l, &p->w_up, &q->w_up, tol);
        cmp_w("w_down", l, &p->w_down, &q->w_down, tol);
    }
}

int
lt_expect_load_error(const char *path, const char *needle1, const char *needle2)
{
    mdl_model_t *m = NULL;
    char err[512] = "";
    int rc;

    rc = mdl_model_load(path, &m, err, sizeof(err));
    ck_assert_msg(rc < 0, "%s loaded but should have failed", path);
    ck_assert_ptr_null(m);
    ck_assert_msg(needle1 == NULL || strstr(err, needle1) != NULL, "error for %s lacks '%s': %s",
                  path, needle1, err);
    ck_assert_msg(needle2 == NULL || strstr(err, needle2) != NULL, "error for %s lacks '%s': %s",
                  path, needle2, err);
    return rc;
}

int
main(void)
{
    SRunner *sr = srunner_create(loader_config_suite());
    int failed;

    srunner_add_suite(sr, loader_gguf_suite());
    srunner_add_suite(sr, loader_formats_suite());
    srunner_add_suite(sr, loader_corrupt_suite());
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
