/* tokenizer.h - BPE tokenizers: SentencePiece-style with byte fallback
 * (Llama 2, Mistral, the default model) and byte-level BPE with a PCRE2
 * pre-tokenizer regex (GPT-2, Llama 3, Qwen, SmolLM), from tokenizer.json
 * or from a GGUF file's embedded vocabulary. Added and special tokens.
 * Incremental, UTF-8-safe detokenization.
 *
 * Invalid UTF-8 input: each invalid byte is encoded as if it were U+FFFD
 * for regex matching, but byte-fallback / byte-level encoding keeps the
 * original bytes where the vocabulary can express them (documented in
 * tokenizer.c).
 *
 * Thread: a loaded tokenizer is immutable and shared; tok_stream_t belongs
 * to one thread.
 */
#ifndef TEXT_TOKENIZER_H
#define TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct tok_tokenizer tok_tokenizer_t;
typedef struct gguf_file gguf_file_t;

enum {
    TOK_ADD_SPECIAL = 1 << 0,   /* add BOS/EOS as the tokenizer config says */
    TOK_PARSE_SPECIAL = 1 << 1, /* special-token text becomes its id */
};

/* tokenizer.json (and, when not NULL, tokenizer_config.json for
 * add_bos_token / add_eos_token and the special token names). */
int tok_load_hf(const char *tokenizer_json, const char *tokenizer_config_json,
                tok_tokenizer_t **out, char *err, size_t errlen);
/* The vocabulary embedded in a GGUF file (tokenizer.ggml.*). */
int tok_load_gguf(const gguf_file_t *g, tok_tokenizer_t **out, char *err, size_t errlen);
void tok_destroy(tok_tokenizer_t *t);

int32_t tok_vocab_size(const tok_tokenizer_t *t);
int32_t tok_bos_id(const tok_tokenizer_t *t); /* -1 when none */
int32_t tok_eos_id(const tok_tokenizer_t *t); /* -1 when none */
/* The token's text as stored in the vocabulary, or NULL if out of range. */
const char *tok_token_str(const tok_tokenizer_t *t, int32_t id);
int tok_is_special(const tok_tokenizer_t *t, int32_t id);
/* The bytes token id adds in the middle of a decoded text: a SentencePiece
 * token keeps its leading space (U+2581 as a space), a byte-fallback or
 * byte-level token is its bytes (maybe part of a UTF-8 character), a
 * special token its text. Borrowed for the tokenizer's life, *len bytes,
 * not NUL-terminated; NULL (and *len 0) for an out-of-range id. Logprob
 * tokens/bytes and the grammar vocabulary both read it. */
const char *tok_token_bytes(const tok_tokenizer_t *t, int32_t id, size_t *len);
/* What each token adds to an output text, for the grammar engine's
 * vocabulary (grammar/grammar.h, gr_vocab_create): for every id,
 * bytes[id] (borrowed, as tok_token_bytes) and lens[id]; special, unknown
 * and control tokens get NULL and 0, as they never stand for text. bytes
 * and lens hold tok_vocab_size(t) entries. */
void tok_output_bytes(const tok_tokenizer_t *t, const char **bytes, uint32_t *lens);
/* Id of an exact token string (special or not), or -1. */
int32_t tok_find(const tok_tokenizer_t *t, const char *s);

/* Views for writers of other formats (tok_export.c; kvserve quantize
 * writes a tokenizer.json vocabulary as GGUF tokenizer.ggml.* keys). */
int tok_is_byte_level(const tok_tokenizer_t *t); /* GPT-2 byte-level BPE, else SentencePiece */
int32_t tok_unk_id(const tok_tokenizer_t *t);    /* -1 when none */
int tok_adds_bos(const tok_tokenizer_t *t);      /* TOK_ADD_SPECIAL prepends BOS */
int tok_adds_eos(const tok_tokenizer_t *t);      /* TOK_ADD_SPECIAL appends EOS */
float tok_token_score(const tok_tokenizer_t *t, int32_t id);
/* The GGUF tokenizer.ggml.token_type of id: UNKNOWN (2) for the unk id,
 * BYTE (6) for <0xXX> under byte fallback, CONTROL (3) for special added
 * tokens, USER_DEFINED (4) for other added ones, else NORMAL (1). */
int tok_token_gguf_type(const tok_tokenizer_t *t, int32_t id);
/* The BPE merges in rank order as id pairs: pairs[2i], pairs[2i + 1]
 * (pairs NULL: just the count). Returns the number of merges. */
uint32_t tok_merges(const tok_tokenizer_t *t, int32_t *pairs);
/* SentencePiece scores that make llama.cpp's highest-score-first merging
 * equal this BPE's rank order: -(r + 1) for the token made by the merge
 * of rank r (the lowest such rank), 0 for the others. malloc'd [n_vocab],
 * owned by the caller. */
float *tok_merge_scores(const tok_tokenizer_t *t);

/* Encodes text[0..len) (need not be NUL-terminated). *ids is malloc'd and
 * owned by the caller. Allocates through xmalloc_try: ST_ENOMEM (nothing
 * returned) when out of memory. */
int tok_encode(const tok_tokenizer_t *t, const char *text, size_t len, int flags, int32_t **ids,
               size_t *n_ids);
/* Decodes ids to bytes (malloc'd, NUL-terminated, owned by the caller).
 * skip_special drops special tokens. Out-of-range ids: ST_EINVAL; out of
 * memory (xmalloc_try): ST_ENOMEM. */
int tok_decode(const tok_tokenizer_t *t, const int32_t *ids, size_t n, int skip_special,
               char **text, size_t *len);

/* Incremental detokenizer: push ids one at a time, get only complete UTF-8
 * text; decode(all ids) == concatenation of every chunk + tok_stream_flush. */
typedef struct tok_stream {
    const tok_tokenizer_t *tok;
    int skip_special;
    int n_pushed;       /* tokens seen so far */
    char pending[32];   /* bytes of an incomplete UTF-8 character */
    size_t n_pending;
    int at_start;       /* SentencePiece: strip the first leading space */
} tok_stream_t;

void tok_stream_init(tok_stream_t *s, const tok_tokenizer_t *t, int skip_special);
/* Appends the new complete text of id to out (cap bytes, NUL-terminated),
 * returns its length, or ST_EINVAL / ST_ERANGE / ST_ENOMEM (xmalloc_try;
 * the stream is then unchanged). */
int tok_stream_push(tok_stream_t *s, int32_t id, char *out, size_t cap);
/* Emits whatever is pending (invalid tail bytes become U+FFFD). */
int tok_stream_flush(tok_stream_t *s, char *out, size_t cap);

#endif /* TEXT_TOKENIZER_H */
