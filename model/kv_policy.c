/* kv_policy.c - the parse of the KV policies (model/kv_policy.h):
 * attention sinks with a rolling window, H2O heavy hitters, SnapKV.
 */
#include <stdio.h>
#include <string.h>

#include "common/status.h"
#include "model/kv_policy.h"

int32_t
mdl_kv_policy_slack(int32_t block_size)
{
    return block_size / 4 > 1 ? block_size / 4 : 1;
}

/* h2o=B,recent=W or snapkv=B,window=W[,pool=K]; 0: not one of them. */
static int
parse_score(const char *s, int32_t block_size, mdl_kv_policy_t *out, char *err, size_t errlen,
            int *rc)
{
    int b = -1, w = -1, k = 1, used = 0;

    if (strncmp(s, "h2o=", 4) == 0) {
        if (sscanf(s, "h2o=%d,recent=%d%n", &b, &w, &used) != 2 || s[used] != '\0' || w < 1 ||
            b <= w + mdl_kv_policy_slack(block_size)) {
            snprintf(err, errlen,
                     "kv policy '%s': expected h2o=B,recent=W in tokens with W >= 1 and "
                     "B > W + %d",
                     s, mdl_kv_policy_slack(block_size));
            *rc = ST_EINVAL;
            return 1;
        }
        out->kind = MDL_KVP_H2O;
    } else if (strncmp(s, "snapkv=", 7) == 0) {
        int n = sscanf(s, "snapkv=%d,window=%d%n,pool=%d%n", &b, &w, &used, &k, &used);
        if ((n != 2 && n != 3) || s[used] != '\0' || w < 1 || b <= w || k < 1) {
            snprintf(err, errlen,
                     "kv policy '%s': expected snapkv=B,window=W,pool=K in tokens with "
                     "1 <= W < B and K >= 1",
                     s);
            *rc = ST_EINVAL;
            return 1;
        }
        out->kind = MDL_KVP_SNAPKV;
    } else {
        return 0;
    }
    out->budget = b;
    out->recent = w;
    out->pool = k;
    *rc = ST_OK;
    return 1;
}

int
mdl_kv_policy_parse(const char *s, int32_t block_size, mdl_kv_policy_t *out, char *err,
                    size_t errlen)
{
    int sink = -1, window = -1, used = 0, rc;

    memset(out, 0, sizeof(*out));
    if (s == NULL || strcmp(s, "full") == 0 || s[0] == '\0') {
        return ST_OK;
    }
    if (parse_score(s, block_size, out, err, errlen, &rc)) {
        return rc;
    }
    if (sscanf(s, "sink=%d,window=%d%n", &sink, &window, &used) != 2 || s[used] != '\0' ||
        sink < 0 || window <= 0) {
        snprintf(err, errlen,
                 "kv policy '%s': expected full, sink=S,window=W (S >= 0, W > 0), "
                 "h2o=B,recent=W or snapkv=B,window=W,pool=K",
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
