/* logits_dump.c - test helper for tests/reference/compare_logits.py and
 * compare_types.py: runs kvserve's forward on the given token ids and writes
 * the logits of every position to stdout as raw little-endian f32,
 * [n_ids][vocab].
 *
 *   logits_dump MODEL CHUNK ID...
 *   logits_dump MODEL CHUNK ID... + ID...
 *   logits_dump --matmul-precision P MODEL CHUNK ...   (high or medium:
 *               mdl_runtime_config_t.matmul_precision; default high)
 *
 * The prompt is fed in chunks of CHUNK tokens (0: all at once) through a
 * KV pool whose blocks are handed out in a scrambled order, so the
 * reference comparison also covers paged attention and chunked prefill.
 * With a lone "+" between two id lists, the two prompts run as two
 * sequences of one batch: every step carries the next CHUNK tokens of each
 * (of the one still going once the shorter is done), their blocks
 * interleaved in the pool; the output is the first prompt's rows, then the
 * second's, so a caller can compare each with its run alone.
 * Exit 0 on success, 1 on failure, 2 on bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "model/model.h"

#define BS 16

/* One prompt of the batch: its ids, physical block table and progress. */
typedef struct dump_seq {
    int32_t n;       /* prompt length */
    int32_t *ids;    /* [n] */
    int32_t *slot;   /* [n] KV slot of each position */
    int32_t n_blocks;
    int32_t *table;  /* [n_blocks] physical block ids */
    int32_t done;    /* tokens already fed */
    float *logits;   /* [n][vocab] */
} dump_seq_t;

int
main(int argc, char **argv)
{
    mdl_model_t *m = NULL;
    mdl_runtime_t *rt = NULL;
    char err[512] = "";
    dump_seq_t seq[2];
    int32_t n_seqs = 1, chunk, vocab, n_max = 0, nb_total = 0, nb_max = 0;
    int32_t *tok, *pos, *slot, *rows, *table;
    int rc;

    mdl_matmul_prec_t prec = MDL_MATMUL_HIGH;

    memset(seq, 0, sizeof(seq));
    if (argc >= 3 && strcmp(argv[1], "--matmul-precision") == 0) {
        if (mdl_matmul_prec_parse(argv[2], &prec) != ST_OK) {
            fprintf(stderr, "logits_dump: bad --matmul-precision '%s'\n", argv[2]);
            return 2;
        }
        argv += 2;
        argc -= 2;
    }
    if (argc < 4) {
        fprintf(stderr, "usage: logits_dump MODEL CHUNK ID... [+ ID...]\n");
        return 2;
    }
    seq[0].n = argc - 3;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "+") == 0) {
            seq[0].n = i - 3;
            seq[1].n = argc - i - 1;
            n_seqs = 2;
            break;
        }
    }
    if (seq[0].n < 1 || (n_seqs == 2 && seq[1].n < 1)) {
        fprintf(stderr, "usage: logits_dump MODEL CHUNK ID... [+ ID...]\n");
        return 2;
    }
    for (int32_t s = 0; s < n_seqs; s++) {
        n_max = seq[s].n > n_max ? seq[s].n : n_max;
        seq[s].n_blocks = (seq[s].n + BS - 1) / BS;
        nb_total += seq[s].n_blocks;
        nb_max = seq[s].n_blocks > nb_max ? seq[s].n_blocks : nb_max;
    }
    chunk = atoi(argv[2]);
    if (chunk <= 0 || chunk > n_max) {
        chunk = n_max;
    }
    rc = mdl_model_load(argv[1], &m, err, sizeof(err));
    if (rc != ST_OK) {
        fprintf(stderr, "logits_dump: %s\n", err);
        return 1;
    }
    vocab = mdl_model_config(m)->vocab_size;
    mdl_runtime_config_t rc_cfg = {
        .block_size = BS,
        .num_blocks = 3 * nb_total + 2,
        .max_num_batched_tokens = n_seqs * chunk,
        .max_num_seqs = n_seqs * chunk,
        .max_blocks_per_seq = nb_max,
        .matmul_precision = prec,
    };
    rc = mdl_runtime_create(m, &rc_cfg, &rt, err, sizeof(err));
    if (rc != ST_OK) {
        fprintf(stderr, "logits_dump: %s\n", err);
        mdl_model_destroy(m);
        return 1;
    }
    /* Block i of sequence s is 3 * (nb_total - i) - s: descending, with
     * gaps, the two sequences' blocks interleaved (one sequence: the
     * 3 * (n_blocks - i) this helper always used). */
    for (int32_t s = 0; s < n_seqs; s++) {
        const char *const *arg = (const char *const *)argv + 3 + (s == 0 ? 0 : seq[0].n + 1);
        dump_seq_t *q = &seq[s];

        q->ids = calloc((size_t)q->n, sizeof(int32_t));
        q->slot = calloc((size_t)q->n, sizeof(int32_t));
        q->table = calloc((size_t)q->n_blocks, sizeof(int32_t));
        q->logits = calloc((size_t)q->n * (size_t)vocab, sizeof(float));
        for (int32_t i = 0; i < q->n_blocks; i++) {
            q->table[i] = 3 * (nb_total - i) - s;
        }
        for (int32_t i = 0; i < q->n; i++) {
            q->ids[i] = atoi(arg[i]);
            q->slot[i] = q->table[i / BS] * BS + i % BS;
        }
    }
    tok = calloc((size_t)(n_seqs * chunk), sizeof(int32_t));
    pos = calloc((size_t)(n_seqs * chunk), sizeof(int32_t));
    slot = calloc((size_t)(n_seqs * chunk), sizeof(int32_t));
    rows = calloc((size_t)(n_seqs * chunk), sizeof(int32_t));
    table = calloc((size_t)(n_seqs * nb_max), sizeof(int32_t));
    for (;;) {
        int32_t qs[3] = {0}, ctx[2], n_tok = 0, n_in = 0, who[2];
        const float *lg;

        /* This step: the next chunk of every sequence not yet done, one
         * block-table row each (padded to nb_max). */
        for (int32_t s = 0; s < n_seqs; s++) {
            dump_seq_t *q = &seq[s];
            int32_t len = q->n - q->done < chunk ? q->n - q->done : chunk;

            if (len == 0) {
                continue;
            }
            for (int32_t i = 0; i < len; i++) {
                tok[n_tok + i] = q->ids[q->done + i];
                pos[n_tok + i] = q->done + i;
                slot[n_tok + i] = q->slot[q->done + i];
                rows[n_tok + i] = n_tok + i;
            }
            memset(table + n_in * nb_max, 0, (size_t)nb_max * sizeof(int32_t));
            memcpy(table + n_in * nb_max, q->table, (size_t)q->n_blocks * sizeof(int32_t));
            n_tok += len;
            ctx[n_in] = q->done + len;
            who[n_in] = s;
            qs[++n_in] = n_tok;
        }
        if (n_in == 0) {
            break;
        }
        mdl_batch_t b = {
            .n_tokens = n_tok,
            .tokens = tok,
            .positions = pos,
            .slot_mapping = slot,
            .n_seqs = n_in,
            .query_start = qs,
            .context_len = ctx,
            .block_tables = table,
            .max_blocks = nb_max,
            .logits_rows = rows,
            .n_logits = n_tok,
        };
        rc = mdl_forward(rt, &b, &lg);
        if (rc != ST_OK) {
            break;
        }
        for (int32_t k = 0; k < n_in; k++) {
            dump_seq_t *q = &seq[who[k]];
            int32_t len = qs[k + 1] - qs[k];

            memcpy(q->logits + (size_t)q->done * vocab, lg + (size_t)qs[k] * vocab,
                   (size_t)len * (size_t)vocab * sizeof(float));
            q->done += len;
        }
    }
    if (rc != ST_OK) {
        fprintf(stderr, "logits_dump: forward: %s\n", st_str(rc));
    } else {
        for (int32_t s = 0; s < n_seqs; s++) {
            fwrite(seq[s].logits, sizeof(float), (size_t)seq[s].n * (size_t)vocab, stdout);
        }
    }
    for (int32_t s = 0; s < n_seqs; s++) {
        free(seq[s].ids);
        free(seq[s].slot);
        free(seq[s].table);
        free(seq[s].logits);
    }
    free(tok);
    free(pos);
    free(slot);
    free(rows);
    free(table);
    mdl_runtime_destroy(rt);
    mdl_model_destroy(m);
    return rc == ST_OK ? 0 : 1;
}
