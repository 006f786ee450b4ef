/* utf8.h - UTF-8 encode and decode of one character, the one copy for the
 * tokenizer, the NFC normalizer, the chat template interpreter and
 * common/util.c's validation.
 *
 * "Well-formed" is Unicode's table 3-7: no overlong forms, no surrogates,
 * nothing above U+10FFFF. The functions are static inline because the
 * tokenizer calls them once per character of every prompt.
 *
 * Thread: any (pure functions).
 */
#ifndef COMMON_UTF8_H
#define COMMON_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Bytes in all of a well-formed sequence led by b (1..4); 0 when b cannot
 * lead one (a continuation byte, 0xC0, 0xC1, 0xF5..0xFF). */
static inline int
utf8_lead_len(uint8_t b)
{
    if (b < 0x80) {
        return 1;
    }
    if (b >= 0xC2 && b <= 0xDF) {
        return 2;
    }
    if (b >= 0xE0 && b <= 0xEF) {
        return 3;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        return 4;
    }
    return 0;
}

/* Whether b may be byte idx (1..3) of a well-formed sequence led by lead
 * (the second byte's range depends on the lead; later ones are 80..BF). */
static inline int
utf8_cont_ok(uint8_t lead, int idx, uint8_t b)
{
    if (idx == 1) {
        switch (lead) {
        case 0xE0:
            return b >= 0xA0 && b <= 0xBF;
        case 0xED:
            return b >= 0x80 && b <= 0x9F;
        case 0xF0:
            return b >= 0x90 && b <= 0xBF;
        case 0xF4:
            return b >= 0x80 && b <= 0x8F;
        default:
            break;
        }
    }
    return b >= 0x80 && b <= 0xBF;
}

/* The character at s[0..n) (n >= 1): its length 1..4, with its code point
 * in *cp unless cp is NULL; 0 if s does not start with a well-formed
 * sequence; -1 if it starts one that s[0..n) cuts short (every byte before
 * the end fits). *cp is written only when the result is positive. */
static inline int
utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
    static const uint8_t lead_mask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    int need = utf8_lead_len(s[0]);
    uint32_t v;

    if (need == 0) {
        return 0;
    }
    v = s[0] & lead_mask[need];
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) {
            return -1;
        }
        if (!utf8_cont_ok(s[0], i, s[i])) {
            return 0;
        }
        v = (v << 6) | (s[i] & 0x3Fu);
    }
    if (cp != NULL) {
        *cp = v;
    }
    return need;
}

/* Writes code point cp as 1..4 bytes to out and returns the count. cp is
 * not checked: a surrogate is written as its 3 bytes, and a value above
 * U+10FFFF as 4 bytes that are not well-formed. */
static inline int
utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

#endif /* COMMON_UTF8_H */
