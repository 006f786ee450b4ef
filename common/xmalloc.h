/* xmalloc.h - small host allocations that abort on failure (Redis zmalloc),
 * and a fallible family for the request path.
 *
 * Use the aborting calls for start-up, model load and other bounded work
 * that has no one to report to. Everything a request allocates goes
 * through the *_try family: it returns NULL on failure and the caller turns
 * that into a clean error for that request only.
 *
 * Test hooks (all cheap, always compiled in):
 *   - xmalloc_fail_after(n): the n-th following *_try call fails, once
 *     (the daemon arms it from KVSERVE_FAIL_ALLOC_AFTER, and, when
 *     KVSERVE_TEST_HOOKS=1, from the debug route POST /debug/fail-alloc,
 *     which re-arms it any number of times in one process);
 *   - xmalloc_try_count(): how many *_try calls the process made, so a test
 *     can count the allocation sites of one request;
 *   - xmalloc_try_failures(): how many *_try calls failed on the calling
 *     thread (lets a builder that cannot see each failure, such as cJSON
 *     routed through xmalloc_try, find out that one happened).
 *
 * Domains. The loop thread and the engine thread serve one request at the
 * same time (the engine allocates DELTA messages while the loop formats
 * the previous ones), so in one shared count the order of their calls
 * would vary from run to run and "the N-th call" would not name one site.
 * Each thread therefore counts in a domain (xmalloc_set_thread_domain(),
 * default XMALLOC_DOMAIN_DEFAULT; the engine thread sets
 * XMALLOC_DOMAIN_ENGINE) with its own count and its own countdown: the
 * calls of one domain for one request come from one thread in program
 * order, so a test enumerates the loop's sites and the engine's sites
 * separately and each N is one site. The calls without _in act on the
 * default domain (KVSERVE_FAIL_ALLOC_AFTER arms it); the debug routes take
 * domain=engine for the other.
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

/* Fallible allocation for request paths: returns NULL on failure (and on
 * n * size overflow for xcalloc_try), and fails on purpose when the
 * fault-injection countdown reaches zero. xrealloc_try leaves p allocated
 * and unchanged when it fails. Free with free(). */
void *xmalloc_try(size_t n);
void *xcalloc_try(size_t n, size_t size);
void *xrealloc_try(void *p, size_t n);
char *xstrdup_try(const char *s);
char *xstrndup_try(const char *s, size_t n);

enum {
    XMALLOC_DOMAIN_DEFAULT = 0, /* every thread that sets nothing (loop, tests) */
    XMALLOC_DOMAIN_ENGINE,      /* the engine thread */
    XMALLOC_N_DOMAINS,
};

/* Puts the calling thread's fallible calls in domain (an unknown domain
 * is the default). Call it first thing in the thread. */
void xmalloc_set_thread_domain(int domain);

/* Test hook: the n-th following fallible call (1-based) of the default
 * domain fails; 0 off. Re-arming replaces a countdown that has not fired
 * yet. */
void xmalloc_fail_after(long n);
/* Calls left before the armed failure fires (0: not armed). */
long xmalloc_fail_pending(void);
/* Fallible calls made so far in the default domain (every thread in it). */
unsigned long xmalloc_try_count(void);
/* The same three for one domain (XMALLOC_DOMAIN_*; others: no-op / 0). */
void xmalloc_fail_after_in(int domain, long n);
long xmalloc_fail_pending_in(int domain);
unsigned long xmalloc_try_count_in(int domain);
/* Fallible calls that failed on the calling thread so far. */
unsigned long xmalloc_try_failures(void);

#endif /* COMMON_XMALLOC_H */
