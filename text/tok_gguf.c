/* tok_gguf.c - builds a tokenizer from a GGUF file's embedded vocabulary
 * (tokenizer.ggml.*), the way llama.cpp reads it.
 *
 *   tokenizer.ggml.model "llama": SentencePiece, merges by token score,
 *       byte fallback through <0xXX> tokens, "▁" for spaces and a "▁"
 *       prefix at the start of the text and after each added token
 *       (tokenizer.ggml.add_space_prefix, default true).
 *   tokenizer.ggml.model "gpt2": byte-level BPE with tokenizer.ggml.merges;
 *       tokenizer.ggml.pre picks the pre-tokenizer regex set (llama.cpp's
 *       lists, applied one after the other, each splitting the pieces the
 *       previous one left; matches and the gaps between them are kept).
 *
 * Token types: CONTROL and UNKNOWN tokens are special (matched in text only
 * under TOK_PARSE_SPECIAL); USER_DEFINED tokens are always split out of
 * the text, as llama.cpp does.
 *
 * Thread: any; the result is immutable.
 */
#define LOG_MODULE "tokenizer"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "formats/gguf.h"
#include "text/tokenizer.h"
#include "text/tokenizer_int.h"

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                                  \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"     \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                   \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"     \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* DeepSeek LLM: letters of the cased scripts, ASCII/full-width punctuation,
 * trailing whitespace, CJK and Hangul runs, digit runs. */
static const char *const k_deepseek_llm[] = {
    "[\\r\\n]",
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"
    "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"
    "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"
    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}"
    "\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}"
    "\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}"
    "\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"
    "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
    "\\x{1E900}-\\x{1E943}]+",
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
    "\\s+$",
    "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+",
    "\\p{N}+",
    NULL,
};
static const char *const k_gpt2[] = {RE_GPT2, NULL};
static const char *const k_llama3[] = {RE_LLAMA3, NULL};
static const char *const k_qwen2[] = {RE_QWEN2, NULL};
static const char *const k_falcon[] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]",
                                       NULL};
static const char *const k_starcoder[] = {"\\p{N}", RE_GPT2, NULL};
static const char *const k_default_bpe[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+",
                                            "[0-9][0-9][0-9]", NULL};

typedef struct pre_set {
    const char *name;
    const char *const *regexes;
    int ignore_merges;
} pre_set_t;

static const pre_set_t k_pre_sets[] = {
    {"gpt-2", k_gpt2, 0},
    {"mpt", k_gpt2, 0},
    {"olmo", k_gpt2, 0},
    {"jais", k_gpt2, 0},
    {"llama3", k_llama3, 1},
    {"llama-bpe", k_llama3, 1},
    {"dbrx", k_llama3, 0},
    {"smaug-bpe", k_llama3, 0},
    {"deepseek-llm", k_deepseek_llm, 0},
    {"falcon", k_falcon, 0},
    {"starcoder", k_starcoder, 0},
    {"refact", k_starcoder, 0},
    {"command-r", k_starcoder, 0},
    {"smollm", k_starcoder, 0},
    {"codeshell", k_starcoder, 0},
    {"qwen2", k_qwen2, 0},
    {"default", k_default_bpe, 0},
};

static int
get_bool_or(const gguf_file_t *g, const char *key, int dflt)
{
    int v;

    return gguf_get_bool(g, key, &v) == ST_OK ? v : dflt;
}

static int32_t
get_id_or(const gguf_file_t *g, const char *key, int32_t n_vocab)
{
    int64_t v;

    if (gguf_get_i64(g, key, &v) != ST_OK || v < 0 || v >= n_vocab) {
        return -1;
    }
    return (int32_t)v;
}

/* llama.cpp sets a few token attributes from the model name: Phi-3's
 * added tokens swallow the whitespace after them (so "<|user|>\n" does not
 * leave a newline to encode), except <unk>, <s> and <|endoftext|>. */
static void
apply_name_attrs(const gguf_file_t *g, tok_tokenizer_t *t)
{
    const char *name;
    size_t len;
    char lower[128];

    if (gguf_get_str(g, "general.name", &name, &len) != ST_OK) {
        return;
    }
    if (len >= sizeof(lower)) {
        len = sizeof(lower) - 1;
    }
    for (size_t i = 0; i < len; i++) {
        lower[i] = (char)tolower((unsigned char)name[i]);
    }
    lower[len] = '\0';
    if (strstr(lower, "phi-3") == NULL && strstr(lower, "phi3") == NULL) {
        return;
    }
    for (int32_t id = 0; id < t->n_vocab; id++) {
        tok_entry_t *e = &t->tokens[id];
        if (e->added) {
            e->rstrip = 1;
        }
    }
    static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++) {
        int32_t id = tok_find(t, keep[i]);
        if (id >= 0) {
            t->tokens[id].rstrip = 0;
        }
    }
}

int
tok_load_gguf(const gguf_file_t *g, tok_tokenizer_t **out, char *err, size_t errlen)
{
    const char *model, *pre = NULL, *s;
    size_t model_len, pre_len = 0, len;
    gguf_type_t et;
    uint64_t n = 0, n_scores = 0, n_types = 0, n_merges = 0;
    const void *scores = NULL, *types = NULL, *dummy;
    gguf_type_t score_t = GGUF_TYPE_FLOAT32, type_t = GGUF_TYPE_INT32;
    tok_tokenizer_t *t = NULL;
    int rc, spm;
    char name[64];

    if (gguf_get_str(g, "tokenizer.ggml.model", &model, &model_len) != ST_OK) {
        snprintf(err, errlen, "GGUF has no tokenizer.ggml.model");
        return ST_EFORMAT;
    }
    if (model_len == 5 && memcmp(model, "llama", 5) == 0) {
        spm = 1;
    } else if (model_len == 4 && memcmp(model, "gpt2", 4) == 0) {
        spm = 0;
    } else {
        snprintf(err, errlen, "unsupported tokenizer.ggml.model \"%.*s\"", (int)model_len, model);
        return ST_EUNSUPPORTED;
    }
    if (gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &dummy) != ST_OK ||
        et != GGUF_TYPE_STRING || n == 0 || n > (1u << 24)) {
        snprintf(err, errlen, "GGUF tokenizer.ggml.tokens missing or not a string array");
        return ST_EFORMAT;
    }
    if (gguf_get_arr(g, "tokenizer.ggml.scores", &score_t, &n_scores, &scores) == ST_OK &&
        (score_t != GGUF_TYPE_FLOAT32 || n_scores != n)) {
        snprintf(err, errlen, "GGUF tokenizer.ggml.scores: wrong type or length");
        return ST_EFORMAT;
    }
    if (gguf_get_arr(g, "tokenizer.ggml.token_type", &type_t, &n_types, &types) == ST_OK &&
        (type_t != GGUF_TYPE_INT32 || n_types != n)) {
        snprintf(err, errlen, "GGUF tokenizer.ggml.token_type: wrong type or length");
        return ST_EFORMAT;
    }
    if (n_scores == 0) {
        scores = NULL;
    }
    if (n_types == 0) {
        types = NULL;
    }

    t = tok__new((int32_t)n);
    for (uint64_t i = 0; i < n; i++) {
        float score = 0.0f;
        int32_t type = TOK_TYPE_NORMAL;
        if (gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &s, &len) != ST_OK) {
            snprintf(err, errlen, "GGUF token %llu unreadable", (unsigned long long)i);
            rc = ST_EFORMAT;
            goto fail;
        }
        if (scores != NULL) {
            memcpy(&score, (const char *)scores + i * 4, 4);
        }
        if (types != NULL) {
            memcpy(&type, (const char *)types + i * 4, 4);
            if (type < TOK_TYPE_UNDEFINED || type > TOK_TYPE_BYTE) {
                type = TOK_TYPE_NORMAL;
            }
        }
        tok__set_token(t, (int32_t)i, s, len, score, type);
        tok_entry_t *e = &t->tokens[i];
        e->special = type == TOK_TYPE_CONTROL || type == TOK_TYPE_UNKNOWN;
        e->added =
            type == TOK_TYPE_CONTROL || type == TOK_TYPE_UNKNOWN || type == TOK_TYPE_USER_DEFINED;
    }
    tok__build_vocab_hash(t);

    t->bos = get_id_or(g, "tokenizer.ggml.bos_token_id", t->n_vocab);
    t->eos = get_id_or(g, "tokenizer.ggml.eos_token_id", t->n_vocab);
    t->unk = get_id_or(g, "tokenizer.ggml.unknown_token_id", t->n_vocab);
    apply_name_attrs(g, t);

    if (spm) {
        int space_prefix = get_bool_or(g, "tokenizer.ggml.add_space_prefix", 1);
        t->algo = TOK_ALGO_SPM;
        t->byte_fallback = 1;
        t->replace_space = 1;
        t->prefix = space_prefix ? TOK_PREFIX_AFTER_SPECIAL : TOK_PREFIX_NONE;
        t->strip_lead = space_prefix;
        if (t->unk < 0) {
            t->unk = tok_find(t, "<unk>");
        }
    } else {
        const pre_set_t *set = NULL;
        t->algo = TOK_ALGO_BPE;
        t->byte_level = 1;
        if (gguf_get_str(g, "tokenizer.ggml.pre", &pre, &pre_len) != ST_OK) {
            pre = "default";
            pre_len = 7;
        }
        for (size_t i = 0; i < sizeof(k_pre_sets) / sizeof(k_pre_sets[0]); i++) {
            if (strlen(k_pre_sets[i].name) == pre_len &&
                memcmp(k_pre_sets[i].name, pre, pre_len) == 0) {
                set = &k_pre_sets[i];
            }
        }
        if (set == NULL) {
            snprintf(err, errlen, "unsupported tokenizer.ggml.pre \"%.*s\"", (int)pre_len, pre);
            rc = ST_EUNSUPPORTED;
            goto fail;
        }
        for (int i = 0; set->regexes[i] != NULL; i++) {
            rc = tok__add_pre_regex(t, set->regexes[i], strlen(set->regexes[i]), TOK_SPLIT_ISOLATED,
                                    0, err, errlen);
            if (rc != ST_OK) {
                goto fail;
            }
        }
        t->ignore_merges = set->ignore_merges;

        if (gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n_merges, &dummy) != ST_OK ||
            et != GGUF_TYPE_STRING) {
            snprintf(err, errlen, "GGUF gpt2 tokenizer without tokenizer.ggml.merges");
            rc = ST_EFORMAT;
            goto fail;
        }
        for (uint64_t i = 0; i < n_merges; i++) {
            const char *sp;
            if (gguf_get_arr_str(g, "tokenizer.ggml.merges", i, &s, &len) != ST_OK) {
                snprintf(err, errlen, "GGUF merge %llu unreadable", (unsigned long long)i);
                rc = ST_EFORMAT;
                goto fail;
            }
            /* "a b": split at the first space after the first byte. */
            sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
            if (sp == NULL) {
                snprintf(err, errlen, "GGUF merge %llu has no space", (unsigned long long)i);
                rc = ST_EFORMAT;
                goto fail;
            }
            tok__add_merge(t, s, (size_t)(sp - s), sp + 1, len - (size_t)(sp - s) - 1, (int32_t)i);
        }
    }

    if (get_bool_or(g, "tokenizer.ggml.add_bos_token", spm) && t->bos >= 0) {
        t->prefix_ids[t->n_prefix_ids++] = t->bos;
    }
    if (get_bool_or(g, "tokenizer.ggml.add_eos_token", 0) && t->eos >= 0) {
        t->suffix_ids[t->n_suffix_ids++] = t->eos;
    }

    rc = tok__finish(t, err, errlen);
    if (rc != ST_OK) {
        goto fail;
    }
    snprintf(name, sizeof(name), "%.*s", (int)model_len, model);
    LOG_DEBUG("GGUF vocabulary: %s, %d tokens, %u merges", name, t->n_vocab, t->n_merges);
    *out = t;
    return ST_OK;

fail:
    tok_destroy(t);
    return rc;
}
