/* xmalloc.c - aborting allocators and a fault-injection hook. */
#include "xmalloc.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_long fail_countdown;

static _Noreturn void
oom(size_t n)
{
    fprintf(stderr, "<2>xmalloc: out of memory allocating %zu bytes\n", n);
    abort();
}

void *
xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        oom(n);
    }
    return p;
}

void *
xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL) {
        oom(n * size);
    }
    return p;
}

void *
xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL) {
        oom(n);
    }
    return q;
}

char *
xstrdup(const char *s)
{
    return xstrndup(s, strlen(s));
}

char *
xstrndup(const char *s, size_t n)
{
    char *p = xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void
xmalloc_fail_after(long n)
{
    atomic_store(&fail_countdown, n);
}

void *
xmalloc_try(size_t n)
{
    long c = atomic_load(&fail_countdown);
    if (c > 0 && atomic_fetch_sub(&fail_countdown, 1) == 1) {
        return NULL;
    }
    return malloc(n ? n : 1);
}
