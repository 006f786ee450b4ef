/* tokenizer.c - the tokenizer core: vocabulary and merge tables, the
 * encoder (added-token split, normalization, PCRE2 pre-tokenization, BPE or
 * SentencePiece merges) and the UTF-8-safe incremental decoder.
 *
 * DESIGN
 *
 *   text ──split on added tokens──▶ segments ──normalize──▶ buffer
 *        ──pre-tokenizer regexes (PCRE2, UTF+UCP)──▶ words ──merge──▶ ids
 *
 * Merging uses one linked list of symbols per word and a binary heap of
 * candidate pairs keyed by (priority, position): merge rank for BPE (lower
 * first), minus the merged token's score for SentencePiece (higher first).
 * Stale heap entries are detected lazily: a pair is still valid when its
 * left symbol is alive, is followed by the same right symbol and their
 * lengths still add up (symbols only ever grow). Each merge removes one
 * symbol, so a word of n symbols costs O(n log n). No recursion anywhere.
 *
 * Invalid UTF-8 input (documented contract): every byte that does not
 * start a well-formed UTF-8 sequence (overlongs, surrogates and truncated
 * sequences included) is one "character" of its own. For regex matching it
 * is seen as U+FFFD; for the model it keeps its original byte, so byte-level
 * vocabularies encode it exactly and byte-fallback vocabularies give its
 * <0xXX> token (the unknown token when the vocabulary has neither).
 *
 * Decoding concatenates each token's decoded bytes (computed once at load)
 * and passes them through one incremental UTF-8 scanner that emits only
 * complete characters. A maximal ill-formed subsequence (Unicode's
 * "maximal subpart" practice, as Rust's from_utf8_lossy and the WHATWG
 * decoder do) becomes one U+FFFD, so decode(all) equals the concatenation
 * of the streamed chunks however the ids are split.
 */
#define LOG_MODULE "tokenizer"

#include "text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/utf8.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "text/tokenizer_int.h"

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */

static uint64_t
hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;

    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

static uint64_t
hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint32_t
pow2_at_least(uint64_t n)
{
    uint32_t c = 16;

    while (c < n) {
        c <<= 1;
    }
    return c;
}

/* Growable byte buffer. Loading uses it aborting; encoding and decoding
 * (the request path) set fallible: a failed growth then sets oom, and the
 * append that needed it adds nothing. */
typedef struct sb {
    char *p;
    size_t n, cap;
    int fallible;
    int oom;
} sb_t;

static int
sb_reserve(sb_t *b, size_t extra)
{
    if (b->n + extra + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 64;
        char *q;
        while (c < b->n + extra + 1) {
            c *= 2;
        }
        if (b->fallible) {
            q = xrealloc_try(b->p, c);
            if (q == NULL) {
                b->oom = 1;
                return 0;
            }
        } else {
            q = xrealloc(b->p, c);
        }
        b->p = q;
        b->cap = c;
    }
    return 1;
}

static void
sb_add(sb_t *b, const void *p, size_t n)
{
    if (!sb_reserve(b, n)) {
        return;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static const char k_fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
static const char k_meta[3] = {(char)0xE2, (char)0x96, (char)0x81}; /* U+2581 "▁" */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes map to U+0100.. in byte order. */
uint32_t
tok__byte_to_cp(uint8_t b)
{
    int n = 0;

    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)) {
        return b;
    }
    for (int c = 0; c < b; c++) {
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) {
            n++;
        }
    }
    return 0x100 + (uint32_t)n;
}

static int
is_ascii_space(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* ------------------------------------------------------------------ */
/* Construction (used by the loaders)                                  */

tok_tokenizer_t *
tok__new(int32_t n_vocab)
{
    tok_tokenizer_t *t = xcalloc(1, sizeof(*t));

    t->n_vocab = n_vocab;
    t->tokens = xcalloc((size_t)(n_vocab > 0 ? n_vocab : 1), sizeof(*t->tokens));
    for (int32_t i = 0; i < n_vocab; i++) {
        t->tokens[i].text = xstrdup("");
        t->tokens[i].type = TOK_TYPE_UNUSED;
    }
    t->bos = t->eos = t->unk = -1;
    for (int i = 0; i < 256; i++) {
        t->byte_ids[i] = -1;
    }
    for (int i = 0; i < 0x144; i++) {
        t->cp_byte[i] = -1;
    }
    for (int b = 0; b < 256; b++) {
        t->byte_cp[b] = (uint16_t)tok__byte_to_cp((uint8_t)b);
        t->cp_byte[t->byte_cp[b]] = (int16_t)b;
    }
    return t;
}

void
tok__set_token(tok_tokenizer_t *t, int32_t id, const char *text, size_t len, float score, int type)
{
    tok_entry_t *e = &t->tokens[id];

    free(e->text);
    e->text = xstrndup(text, len);
    e->len = (uint32_t)len;
    e->score = score;
    e->type = (uint8_t)type;
}

void
tok__build_vocab_hash(tok_tokenizer_t *t)
{
    uint32_t cap = pow2_at_least((uint64_t)t->n_vocab * 2 + 1);

    free(t->vhash);
    t->vhash = xmalloc(cap * sizeof(int32_t));
    memset(t->vhash, 0xFF, cap * sizeof(int32_t));
    t->vhash_mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const tok_entry_t *e = &t->tokens[id];
        if (e->len == 0) {
            continue;
        }
        uint32_t h = (uint32_t)hash_bytes(e->text, e->len) & t->vhash_mask;
        int dup = 0;
        while (t->vhash[h] >= 0) {
            const tok_entry_t *o = &t->tokens[t->vhash[h]];
            if (o->len == e->len && memcmp(o->text, e->text, e->len) == 0) {
                dup = 1; /* first id wins, as in a string->id map built in order */
                break;
            }
            h = (h + 1) & t->vhash_mask;
        }
        if (!dup) {
            t->vhash[h] = id;
        }
    }
}

int32_t
tok__find_n(const tok_tokenizer_t *t, const char *s, size_t len)
{
    if (t->vhash == NULL || len == 0) {
        return -1;
    }
    uint32_t h = (uint32_t)hash_bytes(s, len) & t->vhash_mask;
    while (t->vhash[h] >= 0) {
        const tok_entry_t *o = &t->tokens[t->vhash[h]];
        if (o->len == len && memcmp(o->text, s, len) == 0) {
            return t->vhash[h];
        }
        h = (h + 1) & t->vhash_mask;
    }
    return -1;
}

static tok_merge_slot_t *
merge_slot(const tok_tokenizer_t *t, uint64_t key)
{
    uint32_t h = (uint32_t)hash_u64(key) & t->mhash_mask;

    while (t->mhash[h].key != UINT64_MAX && t->mhash[h].key != key) {
        h = (h + 1) & t->mhash_mask;
    }
    return &t->mhash[h];
}

static void
merge_grow(tok_tokenizer_t *t)
{
    tok_merge_slot_t *old = t->mhash;
    uint32_t old_cap = t->mhash ? t->mhash_mask + 1 : 0;
    uint32_t cap = old_cap ? old_cap * 2 : 1024;

    t->mhash = xmalloc(cap * sizeof(*t->mhash));
    for (uint32_t i = 0; i < cap; i++) {
        t->mhash[i].key = UINT64_MAX;
    }
    t->mhash_mask = cap - 1;
    for (uint32_t i = 0; i < old_cap; i++) {
        if (old[i].key != UINT64_MAX) {
            *merge_slot(t, old[i].key) = old[i];
        }
    }
    free(old);
}

int
tok__add_merge(tok_tokenizer_t *t, const char *a, size_t alen, const char *b, size_t blen,
               int32_t rank)
{
    int32_t ia = tok__find_n(t, a, alen);
    int32_t ib = tok__find_n(t, b, blen);
    int32_t ir;
    char stack[256];
    char *cat;

    if (ia < 0 || ib < 0) {
        return 0;
    }
    cat = alen + blen <= sizeof(stack) ? stack : xmalloc(alen + blen);
    memcpy(cat, a, alen);
    memcpy(cat + alen, b, blen);
    ir = tok__find_n(t, cat, alen + blen);
    if (cat != stack) {
        free(cat);
    }
    if (ir < 0) {
        return 0;
    }
    if (t->mhash == NULL || (uint64_t)(t->n_merges + 1) * 2 > (uint64_t)t->mhash_mask + 1) {
        merge_grow(t);
    }
    uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    tok_merge_slot_t *s = merge_slot(t, key);
    if (s->key == key) {
        return 0; /* an earlier (lower) rank wins */
    }
    s->key = key;
    s->rank = rank;
    s->result = ir;
    t->n_merges++;
    return 1;
}

static const tok_merge_slot_t *
merge_find(const tok_tokenizer_t *t, int32_t a, int32_t b)
{
    if (t->mhash == NULL || a < 0 || b < 0) {
        return NULL;
    }
    const tok_merge_slot_t *s = merge_slot(t, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b);
    return s->key == UINT64_MAX ? NULL : s;
}

int
tok__add_pre_regex(tok_tokenizer_t *t, const char *pattern, size_t len, int behavior, int invert,
                   char *err, size_t errlen)
{
    int ec;
    PCRE2_SIZE eoff;
    pcre2_code *re;

    if (t->n_pre >= TOK_MAX_PRE) {
        snprintf(err, errlen, "too many pre-tokenizer steps (max %d)", TOK_MAX_PRE);
        return ST_EFORMAT;
    }
    /* DOLLAR_ENDONLY: '$' means the end of the word as in Rust/Oniguruma
     * usage here and std::regex in llama.cpp, not "before a final \n". */
    re = pcre2_compile((PCRE2_SPTR)pattern, len,
                       PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_NO_UTF_CHECK, &ec,
                       &eoff, NULL);
    if (re == NULL) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof(msg));
        snprintf(err, errlen, "pre-tokenizer regex: %s at offset %zu", (char *)msg, (size_t)eoff);
        return ST_EFORMAT;
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional speed-up */
    t->pre[t->n_pre].re = re;
    t->pre[t->n_pre].behavior = behavior;
    t->pre[t->n_pre].invert = invert;
    t->n_pre++;
    return ST_OK;
}

/* Parses "<0xXX>" into its byte value, or -1. */
static int
parse_byte_token(const char *s, size_t n)
{
    int v = 0;

    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') {
        return -1;
    }
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') {
            v |= c - '0';
        } else if (c >= 'A' && c <= 'F') {
            v |= c - 'A' + 10;
        } else if (c >= 'a' && c <= 'f') {
            v |= c - 'a' + 10;
        } else {
            return -1;
        }
    }
    return v;
}

static int
cmp_added(const void *pa, const void *pb, void *arg)
{
    const tok_tokenizer_t *t = arg;
    const tok_entry_t *a = &t->tokens[*(const int32_t *)pa];
    const tok_entry_t *b = &t->tokens[*(const int32_t *)pb];

    if ((uint8_t)a->text[0] != (uint8_t)b->text[0]) {
        return (uint8_t)a->text[0] < (uint8_t)b->text[0] ? -1 : 1;
    }
    if (a->len != b->len) {
        return a->len > b->len ? -1 : 1; /* longest first */
    }
    return *(const int32_t *)pa < *(const int32_t *)pb ? -1 : 1;
}

/* The decoded bytes of one token (see the file comment). */
static void
build_piece(tok_tokenizer_t *t, tok_entry_t *e)
{
    sb_t b = {0};
    int byte;

    if (e->added || e->type == TOK_TYPE_CONTROL || e->type == TOK_TYPE_USER_DEFINED ||
        e->type == TOK_TYPE_UNKNOWN) {
        sb_add(&b, e->text, e->len);
    } else if (e->type == TOK_TYPE_BYTE && (byte = parse_byte_token(e->text, e->len)) >= 0) {
        char c = (char)byte;
        sb_add(&b, &c, 1);
    } else if (t->byte_level) {
        const uint8_t *s = (const uint8_t *)e->text;
        size_t i = 0;
        while (i < e->len) {
            uint32_t cp;
            int cl = utf8_decode(s + i, e->len - i, &cp);
            if (cl <= 0) {
                sb_add(&b, s + i, 1);
                i++;
                continue;
            }
            int found = cp < 0x144 ? t->cp_byte[cp] : -1;
            if (found >= 0) {
                char c = (char)found;
                sb_add(&b, &c, 1);
            } else {
                sb_add(&b, s + i, (size_t)cl);
            }
            i += (size_t)cl;
        }
    } else if (t->replace_space) {
        for (size_t i = 0; i < e->len; i++) {
            if (i + 3 <= e->len && memcmp(e->text + i, k_meta, 3) == 0) {
                sb_add(&b, " ", 1);
                i += 2;
            } else {
                sb_add(&b, e->text + i, 1);
            }
        }
    } else {
        sb_add(&b, e->text, e->len);
    }
    e->piece = b.p;
    e->piece_len = (uint32_t)b.n;
}

int
tok__finish(tok_tokenizer_t *t, char *err, size_t errlen)
{
    uint32_t counts[256] = {0};

    if (t->n_vocab <= 0) {
        snprintf(err, errlen, "empty vocabulary");
        return ST_EFORMAT;
    }
    if (t->vhash == NULL) {
        tok__build_vocab_hash(t);
    }

    /* Byte tokens: byte-level characters, or <0xXX> for byte fallback. */
    for (int b = 0; b < 256; b++) {
        if (t->byte_level) {
            char u[4];
            int n = utf8_encode(t->byte_cp[b], u);
            t->byte_ids[b] = tok__find_n(t, u, (size_t)n);
        } else {
            char name[8];
            snprintf(name, sizeof(name), "<0x%02X>", b);
            t->byte_ids[b] = tok__find_n(t, name, 6);
            if (t->byte_ids[b] >= 0 && t->tokens[t->byte_ids[b]].type == TOK_TYPE_NORMAL &&
                t->byte_fallback) {
                t->tokens[t->byte_ids[b]].type = TOK_TYPE_BYTE;
            }
        }
    }

    /* Added tokens, bucketed by first byte, longest first. */
    t->n_added = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (t->tokens[id].added && t->tokens[id].len > 0) {
            t->n_added++;
        }
    }
    free(t->added_ids);
    t->added_ids = xmalloc((t->n_added ? t->n_added : 1) * sizeof(int32_t));
    t->n_added = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (t->tokens[id].added && t->tokens[id].len > 0) {
            t->added_ids[t->n_added++] = id;
            counts[(uint8_t)t->tokens[id].text[0]]++;
        }
    }
    qsort_r(t->added_ids, t->n_added, sizeof(int32_t), cmp_added, t);
    t->added_start[0] = 0;
    for (int c = 0; c < 256; c++) {
        t->added_start[c + 1] = t->added_start[c] + counts[c];
    }

    for (int32_t id = 0; id < t->n_vocab; id++) {
        build_piece(t, &t->tokens[id]);
    }

    /* SentencePiece texts may be cut into words before each "▁" that
     * follows another character when no model token has such a "▁"
     * (added tokens are split out before and do not count). */
    t->meta_split = t->replace_space && t->n_pre == 0;
    for (int32_t id = 0; id < t->n_vocab && t->meta_split; id++) {
        const tok_entry_t *e = &t->tokens[id];
        int seen_other = 0;
        if (e->added) {
            continue;
        }
        for (uint32_t i = 0; i < e->len;) {
            if (i + 3 <= e->len && memcmp(e->text + i, k_meta, 3) == 0) {
                if (seen_other) {
                    t->meta_split = 0;
                    break;
                }
                i += 3;
            } else {
                seen_other = 1;
                i++;
            }
        }
    }
    return ST_OK;
}

void
tok_destroy(tok_tokenizer_t *t)
{
    if (t == NULL) {
        return;
    }
    for (int32_t i = 0; i < t->n_vocab; i++) {
        free(t->tokens[i].text);
        free(t->tokens[i].piece);
    }
    free(t->tokens);
    for (int i = 0; i < t->n_pre; i++) {
        pcre2_code_free(t->pre[i].re);
    }
    free(t->vhash);
    free(t->mhash);
    free(t->added_ids);
    free(t);
}

/* ------------------------------------------------------------------ */
/* Accessors                                                           */

int32_t
tok_vocab_size(const tok_tokenizer_t *t)
{
    return t->n_vocab;
}

int32_t
tok_bos_id(const tok_tokenizer_t *t)
{
    return t->bos;
}

int32_t
tok_eos_id(const tok_tokenizer_t *t)
{
    return t->eos;
}

const char *
tok_token_str(const tok_tokenizer_t *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab) {
        return NULL;
    }
    return t->tokens[id].text;
}

int
tok_is_special(const tok_tokenizer_t *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab) {
        return 0;
    }
    return t->tokens[id].special;
}

const char *
tok_token_bytes(const tok_tokenizer_t *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab) {
        *len = 0;
        return NULL;
    }
    *len = t->tokens[id].piece_len;
    return t->tokens[id].piece != NULL ? t->tokens[id].piece : "";
}

void
tok_output_bytes(const tok_tokenizer_t *t, const char **bytes, uint32_t *lens)
{
    for (int32_t i = 0; i < t->n_vocab; i++) {
        int type = tok_token_gguf_type(t, i);
        size_t len = 0;

        bytes[i] = NULL;
        lens[i] = 0;
        if (tok_is_special(t, i) || type == 2 /* UNKNOWN */ || type == 3 /* CONTROL */) {
            continue;
        }
        bytes[i] = tok_token_bytes(t, i, &len);
        lens[i] = (uint32_t)len;
    }
}

int32_t
tok_find(const tok_tokenizer_t *t, const char *s)
{
    return tok__find_n(t, s, strlen(s));
}

/* ------------------------------------------------------------------ */
/* Encoder                                                             */

typedef struct sym {
    int32_t id;     /* -1: not in the vocabulary */
    uint32_t start; /* byte offset in the word */
    uint32_t len;   /* 0: merged away */
    int32_t prev, next;
} sym_t;

typedef struct cand {
    double prio;  /* lower merges first */
    int32_t left; /* symbol index; ties go to the leftmost */
    int32_t right;
    uint32_t len; /* left.len + right.len when queued */
    int32_t id;   /* the merged token */
} cand_t;

typedef struct span {
    uint32_t off, len;
} span_t;

typedef struct enc {
    const tok_tokenizer_t *t;
    int32_t *ids;
    size_t n_ids, cap_ids;
    sym_t *sym;
    size_t cap_sym;
    cand_t *heap;
    size_t n_heap, cap_heap;
    span_t *sp[2];
    size_t n_sp[2], cap_sp[2];
    sb_t buf;          /* normalized segment */
    sb_t san;          /* sanitized copy for the regexes when buf is not valid UTF-8 */
    uint32_t *san_map; /* san offset -> buf offset */
    size_t cap_map;
    sb_t word; /* byte-level spelling of a word (ignore_merges lookup) */
    pcre2_match_data *md;
    pcre2_general_context *gc; /* PCRE2's allocations through xmalloc_try */
    struct wcache *cache;      /* long inputs only: ids of recently seen words */
    int oom;                   /* an allocation failed: the result is void */
} enc_t;

/* Direct-mapped cache of word -> ids, used for long inputs where words
 * repeat; a slot is simply replaced on collision. */
#define WCACHE_SLOTS 4096
#define WCACHE_MAX_WORD 64

typedef struct wcache {
    uint64_t h;
    char *word; /* NULL: empty slot */
    uint32_t len;
    int32_t *ids;
    uint32_t n;
} wcache_t;

static void
wcache_free(wcache_t *c)
{
    if (c == NULL) {
        return;
    }
    for (size_t i = 0; i < WCACHE_SLOTS; i++) {
        free(c[i].word);
        free(c[i].ids);
    }
    free(c);
}

/* Grows *p to hold cap items of size bytes; 0 with e->oom set when out of
 * memory (*p unchanged). */
static int
enc_grow(enc_t *e, void **p, size_t cap, size_t size)
{
    void *q = cap > (size_t)-1 / size ? NULL : xrealloc_try(*p, cap * size);

    if (q == NULL) {
        e->oom = 1;
        return 0;
    }
    *p = q;
    return 1;
}

static void
enc_push(enc_t *e, int32_t id)
{
    if (e->n_ids == e->cap_ids) {
        size_t cap = e->cap_ids ? e->cap_ids * 2 : 64;
        if (!enc_grow(e, (void **)&e->ids, cap, sizeof(int32_t))) {
            return;
        }
        e->cap_ids = cap;
    }
    e->ids[e->n_ids++] = id;
}

static int
cand_less(const cand_t *a, const cand_t *b)
{
    if (a->prio != b->prio) {
        return a->prio < b->prio;
    }
    return a->left < b->left;
}

static void
heap_push(enc_t *e, cand_t c)
{
    size_t i;

    if (e->n_heap == e->cap_heap) {
        size_t cap = e->cap_heap ? e->cap_heap * 2 : 64;
        if (!enc_grow(e, (void **)&e->heap, cap, sizeof(cand_t))) {
            return;
        }
        e->cap_heap = cap;
    }
    i = e->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &e->heap[p])) {
            break;
        }
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = c;
}

static cand_t
heap_pop(enc_t *e)
{
    cand_t top = e->heap[0];
    cand_t last = e->heap[--e->n_heap];
    size_t i = 0, n = e->n_heap;

    while (n > 0) {
        size_t l = 2 * i + 1, m = i;
        const cand_t *best = &last;
        if (l < n && cand_less(&e->heap[l], best)) {
            m = l;
            best = &e->heap[l];
        }
        if (l + 1 < n && cand_less(&e->heap[l + 1], best)) {
            m = l + 1;
        }
        if (m == i) {
            break;
        }
        e->heap[i] = e->heap[m];
        i = m;
    }
    if (n > 0) {
        e->heap[i] = last;
    }
    return top;
}

/* Queues the pair (l, r) if the vocabulary can merge it. */
static void
try_pair(enc_t *e, const char *w, int32_t l, int32_t r)
{
    const tok_tokenizer_t *t = e->t;
    const sym_t *a, *b;
    cand_t c;

    if (l < 0 || r < 0) {
        return;
    }
    a = &e->sym[l];
    b = &e->sym[r];
    if (t->algo == TOK_ALGO_SPM) {
        int32_t id = tok__find_n(t, w + a->start, (size_t)a->len + b->len);
        if (id < 0) {
            return;
        }
        c.prio = -(double)t->tokens[id].score;
        c.id = id;
    } else {
        const tok_merge_slot_t *m = merge_find(t, a->id, b->id);
        if (m == NULL) {
            return;
        }
        c.prio = m->rank;
        c.id = m->result;
    }
    c.left = l;
    c.right = r;
    c.len = a->len + b->len;
    heap_push(e, c);
}

static void
push_unk(enc_t *e, int *last_unk)
{
    const tok_tokenizer_t *t = e->t;

    if (t->unk < 0) {
        return;
    }
    if (t->fuse_unk && *last_unk) {
        return;
    }
    enc_push(e, t->unk);
    *last_unk = 1;
}

static void enc_word_uncached(enc_t *e, const char *w, size_t n);

/* Encodes one pre-tokenized word w[0..n). */
static void
enc_word(enc_t *e, const char *w, size_t n)
{

    if (n == 0 || e->oom) {
        return;
    }
    wcache_t *slot = NULL;
    size_t first_id = e->n_ids;
    if (e->cache != NULL && n <= WCACHE_MAX_WORD) {
        uint64_t h = hash_bytes(w, n);
        slot = &e->cache[h & (WCACHE_SLOTS - 1)];
        if (slot->word != NULL && slot->h == h && slot->len == n && memcmp(slot->word, w, n) == 0) {
            for (uint32_t i = 0; i < slot->n; i++) {
                enc_push(e, slot->ids[i]);
            }
            return;
        }
        free(slot->word);
        free(slot->ids);
        slot->word = NULL;
        slot->ids = NULL;
        slot->h = h;
    }
    enc_word_uncached(e, w, n);
    if (slot != NULL && !e->oom) {
        uint32_t k = (uint32_t)(e->n_ids - first_id);
        char *word = xstrndup_try(w, n);
        int32_t *ids = word != NULL ? xcalloc_try(k ? k : 1, sizeof(int32_t)) : NULL;
        if (ids == NULL) {
            free(word);
            e->oom = 1;
            return;
        }
        memcpy(ids, e->ids + first_id, k * sizeof(int32_t));
        slot->word = word;
        slot->len = (uint32_t)n;
        slot->n = k;
        slot->ids = ids;
    }
}

/* Encodes one word without the cache. */
static void
enc_word_uncached(enc_t *e, const char *w, size_t n)
{
    const tok_tokenizer_t *t = e->t;
    const uint8_t *u = (const uint8_t *)w;
    int32_t n_sym = 0;
    int last_unk = 0;

    if (t->ignore_merges) {
        int32_t id;
        if (t->byte_level) {
            e->word.n = 0;
            for (size_t i = 0; i < n; i++) {
                char tmp[4];
                int k = utf8_encode(t->byte_cp[u[i]], tmp);
                sb_add(&e->word, tmp, (size_t)k);
            }
            if (e->word.oom) {
                e->oom = 1;
                return;
            }
            id = tok__find_n(t, e->word.p, e->word.n);
        } else {
            id = tok__find_n(t, w, n);
        }
        if (id >= 0) {
            enc_push(e, id);
            return;
        }
    }

    if (n > e->cap_sym) {
        if (!enc_grow(e, (void **)&e->sym, n + 16, sizeof(sym_t))) {
            return;
        }
        e->cap_sym = n + 16;
    }

    /* Initial symbols. */
    for (size_t i = 0; i < n;) {
        size_t cl;
        int32_t id;
        if (t->byte_level) {
            cl = 1;
            id = t->byte_ids[u[i]];
        } else {
            int k = utf8_decode(u + i, n - i, NULL);
            cl = k > 0 ? (size_t)k : 1;
            id = tok__find_n(t, w + i, cl);
            if (id < 0 && t->algo == TOK_ALGO_BPE && t->byte_fallback) {
                int all = 1;
                for (size_t j = 0; j < cl; j++) {
                    all &= t->byte_ids[u[i + j]] >= 0;
                }
                if (all) {
                    for (size_t j = 0; j < cl; j++) {
                        e->sym[n_sym] = (sym_t){t->byte_ids[u[i + j]], (uint32_t)(i + j), 1,
                                                n_sym - 1, n_sym + 1};
                        n_sym++;
                    }
                    i += cl;
                    continue;
                }
            }
        }
        e->sym[n_sym] = (sym_t){id, (uint32_t)i, (uint32_t)cl, n_sym - 1, n_sym + 1};
        n_sym++;
        i += cl;
    }
    e->sym[n_sym - 1].next = -1;

    /* Merge loop. */
    e->n_heap = 0;
    for (int32_t i = 0; i + 1 < n_sym; i++) {
        try_pair(e, w, i, i + 1);
    }
    while (e->n_heap > 0) {
        cand_t c = heap_pop(e);
        sym_t *l = &e->sym[c.left];
        sym_t *r = &e->sym[c.right];
        if (l->len == 0 || l->next != c.right || l->len + r->len != c.len) {
            continue; /* stale */
        }
        l->id = c.id;
        l->len += r->len;
        l->next = r->next;
        if (r->next >= 0) {
            e->sym[r->next].prev = c.left;
        }
        r->len = 0;
        try_pair(e, w, l->prev, c.left);
        try_pair(e, w, c.left, l->next);
    }

    /* Emit. */
    for (int32_t i = 0; i >= 0; i = e->sym[i].next) {
        const sym_t *s = &e->sym[i];
        if (s->id >= 0) {
            enc_push(e, s->id);
            last_unk = 0;
            continue;
        }
        if (t->algo == TOK_ALGO_SPM) {
            for (uint32_t j = 0; j < s->len; j++) {
                int32_t b = t->byte_ids[u[s->start + j]];
                if (b >= 0) {
                    enc_push(e, b);
                    last_unk = 0;
                } else {
                    push_unk(e, &last_unk);
                }
            }
        } else {
            push_unk(e, &last_unk);
        }
    }
}

static void
spans_add(enc_t *e, int which, uint32_t off, uint32_t len)
{
    if (len == 0) {
        return;
    }
    if (e->n_sp[which] == e->cap_sp[which]) {
        size_t cap = e->cap_sp[which] ? e->cap_sp[which] * 2 : 64;
        if (!enc_grow(e, (void **)&e->sp[which], cap, sizeof(span_t))) {
            return;
        }
        e->cap_sp[which] = cap;
    }
    e->sp[which][e->n_sp[which]++] = (span_t){off, len};
}

/* Splits every span of sp[src] with pre-tokenizer p into sp[!src]. The
 * subject of each match is the span alone, so anchors and look-arounds do
 * not see past it (as in llama.cpp and the HF tokenizers). */
static void
pre_split(enc_t *e, const tok_pre_t *p, const char *subj_all, int src)
{
    int dst = !src;

    e->n_sp[dst] = 0;
    for (size_t k = 0; k < e->n_sp[src]; k++) {
        span_t s = e->sp[src][k];
        const char *subj = subj_all + s.off;
        size_t pos = 0, gap = 0;
        /* Pending output piece for the merge behaviours. */
        uint32_t pend_off = 0, pend_len = 0;
        int pend_match = 0;

        for (;;) {
            size_t ms, me;
            int rc = pos < s.len ? pcre2_match(p->re, (PCRE2_SPTR)subj, s.len, pos,
                                               PCRE2_NO_UTF_CHECK, e->md, NULL)
                                 : PCRE2_ERROR_NOMATCH;
            if (rc == PCRE2_ERROR_NOMEMORY) {
                e->oom = 1;
                return;
            }
            if (rc >= 0) {
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
                ms = ov[0];
                me = ov[1];
                if (me <= ms) {
                    /* Empty match: step over one character and retry. */
                    int cl = utf8_decode((const uint8_t *)subj + pos, s.len - pos, NULL);
                    pos += cl > 0 ? (size_t)cl : 1;
                    continue;
                }
            } else {
                ms = me = s.len;
            }
            /* Two pieces: the gap [gap, ms) and the match [ms, me). */
            for (int part = 0; part < 2; part++) {
                size_t a = part == 0 ? gap : ms, b = part == 0 ? ms : me;
                int is_match = (part == 1) != (p->invert != 0);
                if (b <= a) {
                    continue;
                }
                uint32_t off = s.off + (uint32_t)a, len = (uint32_t)(b - a);
                switch (p->behavior) {
                case TOK_SPLIT_REMOVED:
                    if (!is_match) {
                        spans_add(e, dst, off, len);
                    }
                    break;
                case TOK_SPLIT_MERGED_PREV:
                    if (is_match && pend_len > 0) {
                        pend_len += len;
                    } else {
                        spans_add(e, dst, pend_off, pend_len);
                        pend_off = off;
                        pend_len = len;
                    }
                    break;
                case TOK_SPLIT_MERGED_NEXT:
                    if (pend_len > 0 && pend_match) {
                        pend_len += len;
                    } else {
                        spans_add(e, dst, pend_off, pend_len);
                        pend_off = off;
                        pend_len = len;
                    }
                    pend_match = is_match;
                    break;
                case TOK_SPLIT_CONTIGUOUS:
                    if (pend_len > 0 && pend_match && is_match) {
                        pend_len += len;
                    } else {
                        spans_add(e, dst, pend_off, pend_len);
                        pend_off = off;
                        pend_len = len;
                    }
                    pend_match = is_match;
                    break;
                default:
                    spans_add(e, dst, off, len);
                    break;
                }
            }
            if (rc < 0) {
                break;
            }
            pos = gap = me;
        }
        spans_add(e, dst, pend_off, pend_len);
    }
}

/* Normalizes, pre-tokenizes and encodes one text segment s[0..n). */
static void
enc_segment(enc_t *e, const char *s, size_t n, int add_prefix)
{
    const tok_tokenizer_t *t = e->t;
    const char *subj;
    int src = 0;
    char *nfc = NULL;
    size_t nfc_len;

    if (t->nfc && (nfc = tok__nfc(s, n, &nfc_len)) != NULL) {
        s = nfc;
        n = nfc_len;
    } else if (t->nfc && nfc_len == TOK_NFC_OOM) {
        e->oom = 1;
    }
    if (e->oom) {
        free(nfc);
        return;
    }
    e->buf.n = 0;
    if (!sb_reserve(&e->buf, n + 8)) {
        free(nfc);
        e->oom = 1;
        return;
    }
    if (add_prefix && !(t->prefix_if_absent && s[0] == ' ')) {
        sb_add(&e->buf, k_meta, 3);
    }
    if (t->bl_prefix_space && s[0] != ' ') {
        sb_add(&e->buf, " ", 1);
    }
    if (t->replace_space) {
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') {
                sb_add(&e->buf, k_meta, 3);
            } else if (sb_reserve(&e->buf, 1)) {
                e->buf.p[e->buf.n++] = s[i];
            }
        }
        e->buf.p[e->buf.n] = '\0';
    } else {
        sb_add(&e->buf, s, n);
    }
    free(nfc); /* s is not used past this point */
    if (e->buf.oom) {
        e->oom = 1;
        return;
    }

    if (t->n_pre == 0) {
        if (!t->meta_split) {
            enc_word(e, e->buf.p, e->buf.n);
            return;
        }
        /* No token has a "▁" after another character, so no token spans a
         * "▁" that follows a non-"▁" character: words end there. */
        const uint8_t *u = (const uint8_t *)e->buf.p;
        size_t start = 0, i = 0;
        int prev_meta = 1;
        while (i < e->buf.n) {
            int is_meta = i + 3 <= e->buf.n && memcmp(u + i, k_meta, 3) == 0;
            if (is_meta && !prev_meta) {
                enc_word(e, e->buf.p + start, i - start);
                start = i;
            }
            prev_meta = is_meta;
            int cl = utf8_decode(u + i, e->buf.n - i, NULL);
            i += cl > 0 ? (size_t)cl : 1;
        }
        enc_word(e, e->buf.p + start, e->buf.n - start);
        return;
    }

    /* The regexes see valid UTF-8: invalid bytes become U+FFFD, with a map
     * back to the original offsets. */
    subj = e->buf.p;
    int valid = utf8_valid(e->buf.p, e->buf.n);
    if (!valid) {
        const uint8_t *u = (const uint8_t *)e->buf.p;
        e->san.n = 0;
        if (e->cap_map < e->buf.n * 3 + 1) {
            if (!enc_grow(e, (void **)&e->san_map, e->buf.n * 3 + 1, sizeof(uint32_t))) {
                return;
            }
            e->cap_map = e->buf.n * 3 + 1;
        }
        for (size_t i = 0; i < e->buf.n;) {
            int cl = utf8_decode(u + i, e->buf.n - i, NULL);
            size_t at = e->san.n;
            if (cl > 0) {
                sb_add(&e->san, u + i, (size_t)cl);
            } else {
                sb_add(&e->san, k_fffd, 3);
                cl = 1;
            }
            for (size_t j = at; j < e->san.n; j++) {
                e->san_map[j] = (uint32_t)i;
            }
            i += (size_t)cl;
        }
        if (e->san.oom) {
            e->oom = 1;
            return;
        }
        e->san_map[e->san.n] = (uint32_t)e->buf.n;
        subj = e->san.p;
    }

    e->n_sp[0] = 0;
    spans_add(e, 0, 0, (uint32_t)(valid ? e->buf.n : e->san.n));
    for (int i = 0; i < t->n_pre; i++) {
        pre_split(e, &t->pre[i], subj, src);
        src = !src;
    }
    if (e->oom) {
        return;
    }
    for (size_t k = 0; k < e->n_sp[src]; k++) {
        span_t sp = e->sp[src][k];
        if (!valid) {
            uint32_t a = e->san_map[sp.off], b = e->san_map[sp.off + sp.len];
            sp.off = a;
            sp.len = b - a;
        }
        enc_word(e, e->buf.p + sp.off, sp.len);
    }
}

/* The longest added token matching at text[i..n), or -1. */
static int32_t
match_added(const tok_tokenizer_t *t, const char *text, size_t i, size_t n, int parse_special)
{
    uint8_t c = (uint8_t)text[i];

    for (uint32_t k = t->added_start[c]; k < t->added_start[c + 1]; k++) {
        int32_t id = t->added_ids[k];
        const tok_entry_t *e = &t->tokens[id];
        if (e->special && !parse_special) {
            continue;
        }
        if (e->len <= n - i && memcmp(text + i, e->text, e->len) == 0) {
            return id;
        }
    }
    return -1;
}

static void *
pcre_malloc(PCRE2_SIZE n, void *data)
{
    (void)data;
    return xmalloc_try(n);
}

static void
pcre_free(void *p, void *data)
{
    (void)data;
    free(p);
}

int
tok_encode(const tok_tokenizer_t *t, const char *text, size_t len, int flags, int32_t **ids,
           size_t *n_ids)
{
    enc_t e = {0};
    size_t seg = 0, i = 0;
    int prev_token = 1;
    int parse_special = (flags & TOK_PARSE_SPECIAL) != 0;

    if (text == NULL && len > 0) {
        return ST_EINVAL;
    }
    e.t = t;
    e.buf.fallible = e.san.fallible = e.word.fallible = 1;
    if (t->n_pre > 0) {
        /* Enough ovector pairs for any of the patterns; PCRE2 allocates
         * the match data and its backtracking frames through xmalloc_try. */
        e.gc = pcre2_general_context_create(pcre_malloc, pcre_free, NULL);
        e.md = e.gc != NULL ? pcre2_match_data_create(32, e.gc) : NULL;
        e.oom |= e.md == NULL;
    }
    if (len >= 4096 && !e.oom) {
        e.cache = xcalloc_try(WCACHE_SLOTS, sizeof(wcache_t));
        e.oom |= e.cache == NULL;
    }
    if (flags & TOK_ADD_SPECIAL) {
        for (int k = 0; k < t->n_prefix_ids; k++) {
            enc_push(&e, t->prefix_ids[k]);
        }
    }

    /* Split on added tokens, leftmost-longest. */
    while (seg < len || i < len) {
        int32_t id = -1;
        size_t seg_end = i;
        if (i < len && t->added_start[(uint8_t)text[i] + 1] > t->added_start[(uint8_t)text[i]]) {
            id = match_added(t, text, i, len, parse_special);
        }
        if (id < 0 && i < len) {
            i++;
            continue;
        }
        /* Flush the text segment [seg, seg_end), honouring lstrip. */
        if (id >= 0 && t->tokens[id].lstrip) {
            while (seg_end > seg && is_ascii_space((uint8_t)text[seg_end - 1])) {
                seg_end--;
            }
        }
        if (seg_end > seg) {
            int add_prefix = 0;
            if (t->prefix == TOK_PREFIX_EVERY_SEGMENT) {
                add_prefix = 1;
            } else if (t->prefix == TOK_PREFIX_AFTER_SPECIAL) {
                add_prefix = prev_token;
            } else if (t->prefix == TOK_PREFIX_FIRST_SEGMENT) {
                add_prefix = seg == 0;
            }
            enc_segment(&e, text + seg, seg_end - seg, add_prefix);
            prev_token = 0;
        }
        if (id < 0) {
            break; /* end of text */
        }
        enc_push(&e, id);
        prev_token = 1;
        i += t->tokens[id].len;
        if (t->tokens[id].rstrip) {
            while (i < len && is_ascii_space((uint8_t)text[i])) {
                i++;
            }
        }
        seg = i;
    }

    if (flags & TOK_ADD_SPECIAL) {
        for (int k = 0; k < t->n_suffix_ids; k++) {
            enc_push(&e, t->suffix_ids[k]);
        }
    }

    if (e.md != NULL) {
        pcre2_match_data_free(e.md);
    }
    if (e.gc != NULL) {
        pcre2_general_context_free(e.gc);
    }
    free(e.sym);
    free(e.heap);
    free(e.sp[0]);
    free(e.sp[1]);
    free(e.buf.p);
    free(e.san.p);
    free(e.san_map);
    free(e.word.p);
    wcache_free(e.cache);
    if (e.ids == NULL && !e.oom) {
        e.ids = xmalloc_try(sizeof(int32_t));
        e.oom |= e.ids == NULL;
    }
    if (e.oom || e.buf.oom || e.san.oom || e.word.oom) {
        free(e.ids);
        return ST_ENOMEM;
    }
    *ids = e.ids;
    *n_ids = e.n_ids;
    return ST_OK;
}

/* ------------------------------------------------------------------ */
/* Decoder                                                             */

/* Feeds bytes through the UTF-8 scanner: complete characters go to out,
 * each maximal ill-formed subsequence becomes one U+FFFD, and a valid but
 * unfinished tail stays in pend (at most 3 bytes). */
static void
utf8_feed(uint8_t *pend, size_t *n_pend, const uint8_t *in, size_t n, sb_t *out)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t b = in[i];
        if (*n_pend > 0) {
            if (utf8_cont_ok(pend[0], (int)*n_pend, b)) {
                pend[(*n_pend)++] = b;
                if ((int)*n_pend == utf8_lead_len(pend[0])) {
                    sb_add(out, pend, *n_pend);
                    *n_pend = 0;
                }
                continue;
            }
            sb_add(out, k_fffd, 3);
            *n_pend = 0;
            /* b starts afresh below. */
        }
        int need = utf8_lead_len(b);
        if (need == 1) {
            if (!sb_reserve(out, 1)) {
                return;
            }
            out->p[out->n++] = (char)b;
            out->p[out->n] = '\0';
        } else if (need == 0) {
            sb_add(out, k_fffd, 3);
        } else {
            pend[0] = b;
            *n_pend = 1;
        }
    }
}

static void
stream_piece(tok_stream_t *s, const tok_entry_t *e, sb_t *out)
{
    const uint8_t *p = (const uint8_t *)e->piece;
    size_t n = e->piece_len;

    if (n == 0) {
        return;
    }
    if (s->at_start) {
        s->at_start = 0;
        if (p[0] == ' ') {
            p++;
            n--;
        }
    }
    utf8_feed((uint8_t *)s->pending, &s->n_pending, p, n, out);
}

void
tok_stream_init(tok_stream_t *s, const tok_tokenizer_t *t, int skip_special)
{
    memset(s, 0, sizeof(*s));
    s->tok = t;
    s->skip_special = skip_special;
    s->at_start = t->strip_lead;
}

static int
stream_out(const sb_t *b, char *out, size_t cap)
{
    if (b->n + 1 > cap) {
        return ST_ERANGE;
    }
    if (b->n > 0) {
        memcpy(out, b->p, b->n);
    }
    out[b->n] = '\0';
    return (int)b->n;
}

int
tok_stream_push(tok_stream_t *s, int32_t id, char *out, size_t cap)
{
    const tok_tokenizer_t *t = s->tok;
    tok_stream_t saved = *s;
    sb_t b = {0};
    int rc;

    if (id < 0 || id >= t->n_vocab) {
        return ST_EINVAL;
    }
    b.fallible = 1;
    s->n_pushed++;
    if (!(s->skip_special && t->tokens[id].special)) {
        stream_piece(s, &t->tokens[id], &b);
    }
    rc = b.oom ? ST_ENOMEM : stream_out(&b, out, cap);
    if (rc < 0) {
        *s = saved; /* nothing consumed: the caller may retry with more room */
    }
    free(b.p);
    return rc;
}

int
tok_stream_flush(tok_stream_t *s, char *out, size_t cap)
{
    if (s->n_pending > 0) {
        if (cap < 4) {
            return ST_ERANGE;
        }
        memcpy(out, k_fffd, 3);
        out[3] = '\0';
        s->n_pending = 0;
        return 3;
    }
    if (cap < 1) {
        return ST_ERANGE;
    }
    out[0] = '\0';
    return 0;
}

int
tok_decode(const tok_tokenizer_t *t, const int32_t *ids, size_t n, int skip_special, char **text,
           size_t *len)
{
    tok_stream_t s;
    sb_t b = {0};

    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) {
            return ST_EINVAL;
        }
    }
    tok_stream_init(&s, t, skip_special);
    b.fallible = 1;
    sb_reserve(&b, 16);
    for (size_t i = 0; i < n && !b.oom; i++) {
        if (!(skip_special && t->tokens[ids[i]].special)) {
            stream_piece(&s, &t->tokens[ids[i]], &b);
        }
    }
    if (s.n_pending > 0) {
        sb_add(&b, k_fffd, 3);
    }
    if (b.oom) {
        free(b.p);
        return ST_ENOMEM;
    }
    b.p[b.n] = '\0';
    *text = b.p;
    *len = b.n;
    return ST_OK;
}
