/* srv_grammar.h - the server's side of constrained decoding: the
 * vocabulary's token bytes for grammar/ (built once at start-up, shared
 * read-only with the engine thread through every compiled grammar), and
 * srv_constraint_t -> a compiled grammar.
 *
 * Thread: loop thread (init/fini at start-up and shutdown).
 */
#ifndef SERVER_SRV_GRAMMAR_H
#define SERVER_SRV_GRAMMAR_H

#include "grammar/grammar.h"
#include "server/srv_int.h"
#include "text/tokenizer.h"

/* The token-byte trie of tok: special, control and unknown tokens have no
 * bytes (never allowed); eos_ids are allowed in accepting states. NULL
 * when out of memory. */
gr_vocab_t *srv_grammar_vocab(const tok_tokenizer_t *tok, const int32_t *eos_ids, int32_t n_eos);

/* Compiles c against vocab. Returns 1 with *out set (NULL for
 * SRV_CONSTRAINT_NONE), or 0 with err set: 400 naming what is wrong or
 * unsupported, param set to the request field. */
int srv_grammar_compile(const gr_vocab_t *vocab, const srv_constraint_t *c, gr_grammar_t **out,
                        srv_error_t *err);

#endif /* SERVER_SRV_GRAMMAR_H */
