/* test_kn_mass.c - the attention-mass accumulator of H2O / SnapKV
 * (kernels/cpu/kn_mass.h) against its double-precision scalar reference:
 * paged, varlen batches mixing prefill chunks and decodes, GQA, a sliding
 * window, rows on and off; that the mass of every accumulating row sums to
 * one per query head; and that it adds to what acc held.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kn_cpu.h"
#include "kernels/cpu/kn_mass.h"

static uint64_t rng = 88172645463325252ULL;

static float
frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

typedef struct fix {
    int32_t n_seqs, n_tok, n_heads, n_kv, hd, bs, max_blocks, n_blocks;
    int32_t qs[5], ctx[4], *bt;
    float *q, *k, *v, *out;
    uint8_t *on;
} fix_t;

/* Sequences with n_new[s] new tokens and ctx[s] context each, blocks laid
 * out in a shuffled order so slots are not contiguous. */
static void
fix_make(fix_t *f, int32_t n_heads, int32_t n_kv, int32_t hd, int32_t bs, const int32_t *n_new,
         const int32_t *ctx, int32_t n_seqs)
{
    memset(f, 0, sizeof(*f));
    f->n_seqs = n_seqs;
    f->n_heads = n_heads;
    f->n_kv = n_kv;
    f->hd = hd;
    f->bs = bs;
    f->max_blocks = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        int32_t nb = (ctx[s] + bs - 1) / bs;
        f->max_blocks = nb > f->max_blocks ? nb : f->max_blocks;
        f->qs[s + 1] = f->qs[s] + n_new[s];
        f->ctx[s] = ctx[s];
    }
    f->n_tok = f->qs[n_seqs];
    f->n_blocks = 1 + n_seqs * f->max_blocks;
    f->bt = calloc((size_t)n_seqs * f->max_blocks, sizeof(int32_t));
    for (int32_t i = 0; i < n_seqs * f->max_blocks; i++) {
        /* a permutation of 1 .. n_blocks - 1 */
        f->bt[i] = 1 + (int32_t)(((int64_t)i * 7 + 3) % (n_seqs * f->max_blocks));
    }
    f->q = malloc(sizeof(float) * (size_t)f->n_tok * n_heads * hd);
    f->out = malloc(sizeof(float) * (size_t)f->n_tok * n_heads * hd);
    f->k = malloc(sizeof(float) * (size_t)f->n_blocks * n_kv * bs * hd);
    f->v = malloc(sizeof(float) * (size_t)f->n_blocks * n_kv * bs * hd);
    for (size_t i = 0; i < (size_t)f->n_tok * n_heads * hd; i++) {
        f->q[i] = 2.0f * frand();
    }
    for (size_t i = 0; i < (size_t)f->n_blocks * n_kv * bs * hd; i++) {
        f->k[i] = frand();
        f->v[i] = frand();
    }
    f->on = malloc((size_t)f->n_tok);
}

static void
fix_free(fix_t *f)
{
    free(f->bt);
    free(f->q);
    free(f->out);
    free(f->k);
    free(f->v);
    free(f->on);
}

static kn_attn_args_t
fix_args(fix_t *f, int32_t window)
{
    kn_attn_args_t a = {
        .out = f->out,
        .q = f->q,
        .k_cache = f->k,
        .v_cache = f->v,
        .query_start = f->qs,
        .context_len = f->ctx,
        .block_tables = f->bt,
        .max_blocks = f->max_blocks,
        .n_seqs = f->n_seqs,
        .n_tok = f->n_tok,
        .n_heads = f->n_heads,
        .n_kv_heads = f->n_kv,
        .head_dim = f->hd,
        .block_size = f->bs,
        .sliding_window = window,
        .scale = 1.0f / sqrtf((float)f->hd),
    };
    return a;
}

static void
check_case(int32_t n_heads, int32_t n_kv, int32_t hd, int32_t bs, int32_t window, int every)
{
    const int32_t n_new[3] = {1, 9, 1}, ctx[3] = {37, 40, 5};
    fix_t f;
    size_t cells;
    float *acc, *ref;
    double total = 0.0, expect = 0.0;

    fix_make(&f, n_heads, n_kv, hd, bs, n_new, ctx, 3);
    for (int32_t t = 0; t < f.n_tok; t++) {
        f.on[t] = every || t % 3 != 1;
        expect += f.on[t] ? n_heads : 0; /* each query head's probabilities sum to 1 */
    }
    cells = (size_t)f.n_blocks * bs * n_kv;
    acc = malloc(sizeof(float) * cells);
    ref = malloc(sizeof(float) * cells);
    for (size_t i = 0; i < cells; i++) {
        acc[i] = ref[i] = 0.25f; /* it adds to what was there */
    }
    kn_attn_args_t a = fix_args(&f, window);
    kn_cpu_attn_mass(&a, f.on, acc);
    kn_cpu_attn_mass_ref(&a, f.on, ref);
    for (size_t i = 0; i < cells; i++) {
        ck_assert_msg(fabsf(acc[i] - ref[i]) <= 2e-5f * (1.0f + fabsf(ref[i])),
                      "cell %zu: %.7f vs reference %.7f", i, acc[i], ref[i]);
        total += acc[i] - 0.25f;
    }
    ck_assert_msg(fabs(total - expect) < 1e-3, "mass %.6f, %.0f query rows x heads", total,
                  expect);
    free(acc);
    free(ref);
    fix_free(&f);
}

START_TEST(test_mass_mha)
{
    check_case(4, 4, 16, 8, 0, 1);
}
END_TEST

START_TEST(test_mass_gqa_rows_off)
{
    check_case(6, 2, 32, 16, 0, 0);
}
END_TEST

START_TEST(test_mass_mqa_window)
{
    check_case(4, 1, 8, 4, 12, 1);
}
END_TEST

/* A larger batch takes the threaded path: still equal to the reference. */
START_TEST(test_mass_threaded)
{
    const int32_t n_new[4] = {64, 1, 1, 30}, ctx[4] = {200, 180, 33, 120};
    fix_t f;
    size_t cells;
    float *acc, *ref;

    kn_cpu_init(4);
    fix_make(&f, 8, 4, 64, 16, n_new, ctx, 4);
    memset(f.on, 1, (size_t)f.n_tok);
    cells = (size_t)f.n_blocks * 16 * 4;
    acc = calloc(cells, sizeof(float));
    ref = calloc(cells, sizeof(float));
    kn_attn_args_t a = fix_args(&f, 0);
    kn_cpu_attn_mass(&a, f.on, acc);
    kn_cpu_attn_mass_ref(&a, f.on, ref);
    for (size_t i = 0; i < cells; i++) {
        ck_assert_msg(fabsf(acc[i] - ref[i]) <= 2e-5f * (1.0f + fabsf(ref[i])),
                      "cell %zu: %.7f vs reference %.7f", i, acc[i], ref[i]);
    }
    free(acc);
    free(ref);
    fix_free(&f);
}
END_TEST

int
main(void)
{
    Suite *s = suite_create("kn_mass");
    TCase *tc = tcase_create("mass");
    SRunner *sr;
    int failed;

    tcase_add_test(tc, test_mass_mha);
    tcase_add_test(tc, test_mass_gqa_rows_off);
    tcase_add_test(tc, test_mass_mqa_window);
    tcase_add_test(tc, test_mass_threaded);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
