/* sched_policy.c - VTC charges, the swap-in gate and un-planning a row
 * (see sched_policy.h for the design).
 *
 * Thread: engine thread (or a test's); no state of its own.
 */
#include "scheduler/sched_policy.h"

#include <math.h>
#include <string.h>

#include "common/status.h"
#include "scheduler/sched.h"

static int
weight_ok(double w)
{
    return isfinite(w) && w >= 0 && w <= SP_VTC_WEIGHT_MAX;
}

int
sp_vtc_resolve(const sp_vtc_weights_t *in, sp_vtc_weights_t *out)
{
    sp_vtc_weights_t w = *in;

    if (w.input == 0 && w.cached == 0 && w.output == 0) {
        w = (sp_vtc_weights_t){.input = SP_VTC_INPUT_DEFAULT,
                               .cached = SP_VTC_CACHED_DEFAULT,
                               .output = SP_VTC_OUTPUT_DEFAULT};
    }
    if (!weight_ok(w.input) || !weight_ok(w.cached) || !weight_ok(w.output) ||
        (w.input == 0 && w.output == 0)) {
        return ST_EINVAL;
    }
    *out = w;
    return ST_OK;
}

double
sp_vtc_prompt_charge(const sp_vtc_weights_t *w, int32_t n_prompt, int32_t n_cached)
{
    if (n_cached > n_prompt) {
        n_cached = n_prompt;
    }
    if (n_cached < 0) {
        n_cached = 0;
    }
    return (double)(n_prompt - n_cached) * w->input + (double)n_cached * w->cached;
}

sp_swap_in_t
sp_swap_in_gate(const sp_swap_in_req_t *r)
{
    uint32_t headroom;

    if (r->tenant_max > 0 && r->tenant_slots + r->slots > r->tenant_max) {
        return SP_SWAP_IN_SKIP;
    }
    if (r->tenant_kv > 0 && r->tenant_running > 0 &&
        (uint64_t)r->tenant_blocks + r->need > r->tenant_kv) {
        return SP_SWAP_IN_SKIP;
    }
    if (r->run_slots + r->slots > r->max_slots) {
        return SP_SWAP_IN_STOP;
    }
    /* The watermark (at least one block) stays free for the running
     * sequences' next tokens; alone on the device it needs none. */
    headroom = r->others_running ? (r->watermark > 0 ? r->watermark : 1) : 0;
    if ((uint64_t)r->need + headroom > r->free_blocks) {
        return SP_SWAP_IN_STOP;
    }
    return SP_SWAP_IN_OK;
}

void
sp_unplan_row(sp_rows_t *b, int32_t row)
{
    const int32_t t0 = b->query_start[row], len = b->rows_new[row], t1 = t0 + len;
    const int32_t n_tok = *b->n_tok, n_rows = *b->n_rows;
    int32_t lo = 0, m = 0, s_lo = 0, s_n = 0, res_n = 0;

    /* Tokens, positions and slots after the row move down. */
    memmove(b->tokens + t0, b->tokens + t1, sizeof(int32_t) * (size_t)(n_tok - t1));
    memmove(b->positions + t0, b->positions + t1, sizeof(int32_t) * (size_t)(n_tok - t1));
    memmove(b->slots + t0, b->slots + t1, sizeof(int32_t) * (size_t)(n_tok - t1));

    /* Its logits rows: the contiguous run pointing into [t0, t1). */
    while (lo < *b->n_logits && b->logits_rows[lo] < t0) {
        lo++;
    }
    while (lo + m < *b->n_logits && b->logits_rows[lo + m] < t1) {
        m++;
    }
    for (int32_t i = lo + m; i < *b->n_logits; i++) {
        b->logits_rows[i - m] = b->logits_rows[i] - len;
    }
    *b->n_logits -= m;

    /* Its samples: those reading logits rows [lo, lo + m). */
    while (s_lo < *b->n_samples && b->samples[s_lo].row < lo) {
        s_lo++;
    }
    while (s_lo + s_n < *b->n_samples && b->samples[s_lo + s_n].row < lo + m) {
        res_n += 1 + b->samples[s_lo + s_n].n_draft;
        s_n++;
    }
    for (int32_t i = s_lo + s_n; i < *b->n_samples; i++) {
        sched_sample_t sm = b->samples[i];
        sm.row -= m;
        sm.res -= res_n;
        b->samples[i - s_n] = sm;
    }
    *b->n_samples -= s_n;
    *b->n_res -= res_n;

    /* Later rows move down one. */
    for (int32_t r = row + 1; r < n_rows; r++) {
        b->query_start[r - 1] = b->query_start[r] - len;
        b->context_len[r - 1] = b->context_len[r];
        b->rows_new[r - 1] = b->rows_new[r];
        b->rows_draft[r - 1] = b->rows_draft[r];
        b->rows_seq[r - 1] = b->rows_seq[r];
    }
    *b->n_rows = n_rows - 1;
    *b->n_tok = n_tok - len;
    *b->budget_tokens += len;
}
