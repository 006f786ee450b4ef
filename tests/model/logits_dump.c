/* logits_dump.c - test helper for tests/reference/compare_logits.py:
 * runs kvserve's forward on the given token ids and writes the logits of
 * every position to stdout as raw little-endian f32, [n_ids][vocab].
 *
 *   logits_dump MODEL CHUNK ID...
 *
 * The prompt is fed in chunks of CHUNK tokens (0: all at once) through a
 * KV pool whose blocks are handed out in a scrambled order, so the
 * reference comparison also covers paged attention and chunked prefill.
 * Exit 0 on success, 1 on failure, 2 on bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "model/model.h"

#define BS 16

int
main(int argc, char **argv)
{
    mdl_model_t *m = NULL;
    mdl_runtime_t *rt = NULL;
    char err[512] = "";
    int32_t n, chunk, vocab, n_blocks;
    int32_t *ids, *pos, *slot, *rows, *table;
    int rc;

    if (argc < 4) {
        fprintf(stderr, "usage: logits_dump MODEL CHUNK ID...\n");
        return 2;
    }
    n = argc - 3;
    chunk = atoi(argv[2]);
    if (chunk <= 0 || chunk > n) {
        chunk = n;
    }
    rc = mdl_model_load(argv[1], &m, err, sizeof(err));
    if (rc != ST_OK) {
        fprintf(stderr, "logits_dump: %s\n", err);
        return 1;
    }
    vocab = mdl_model_config(m)->vocab_size;
    n_blocks = (n + BS - 1) / BS;
    mdl_runtime_config_t rc_cfg = {
        .block_size = BS,
        .num_blocks = 3 * n_blocks + 2,
        .max_num_batched_tokens = chunk,
        .max_num_seqs = chunk,
        .max_blocks_per_seq = n_blocks,
    };
    rc = mdl_runtime_create(m, &rc_cfg, &rt, err, sizeof(err));
    if (rc != ST_OK) {
        fprintf(stderr, "logits_dump: %s\n", err);
        mdl_model_destroy(m);
        return 1;
    }
    ids = calloc((size_t)n, sizeof(int32_t));
    pos = calloc((size_t)n, sizeof(int32_t));
    slot = calloc((size_t)n, sizeof(int32_t));
    rows = calloc((size_t)n, sizeof(int32_t));
    table = calloc((size_t)n_blocks, sizeof(int32_t));
    for (int32_t i = 0; i < n_blocks; i++) {
        table[i] = 3 * (n_blocks - i); /* descending, with gaps */
    }
    for (int32_t i = 0; i < n; i++) {
        ids[i] = atoi(argv[3 + i]);
        pos[i] = i;
        slot[i] = table[i / BS] * BS + i % BS;
    }
    for (int32_t at = 0; at < n && rc == ST_OK; at += chunk) {
        int32_t len = n - at < chunk ? n - at : chunk;
        int32_t qs[2] = {0, len}, ctx = at + len;
        const float *lg;

        for (int32_t i = 0; i < len; i++) {
            rows[i] = i;
        }
        mdl_batch_t b = {
            .n_tokens = len,
            .tokens = ids + at,
            .positions = pos + at,
            .slot_mapping = slot + at,
            .n_seqs = 1,
            .query_start = qs,
            .context_len = &ctx,
            .block_tables = table,
            .max_blocks = n_blocks,
            .logits_rows = rows,
            .n_logits = len,
        };
        rc = mdl_forward(rt, &b, &lg);
        if (rc == ST_OK) {
            fwrite(lg, sizeof(float), (size_t)len * vocab, stdout);
        }
    }
    if (rc != ST_OK) {
        fprintf(stderr, "logits_dump: forward: %s\n", st_str(rc));
    }
    free(ids);
    free(pos);
    free(slot);
    free(rows);
    free(table);
    mdl_runtime_destroy(rt);
    mdl_model_destroy(m);
    return rc == ST_OK ? 0 : 1;
}
