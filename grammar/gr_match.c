/* gr_match.c - the vocabulary trie, the grammar's node pool and mask
 * cache, and the per-sequence matcher (see grammar.h DESIGN).
 *
 * DESIGN
 *   A stack is a chain of nodes (pos, parent): pos is where to continue in
 *   the program (for the top node always a byte class), parent the node
 *   to return to when the alternative ends (GR_NONE: the root's caller).
 *   Nodes are hash-consed, so a stack is one id and a state (a set of
 *   stacks) a sorted array of ids. Node 0 is ACC: the empty stack, present
 *   exactly when the bytes so far form a complete sentence.
 *
 *   expand(pos, parent) produces the tops reachable from pos without
 *   reading a byte: a class is a top; a rule reference expands each of
 *   the rule's alternatives with the continuation (pos + 1, parent)
 *   pushed, or with parent itself when pos + 1 ends the alternative (a
 *   tail call: right recursion runs in constant depth); an alternative's
 *   end returns to the parent. Left recursion is refused by the compiler,
 *   so expansion terminates; its depth and work are still capped.
 *
 *   advance(state, byte) takes every top whose class holds byte and
 *   expands the position after it. States are interned and advance is
 *   memoized per (state id, byte) (step()), so the mask walk, which keeps
 *   the state id of each trie depth (a node's parent state is always the
 *   last one at depth d - 1, the trie being walked in preorder), costs one
 *   table lookup per visited node once the transitions are known, and
 *   skips a child at once when no top's class holds its byte.
 *
 *   Masks are cached per state id; the cache is cleared when it outgrows
 *   GR_CACHE_BYTES. States, nodes and memo entries live as long as the
 *   grammar (one request), bounded by GR_MAX_STATES and GR_MAX_NODES.
 *
 * Thread: see grammar.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "grammar/gr_int.h"
#include "grammar/grammar.h"

#define GR_NONE UINT32_MAX
#define GR_ACC 0u
#define GR_MAX_DEPTH 2048     /* expansion recursion */
#define GR_MAX_SET (1 << 14)  /* stacks in one state */
#define GR_MAX_WORK (1 << 20) /* expansion steps per advance */
#define GR_CACHE_BYTES (64u << 20)
#define GR_MAX_NODES (1u << 24)

/* ---- vocabulary ------------------------------------------------------------- */

struct gr_vocab {
    int32_t n;
    int32_t words;
    char **bytes;
    uint32_t *lens;
    int32_t *eos;
    int32_t n_eos;
    /* trie in preorder; node 0 is the root (depth 0, no byte) */
    int32_t n_nodes;
    uint8_t *byte;
    int32_t *depth;
    int32_t *skip;      /* first node after the subtree */
    int32_t *tok_start; /* [n_nodes + 1] into tok_ids */
    int32_t *tok_ids;
    int32_t max_depth;
};

static const gr_vocab_t *sort_vocab; /* qsort has no context argument */

static int
tok_cmp(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = sort_vocab->lens[x], ly = sort_vocab->lens[y];
    int c = memcmp(sort_vocab->bytes[x], sort_vocab->bytes[y], lx < ly ? lx : ly);
    if (c != 0) {
        return c;
    }
    if (lx != ly) {
        return lx < ly ? -1 : 1;
    }
    return x < y ? -1 : x > y;
}

int
gr_vocab_create(int32_t n, const char *const *bytes, const uint32_t *lens, const int32_t *eos_ids,
                int32_t n_eos, gr_vocab_t **out)
{
    if (n <= 0 || bytes == NULL || lens == NULL || n_eos < 0 || out == NULL) {
        return ST_EINVAL;
    }
    gr_vocab_t *v = xcalloc(1, sizeof(*v));
    v->n = n;
    v->words = (n + 31) / 32;
    v->bytes = xcalloc((size_t)n, sizeof(char *));
    v->lens = xcalloc((size_t)n, sizeof(uint32_t));
    v->eos = xmalloc((size_t)(n_eos > 0 ? n_eos : 1) * sizeof(int32_t));
    for (int32_t k = 0; k < n_eos; k++) {
        if (eos_ids[k] >= 0 && eos_ids[k] < n) {
            v->eos[v->n_eos++] = eos_ids[k];
        }
    }
    int32_t *order = xmalloc((size_t)n * sizeof(int32_t));
    int32_t n_real = 0;
    size_t total = 1;
    for (int32_t i = 0; i < n; i++) {
        int is_eos = 0;
        for (int32_t k = 0; k < v->n_eos; k++) {
            is_eos |= v->eos[k] == i;
        }
        if (lens[i] == 0 || bytes[i] == NULL || is_eos) {
            continue;
        }
        v->lens[i] = lens[i];
        v->bytes[i] = xmalloc(lens[i]);
        memcpy(v->bytes[i], bytes[i], lens[i]);
        order[n_real++] = i;
        total += lens[i];
    }
    sort_vocab = v;
    qsort(order, (size_t)n_real, sizeof(int32_t), tok_cmp);
    sort_vocab = NULL;

    v->byte = xmalloc(total);
    v->depth = xmalloc(total * sizeof(int32_t));
    v->skip = xmalloc(total * sizeof(int32_t));
    v->tok_start = xmalloc((total + 1) * sizeof(int32_t));
    v->tok_ids = xmalloc((size_t)(n_real > 0 ? n_real : 1) * sizeof(int32_t));
    int32_t max_len = 1;
    for (int32_t i = 0; i < n_real; i++) {
        if ((int32_t)v->lens[order[i]] > max_len) {
            max_len = (int32_t)v->lens[order[i]];
        }
    }
    int32_t *path = xmalloc((size_t)(max_len + 1) * sizeof(int32_t));
    int32_t *open = xmalloc((size_t)(max_len + 2) * sizeof(int32_t));
    int32_t n_open = 0;
    int32_t nn = 1, nt = 0;
    v->byte[0] = 0;
    v->depth[0] = 0;
    v->tok_start[0] = 0;
    path[0] = 0;
    open[n_open++] = 0;
    int32_t prev = -1;
    for (int32_t i = 0; i < n_real; i++) {
        int32_t t = order[i];
        uint32_t len = v->lens[t];
        uint32_t lcp = 0;
        if (prev >= 0) {
            uint32_t pl = v->lens[prev];
            while (lcp < len && lcp < pl && v->bytes[t][lcp] == v->bytes[prev][lcp]) {
                lcp++;
            }
        }
        for (uint32_t d = lcp + 1; d <= len; d++) {
            while (n_open > 0 && v->depth[open[n_open - 1]] >= (int32_t)d) {
                v->skip[open[--n_open]] = nn;
            }
            v->byte[nn] = (uint8_t)v->bytes[t][d - 1];
            v->depth[nn] = (int32_t)d;
            v->tok_start[nn] = nt;
            path[d] = nn;
            open[n_open++] = nn;
            nn++;
        }
        /* Tokens of a node are consecutive in sorted order, so the ids
         * at tok_start[node] .. tok_start[node + 1] are its tokens. */
        v->tok_ids[nt++] = t;
        (void)path;
        prev = t;
    }
    while (n_open > 0) {
        v->skip[open[--n_open]] = nn;
    }
    v->tok_start[nn] = nt;
    v->n_nodes = nn;
    v->max_depth = max_len;
    free(path);
    free(open);
    free(order);
    *out = v;
    return ST_OK;
}

/* The tokens ending at trie node i: tok_ids[lo .. hi). Nodes created for a
 * token's last byte get that token's index as their start; nodes that end
 * no token have an empty range because the next node starts at the same
 * index. */
static inline void
node_tokens(const gr_vocab_t *v, int32_t i, int32_t *lo, int32_t *hi)
{
    *lo = v->tok_start[i];
    *hi = v->tok_start[i + 1];
}

void
gr_vocab_destroy(gr_vocab_t *v)
{
    if (v == NULL) {
        return;
    }
    for (int32_t i = 0; i < v->n; i++) {
        free(v->bytes[i]);
    }
    free(v->bytes);
    free(v->lens);
    free(v->eos);
    free(v->byte);
    free(v->depth);
    free(v->skip);
    free(v->tok_start);
    free(v->tok_ids);
    free(v);
}

int32_t
gr_vocab_size(const gr_vocab_t *v)
{
    return v->n;
}

int32_t
gr_vocab_mask_words(const gr_vocab_t *v)
{
    return v->words;
}

/* ---- grammar ---------------------------------------------------------------- */

/* Interned states: a state (sorted node ids) gets an id the first time it
 * is seen; its byte union, acceptance and cached mask hang off the id, and
 * advance(state, byte) is memoized per (id, byte). Ids are never freed
 * while the grammar lives (matchers hold them). */
#define GR_DEAD UINT32_MAX
#define GR_MAX_STATES (1u << 22)

struct gr_grammar {
    gr_prog_t prog;
    const gr_vocab_t *vocab;
    char *gbnf;
    /* node pool */
    uint32_t *npos, *npar;
    uint32_t n_nodes, cap_nodes;
    uint32_t *nhash; /* node id + 1, 0 empty */
    uint32_t nhash_mask;
    /* scratch for one advance */
    uint32_t *buf;
    size_t buf_n, buf_cap;
    int failed; /* a cap was hit in this advance */
    uint32_t work;
    /* states */
    uint32_t *sdata; /* contents, concatenated */
    size_t sdata_n, sdata_cap;
    uint32_t *soff, *slen;
    uint32_t (*sbytes)[8]; /* bytes some stack top takes */
    uint8_t *sacc;         /* ACC in the state */
    int64_t *smask;        /* offset of the cached mask in cmasks, -1 none */
    uint32_t n_states, cap_states;
    uint32_t *shash; /* state id + 1 */
    uint32_t shash_mask;
    uint32_t init; /* the start state */
    /* advance memo: key (state << 8 | byte) + 1, value the next state */
    uint64_t *mkey;
    uint32_t *mval;
    uint32_t mmask, m_used;
    /* per-depth walk states */
    uint32_t *lvl;
    /* mask cache */
    uint32_t *cmasks;
    size_t cmasks_n, cmasks_cap;
    uint64_t walks, hits;
};

static inline uint32_t
hash2(uint32_t a, uint32_t b)
{
    uint64_t x = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32) ^ (uint32_t)x;
}

static void
nhash_grow(gr_grammar_t *g)
{
    uint32_t cap = g->nhash_mask ? (g->nhash_mask + 1) * 2 : 1024;
    uint32_t *t = xcalloc(cap, sizeof(uint32_t));
    for (uint32_t id = 0; id < g->n_nodes; id++) {
        uint32_t h = hash2(g->npos[id], g->npar[id]) & (cap - 1);
        while (t[h] != 0) {
            h = (h + 1) & (cap - 1);
        }
        t[h] = id + 1;
    }
    free(g->nhash);
    g->nhash = t;
    g->nhash_mask = cap - 1;
}

static uint32_t
node_get(gr_grammar_t *g, uint32_t pos, uint32_t parent)
{
    uint32_t h = hash2(pos, parent) & g->nhash_mask;
    for (;;) {
        uint32_t e = g->nhash[h];
        if (e == 0) {
            break;
        }
        if (g->npos[e - 1] == pos && g->npar[e - 1] == parent) {
            return e - 1;
        }
        h = (h + 1) & g->nhash_mask;
    }
    if (g->n_nodes >= GR_MAX_NODES) {
        g->failed = 1;
        return GR_ACC;
    }
    if (g->n_nodes == g->cap_nodes) {
        g->cap_nodes *= 2;
        g->npos = xrealloc(g->npos, g->cap_nodes * sizeof(uint32_t));
        g->npar = xrealloc(g->npar, g->cap_nodes * sizeof(uint32_t));
    }
    uint32_t id = g->n_nodes++;
    g->npos[id] = pos;
    g->npar[id] = parent;
    g->nhash[h] = id + 1;
    if (g->n_nodes * 2 > g->nhash_mask + 1) {
        nhash_grow(g);
    }
    return id;
}

static inline void
buf_push(gr_grammar_t *g, uint32_t v)
{
    if (g->buf_n == g->buf_cap) {
        g->buf_cap = g->buf_cap ? g->buf_cap * 2 : 4096;
        g->buf = xrealloc(g->buf, g->buf_cap * sizeof(uint32_t));
    }
    g->buf[g->buf_n++] = v;
}

static void
expand(gr_grammar_t *g, uint32_t pos, uint32_t parent, int depth)
{
    const gr_prog_t *p = &g->prog;

    if (depth > GR_MAX_DEPTH || ++g->work > GR_MAX_WORK || g->failed) {
        g->failed = 1;
        return;
    }
    uint32_t e = p->code[pos];
    switch (GR_EL_TYPE(e)) {
    case GR_EL_CLASS:
        buf_push(g, node_get(g, pos, parent));
        break;
    case GR_EL_END:
        if (parent == GR_NONE) {
            buf_push(g, GR_ACC);
        } else {
            expand(g, g->npos[parent], g->npar[parent], depth + 1);
        }
        break;
    default: {
        uint32_t r = GR_EL_ARG(e);
        uint32_t ret =
            GR_EL_TYPE(p->code[pos + 1]) == GR_EL_END ? parent : node_get(g, pos + 1, parent);
        for (int32_t a = p->rule_alts[r]; a < p->rule_alts[r + 1]; a++) {
            expand(g, p->alt_start[a], ret, depth + 1);
        }
        break;
    }
    }
}

static int
u32_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts and dedupes buf[off .. buf_n); returns the new count. */
static uint32_t
set_finish(gr_grammar_t *g, size_t off)
{
    uint32_t *s = g->buf + off;
    size_t n = g->buf_n - off;
    if (n > 1) {
        if (n <= 16) {
            for (size_t i = 1; i < n; i++) {
                uint32_t x = s[i];
                size_t j = i;
                while (j > 0 && s[j - 1] > x) {
                    s[j] = s[j - 1];
                    j--;
                }
                s[j] = x;
            }
        } else {
            qsort(s, n, sizeof(uint32_t), u32_cmp);
        }
        size_t w = 1;
        for (size_t i = 1; i < n; i++) {
            if (s[i] != s[w - 1]) {
                s[w++] = s[i];
            }
        }
        n = w;
    }
    if (n > GR_MAX_SET) {
        g->failed = 1;
    }
    g->buf_n = off + n;
    return (uint32_t)n;
}

/* Appends advance(buf[src .. src + n), byte) at the end of buf; returns
 * its count (0: the byte is not allowed, or a cap was hit). */
static uint32_t
advance(gr_grammar_t *g, size_t src, uint32_t n, uint8_t byte)
{
    size_t off = g->buf_n;
    g->failed = 0;
    g->work = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = g->buf[src + i];
        if (id == GR_ACC) {
            continue;
        }
        uint32_t pos = g->npos[id];
        const uint32_t *c = g->prog.cls[GR_EL_ARG(g->prog.code[pos])];
        if (c[byte >> 5] & (1u << (byte & 31))) {
            expand(g, pos + 1, g->npar[id], 0);
        }
    }
    uint32_t k = set_finish(g, off);
    if (g->failed) {
        g->buf_n = off;
        return 0;
    }
    return k;
}

static uint64_t
key_hash(const uint32_t *s, uint32_t n)
{
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (uint32_t i = 0; i < n; i++) {
        h = (h ^ s[i]) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

static void
shash_grow(gr_grammar_t *g)
{
    uint32_t cap = g->shash_mask ? (g->shash_mask + 1) * 2 : 1024;
    uint32_t *t = xcalloc(cap, sizeof(uint32_t));
    for (uint32_t id = 0; id < g->n_states; id++) {
        uint32_t h = (uint32_t)key_hash(g->sdata + g->soff[id], g->slen[id]) & (cap - 1);
        while (t[h] != 0) {
            h = (h + 1) & (cap - 1);
        }
        t[h] = id + 1;
    }
    free(g->shash);
    g->shash = t;
    g->shash_mask = cap - 1;
}

/* The id of the state s[0..n) (sorted, deduped), interning it when new;
 * GR_DEAD for the empty state or when the state table is full. s must
 * not point into g->sdata. */
static uint32_t
intern(gr_grammar_t *g, const uint32_t *s, uint32_t n)
{
    if (n == 0) {
        return GR_DEAD;
    }
    uint64_t hk = key_hash(s, n);
    uint32_t h = (uint32_t)hk & g->shash_mask;
    for (;;) {
        uint32_t e = g->shash[h];
        if (e == 0) {
            break;
        }
        if (g->slen[e - 1] == n && memcmp(g->sdata + g->soff[e - 1], s, n * 4) == 0) {
            return e - 1;
        }
        h = (h + 1) & g->shash_mask;
    }
    if (g->n_states >= GR_MAX_STATES || g->sdata_n + n > (size_t)UINT32_MAX) {
        return GR_DEAD;
    }
    if (g->n_states == g->cap_states) {
        g->cap_states = g->cap_states ? g->cap_states * 2 : 256;
        g->soff = xrealloc(g->soff, g->cap_states * sizeof(uint32_t));
        g->slen = xrealloc(g->slen, g->cap_states * sizeof(uint32_t));
        g->sbytes = xrealloc(g->sbytes, g->cap_states * 32);
        g->sacc = xrealloc(g->sacc, g->cap_states);
        g->smask = xrealloc(g->smask, g->cap_states * sizeof(int64_t));
    }
    if (g->sdata_n + n > g->sdata_cap) {
        g->sdata_cap = (g->sdata_n + n) * 2;
        g->sdata = xrealloc(g->sdata, g->sdata_cap * 4);
    }
    uint32_t id = g->n_states++;
    g->soff[id] = (uint32_t)g->sdata_n;
    g->slen[id] = n;
    memcpy(g->sdata + g->sdata_n, s, n * 4);
    g->sdata_n += n;
    g->sacc[id] = s[0] == GR_ACC;
    g->smask[id] = -1;
    memset(g->sbytes[id], 0, 32);
    for (uint32_t i = 0; i < n; i++) {
        if (s[i] == GR_ACC) {
            continue;
        }
        const uint32_t *c = g->prog.cls[GR_EL_ARG(g->prog.code[g->npos[s[i]]])];
        for (int k = 0; k < 8; k++) {
            g->sbytes[id][k] |= c[k];
        }
    }
    g->shash[h] = id + 1;
    if (g->n_states * 2 > g->shash_mask + 1) {
        shash_grow(g);
    }
    return id;
}

static void
memo_grow(gr_grammar_t *g)
{
    uint32_t cap = g->mmask ? (g->mmask + 1) * 2 : 4096;
    uint64_t *k = xcalloc(cap, sizeof(uint64_t));
    uint32_t *v = xmalloc(cap * sizeof(uint32_t));
    for (uint32_t i = 0; g->mkey != NULL && i <= g->mmask; i++) {
        if (g->mkey[i] != 0) {
            uint32_t h = hash2((uint32_t)(g->mkey[i] >> 32), (uint32_t)g->mkey[i]) & (cap - 1);
            while (k[h] != 0) {
                h = (h + 1) & (cap - 1);
            }
            k[h] = g->mkey[i];
            v[h] = g->mval[i];
        }
    }
    free(g->mkey);
    free(g->mval);
    g->mkey = k;
    g->mval = v;
    g->mmask = cap - 1;
}

/* advance(state sid, byte) as a state id (GR_DEAD: refused), memoized. */
static uint32_t
step(gr_grammar_t *g, uint32_t sid, uint8_t byte)
{
    if (!(g->sbytes[sid][byte >> 5] & (1u << (byte & 31)))) {
        return GR_DEAD;
    }
    uint64_t key = (((uint64_t)sid << 8) | byte) + 1;
    uint32_t h = hash2((uint32_t)(key >> 32), (uint32_t)key) & g->mmask;
    for (;;) {
        if (g->mkey[h] == key) {
            return g->mval[h];
        }
        if (g->mkey[h] == 0) {
            break;
        }
        h = (h + 1) & g->mmask;
    }
    g->buf_n = 0;
    for (uint32_t i = 0; i < g->slen[sid]; i++) {
        buf_push(g, g->sdata[g->soff[sid] + i]);
    }
    uint32_t n = g->slen[sid];
    uint32_t k = advance(g, 0, n, byte);
    uint32_t r = intern(g, g->buf + n, k);
    g->buf_n = 0;
    g->mkey[h] = key;
    g->mval[h] = r;
    if (++g->m_used * 2 > g->mmask + 1) {
        memo_grow(g);
    }
    return r;
}

int
gr_compile(gr_kind_t kind, const char *spec, const gr_vocab_t *vocab, gr_grammar_t **out, char *err,
           size_t errlen)
{
    gr_sb_t text = {0};
    int rc;

    if (vocab == NULL || out == NULL || (kind != GR_KIND_JSON_OBJECT && spec == NULL)) {
        snprintf(err, errlen, "no grammar given");
        return ST_EINVAL;
    }
    if (spec != NULL && strlen(spec) > GR_MAX_SPEC) {
        snprintf(err, errlen, "grammar specification longer than %d bytes", GR_MAX_SPEC);
        return ST_EINVAL;
    }
    switch (kind) {
    case GR_KIND_JSON_OBJECT:
        rc = gr__schema_to_gbnf(NULL, &text, err, errlen);
        break;
    case GR_KIND_JSON_SCHEMA:
        rc = gr__schema_to_gbnf(spec, &text, err, errlen);
        break;
    case GR_KIND_GBNF:
        gr__sb_puts(&text, spec);
        rc = ST_OK;
        break;
    case GR_KIND_REGEX:
        rc = gr__regex_to_gbnf(spec, &text, err, errlen);
        break;
    case GR_KIND_CHOICE:
        rc = gr__choice_to_gbnf(spec, &text, err, errlen);
        break;
    default:
        snprintf(err, errlen, "unknown grammar kind %d", (int)kind);
        rc = ST_EINVAL;
        break;
    }
    if (rc != ST_OK) {
        free(text.p);
        return rc;
    }
    if (text.p == NULL) {
        gr__sb_puts(&text, "");
    }
    gr_grammar_t *g = xcalloc(1, sizeof(*g));
    rc = gr__gbnf_compile(text.p, &g->prog, err, errlen);
    if (rc != ST_OK) {
        free(text.p);
        free(g);
        return rc;
    }
    g->gbnf = text.p;
    g->vocab = vocab;
    g->cap_nodes = 1024;
    g->npos = xmalloc(g->cap_nodes * sizeof(uint32_t));
    g->npar = xmalloc(g->cap_nodes * sizeof(uint32_t));
    g->npos[0] = GR_NONE; /* ACC */
    g->npar[0] = GR_NONE;
    g->n_nodes = 1;
    nhash_grow(g);
    g->lvl = xmalloc((size_t)(vocab->max_depth + 2) * sizeof(uint32_t));
    shash_grow(g);
    memo_grow(g);

    /* The start state: the root's alternatives, returning to nobody. */
    const gr_prog_t *p = &g->prog;
    g->buf_n = 0;
    g->work = 0;
    for (int32_t a = p->rule_alts[p->root]; a < p->rule_alts[p->root + 1]; a++) {
        expand(g, p->alt_start[a], GR_NONE, 0);
    }
    uint32_t n_init = set_finish(g, 0);
    if (g->failed || n_init == 0) {
        snprintf(err, errlen, "grammar: %s",
                 g->failed ? "the start state is too large" : "the grammar matches nothing");
        gr_grammar_destroy(g);
        return ST_EINVAL;
    }
    uint32_t *tmp = xmalloc(n_init * sizeof(uint32_t));
    memcpy(tmp, g->buf, n_init * sizeof(uint32_t));
    g->init = intern(g, tmp, n_init);
    free(tmp);
    g->buf_n = 0;
    *out = g;
    return ST_OK;
}

void
gr_grammar_destroy(gr_grammar_t *g)
{
    if (g == NULL) {
        return;
    }
    gr__prog_fini(&g->prog);
    free(g->gbnf);
    free(g->npos);
    free(g->npar);
    free(g->nhash);
    free(g->buf);
    free(g->sdata);
    free(g->soff);
    free(g->slen);
    free(g->sbytes);
    free(g->sacc);
    free(g->smask);
    free(g->shash);
    free(g->mkey);
    free(g->mval);
    free(g->lvl);
    free(g->cmasks);
    free(g);
}

const char *
gr_grammar_gbnf(const gr_grammar_t *g)
{
    return g->gbnf;
}

void
gr_grammar_stats(const gr_grammar_t *g, uint64_t *walks, uint64_t *hits)
{
    *walks = g->walks;
    *hits = g->hits;
}

/* ---- matcher ---------------------------------------------------------------- */

struct gr_matcher {
    gr_grammar_t *g;
    uint32_t *hist; /* [n_steps + 1] state ids; hist[n_steps] is the current one */
    int32_t n_steps, cap;
};

static void
m_push(gr_matcher_t *m, uint32_t sid)
{
    if (m->n_steps + 2 > m->cap) {
        m->cap = m->cap ? m->cap * 2 : 64;
        m->hist = xrealloc(m->hist, (size_t)m->cap * sizeof(uint32_t));
    }
    m->hist[++m->n_steps] = sid;
}

gr_matcher_t *
gr_matcher_create(gr_grammar_t *g)
{
    gr_matcher_t *m = xcalloc_try(1, sizeof(*m));
    if (m == NULL) {
        return NULL;
    }
    m->hist = xmalloc_try(64 * sizeof(uint32_t));
    if (m->hist == NULL) {
        free(m);
        return NULL;
    }
    m->g = g;
    m->cap = 64;
    m->hist[0] = g->init;
    return m;
}

gr_matcher_t *
gr_matcher_copy(const gr_matcher_t *m)
{
    gr_matcher_t *c = xcalloc_try(1, sizeof(*c));
    if (c == NULL) {
        return NULL;
    }
    c->cap = m->n_steps + 64;
    c->hist = xmalloc_try((size_t)c->cap * sizeof(uint32_t));
    if (c->hist == NULL) {
        free(c);
        return NULL;
    }
    c->g = m->g;
    c->n_steps = m->n_steps;
    memcpy(c->hist, m->hist, (size_t)(m->n_steps + 1) * sizeof(uint32_t));
    return c;
}

void
gr_matcher_destroy(gr_matcher_t *m)
{
    if (m == NULL) {
        return;
    }
    free(m->hist);
    free(m);
}

int
gr_matcher_accept_bytes(gr_matcher_t *m, const char *s, size_t len)
{
    uint32_t sid = m->hist[m->n_steps];
    for (size_t i = 0; i < len; i++) {
        sid = step(m->g, sid, (uint8_t)s[i]);
        if (sid == GR_DEAD) {
            return ST_EINVAL;
        }
    }
    m_push(m, sid);
    return ST_OK;
}

int
gr_matcher_accepting(const gr_matcher_t *m)
{
    return m->g->sacc[m->hist[m->n_steps]];
}

int
gr_matcher_done(const gr_matcher_t *m)
{
    const gr_grammar_t *g = m->g;
    uint32_t sid = m->hist[m->n_steps];
    return g->slen[sid] == 1 && g->sdata[g->soff[sid]] == GR_ACC;
}

static int
is_eos(const gr_vocab_t *v, int32_t id)
{
    for (int32_t k = 0; k < v->n_eos; k++) {
        if (v->eos[k] == id) {
            return 1;
        }
    }
    return 0;
}

int
gr_matcher_accept_token(gr_matcher_t *m, int32_t id)
{
    const gr_vocab_t *v = m->g->vocab;

    if (id < 0 || id >= v->n) {
        return ST_EINVAL;
    }
    if (is_eos(v, id)) {
        if (!gr_matcher_accepting(m)) {
            return ST_EINVAL;
        }
        m_push(m, m->hist[m->n_steps]); /* a step, so rollback counts tokens */
        return ST_OK;
    }
    if (v->lens[id] == 0) {
        return ST_EINVAL;
    }
    return gr_matcher_accept_bytes(m, v->bytes[id], v->lens[id]);
}

int
gr_matcher_rollback(gr_matcher_t *m, int32_t k)
{
    if (k < 0 || k > m->n_steps) {
        return ST_EINVAL;
    }
    m->n_steps -= k;
    return ST_OK;
}

int32_t
gr_matcher_steps(const gr_matcher_t *m)
{
    return m->n_steps;
}

/* ---- mask ------------------------------------------------------------------- */

/* The trie walk: every token whose bytes the state takes. */
static void
walk(gr_grammar_t *g, uint32_t sid, uint32_t *mask)
{
    const gr_vocab_t *v = g->vocab;
    uint32_t *lvl = g->lvl;
    int32_t i = 1;

    lvl[0] = sid;
    while (i < v->n_nodes) {
        int32_t d = v->depth[i];
        uint8_t b = v->byte[i];
        uint32_t p = lvl[d - 1];
        if (!(g->sbytes[p][b >> 5] & (1u << (b & 31)))) {
            i = v->skip[i];
            continue;
        }
        uint32_t r = step(g, p, b);
        if (r == GR_DEAD) {
            i = v->skip[i];
            continue;
        }
        int32_t lo, hi;
        node_tokens(v, i, &lo, &hi);
        for (int32_t t = lo; t < hi; t++) {
            int32_t id = v->tok_ids[t];
            mask[id >> 5] |= 1u << (id & 31);
        }
        lvl[d] = r;
        i++;
    }
}

void
gr_matcher_fill_mask(gr_matcher_t *m, uint32_t *mask)
{
    gr_grammar_t *g = m->g;
    const gr_vocab_t *v = g->vocab;
    uint32_t sid = m->hist[m->n_steps];
    size_t words = (size_t)v->words;

    if (g->smask[sid] >= 0) {
        memcpy(mask, g->cmasks + g->smask[sid], words * 4);
        g->hits++;
        return;
    }
    memset(mask, 0, words * 4);
    walk(g, sid, mask);
    if (g->sacc[sid]) {
        for (int32_t k = 0; k < v->n_eos; k++) {
            mask[v->eos[k] >> 5] |= 1u << (v->eos[k] & 31);
        }
    }
    g->walks++;
    if ((g->cmasks_n + words) * 4 > GR_CACHE_BYTES) {
        for (uint32_t k = 0; k < g->n_states; k++) {
            g->smask[k] = -1;
        }
        g->cmasks_n = 0;
    }
    if (g->cmasks_n + words > g->cmasks_cap) {
        g->cmasks_cap = (g->cmasks_n + words) * 2;
        g->cmasks = xrealloc(g->cmasks, g->cmasks_cap * 4);
    }
    memcpy(g->cmasks + g->cmasks_n, mask, words * 4);
    g->smask[sid] = (int64_t)g->cmasks_n;
    g->cmasks_n += words;
}

void
gr_mask_apply(const uint32_t *mask, float *logits, int32_t n)
{
    for (int32_t w = 0; w * 32 < n; w++) {
        uint32_t bits = mask[w];
        if (bits == UINT32_MAX) {
            continue;
        }
        int32_t end = w * 32 + 32 < n ? w * 32 + 32 : n;
        for (int32_t i = w * 32; i < end; i++) {
            if (!(bits & (1u << (i & 31)))) {
                logits[i] = -INFINITY;
            }
        }
    }
}
