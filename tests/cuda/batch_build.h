/* batch_build.h - one step's mdl_batch_t from scripted sequences, for the
 * tests that drive a forward pass step by step (test_devemu.c,
 * test_spec_emu.c, test_mass_emu.c, test_tp.c).
 *
 * DESIGN
 *   A test keeps each sequence as its token ids, how many of them are in
 *   the KV cache (done) and its block table. tb_add() appends the next n
 *   ids of one sequence to the step -- positions done.., slots from the
 *   table, the sequence's context and table row -- and marks its last
 *   n_rows tokens as logits rows, in order. tb_end() gives the batch. The
 *   builder holds every array, so the batch lives as long as it does.
 *
 * Thread: tests only, one thread.
 */
#ifndef TESTS_CUDA_BATCH_BUILD_H
#define TESTS_CUDA_BATCH_BUILD_H

#include <stdint.h>

#include "model/model.h"

#define TB_MAX_TOK 256   /* tokens in one step */
#define TB_MAX_SEQ 8     /* sequences in one step */
#define TB_MAX_BLOCKS 16 /* block table entries per sequence */

typedef struct tb_batch {
    int32_t tok[TB_MAX_TOK], pos[TB_MAX_TOK], slot[TB_MAX_TOK], lrows[TB_MAX_TOK];
    int32_t qs[TB_MAX_SEQ + 1], ctx[TB_MAX_SEQ];
    int32_t bt[TB_MAX_SEQ * TB_MAX_BLOCKS];
    int32_t block_size, max_blocks;
    mdl_batch_t b;
} tb_batch_t;

/* An empty step for tables of max_blocks (<= TB_MAX_BLOCKS) entries of
 * block_size slots. */
void tb_begin(tb_batch_t *t, int32_t block_size, int32_t max_blocks);
/* Appends ids[*done .. *done + n) of a sequence whose table is
 * table[max_blocks]; its last n_rows (<= n) tokens become logits rows;
 * *done += n. Returns the step index of its first token. Fails the running
 * test past the TB_MAX_* limits. */
int32_t tb_add(tb_batch_t *t, const int32_t *ids, int32_t *done, int32_t n, const int32_t *table,
               int32_t n_rows);
/* The step built so far (n_seqs, n_tokens, n_logits set); callers may set
 * other fields (mass_rows, table_rows) on it. */
mdl_batch_t *tb_end(tb_batch_t *t);

#endif /* TESTS_CUDA_BATCH_BUILD_H */
