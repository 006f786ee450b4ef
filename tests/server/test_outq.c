/* test_outq.c - a stream's output queue (server/srv_outq.h): bytes come out
 * in order whatever the read sizes and however appends and reads
 * interleave, and a slow reader's backlog is not moved once per read. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "server/srv_outq.h"

/* Byte i of the test stream. */
static char
byte_at(size_t i)
{
    return (char)('a' + (i * 7 + i / 251) % 26);
}

static void
append(srv_outq_t *q, size_t *written, size_t n)
{
    char tmp[4096];

    while (n > 0) {
        size_t k = n < sizeof(tmp) ? n : sizeof(tmp);
        for (size_t i = 0; i < k; i++) {
            tmp[i] = byte_at(*written + i);
        }
        srv_buf_add(&q->buf, tmp, k);
        ck_assert(!q->buf.oom);
        *written += k;
        n -= k;
    }
}

static void
read_check(srv_outq_t *q, size_t *read, size_t max)
{
    char *dst = malloc(max + 1), *want = malloc(max + 1);
    size_t n = srv_outq_read(q, dst, max);

    for (size_t i = 0; i < n; i++) {
        want[i] = byte_at(*read + i);
    }
    /* One check per read: Check's asserts cost a pipe write each. */
    ck_assert_msg(memcmp(dst, want, n) == 0, "bytes out of order at %zu", *read);
    *read += n;
    free(dst);
    free(want);
}

START_TEST(test_outq_order_and_moves)
{
    /* A slow reader: 16 KiB reads (MHD's block) every 8 appends of
     * ~2.9 KB, so the backlog grows by ~7 KB per read to several MiB. */
    srv_outq_t q = {0};
    size_t written = 0, read = 0, peak = 0;

    for (int round = 0; round < 4000; round++) {
        append(&q, &written, 2000 + (size_t)(round % 7) * 300);
        if (round % 8 == 0) {
            read_check(&q, &read, 16 * 1024 - (size_t)round % 5);
        }
        peak = srv_outq_pending(&q) > peak ? srv_outq_pending(&q) : peak;
    }
    ck_assert_uint_eq(srv_outq_pending(&q), written - read);
    ck_assert_uint_gt(peak, (size_t)3 << 20);
    while (srv_outq_pending(&q) > 0) {
        read_check(&q, &read, 16 * 1024);
    }
    ck_assert_uint_eq(read, written);
    /* Each byte moved at most once per byte read before it: a memmove
     * per read would have moved hundreds of times more. */
    ck_assert_uint_le(q.moved, read);
    /* Caught up: the buffer was rewound. */
    ck_assert_uint_eq(q.buf.len, 0);
    ck_assert_uint_eq(q.off, 0);
    srv_outq_free(&q);
}
END_TEST

START_TEST(test_outq_cut_back_between_reads)
{
    /* A writer that tears a chunk cuts buf.len back to what it saw; a read
     * in between never moves the bytes under it. */
    srv_outq_t q = {0};
    char out[64];

    srv_buf_adds(&q.buf, "data: one\n\n");
    ck_assert_uint_eq(srv_outq_read(&q, out, 5), 5);
    size_t mark = q.buf.len;
    srv_buf_adds(&q.buf, "data: tor");
    q.buf.len = mark;
    srv_buf_adds(&q.buf, "data: two\n\n");
    size_t n = srv_outq_read(&q, out, sizeof(out));
    out[n] = '\0';
    ck_assert_str_eq(out, " one\n\ndata: two\n\n");
    ck_assert_uint_eq(srv_outq_pending(&q), 0);
    ck_assert_uint_eq(srv_outq_read(&q, out, sizeof(out)), 0);
    srv_outq_free(&q);
}
END_TEST

Suite *
server_outq_suite(void)
{
    Suite *s = suite_create("server_outq");
    TCase *tc = tcase_create("outq");

    tcase_add_test(tc, test_outq_order_and_moves);
    tcase_add_test(tc, test_outq_cut_back_between_reads);
    suite_add_tcase(s, tc);
    return s;
}
