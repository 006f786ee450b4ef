/* tok_hf.c - loads a Hugging Face tokenizer.json (BPE model) and, when
 * given, tokenizer_config.json into a tok_tokenizer_t.
 *
 * Supported components (others are rejected with ST_EUNSUPPORTED, so a
 * tokenizer is never silently wrong):
 *   model          BPE: vocab, merges ("a b" strings or [a, b] pairs),
 *                  byte_fallback, ignore_merges, fuse_unk, unk_token
 *   normalizer     Sequence, Prepend("▁"), Replace(" " -> "▁"), NFC (applied
 *                  first, whatever its place in the Sequence: the other two
 *                  commute with it)
 *   pre_tokenizer  Sequence, Split (Regex or String pattern, every
 *                  behaviour, invert), ByteLevel (add_prefix_space,
 *                  use_regex), Digits, Metaspace, Whitespace,
 *                  WhitespaceSplit, Punctuation
 *   post_processor TemplateProcessing (single), ByteLevel, Sequence
 *   decoder        ByteLevel, Replace, ByteFallback, Fuse, Strip,
 *                  Metaspace, Sequence
 * Added tokens are matched in the raw text (also those marked
 * "normalized", which only differs for normalizers that change them).
 * BOS/EOS come from the TemplateProcessing post-processor; an explicit
 * add_bos_token: false or add_eos_token: true in tokenizer_config.json
 * overrides it (the transformers Llama tokenizers do the same); without a
 * template those two flags decide alone.
 *
 * Thread: any; the result is immutable.
 */
#define LOG_MODULE "tokenizer"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "text/tokenizer.h"
#include "text/tokenizer_int.h"

/* Nesting limit for Sequence components (real files use one level). */
#define TOK_HF_MAX_DEPTH 8

/* The GPT-2 pre-tokenizer regex (ByteLevel use_regex). */
static const char k_gpt2_re[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int
read_file(const char *path, char **out, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, n = 0;

    if (f == NULL) {
        int rc = -errno;
        snprintf(err, errlen, "%s: %s", path, st_str(rc));
        return rc;
    }
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 1 << 20;
            buf = xrealloc(buf, cap);
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) {
            break;
        }
    }
    if (ferror(f)) {
        fclose(f);
        free(buf);
        snprintf(err, errlen, "%s: read error", path);
        return ST_EFORMAT;
    }
    fclose(f);
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return ST_OK;
}

static int
jbool(const cJSON *o, const char *key, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

    if (cJSON_IsBool(v)) {
        return cJSON_IsTrue(v);
    }
    return dflt;
}

static const char *
jstr(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* tokenizer_config.json token fields are a string or {"content": ...}. */
static const char *
jtoken_name(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

    if (cJSON_IsString(v)) {
        return v->valuestring;
    }
    if (cJSON_IsObject(v)) {
        return jstr(v, "content");
    }
    return NULL;
}

static int
is_meta(const char *s)
{
    return s != NULL && strcmp(s, "\xE2\x96\x81") == 0;
}

/* Appends a regex that matches the literal s (PCRE2 \Q..\E cannot hold
 * "\E", so escape character by character instead). */
static char *
literal_regex(const char *s)
{
    size_t n = strlen(s);
    char *r = xmalloc(n * 2 + 1);
    size_t k = 0;

    for (size_t i = 0; i < n; i++) {
        if (strchr("\\^$.|?*+()[]{}-/", s[i]) != NULL && s[i] != '\0') {
            r[k++] = '\\';
        }
        r[k++] = s[i];
    }
    r[k] = '\0';
    return r;
}

static int
split_behavior(const char *b)
{
    if (b == NULL || strcmp(b, "Isolated") == 0) {
        return TOK_SPLIT_ISOLATED;
    }
    if (strcmp(b, "Removed") == 0) {
        return TOK_SPLIT_REMOVED;
    }
    if (strcmp(b, "MergedWithPrevious") == 0) {
        return TOK_SPLIT_MERGED_PREV;
    }
    if (strcmp(b, "MergedWithNext") == 0) {
        return TOK_SPLIT_MERGED_NEXT;
    }
    if (strcmp(b, "Contiguous") == 0) {
        return TOK_SPLIT_CONTIGUOUS;
    }
    return -1;
}

static int
load_normalizer(tok_tokenizer_t *t, const cJSON *n, int depth, char *err, size_t errlen)
{
    const char *type;

    if (n == NULL || cJSON_IsNull(n)) {
        return ST_OK;
    }
    type = jstr(n, "type");
    if (type == NULL) {
        snprintf(err, errlen, "normalizer without type");
        return ST_EFORMAT;
    }
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *it;
        if (depth >= TOK_HF_MAX_DEPTH) {
            snprintf(err, errlen, "normalizer Sequence nested too deeply");
            return ST_EFORMAT;
        }
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(n, "normalizers"))
        {
            int rc = load_normalizer(t, it, depth + 1, err, errlen);
            if (rc != ST_OK) {
                return rc;
            }
        }
        return ST_OK;
    }
    if (strcmp(type, "Prepend") == 0 && is_meta(jstr(n, "prepend"))) {
        t->prefix = TOK_PREFIX_EVERY_SEGMENT;
        return ST_OK;
    }
    if (strcmp(type, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *from = jstr(pat, "String");
        if (from != NULL && strcmp(from, " ") == 0 && is_meta(jstr(n, "content"))) {
            t->replace_space = 1;
            return ST_OK;
        }
    }
    if (strcmp(type, "NFC") == 0) {
        t->nfc = 1;
        return ST_OK;
    }
    snprintf(err, errlen, "unsupported normalizer %s", type);
    return ST_EUNSUPPORTED;
}

static int
load_pre(tok_tokenizer_t *t, const cJSON *p, int first, int depth, char *err, size_t errlen)
{
    const char *type;

    if (p == NULL || cJSON_IsNull(p)) {
        return ST_OK;
    }
    type = jstr(p, "type");
    if (type == NULL) {
        snprintf(err, errlen, "pre_tokenizer without type");
        return ST_EFORMAT;
    }
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *it;
        int i = 0;
        if (depth >= TOK_HF_MAX_DEPTH) {
            snprintf(err, errlen, "pre_tokenizer Sequence nested too deeply");
            return ST_EFORMAT;
        }
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(p, "pretokenizers"))
        {
            int rc = load_pre(t, it, first && i == 0, depth + 1, err, errlen);
            if (rc != ST_OK) {
                return rc;
            }
            i++;
        }
        return ST_OK;
    }
    if (strcmp(type, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *re = jstr(pat, "Regex");
        const char *lit = jstr(pat, "String");
        int beh = split_behavior(jstr(p, "behavior"));
        int rc;
        if (beh < 0 || (re == NULL && lit == NULL)) {
            snprintf(err, errlen, "bad Split pre-tokenizer");
            return ST_EFORMAT;
        }
        if (re != NULL) {
            return tok__add_pre_regex(t, re, strlen(re), beh, jbool(p, "invert", 0), err, errlen);
        }
        char *r = literal_regex(lit);
        rc = tok__add_pre_regex(t, r, strlen(r), beh, jbool(p, "invert", 0), err, errlen);
        free(r);
        return rc;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        t->byte_level = 1;
        if (jbool(p, "add_prefix_space", 0)) {
            if (!first) {
                snprintf(err, errlen, "ByteLevel add_prefix_space after another pre-tokenizer");
                return ST_EUNSUPPORTED;
            }
            t->bl_prefix_space = 1;
        }
        if (jbool(p, "use_regex", 1)) {
            return tok__add_pre_regex(t, k_gpt2_re, strlen(k_gpt2_re), TOK_SPLIT_ISOLATED, 0, err,
                                      errlen);
        }
        return ST_OK;
    }
    if (strcmp(type, "Digits") == 0) {
        const char *re = jbool(p, "individual_digits", 0) ? "[0-9]" : "[0-9]+"; /* ASCII, as HF */
        return tok__add_pre_regex(t, re, strlen(re), TOK_SPLIT_ISOLATED, 0, err, errlen);
    }
    if (strcmp(type, "Whitespace") == 0) {
        const char *re = "\\w+|[^\\w\\s]+";
        return tok__add_pre_regex(t, re, strlen(re), TOK_SPLIT_REMOVED, 1, err, errlen);
    }
    if (strcmp(type, "WhitespaceSplit") == 0) {
        return tok__add_pre_regex(t, "\\s+", 3, TOK_SPLIT_REMOVED, 0, err, errlen);
    }
    if (strcmp(type, "Punctuation") == 0) {
        int beh = split_behavior(jstr(p, "behavior"));
        return tok__add_pre_regex(t, "\\p{P}", 5, beh < 0 ? TOK_SPLIT_ISOLATED : beh, 0, err,
                                  errlen);
    }
    if (strcmp(type, "Metaspace") == 0) {
        const char *scheme = jstr(p, "prepend_scheme");
        if (!first || !is_meta(jstr(p, "replacement"))) {
            snprintf(err, errlen, "unsupported Metaspace configuration");
            return ST_EUNSUPPORTED;
        }
        /* prepend_scheme (or the older add_prefix_space): "always" gives
         * every segment a "▁" unless it starts with a space already,
         * "first" only the segment at the start of the text. */
        t->prefix = jbool(p, "add_prefix_space", 1) ? TOK_PREFIX_EVERY_SEGMENT : TOK_PREFIX_NONE;
        if (scheme != NULL) {
            t->prefix = strcmp(scheme, "always") == 0  ? TOK_PREFIX_EVERY_SEGMENT
                        : strcmp(scheme, "first") == 0 ? TOK_PREFIX_FIRST_SEGMENT
                                                       : TOK_PREFIX_NONE;
        }
        t->prefix_if_absent = 1;
        t->replace_space = 1;
        if (jbool(p, "split", 1)) {
            return tok__add_pre_regex(t, "\xE2\x96\x81", 3, TOK_SPLIT_MERGED_NEXT, 0, err, errlen);
        }
        return ST_OK;
    }
    snprintf(err, errlen, "unsupported pre_tokenizer %s", type);
    return ST_EUNSUPPORTED;
}

static int
load_decoder(tok_tokenizer_t *t, const cJSON *d, int depth, char *err, size_t errlen)
{
    const char *type;

    if (d == NULL || cJSON_IsNull(d)) {
        return ST_OK;
    }
    type = jstr(d, "type");
    if (type == NULL) {
        snprintf(err, errlen, "decoder without type");
        return ST_EFORMAT;
    }
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *it;
        if (depth >= TOK_HF_MAX_DEPTH) {
            snprintf(err, errlen, "decoder Sequence nested too deeply");
            return ST_EFORMAT;
        }
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(d, "decoders"))
        {
            int rc = load_decoder(t, it, depth + 1, err, errlen);
            if (rc != ST_OK) {
                return rc;
            }
        }
        return ST_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        t->byte_level = 1;
        return ST_OK;
    }
    if (strcmp(type, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(d, "pattern");
        if (is_meta(jstr(pat, "String")) &&
            strcmp(jstr(d, "content") ? jstr(d, "content") : "", " ") == 0) {
            t->replace_space = 1;
            return ST_OK;
        }
    }
    if (strcmp(type, "ByteFallback") == 0 || strcmp(type, "Fuse") == 0) {
        return ST_OK;
    }
    if (strcmp(type, "Strip") == 0) {
        const char *c = jstr(d, "content");
        const cJSON *start = cJSON_GetObjectItemCaseSensitive(d, "start");
        if (c != NULL && strcmp(c, " ") == 0 && cJSON_IsNumber(start) && start->valueint >= 1) {
            t->strip_lead = 1;
        }
        return ST_OK;
    }
    if (strcmp(type, "Metaspace") == 0) {
        const char *scheme = jstr(d, "prepend_scheme");
        int prepend = jbool(d, "add_prefix_space", 1);
        if (scheme != NULL) {
            prepend = strcmp(scheme, "never") != 0;
        }
        t->replace_space = 1;
        t->strip_lead = prepend;
        return ST_OK;
    }
    snprintf(err, errlen, "unsupported decoder %s", type);
    return ST_EUNSUPPORTED;
}

static int32_t
special_ids(const cJSON *specials, const char *name, int32_t *out, int max)
{
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(specials, name);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(st, "ids");
    const cJSON *it;
    int n = 0;

    cJSON_ArrayForEach(it, ids)
    {
        if (n < max && cJSON_IsNumber(it)) {
            out[n++] = (int32_t)it->valuedouble;
        }
    }
    return n;
}

/* Returns 1 when a TemplateProcessing was found (and applied). */
static int
load_post(tok_tokenizer_t *t, const cJSON *p, int depth)
{
    const char *type;

    if (p == NULL || cJSON_IsNull(p)) {
        return 0;
    }
    type = jstr(p, "type");
    if (type == NULL) {
        return 0;
    }
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *it;
        int found = 0;
        if (depth >= TOK_HF_MAX_DEPTH) {
            return 0;
        }
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(p, "processors"))
        {
            found |= load_post(t, it, depth + 1);
        }
        return found;
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
        const cJSON *it;
        int after = 0;
        t->n_prefix_ids = t->n_suffix_ids = 0;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(p, "single"))
        {
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
            if (sp == NULL) {
                after = 1; /* the Sequence item */
                continue;
            }
            const char *name = jstr(sp, "id");
            if (name == NULL) {
                continue;
            }
            if (after) {
                t->n_suffix_ids += special_ids(specials, name, t->suffix_ids + t->n_suffix_ids,
                                               TOK_MAX_AFFIX - t->n_suffix_ids);
            } else {
                t->n_prefix_ids += special_ids(specials, name, t->prefix_ids + t->n_prefix_ids,
                                               TOK_MAX_AFFIX - t->n_prefix_ids);
            }
        }
        return 1;
    }
    return 0;
}

static int
load_model(tok_tokenizer_t **out, const cJSON *root, char *err, size_t errlen)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const char *type = jstr(model, "type");
    const cJSON *it;
    int64_t max_id = -1;
    tok_tokenizer_t *t;
    int32_t rank = 0;

    if (!cJSON_IsObject(model) || !cJSON_IsObject(vocab)) {
        snprintf(err, errlen, "tokenizer.json: no model.vocab object");
        return ST_EFORMAT;
    }
    if (type != NULL && strcmp(type, "BPE") != 0) {
        snprintf(err, errlen, "tokenizer.json: unsupported model type %s", type);
        return ST_EUNSUPPORTED;
    }
    cJSON_ArrayForEach(it, vocab)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 16777216.0) {
            snprintf(err, errlen, "tokenizer.json: bad id for token");
            return ST_EFORMAT;
        }
        if ((int64_t)it->valuedouble > max_id) {
            max_id = (int64_t)it->valuedouble;
        }
    }
    cJSON_ArrayForEach(it, added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 16777216.0 ||
            !jstr(it, "content")) {
            snprintf(err, errlen, "tokenizer.json: bad added token");
            return ST_EFORMAT;
        }
        if ((int64_t)id->valuedouble > max_id) {
            max_id = (int64_t)id->valuedouble;
        }
    }
    if (max_id < 0) {
        snprintf(err, errlen, "tokenizer.json: empty vocabulary");
        return ST_EFORMAT;
    }
    /* Ids are dense in practice; refuse to allocate for a few huge ids. */
    if (max_id >= 2 * (int64_t)(cJSON_GetArraySize(vocab) + cJSON_GetArraySize(added)) + 1024) {
        snprintf(err, errlen, "tokenizer.json: token ids are too sparse (max id %lld)",
                 (long long)max_id);
        return ST_EFORMAT;
    }

    t = tok__new((int32_t)(max_id + 1));
    cJSON_ArrayForEach(it, vocab)
    {
        tok__set_token(t, (int32_t)it->valuedouble, it->string, strlen(it->string), 0.0f,
                       TOK_TYPE_NORMAL);
    }
    cJSON_ArrayForEach(it, added)
    {
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
        const char *content = jstr(it, "content");
        int special = jbool(it, "special", 0);
        tok__set_token(t, id, content, strlen(content), 0.0f,
                       special ? TOK_TYPE_CONTROL : TOK_TYPE_USER_DEFINED);
        t->tokens[id].added = 1;
        t->tokens[id].special = (uint8_t)special;
        t->tokens[id].lstrip = (uint8_t)jbool(it, "lstrip", 0);
        t->tokens[id].rstrip = (uint8_t)jbool(it, "rstrip", 0);
    }
    tok__build_vocab_hash(t);

    t->algo = TOK_ALGO_BPE;
    t->byte_fallback = jbool(model, "byte_fallback", 0);
    t->ignore_merges = jbool(model, "ignore_merges", 0);
    t->fuse_unk = jbool(model, "fuse_unk", 0);
    if (jstr(model, "unk_token") != NULL) {
        t->unk = tok_find(t, jstr(model, "unk_token"));
    }

    cJSON_ArrayForEach(it, merges)
    {
        if (cJSON_IsString(it)) {
            const char *s = it->valuestring;
            const char *sp = strchr(s, ' ');
            if (sp == NULL) {
                snprintf(err, errlen, "tokenizer.json: bad merge \"%.40s\"", s);
                tok_destroy(t);
                return ST_EFORMAT;
            }
            tok__add_merge(t, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), rank);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            const char *a = cJSON_GetArrayItem(it, 0)->valuestring;
            const char *b = cJSON_GetArrayItem(it, 1)->valuestring;
            tok__add_merge(t, a, strlen(a), b, strlen(b), rank);
        } else {
            snprintf(err, errlen, "tokenizer.json: bad merge entry");
            tok_destroy(t);
            return ST_EFORMAT;
        }
        rank++;
    }
    *out = t;
    return ST_OK;
}

int
tok_load_hf(const char *tokenizer_json, const char *tokenizer_config_json, tok_tokenizer_t **out,
            char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    cJSON *root = NULL, *cfg = NULL;
    tok_tokenizer_t *t = NULL;
    int rc, have_template;

    rc = read_file(tokenizer_json, &text, &len, err, errlen);
    if (rc != ST_OK) {
        return rc;
    }
    root = cJSON_ParseWithLength(text, len);
    free(text);
    if (root == NULL) {
        snprintf(err, errlen, "%s: not valid JSON", tokenizer_json);
        return ST_EFORMAT;
    }
    if (tokenizer_config_json != NULL) {
        rc = read_file(tokenizer_config_json, &text, &len, err, errlen);
        if (rc != ST_OK) {
            goto fail;
        }
        cfg = cJSON_ParseWithLength(text, len);
        free(text);
        if (cfg == NULL) {
            snprintf(err, errlen, "%s: not valid JSON", tokenizer_config_json);
            rc = ST_EFORMAT;
            goto fail;
        }
    }

    rc = load_model(&t, root, err, errlen);
    if (rc != ST_OK) {
        goto fail;
    }
    rc = load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), 0, err, errlen);
    if (rc == ST_OK) {
        rc =
            load_pre(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), 1, 0, err, errlen);
    }
    if (rc == ST_OK) {
        rc = load_decoder(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"), 0, err, errlen);
    }
    if (rc != ST_OK) {
        goto fail;
    }
    have_template = load_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), 0);

    /* BOS / EOS: the config's names, else the template's first id. */
    if (cfg != NULL) {
        const char *bos = jtoken_name(cfg, "bos_token");
        const char *eos = jtoken_name(cfg, "eos_token");
        t->bos = bos ? tok_find(t, bos) : -1;
        t->eos = eos ? tok_find(t, eos) : -1;
        if (!have_template) {
            if (jbool(cfg, "add_bos_token", 0) && t->bos >= 0) {
                t->prefix_ids[t->n_prefix_ids++] = t->bos;
            }
            if (jbool(cfg, "add_eos_token", 0) && t->eos >= 0) {
                t->suffix_ids[t->n_suffix_ids++] = t->eos;
            }
        } else {
            /* An explicit config flag wins over the template, as the
             * transformers Llama tokenizer rebuilds its template from it. */
            if (jbool(cfg, "add_bos_token", 1) == 0 && t->n_prefix_ids > 0 &&
                t->prefix_ids[0] == t->bos) {
                memmove(t->prefix_ids, t->prefix_ids + 1,
                        (size_t)(--t->n_prefix_ids) * sizeof(int32_t));
            }
            if (jbool(cfg, "add_eos_token", 0) && t->eos >= 0 && t->n_suffix_ids < TOK_MAX_AFFIX &&
                (t->n_suffix_ids == 0 || t->suffix_ids[t->n_suffix_ids - 1] != t->eos)) {
                t->suffix_ids[t->n_suffix_ids++] = t->eos;
            }
        }
    }
    if (t->bos < 0 && t->n_prefix_ids > 0) {
        t->bos = t->prefix_ids[0];
    }
    if (t->bos < 0) {
        t->bos = tok_find(t, "<s>");
    }
    if (t->eos < 0) {
        static const char *const names[] = {"</s>", "<|end_of_text|>", "<|endoftext|>",
                                            "<|im_end|>"};
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && t->eos < 0; i++) {
            t->eos = tok_find(t, names[i]);
        }
    }
    for (int i = 0; i < t->n_prefix_ids; i++) {
        if (t->prefix_ids[i] < 0 || t->prefix_ids[i] >= t->n_vocab) {
            snprintf(err, errlen, "post_processor names an unknown token id");
            rc = ST_EFORMAT;
            goto fail;
        }
    }
    for (int i = 0; i < t->n_suffix_ids; i++) {
        if (t->suffix_ids[i] < 0 || t->suffix_ids[i] >= t->n_vocab) {
            snprintf(err, errlen, "post_processor names an unknown token id");
            rc = ST_EFORMAT;
            goto fail;
        }
    }

    rc = tok__finish(t, err, errlen);
    if (rc != ST_OK) {
        goto fail;
    }
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    LOG_DEBUG("loaded %s: %d tokens, %u merges, %d pre-tokenizer steps", tokenizer_json, t->n_vocab,
              t->n_merges, t->n_pre);
    *out = t;
    return ST_OK;

fail:
    tok_destroy(t);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    return rc;
}
