/* tokenizer_int.h - internals shared by the tokenizer's files: the core
 * (tokenizer.c: vocabulary, encoder, decoder), the tokenizer.json loader
 * (tok_hf.c) and the GGUF vocabulary loader (tok_gguf.c).
 *
 * A loader fills a tok_tokenizer_t through tok__new / tok__add_token /
 * tok__add_merge / tok__add_pre_regex and the plain fields below, then
 * calls tok__finish, which builds the lookup tables and the per-token
 * decoded pieces. After that the object is immutable.
 *
 * Thread: loading happens on one thread; a finished tokenizer is read-only.
 */
#ifndef TEXT_TOKENIZER_INT_H
#define TEXT_TOKENIZER_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

/* Token kinds (the GGUF tokenizer.ggml.token_type numbering). */
enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

/* How the words left by pre-tokenization become ids. */
enum tok_algo {
    TOK_ALGO_BPE = 0, /* merge ranks over id pairs (tokenizer.json, GGUF gpt2) */
    TOK_ALGO_SPM = 1, /* highest-score merges over strings (GGUF llama) */
};

/* Where SentencePiece's "▁" prefix goes (normalization of a text segment). */
enum tok_prefix {
    TOK_PREFIX_NONE = 0,
    TOK_PREFIX_EVERY_SEGMENT = 1, /* HF Prepend normalizer: every non-empty segment */
    TOK_PREFIX_AFTER_SPECIAL = 2, /* llama.cpp: at the start and after an added token */
    TOK_PREFIX_FIRST_SEGMENT = 3, /* Metaspace "first": a segment at offset 0 only */
};

/* Split behaviours of the HF Split pre-tokenizer. */
enum tok_split {
    TOK_SPLIT_ISOLATED = 0,
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS,
};

#define TOK_MAX_PRE 8
#define TOK_MAX_AFFIX 4

typedef struct tok_entry {
    char *text; /* vocabulary string, NUL-terminated, owned */
    uint32_t len;
    char *piece; /* decoded bytes (not NUL-terminated), owned; may alias nothing */
    uint32_t piece_len;
    float score;
    uint8_t type;    /* TOK_TYPE_* */
    uint8_t special; /* dropped by skip_special; matched only under TOK_PARSE_SPECIAL */
    uint8_t added;   /* split out of the text before normalization */
    uint8_t lstrip;  /* added token swallows whitespace on its left */
    uint8_t rstrip;  /* ... and on its right */
} tok_entry_t;

typedef struct tok_pre {
    pcre2_code *re;
    int behavior; /* TOK_SPLIT_* */
    int invert;
} tok_pre_t;

typedef struct tok_merge_slot {
    uint64_t key; /* (left id << 32) | right id; UINT64_MAX when empty */
    int32_t rank;
    int32_t result;
} tok_merge_slot_t;

struct tok_tokenizer {
    int algo;          /* TOK_ALGO_* */
    int byte_level;    /* GPT-2 byte-to-unicode alphabet */
    int byte_fallback; /* unknown characters become <0xXX> tokens */
    int ignore_merges; /* a word found whole in the vocabulary skips BPE */
    int fuse_unk;
    int prefix;           /* TOK_PREFIX_* */
    int prefix_if_absent; /* Metaspace: no prefix when the segment starts with a space */
    int nfc;              /* normalizer NFC */
    int replace_space;    /* ' ' becomes "▁" before the model (SentencePiece) */
    int bl_prefix_space;  /* ByteLevel add_prefix_space */
    int strip_lead;       /* decoder drops one leading space of the text */
    int meta_split;       /* SentencePiece text may be cut before "▁" (see tok__finish) */

    int32_t n_vocab;
    tok_entry_t *tokens;
    int32_t bos, eos, unk;

    /* Ids added by TOK_ADD_SPECIAL before / after the text. */
    int32_t prefix_ids[TOK_MAX_AFFIX];
    int n_prefix_ids;
    int32_t suffix_ids[TOK_MAX_AFFIX];
    int n_suffix_ids;

    tok_pre_t pre[TOK_MAX_PRE];
    int n_pre;

    /* Vocabulary hash: open addressing over ids, keyed by text. */
    int32_t *vhash;
    uint32_t vhash_mask;

    /* Merge table (BPE): open addressing over id pairs. */
    tok_merge_slot_t *mhash;
    uint32_t mhash_mask;
    uint32_t n_merges;

    int32_t byte_ids[256];  /* id of each byte's token (byte-level char or <0xXX>), or -1 */
    uint16_t byte_cp[256];  /* tok__byte_to_cp, tabulated */
    int16_t cp_byte[0x144]; /* its inverse over U+0000..U+0143, -1 where none */

    /* Added tokens matched in the raw text, bucketed by first byte and sorted
     * longest first within a bucket. */
    int32_t *added_ids;
    uint32_t n_added;
    uint32_t added_start[257];
};

/* Allocates an empty tokenizer with n_vocab slots (text "" and type UNUSED). */
tok_tokenizer_t *tok__new(int32_t n_vocab);
/* Sets slot id. Takes a copy of text. */
void tok__set_token(tok_tokenizer_t *t, int32_t id, const char *text, size_t len, float score,
                    int type);
/* Builds the vocabulary hash; needed before tok__find_n / tok__add_merge. */
void tok__build_vocab_hash(tok_tokenizer_t *t);
int32_t tok__find_n(const tok_tokenizer_t *t, const char *s, size_t len);
/* Registers merge (a, b) with the given rank; ignored (returns 0) when a, b
 * or their concatenation is not in the vocabulary, or when the pair already
 * has a lower rank. Returns 1 when recorded. */
int tok__add_merge(tok_tokenizer_t *t, const char *a, size_t alen, const char *b, size_t blen,
                   int32_t rank);
/* Compiles a pre-tokenizer split pattern (PCRE2, UTF + UCP). ST_EFORMAT
 * with the compiler's message in err when it does not compile. */
int tok__add_pre_regex(tok_tokenizer_t *t, const char *pattern, size_t len, int behavior,
                       int invert, char *err, size_t errlen);
/* Builds byte_ids, the added-token index and the decoded pieces. */
int tok__finish(tok_tokenizer_t *t, char *err, size_t errlen);

/* NFC of s[0..n) (tok_nfc.c): a malloc'd NUL-terminated copy with its
 * length in *out_len, or NULL when s is in NFC already (always the case
 * below U+0300; *out_len = 0), or NULL with *out_len = TOK_NFC_OOM when
 * an allocation failed (fallible family, common/xmalloc.h). Invalid UTF-8
 * bytes pass through unchanged. */
#define TOK_NFC_OOM ((size_t)-1)
char *tok__nfc(const char *s, size_t n, size_t *out_len);

/* The GPT-2 byte-level alphabet: the code point standing for byte b. */
uint32_t tok__byte_to_cp(uint8_t b);

#endif /* TEXT_TOKENIZER_INT_H */
