/* kv_policy.c - attention sinks with a rolling window: the policy's parse
 * (model/kv_policy.h).
 */
#include <stdio.h>
#include <string.h>

#include "common/status.h"
#include "model/kv_policy.h"

int
mdl_kv_policy_parse(const char *s, int32_t block_size, mdl_kv_policy_t *out, char *err,
                    size_t errlen)
{
    int sink = -1, window = -1, used = 0;

    if (s == NULL || strcmp(s, "full") == 0 || s[0] == '\0') {
        out->sink = out->window = 0;
        return ST_OK;
    }
    if (sscanf(s, "sink=%d,window=%d%n", &sink, &window, &used) != 2 || s[used] != '\0' ||
        sink < 0 || window <= 0) {
        snprintf(err, errlen, "kv policy '%s': expected full or sink=S,window=W (S >= 0, W > 0)",
                 s);
        return ST_EINVAL;
    }
    if (block_size <= 0 || sink % block_size != 0 || window % block_size != 0) {
        snprintf(err, errlen, "kv policy '%s': sink and window must be whole blocks of %d tokens",
                 s, block_size);
        return ST_EINVAL;
    }
    out->sink = sink;
    out->window = window;
    return ST_OK;
}
