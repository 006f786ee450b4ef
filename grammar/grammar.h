/* grammar.h - constrained decoding: grammars compiled from JSON Schema,
 * json_object, llama.cpp GBNF, a regex subset and choice lists, and a
 * per-sequence matcher that yields each step's mask of allowed tokens.
 *
 * Own code because no Debian C library does this (xgrammar, outlines and
 * llguidance are C++/Rust/Python and not packaged for Debian 12).
 *
 * DESIGN
 *   Every source is first turned into GBNF text (gr_schema.c, gr_regex.c),
 *   and GBNF is compiled (gr_gbnf.c) into one IR: a context-free grammar
 *   over BYTES whose rules are alternatives of sequences of elements, each
 *   a byte class (256-bit set) or a rule reference. Code-point classes
 *   become UTF-8 byte-sequence alternatives, so the matcher never decodes
 *   UTF-8. Left recursion is refused at compile time.
 *
 *   The matcher (gr_match.c) is a nondeterministic pushdown automaton over
 *   bytes (llama.cpp's grammar stacks): its state is a set of stacks whose
 *   tops are byte classes. Stacks are hash-consed nodes (pos, parent) in a
 *   pool shared by every matcher of one grammar, and states (sorted arrays
 *   of node ids) are interned, so a state is one id with its byte union,
 *   acceptance and cached mask, and advance(state, byte) is memoized per
 *   (id, byte). A matcher is the array of the state ids it went through:
 *   a copy is a memcpy, rollback drops the last k. A call to a rule whose
 *   caller has nothing left (tail position) does not push, so x* stays
 *   flat.
 *
 *   The mask walks a trie of the vocabulary's token bytes (gr_vocab_t,
 *   built once at start-up, read-only) against the state, one memoized
 *   step per trie node, pruning a subtree as soon as no stack takes its
 *   byte, and is cached per state: states repeat (inside an unbounded
 *   string, between array items), so those steps copy a cached bitmap.
 *   EOS ids are allowed exactly when some stack is empty (the grammar
 *   accepts).
 *
 * Thread: gr_vocab_t is immutable after creation and shared by any
 * thread. A grammar is compiled on any thread; once handed over, the
 * grammar and all its matchers belong to one thread (the engine's), since
 * matchers share the grammar's node pool and mask cache.
 */
#ifndef GRAMMAR_GRAMMAR_H
#define GRAMMAR_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

typedef enum gr_kind {
    GR_KIND_JSON_OBJECT = 1, /* any JSON object; spec ignored */
    GR_KIND_JSON_SCHEMA,     /* spec: JSON Schema text */
    GR_KIND_GBNF,            /* spec: llama.cpp GBNF, root rule "root" */
    GR_KIND_REGEX,           /* spec: a regular expression (whole output) */
    GR_KIND_CHOICE,          /* spec: JSON array of strings */
} gr_kind_t;

typedef struct gr_vocab gr_vocab_t;
typedef struct gr_grammar gr_grammar_t;
typedef struct gr_matcher gr_matcher_t;

/* ---- vocabulary ---------------------------------------------------------- */

/* Builds the token-byte trie of n tokens: bytes[i][0..lens[i]) is what
 * token i adds to the output text. A token with length 0 (special and
 * control tokens, unused ids) is never allowed under a grammar, except
 * the eos ids, which are allowed exactly in accepting states. Copies what
 * it needs. ST_EINVAL on bad arguments. */
int gr_vocab_create(int32_t n, const char *const *bytes, const uint32_t *lens,
                    const int32_t *eos_ids, int32_t n_eos, gr_vocab_t **out);
void gr_vocab_destroy(gr_vocab_t *v);
int32_t gr_vocab_size(const gr_vocab_t *v);
/* Words of a mask: (n + 31) / 32 uint32_t. */
int32_t gr_vocab_mask_words(const gr_vocab_t *v);

/* ---- grammar ------------------------------------------------------------- */

/* Compiles spec of kind for vocab (borrowed: it must outlive the grammar).
 * On error returns ST_EINVAL and writes one line into err naming what is
 * wrong or unsupported (e.g. "unsupported JSON Schema keyword 'not' at
 * /properties/a"). ST_ENOMEM when out of memory. */
int gr_compile(gr_kind_t kind, const char *spec, const gr_vocab_t *vocab, gr_grammar_t **out,
               char *err, size_t errlen);
/* Frees the grammar; its matchers must be destroyed first. NULL: no-op. */
void gr_grammar_destroy(gr_grammar_t *g);
/* The GBNF text a non-GBNF source was compiled through (for debugging and
 * tests), or NULL. Borrowed from the grammar. */
const char *gr_grammar_gbnf(const gr_grammar_t *g);
/* Cache statistics: masks computed by a trie walk, masks served from the
 * per-state cache. */
void gr_grammar_stats(const gr_grammar_t *g, uint64_t *walks, uint64_t *hits);

/* ---- matcher ------------------------------------------------------------- */

/* A matcher at the grammar's start. NULL when out of memory. */
gr_matcher_t *gr_matcher_create(gr_grammar_t *g);
/* An independent copy (n > 1 forks, speculation). NULL when out of memory. */
gr_matcher_t *gr_matcher_copy(const gr_matcher_t *m);
void gr_matcher_destroy(gr_matcher_t *m);

/* Advances over token id. ST_OK, or ST_EINVAL when the grammar does not
 * allow it (the matcher is unchanged). An eos id is accepted without
 * moving when the matcher accepts. */
int gr_matcher_accept_token(gr_matcher_t *m, int32_t id);
/* Advances over raw bytes as one step (tests, prompts forced by the
 * server). Same contract as accept_token. */
int gr_matcher_accept_bytes(gr_matcher_t *m, const char *s, size_t n);
/* Undoes the last k accepted steps. ST_EINVAL when fewer than k were
 * accepted (nothing changes). */
int gr_matcher_rollback(gr_matcher_t *m, int32_t k);
/* Steps accepted so far (what rollback can undo). */
int32_t gr_matcher_steps(const gr_matcher_t *m);
/* 1 when the output so far is a complete sentence (EOS allowed). */
int gr_matcher_accepting(const gr_matcher_t *m);
/* 1 when the output is complete and no byte may follow: the request is
 * done. */
int gr_matcher_done(const gr_matcher_t *m);
/* Writes the allowed-token bitmap (bit i of word i / 32 = token i) into
 * mask[gr_vocab_mask_words()]. */
void gr_matcher_fill_mask(gr_matcher_t *m, uint32_t *mask);

/* Sets logits[i] = -INFINITY for every token i < n whose mask bit is 0. */
void gr_mask_apply(const uint32_t *mask, float *logits, int32_t n);

#endif /* GRAMMAR_GRAMMAR_H */
