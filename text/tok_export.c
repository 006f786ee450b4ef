/* tok_export.c - read-only views of a loaded tokenizer for writers of
 * other formats (kvserve quantize writes a tokenizer.json vocabulary as
 * GGUF tokenizer.ggml.* keys): token types in GGUF numbering, scores,
 * merges in rank order, the special ids and the BOS/EOS flags.
 *
 * Thread: any; reads an immutable tokenizer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xmalloc.h"
#include "text/tokenizer.h"
#include "text/tokenizer_int.h"

int
tok_is_byte_level(const tok_tokenizer_t *t)
{
    return t->byte_level;
}

int32_t
tok_unk_id(const tok_tokenizer_t *t)
{
    return t->unk;
}

int
tok_adds_bos(const tok_tokenizer_t *t)
{
    return t->n_prefix_ids > 0 && t->prefix_ids[0] == t->bos && t->bos >= 0;
}

int
tok_adds_eos(const tok_tokenizer_t *t)
{
    return t->n_suffix_ids > 0 && t->suffix_ids[t->n_suffix_ids - 1] == t->eos && t->eos >= 0;
}

float
tok_token_score(const tok_tokenizer_t *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab ? t->tokens[id].score : 0.0f;
}

/* "<0xXX>" with two upper-case hex digits. */
static int
is_byte_token(const char *s)
{
    unsigned v;
    char tail;

    return strlen(s) == 6 && sscanf(s, "<0x%2X%c", &v, &tail) == 2 && tail == '>';
}

int
tok_token_gguf_type(const tok_tokenizer_t *t, int32_t id)
{
    const tok_entry_t *e;

    if (id < 0 || id >= t->n_vocab) {
        return TOK_TYPE_UNDEFINED;
    }
    e = &t->tokens[id];
    if (id == t->unk) {
        return TOK_TYPE_UNKNOWN;
    }
    if (t->byte_fallback && !e->added && is_byte_token(e->text)) {
        return TOK_TYPE_BYTE;
    }
    return e->type;
}

static int
cmp_rank(const void *a, const void *b)
{
    const tok_merge_slot_t *x = a, *y = b;

    return (x->rank > y->rank) - (x->rank < y->rank);
}

uint32_t
tok_merges(const tok_tokenizer_t *t, int32_t *pairs)
{
    tok_merge_slot_t *v;
    uint32_t n = 0;

    if (pairs == NULL || t->n_merges == 0) {
        return t->n_merges;
    }
    v = xmalloc(sizeof(*v) * t->n_merges);
    for (uint32_t i = 0; t->mhash != NULL && i <= t->mhash_mask; i++) {
        if (t->mhash[i].key != UINT64_MAX) {
            v[n++] = t->mhash[i];
        }
    }
    qsort(v, n, sizeof(*v), cmp_rank);
    for (uint32_t i = 0; i < n; i++) {
        pairs[2 * i] = (int32_t)(v[i].key >> 32);
        pairs[2 * i + 1] = (int32_t)(uint32_t)v[i].key;
    }
    free(v);
    return n;
}

float *
tok_merge_scores(const tok_tokenizer_t *t)
{
    float *s = xcalloc((size_t)t->n_vocab, sizeof(*s));
    uint8_t *seen = xcalloc((size_t)t->n_vocab, 1);
    uint32_t n = t->n_merges;
    tok_merge_slot_t *v = xmalloc(sizeof(*v) * (n > 0 ? n : 1));
    uint32_t k = 0;

    for (uint32_t i = 0; t->mhash != NULL && i <= t->mhash_mask; i++) {
        if (t->mhash[i].key != UINT64_MAX) {
            v[k++] = t->mhash[i];
        }
    }
    qsort(v, k, sizeof(*v), cmp_rank);
    for (uint32_t i = 0; i < k; i++) {
        int32_t r = v[i].result;

        if (!seen[r]) {
            seen[r] = 1;
            s[r] = -(float)(i + 1);
        }
    }
    free(v);
    free(seen);
    return s;
}
