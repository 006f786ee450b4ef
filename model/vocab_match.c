/* vocab_match.c - do two models share a vocabulary (model/model.h,
 * mdl_model_vocab_match)? A draft model for speculative decoding must:
 * its token ids are verified by the target as the target's own.
 *
 * Thread: any (models are immutable).
 */
#include <stdio.h>
#include <string.h>

#include "common/status.h"
#include "model/model.h"
#include "text/tokenizer.h"

int
mdl_model_vocab_match(const mdl_model_t *a, const mdl_model_t *b, char *err, size_t errlen)
{
    const mdl_config_t *ca = mdl_model_config(a), *cb = mdl_model_config(b);
    const tok_tokenizer_t *ta = mdl_model_tokenizer(a), *tb = mdl_model_tokenizer(b);

    if (ca->vocab_size != cb->vocab_size || tok_vocab_size(ta) != tok_vocab_size(tb)) {
        snprintf(err, errlen, "vocabulary of %d tokens (tokenizer %d), the target's %d (%d)",
                 cb->vocab_size, tok_vocab_size(tb), ca->vocab_size, tok_vocab_size(ta));
        return ST_EINVAL;
    }
    for (int32_t id = 0; id < tok_vocab_size(ta); id++) {
        size_t la = 0, lb = 0;
        const char *xa = tok_token_bytes(ta, id, &la), *xb = tok_token_bytes(tb, id, &lb);

        if (la != lb || (la > 0 && memcmp(xa, xb, la) != 0)) {
            snprintf(err, errlen, "token %d differs from the target's", id);
            return ST_EINVAL;
        }
    }
    return ST_OK;
}
