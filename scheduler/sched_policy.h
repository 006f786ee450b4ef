/* sched_policy.h - scheduler policy pieces that stand apart from the
 * queues in sched.c: the virtual token counter's charges, the gate that
 * decides whether a swapped sequence comes back now, and taking a
 * planned row back out of a step's batch (issue 15).
 *
 * DESIGN
 *   VTC charges (Sheng et al., "Fairness in Serving Large Language
 *   Models", OSDI 2024, which charges input and output tokens with
 *   separate weights): a tenant's counter grows by
 *     input  x (prompt tokens computed at first admission)
 *   + cached x (prompt tokens the prefix cache served at first admission)
 *   + output x (each generated token),
 *   divided by the tenant's weight. The defaults (1, 0.25, 2) say that a
 *   generated token costs a whole decode step of the batch (memory-bound,
 *   one token per sequence per step) where a prompt token is one of
 *   thousands computed in a prefill chunk, and that a cached prompt
 *   token costs no compute, only the KV it keeps resident. They follow
 *   the paper's choice of output = 2 x input and the common price ratio
 *   of cached to fresh input tokens.
 *
 *   Swap-in gate: a swapped sequence comes back only when its tenant has
 *   room under max_running and its KV share (counting the blocks the
 *   swap-in takes), and the pool keeps the admission watermark (at least
 *   one block) free after it while anything else runs. A tenant at its
 *   limit is skipped, so one tenant's swapped backlog does not hold the
 *   others back; a full pool or step stops swap-in (and admission) for
 *   everyone, so swapped sequences keep their turn before new work.
 *
 *   Un-planning (vLLM v1's preemption of an already scheduled request): a
 *   row of the step's flattened batch is removed and the rows, tokens,
 *   logits rows and samples after it close the gap; the token budget is
 *   refunded. The block manager undoes the row's reservation separately
 *   (bm_seq_unreserve).
 *
 * Thread: engine thread only (or a test's thread); no state of its own.
 */
#ifndef SCHEDULER_SCHED_POLICY_H
#define SCHEDULER_SCHED_POLICY_H

#include <stdint.h>

/* VTC weights per token kind. All three 0 (a zeroed config) means the
 * defaults below. */
typedef struct sp_vtc_weights {
    double input;  /* a prompt token computed at first admission */
    double cached; /* a prompt token served by the prefix cache */
    double output; /* a generated token */
} sp_vtc_weights_t;

#define SP_VTC_INPUT_DEFAULT 1.0
#define SP_VTC_CACHED_DEFAULT 0.25
#define SP_VTC_OUTPUT_DEFAULT 2.0
#define SP_VTC_WEIGHT_MAX 1e6

/* Copies in to out, with the defaults when all three are 0. ST_EINVAL
 * when a weight is negative, not finite or above SP_VTC_WEIGHT_MAX, or
 * input and output are both 0 (the counter would not move). */
int sp_vtc_resolve(const sp_vtc_weights_t *in, sp_vtc_weights_t *out);

/* The charge of a prompt at first admission, before the tenant weight:
 * n_cached of its n_prompt tokens came from the prefix cache. */
double sp_vtc_prompt_charge(const sp_vtc_weights_t *w, int32_t n_prompt, int32_t n_cached);

typedef enum sp_swap_in {
    SP_SWAP_IN_OK = 0, /* swap it in */
    SP_SWAP_IN_SKIP,   /* its tenant is at max_running or its KV share: try the next */
    SP_SWAP_IN_STOP,   /* the step's slots or the pool's blocks are short: stop */
} sp_swap_in_t;

/* What the swap-in gate looks at, for one swapped sequence. */
typedef struct sp_swap_in_req {
    uint32_t slots;          /* max_num_seqs slots the sequence takes */
    uint32_t run_slots;      /* slots running now, all tenants */
    uint32_t max_slots;      /* max_num_seqs */
    uint32_t tenant_slots;   /* the tenant's running slots */
    uint32_t tenant_max;     /* the tenant's max_running; 0: unlimited */
    uint32_t tenant_running; /* the tenant's running sequences */
    uint32_t tenant_blocks;  /* device blocks the tenant holds */
    uint32_t tenant_kv;      /* the tenant's block limit; 0: all */
    uint32_t need;           /* device blocks the swap-in takes */
    uint32_t free_blocks;    /* device blocks that can be handed out */
    uint32_t watermark;      /* blocks admission keeps free for growth */
    int others_running;      /* any sequence runs */
} sp_swap_in_req_t;

/* Decides for one swapped sequence (see DESIGN). A tenant with nothing
 * running gets its sequence back even past its KV share (it held those
 * blocks when it was preempted; refusing would strand it). */
sp_swap_in_t sp_swap_in_gate(const sp_swap_in_req_t *r);

struct sched_sample;
struct sched_seq;

/* The step's batch under construction, as sched.c lays it out: rows in
 * plan order, each row's tokens contiguous from query_start[row], its
 * logits rows contiguous in logits_rows and its samples contiguous in
 * samples (results numbered in sample order). Counters by pointer. */
typedef struct sp_rows {
    int32_t *tokens, *positions, *slots; /* [*n_tok] */
    int32_t *query_start, *context_len;  /* [*n_rows] */
    int32_t *rows_new, *rows_draft;      /* [*n_rows] */
    struct sched_seq **rows_seq;         /* [*n_rows] the row's sequence */
    int32_t *logits_rows;                /* [*n_logits] token index of each */
    struct sched_sample *samples;        /* [*n_samples] */
    int32_t *n_tok, *n_rows, *n_logits, *n_samples, *n_res;
    int32_t *budget_tokens; /* refunded with the row's tokens */
} sp_rows_t;

/* Removes row `row` and everything that belongs to it (tokens, logits
 * rows, samples); later rows move down and keep their contents, with
 * indices fixed up. Cannot fail; the row must exist. */
void sp_unplan_row(sp_rows_t *b, int32_t row);

#endif /* SCHEDULER_SCHED_POLICY_H */
