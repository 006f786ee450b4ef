/* test_common.c - channel, list, UTF-8, SHA-256 and status helpers. */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/chan.h"
#include "common/list.h"
#include "common/status.h"
#include "common/util.h"
#include "common/xmalloc.h"

Suite *common_utf8_suite(void); /* test_utf8.c */

typedef struct num_msg {
    msg_t hdr;
    int value;
} num_msg_t;

static void *
producer(void *arg)
{
    chan_t *ch = arg;
    for (int i = 0; i < 10000; i++) {
        num_msg_t *m = xmalloc(sizeof(*m));
        m->value = i;
        chan_send(ch, &m->hdr);
    }
    return NULL;
}

START_TEST(test_chan_fifo_across_threads)
{
    chan_t ch;
    pthread_t th;
    int expect = 0;

    chan_init(&ch, NULL, NULL);
    ck_assert_int_eq(pthread_create(&th, NULL, producer, &ch), 0);
    while (expect < 10000) {
        msg_t *m = chan_wait_all(&ch, 1000);
        while (m != NULL) {
            msg_t *next = m->next;
            ck_assert_int_eq(((num_msg_t *)m)->value, expect);
            expect++;
            free(m);
            m = next;
        }
    }
    pthread_join(th, NULL);
    ck_assert_ptr_null(chan_take_all(&ch));
    chan_fini(&ch);
}
END_TEST

static int wakes;

static void
count_wake(chan_t *ch, void *arg)
{
    (void)ch;
    (void)arg;
    wakes++;
}

START_TEST(test_chan_wakes_only_on_empty_to_nonempty)
{
    chan_t ch;
    num_msg_t a, b, c;

    wakes = 0;
    chan_init(&ch, count_wake, NULL);
    chan_send(&ch, &a.hdr);
    chan_send(&ch, &b.hdr);
    ck_assert_int_eq(wakes, 1);
    ck_assert_ptr_eq(chan_take_all(&ch), &a.hdr);
    chan_send(&ch, &c.hdr);
    ck_assert_int_eq(wakes, 2);
    ck_assert_ptr_eq(chan_wait_all(&ch, 0), &c.hdr);
    ck_assert_ptr_null(chan_wait_all(&ch, 10));
    chan_fini(&ch);
}
END_TEST

START_TEST(test_chan_send_list_is_one_step)
{
    chan_t ch;
    num_msg_t a, b, c, d;
    msg_t *m;
    int v = 0;

    wakes = 0;
    chan_init(&ch, count_wake, NULL);
    a.value = 0;
    b.value = 1;
    c.value = 2;
    d.value = 3;
    chan_send(&ch, &a.hdr);
    b.hdr.next = &c.hdr;
    c.hdr.next = &d.hdr;
    d.hdr.next = NULL;
    chan_send_list(&ch, &b.hdr);
    chan_send_list(&ch, NULL);
    ck_assert_int_eq(wakes, 1); /* not empty before the list */
    for (m = chan_take_all(&ch); m != NULL; m = m->next) {
        ck_assert_int_eq(((num_msg_t *)m)->value, v++);
    }
    ck_assert_int_eq(v, 4);
    /* Into an empty channel: one wake, and the tail is the list's last. */
    chan_send_list(&ch, &b.hdr);
    ck_assert_int_eq(wakes, 2);
    chan_send(&ch, &a.hdr);
    v = 0;
    for (m = chan_take_all(&ch); m != NULL; m = m->next) {
        ck_assert_int_eq(((num_msg_t *)m)->value, (v + 1) % 4);
        v++;
    }
    ck_assert_int_eq(v, 4);
    chan_fini(&ch);
}
END_TEST

typedef struct item {
    list_node_t node;
    int v;
} item_t;

START_TEST(test_list_order_and_remove)
{
    list_node_t head, *it;
    item_t items[4];
    int seen[4], n = 0;

    list_init(&head);
    ck_assert(list_empty(&head));
    for (int i = 0; i < 4; i++) {
        items[i].v = i;
        list_push_back(&head, &items[i].node);
    }
    list_remove(&items[1].node);
    list_push_front(&head, &items[1].node);
    LIST_FOREACH(it, &head)
    {
        seen[n++] = LIST_ENTRY(it, item_t, node)->v;
    }
    ck_assert_int_eq(n, 4);
    ck_assert_int_eq(seen[0], 1);
    ck_assert_int_eq(seen[1], 0);
    ck_assert_int_eq(seen[2], 2);
    ck_assert_int_eq(seen[3], 3);
}
END_TEST

START_TEST(test_utf8_validation)
{
    ck_assert(utf8_valid("abc", 3));
    ck_assert(utf8_valid("\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80", 9));
    ck_assert(!utf8_valid("\xc0\xaf", 2));         /* overlong */
    ck_assert(!utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    ck_assert(!utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    ck_assert(!utf8_valid("\xe6\x97", 2));         /* truncated */
    ck_assert_uint_eq(utf8_complete_prefix("ab\xe6\x97", 4), 2);
    ck_assert_uint_eq(utf8_complete_prefix("ab\xe6\x97\xa5", 5), 5);
    ck_assert_uint_eq(utf8_complete_prefix("a\xff", 2), 2);
}
END_TEST

START_TEST(test_sha256_and_ct_equal)
{
    char hex[65];

    sha256_hex("abc", 3, hex);
    ck_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    ck_assert(ct_equal("secret", "secret", 6));
    ck_assert(!ct_equal("secret", "secreT", 6));
}
END_TEST

START_TEST(test_status_strings)
{
    ck_assert_str_eq(st_str(ST_EAGAIN), strerror(EAGAIN));
    ck_assert_str_eq(st_str(ST_EFORMAT), "malformed input");
    ck_assert_ptr_nonnull(st_str(-99999));
}
END_TEST

START_TEST(test_xmalloc_fault_injection)
{
    void *p;

    xmalloc_fail_after(2);
    p = xmalloc_try(8);
    ck_assert_ptr_nonnull(p);
    free(p);
    ck_assert_ptr_null(xmalloc_try(8));
    p = xmalloc_try(8);
    ck_assert_ptr_nonnull(p);
    free(p);
}
END_TEST

int
main(void)
{
    Suite *s = suite_create("common");
    TCase *tc = tcase_create("core");
    SRunner *sr;
    int failed;

    tcase_add_test(tc, test_chan_fifo_across_threads);
    tcase_add_test(tc, test_chan_wakes_only_on_empty_to_nonempty);
    tcase_add_test(tc, test_chan_send_list_is_one_step);
    tcase_add_test(tc, test_list_order_and_remove);
    tcase_add_test(tc, test_utf8_validation);
    tcase_add_test(tc, test_sha256_and_ct_equal);
    tcase_add_test(tc, test_status_strings);
    tcase_add_test(tc, test_xmalloc_fault_injection);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_add_suite(sr, common_utf8_suite());
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
