/* xmalloc.h - small host allocations that abort on failure (Redis zmalloc).
 *
 * Use for small, bounded allocations. Large buffers and mmaps use checked
 * calls at start-up. Under the test hook below, xmalloc_try() lets request
 * paths inject allocation failures.
 *
 * Thread: any.
 */
#ifndef COMMON_XMALLOC_H
#define COMMON_XMALLOC_H

#include <stddef.h>

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);

/* Fallible allocation for request paths: returns NULL on failure, and
 * fails on purpose when the fault-injection countdown reaches zero. */
void *xmalloc_try(size_t n);
/* Test hook: the n-th following xmalloc_try() call (1-based) fails; 0 off. */
void xmalloc_fail_after(long n);

#endif /* COMMON_XMALLOC_H */
