/* util.c - time, UTF-8 validation, SHA-256 (OpenSSL), constant-time compare. */
#include "util.h"

#include <openssl/evp.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "common/utf8.h"

uint64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double
now_s(void)
{
    return (double)now_ns() * 1e-9;
}

int
utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        uint64_t w;

        /* ASCII runs 8 bytes at a time (an 8 MiB body is checked on the
         * loop thread). */
        if (i + 8 <= n && (memcpy(&w, p + i, 8), (w & 0x8080808080808080ull) == 0)) {
            i += 8;
            continue;
        }
        int l = utf8_decode(p + i, n - i, NULL);
        if (l <= 0) {
            return 0;
        }
        i += (size_t)l;
    }
    return 1;
}

size_t
utf8_complete_prefix(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        int l = utf8_decode(p + i, n - i, NULL);
        if (l < 0) {
            return i; /* truncated tail: hold it back */
        }
        i += l == 0 ? 1 : (size_t)l; /* malformed byte: pass it on */
    }
    return n;
}

void
sha256_hex(const void *data, size_t n, char out[65])
{
    unsigned char md[32];
    unsigned int len = 0;
    static const char hex[] = "0123456789abcdef";

    EVP_Digest(data, n, md, &len, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15];
    }
    out[64] = '\0';
}

int
ct_equal(const void *a, const void *b, size_t n)
{
    const volatile unsigned char *x = a, *y = b;
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++) {
        d |= x[i] ^ y[i];
    }
    return d == 0;
}
