/* srv_grammar.c - see srv_grammar.h.
 *
 * Thread: loop thread.
 */
#define LOG_MODULE "grammar"

#include "server/srv_grammar.h"

#include <stdlib.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"

gr_vocab_t *
srv_grammar_vocab(const tok_tokenizer_t *tok, const int32_t *eos_ids, int32_t n_eos)
{
    int32_t n = tok_vocab_size(tok);
    const char **bytes = xcalloc((size_t)n, sizeof(char *));
    uint32_t *lens = xcalloc((size_t)n, sizeof(uint32_t));
    gr_vocab_t *v = NULL;

    tok_output_bytes(tok, bytes, lens);
    if (gr_vocab_create(n, bytes, lens, eos_ids, n_eos, &v) != ST_OK) {
        v = NULL;
    }
    free(bytes);
    free(lens);
    return v;
}

int
srv_grammar_compile(const gr_vocab_t *vocab, const srv_constraint_t *c, gr_grammar_t **out,
                    srv_error_t *err)
{
    static const struct {
        int kind;
        gr_kind_t gk;
        const char *param;
    } map[] = {
        {SRV_CONSTRAINT_JSON_OBJECT, GR_KIND_JSON_OBJECT, "response_format"},
        {SRV_CONSTRAINT_JSON_SCHEMA, GR_KIND_JSON_SCHEMA, "response_format"},
        {SRV_CONSTRAINT_GBNF, GR_KIND_GBNF, "grammar"},
        {SRV_CONSTRAINT_REGEX, GR_KIND_REGEX, "structured_outputs.regex"},
        {SRV_CONSTRAINT_CHOICE, GR_KIND_CHOICE, "structured_outputs.choice"},
    };
    char msg[256];

    *out = NULL;
    if (c->kind == SRV_CONSTRAINT_NONE) {
        return 1;
    }
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        if (map[i].kind != c->kind) {
            continue;
        }
        if (vocab == NULL) {
            srv_err_set(err, 400, map[i].param, "structured output is not available");
            return 0;
        }
        int rc = gr_compile(map[i].gk, c->spec, vocab, out, msg, sizeof(msg));
        if (rc != ST_OK) {
            srv_err_set(err, rc == ST_ENOMEM ? 503 : 400, map[i].param, "%s", msg);
            return 0;
        }
        return 1;
    }
    srv_err_set(err, 400, NULL, "unknown structured output kind %d", c->kind);
    return 0;
}
