/* test_utf8.c - common/utf8.h: encode and decode of one character. */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include "common/utf8.h"

/* Every scalar value survives encode then decode, in the shortest form;
 * one byte short it reads as cut, not malformed. Counted, then checked
 * once (a million ck_asserts would outlast the test timeout). */
START_TEST(test_utf8_round_trip)
{
    uint32_t bad = 0, first_bad = 0;

    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        char u[4];
        uint32_t back = 0xFFFFFFFFu;
        int n, ok;

        if (cp >= 0xD800 && cp < 0xE000) {
            continue;
        }
        n = utf8_encode(cp, u);
        ok = n == (cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4) &&
             utf8_lead_len((uint8_t)u[0]) == n &&
             utf8_decode((const uint8_t *)u, (size_t)n, &back) == n && back == cp &&
             (n == 1 || utf8_decode((const uint8_t *)u, (size_t)n - 1, NULL) == -1);
        if (!ok && bad++ == 0) {
            first_bad = cp;
        }
    }
    ck_assert_msg(bad == 0, "%u code points fail, the first U+%04X", bad, first_bad);
}
END_TEST

START_TEST(test_utf8_encode_bytes)
{
    char u[4];

    ck_assert_int_eq(utf8_encode(0x24, u), 1);
    ck_assert_int_eq(memcmp(u, "\x24", 1), 0);
    ck_assert_int_eq(utf8_encode(0xE9, u), 2);
    ck_assert_int_eq(memcmp(u, "\xc3\xa9", 2), 0);
    ck_assert_int_eq(utf8_encode(0x2581, u), 3);
    ck_assert_int_eq(memcmp(u, "\xe2\x96\x81", 3), 0);
    ck_assert_int_eq(utf8_encode(0x1F600, u), 4);
    ck_assert_int_eq(memcmp(u, "\xf0\x9f\x98\x80", 4), 0);
    /* Not checked: a surrogate is written as its three bytes. */
    ck_assert_int_eq(utf8_encode(0xD800, u), 3);
    ck_assert_int_eq(memcmp(u, "\xed\xa0\x80", 3), 0);
}
END_TEST

/* Ill-formed input gives 0 (and leaves *cp alone), a cut one -1. */
START_TEST(test_utf8_decode_rejects)
{
    static const struct {
        const char *s;
        size_t n;
        int want;
    } cases[] = {
        {"\x80", 1, 0},             /* lone continuation byte */
        {"\xc0\xaf", 2, 0},         /* overlong, C0 never leads */
        {"\xc1\xbf", 2, 0},         /* overlong */
        {"\xe0\x80\xaf", 3, 0},     /* overlong 3-byte */
        {"\xed\xa0\x80", 3, 0},     /* surrogate */
        {"\xf0\x80\x80\xaf", 4, 0}, /* overlong 4-byte */
        {"\xf4\x90\x80\x80", 4, 0}, /* above U+10FFFF */
        {"\xf5\x80\x80\x80", 4, 0}, /* F5 never leads */
        {"\xff", 1, 0},
        {"\xc3\x28", 2, 0},         /* second byte not a continuation */
        {"\xe6\x97\x28", 3, 0},     /* third byte not a continuation */
        {"\xe6\x97", 2, -1},        /* cut after two of three */
        {"\xf0\x9f\x98", 3, -1},    /* cut after three of four */
        {"\xe6\x28", 2, 0},         /* bad before the cut: malformed */
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint32_t cp = 7;

        ck_assert_int_eq(utf8_decode((const uint8_t *)cases[i].s, cases[i].n, &cp),
                         cases[i].want);
        ck_assert_uint_eq(cp, 7);
    }
    ck_assert_int_eq(utf8_lead_len(0x80), 0);
    ck_assert_int_eq(utf8_lead_len(0xC1), 0);
    ck_assert_int_eq(utf8_lead_len(0xF5), 0);
    ck_assert(utf8_cont_ok(0xE0, 1, 0xA0));
    ck_assert(!utf8_cont_ok(0xE0, 1, 0x9F));
    ck_assert(utf8_cont_ok(0xE0, 2, 0x80));
    ck_assert(!utf8_cont_ok(0xF4, 1, 0x90));
}
END_TEST

Suite *
common_utf8_suite(void)
{
    Suite *s = suite_create("common_utf8");
    TCase *tc = tcase_create("utf8");

    tcase_add_test(tc, test_utf8_round_trip);
    tcase_add_test(tc, test_utf8_encode_bytes);
    tcase_add_test(tc, test_utf8_decode_rejects);
    suite_add_tcase(s, tc);
    return s;
}
