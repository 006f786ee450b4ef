/* util.h - small helpers: monotonic time, UTF-8 validation, SHA-256 hex.
 *
 * Thread: any.
 */
#ifndef COMMON_UTIL_H
#define COMMON_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Monotonic clock in nanoseconds / seconds. */
uint64_t now_ns(void);
double now_s(void);

/* 1 if s[0..n) is well-formed UTF-8 (no overlongs, no surrogates). */
int utf8_valid(const char *s, size_t n);
/* Length of the longest prefix of s[0..n) that ends on a character
 * boundary and holds no truncated sequence at its end. */
size_t utf8_complete_prefix(const char *s, size_t n);

/* SHA-256 of data as 64 lowercase hex chars plus NUL into out[65]. */
void sha256_hex(const void *data, size_t n, char out[65]);
/* Constant-time comparison of two equal-length buffers: 1 if equal. */
int ct_equal(const void *a, const void *b, size_t n);

#endif /* COMMON_UTIL_H */
