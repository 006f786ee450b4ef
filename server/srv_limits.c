/* srv_limits.c - request limits checked before costly work
 * (server/srv_limits.h).
 *
 * Thread: any (the request preparation runs on libuv's thread pool,
 * srv_work.h); the per-tokenizer cache is behind a mutex.
 */
#include <pthread.h>
#include <string.h>

#include "server/srv_limits.h"

size_t
srv_prompt_byte_cap(const tok_tokenizer_t *tok, int32_t max_model_len)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static const tok_tokenizer_t *cached_tok;
    static size_t cached_longest;
    size_t longest;

    pthread_mutex_lock(&mu);
    if (tok != cached_tok) {
        int32_t n = tok_vocab_size(tok);

        longest = 1;
        for (int32_t i = 0; i < n; i++) {
            const char *s = tok_token_str(tok, i);
            size_t len = s != NULL ? strlen(s) : 0;

            longest = len > longest ? len : longest;
        }
        cached_tok = tok;
        cached_longest = longest;
    }
    longest = cached_longest;
    pthread_mutex_unlock(&mu);
    /* A few tokens more than the context: BOS and a leading space. */
    return (size_t)SRV_PROMPT_BYTES_PER_TOKEN * longest * ((size_t)max_model_len + 8);
}
