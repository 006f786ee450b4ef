/* srv_outq.h - a stream's output bytes: appended at the end of a srv_buf_t
 * and read from an offset (issue 15).
 *
 * DESIGN
 *   MHD's content reader takes at most its block (16 KiB) per call; a
 *   client that reads slowly lets a backlog of up to --max-sse-buffer-bytes
 *   build up. Dropping the bytes read with a memmove of the whole backlog
 *   per call made that O(backlog^2). The queue keeps a read offset
 *   instead: the buffer is rewound for free when the reader catches up,
 *   and otherwise compacted only once the bytes read are at least
 *   SRV_OUTQ_COMPACT and at least the bytes unread, so each byte is
 *   moved at most once for every byte read before it (the test checks
 *   moved <= read).
 *
 *   Writers append to buf (srv_buf_add and the builders); buf.len is the
 *   end of the written bytes, and a writer may cut back to a length it
 *   saw (a torn chunk) since reads never move bytes between two writes.
 *
 * Thread: the loop thread (one queue per stream).
 */
#ifndef SERVER_SRV_OUTQ_H
#define SERVER_SRV_OUTQ_H

#include <stddef.h>

#include "server/srv_int.h"

#define SRV_OUTQ_COMPACT (64 * 1024)

typedef struct srv_outq {
    srv_buf_t buf; /* bytes [off, buf.len) are unread */
    size_t off;
    size_t moved; /* bytes moved by compactions so far (for tests) */
} srv_outq_t;

/* Bytes written and not yet read. */
size_t srv_outq_pending(const srv_outq_t *q);
/* Copies up to max unread bytes to dst and returns how many. */
size_t srv_outq_read(srv_outq_t *q, char *dst, size_t max);
void srv_outq_free(srv_outq_t *q);

#endif /* SERVER_SRV_OUTQ_H */
