/* xmalloc.c - aborting allocators, the fallible family and its
 * fault-injection and counting hooks (see xmalloc.h). */
#include "xmalloc.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_long fail_countdown[XMALLOC_N_DOMAINS];
static atomic_ulong try_count[XMALLOC_N_DOMAINS];
static _Thread_local unsigned long tl_failures;
static _Thread_local int tl_domain; /* XMALLOC_DOMAIN_* of the calling thread */

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

static int
domain_ok(int d)
{
    return d >= 0 && d < XMALLOC_N_DOMAINS;
}

void
xmalloc_set_thread_domain(int domain)
{
    tl_domain = domain_ok(domain) ? domain : XMALLOC_DOMAIN_DEFAULT;
}

void
xmalloc_fail_after_in(int domain, long n)
{
    if (domain_ok(domain)) {
        atomic_store(&fail_countdown[domain], n > 0 ? n : 0);
    }
}

long
xmalloc_fail_pending_in(int domain)
{
    return domain_ok(domain) ? atomic_load(&fail_countdown[domain]) : 0;
}

unsigned long
xmalloc_try_count_in(int domain)
{
    return domain_ok(domain) ? atomic_load(&try_count[domain]) : 0;
}

void
xmalloc_fail_after(long n)
{
    xmalloc_fail_after_in(XMALLOC_DOMAIN_DEFAULT, n);
}

long
xmalloc_fail_pending(void)
{
    return xmalloc_fail_pending_in(XMALLOC_DOMAIN_DEFAULT);
}

unsigned long
xmalloc_try_count(void)
{
    return xmalloc_try_count_in(XMALLOC_DOMAIN_DEFAULT);
}

unsigned long
xmalloc_try_failures(void)
{
    return tl_failures;
}

/* One fallible call: counts it in the calling thread's domain and says
 * whether that domain's armed countdown makes it fail. The decrement is a
 * compare-and-swap so that exactly one call fails even when several
 * threads of the domain race for the last count. */
static int
try_should_fail(void)
{
    atomic_long *cd = &fail_countdown[tl_domain];
    long c = atomic_load(cd);

    atomic_fetch_add(&try_count[tl_domain], 1);
    while (c > 0) {
        if (atomic_compare_exchange_weak(cd, &c, c - 1)) {
            return c == 1;
        }
    }
    return 0;
}

static void *
try_failed(void)
{
    tl_failures++;
    return NULL;
}

void *
xmalloc_try(size_t n)
{
    void *p;

    if (try_should_fail()) {
        return try_failed();
    }
    p = malloc(n ? n : 1);
    return p != NULL ? p : try_failed();
}

void *
xcalloc_try(size_t n, size_t size)
{
    void *p;

    if (try_should_fail()) {
        return try_failed();
    }
    if (size != 0 && n > (size_t)-1 / size) {
        return try_failed();
    }
    p = calloc(n ? n : 1, size ? size : 1);
    return p != NULL ? p : try_failed();
}

void *
xrealloc_try(void *p, size_t n)
{
    void *q;

    if (try_should_fail()) {
        return try_failed();
    }
    q = realloc(p, n ? n : 1);
    return q != NULL ? q : try_failed();
}

char *
xstrdup_try(const char *s)
{
    return xstrndup_try(s, strlen(s));
}

char *
xstrndup_try(const char *s, size_t n)
{
    char *p = xmalloc_try(n + 1);

    if (p != NULL) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}
