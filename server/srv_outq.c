/* srv_outq.c - a stream's output read from an offset (server/srv_outq.h).
 *
 * Thread: the loop thread.
 */
#include <string.h>

#include "server/srv_outq.h"

size_t
srv_outq_pending(const srv_outq_t *q)
{
    return q->buf.len - q->off;
}

size_t
srv_outq_read(srv_outq_t *q, char *dst, size_t max)
{
    size_t n = srv_outq_pending(q);

    n = n < max ? n : max;
    if (n > 0) {
        memcpy(dst, q->buf.data + q->off, n);
        q->off += n;
    }
    if (q->off == q->buf.len) {
        /* Caught up: rewind for free. */
        q->off = 0;
        q->buf.len = 0;
        if (q->buf.data != NULL) {
            q->buf.data[0] = '\0';
        }
    } else if (q->off >= SRV_OUTQ_COMPACT && q->off >= q->buf.len - q->off) {
        size_t left = q->buf.len - q->off;
        memmove(q->buf.data, q->buf.data + q->off, left);
        q->moved += left;
        q->buf.len = left;
        q->buf.data[left] = '\0';
        q->off = 0;
    }
    return n;
}

void
srv_outq_free(srv_outq_t *q)
{
    srv_buf_free(&q->buf);
    q->off = 0;
}
