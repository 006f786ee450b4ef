/* test_sched_grammar.c - structured output in the scheduler: a request's
 * grammar masks every sample of each of its choices, the matcher advances
 * on the committed token, a complete grammar ends the choice (STOP, its
 * last token in the text), and the outputs are the same alone, batched,
 * under preemption by swap and by recompute, and for n > 1 choices.
 *
 * The fake model's tokens get bytes: 3..12 are '0'..'9', 13..38 'a'..'z',
 * 39 ',', 40 '[', 41 ']', 42 "[1", 43 ",9", the rest "zz"; 2 is EOS.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "grammar/grammar.h"
#include "tests/scheduler/fake_model.h"

static fake_env_t env;
static gr_vocab_t *vocab;
static char tok_text[FAKE_VOCAB][4];

/* [ d (, d){2,5} ] with d a digit: the output is complete at ']'. */
static const char k_gbnf[] = "root ::= \"[\" [0-9] ( \",\" [0-9] ){2,5} \"]\"";

static void
vocab_setup(void)
{
    const char *bytes[FAKE_VOCAB];
    uint32_t lens[FAKE_VOCAB];
    int32_t eos = FAKE_EOS;

    for (int32_t t = 0; t < FAKE_VOCAB; t++) {
        if (t < 3) {
            tok_text[t][0] = '\0';
        } else if (t <= 12) {
            snprintf(tok_text[t], sizeof(tok_text[t]), "%c", '0' + (t - 3));
        } else if (t <= 38) {
            snprintf(tok_text[t], sizeof(tok_text[t]), "%c", 'a' + (t - 13));
        } else {
            static const char *const rest[] = {",", "[", "]", "[1", ",9"};
            snprintf(tok_text[t], sizeof(tok_text[t]), "%s", t <= 43 ? rest[t - 39] : "zz");
        }
        bytes[t] = tok_text[t];
        lens[t] = (uint32_t)strlen(tok_text[t]);
    }
    ck_assert_int_eq(gr_vocab_create(FAKE_VOCAB, bytes, lens, &eos, 1, &vocab), ST_OK);
}

static gr_grammar_t *
compile(void)
{
    gr_grammar_t *g = NULL;
    char err[200];
    ck_assert_int_eq(gr_compile(GR_KIND_GBNF, k_gbnf, vocab, &g, err, sizeof(err)), ST_OK);
    return g;
}

/* The text of a choice's tokens; 1 when it is a complete sentence. */
static int
valid(const fake_out_t *o, char *text, size_t cap)
{
    size_t n = 0;
    text[0] = '\0';
    for (int32_t i = 0; i < o->n_tokens; i++) {
        n += (size_t)snprintf(text + n, cap - n, "%s", tok_text[o->tokens[i]]);
    }
    gr_grammar_t *g = compile();
    gr_matcher_t *m = gr_matcher_create(g);
    int ok = gr_matcher_accept_bytes(m, text, n) == ST_OK && gr_matcher_done(m);
    gr_matcher_destroy(m);
    gr_grammar_destroy(g);
    return ok;
}

/* 8 constrained requests (n = 2 for the odd ones) and 2 free ones. */
static void
run(int swap_blocks, int num_blocks, int sample_random, fake_out_t (*outs)[2], sched_stats_t *st)
{
    fake_cfg_t c = fake_cfg_default();
    eng_request_t r;

    c.num_blocks = num_blocks;
    c.swap_blocks = swap_blocks;
    c.max_num_seqs = 12;
    fake_env_init(&env, &c);
    env.sample_random = sample_random;
    for (int i = 0; i < 10; i++) {
        fake_req_fill(&r, (uint64_t)i + 1, 0, 20 + i, (uint32_t)(200 + i), 30);
        r.n = i < 8 && (i & 1) ? 2 : 1;
        r.seed = (uint64_t)i;
        r.has_seed = 1;
        if (i < 8) {
            r.grammar = compile();
        }
        ck_assert_int_eq(fake_submit_req(&env, &r), ST_OK);
        ck_assert_ptr_null(r.grammar); /* the scheduler owns it now */
    }
    fake_run(&env, 100000);
    sched_get_stats(env.sched, st);
    for (int i = 0; i < 10; i++) {
        for (int k = 0; k < 2; k++) {
            outs[i][k] = env.out[i + 1][k];
        }
    }
    fake_env_fini(&env);
}

static void
check_outputs(fake_out_t (*outs)[2])
{
    char text[256];
    for (int i = 0; i < 8; i++) {
        for (int k = 0; k < (i & 1 ? 2 : 1); k++) {
            const fake_out_t *o = &outs[i][k];
            ck_assert(o->finished);
            ck_assert_msg(valid(o, text, sizeof(text)), "request %d choice %d: '%s'", i, k, text);
            ck_assert_int_eq(o->reason, ENG_FINISH_STOP);
            ck_assert_int_eq(o->stop_token, -1); /* ']' is part of the text */
        }
    }
    /* The free requests are not constrained: they run to max_tokens or the
     * context (far past any sentence of the grammar). */
    for (int i = 8; i < 10; i++) {
        ck_assert_int_ge(outs[i][0].n_tokens, 20);
        ck_assert_int_eq(outs[i][0].reason, ENG_FINISH_LENGTH);
    }
}

static void
same(fake_out_t (*a)[2], fake_out_t (*b)[2])
{
    /* The constrained ones (a free one may outgrow the tiny pool and end
     * early under pressure). */
    for (int i = 0; i < 8; i++) {
        for (int k = 0; k < (i & 1 ? 2 : 1); k++) {
            ck_assert_int_eq(a[i][k].n_tokens, b[i][k].n_tokens);
            ck_assert_int_eq(
                memcmp(a[i][k].tokens, b[i][k].tokens, (size_t)a[i][k].n_tokens * sizeof(int32_t)),
                0);
        }
    }
}

START_TEST(test_grammar_masks_advances_and_stops)
{
    static fake_out_t plain[10][2], swapped[10][2], recomputed[10][2];
    sched_stats_t st;

    vocab_setup();
    /* Greedy over the masked logits (the fake's random mode draws without
     * looking at the logits, so it cannot stand in for a masked draw). */
    for (int random = 0; random < 1; random++) {
        run(0, 400, random, plain, &st);
        ck_assert_uint_eq(st.preempt_swap + st.preempt_recompute, 0);
        check_outputs(plain);

        run(200, 14, random, swapped, &st);
        ck_assert_uint_gt(st.preempt_swap, 0);
        check_outputs(swapped);
        same(plain, swapped);

        run(0, 14, random, recomputed, &st);
        ck_assert_uint_gt(st.preempt_recompute, 0);
        check_outputs(recomputed);
        same(plain, recomputed);
    }
    gr_vocab_destroy(vocab);
}
END_TEST

Suite *
scheduler_grammar_suite(void)
{
    Suite *s = suite_create("scheduler_grammar");
    TCase *tc = tcase_create("grammar");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_grammar_masks_advances_and_stops);
    suite_add_tcase(s, tc);
    return s;
}
