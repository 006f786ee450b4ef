/* lt.h - kvs-loadtest internals: the incremental HTTP/1.1 response parser,
 * the SSE event splitter, length distributions and percentile statistics.
 *
 * The parsers are pure (no I/O) so they are unit-tested on byte streams cut
 * at every position; loadtest.c drives them from libuv reads.
 *
 * Thread: single-threaded (the loadtest loop); no globals.
 */
#ifndef LOADTEST_LT_H
#define LOADTEST_LT_H

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------ */
/* HTTP/1.1 response parser.                                           */

typedef enum lt_http_state {
    LT_HTTP_STATUS = 0,  /* reading the status line */
    LT_HTTP_HEADERS,
    LT_HTTP_BODY_LEN,    /* Content-Length body */
    LT_HTTP_CHUNK_SIZE,  /* chunked: size line */
    LT_HTTP_CHUNK_DATA,
    LT_HTTP_CHUNK_CRLF,  /* CRLF after a chunk's data */
    LT_HTTP_TRAILERS,
    LT_HTTP_BODY_EOF,    /* body until the connection closes */
    LT_HTTP_DONE,
    LT_HTTP_ERROR,
} lt_http_state_t;

typedef struct lt_http {
    lt_http_state_t state;
    int status;              /* HTTP status code */
    int keep_alive;          /* 1 unless "Connection: close" or HTTP/1.0 */
    int event_stream;        /* Content-Type: text/event-stream */
    int64_t content_length;  /* -1 if absent */
    int chunked;
    int64_t remaining;       /* body or chunk bytes still expected */
    char line[8192];         /* partial status/header/size line */
    size_t line_len;
    char retry_after[32];    /* Retry-After header value, if any */
} lt_http_t;

/* Body bytes callback: data[0..n) of the (de-chunked) body. */
typedef void (*lt_body_fn)(void *arg, const char *data, size_t n);

void lt_http_init(lt_http_t *h);
/* Feeds n bytes; calls body() for body bytes. Returns the number of bytes
 * consumed: less than n only when the response ended (LT_HTTP_DONE) and
 * the rest belongs to the next response, or on LT_HTTP_ERROR. */
size_t lt_http_feed(lt_http_t *h, const char *data, size_t n, lt_body_fn body, void *arg);
/* The peer closed the connection: completes an until-EOF body. Returns 1 if
 * the response is complete (LT_HTTP_DONE), 0 if it was cut short. */
int lt_http_eof(lt_http_t *h);

/* ------------------------------------------------------------------ */
/* Server-sent events.                                                 */

typedef struct lt_sse {
    char *buf;          /* pending bytes of an incomplete event */
    size_t len, cap;
    size_t max;         /* larger pending event -> error */
} lt_sse_t;

/* Event callback: the concatenated "data:" lines of one event (joined by
 * '\n', the "data:" prefix and one following space removed). */
typedef void (*lt_event_fn)(void *arg, const char *data, size_t n);

void lt_sse_init(lt_sse_t *s, size_t max_event);
void lt_sse_free(lt_sse_t *s);
/* Feeds body bytes, calling ev() once per complete event. Returns 0, or -1
 * if an event exceeds max_event bytes. */
int lt_sse_feed(lt_sse_t *s, const char *data, size_t n, lt_event_fn ev, void *arg);

/* ------------------------------------------------------------------ */
/* Length distributions: "128" (fixed), "64-256" (uniform integers),
 * "normal:MEAN:SD" (rounded, clamped to >= 1), "exp:MEAN" (rounded, >= 1). */

typedef struct lt_dist {
    int kind;           /* 0 fixed, 1 uniform, 2 normal, 3 exponential */
    double a, b;
} lt_dist_t;

/* ST-style: 0 on success, -1 on a malformed spec. */
int lt_dist_parse(const char *spec, lt_dist_t *d);
/* Draws a value >= 1 using the xorshift state *rng. */
int32_t lt_dist_draw(const lt_dist_t *d, uint64_t *rng);

/* Uniform in [0, 1) from a xorshift64* state (never 0). */
double lt_rand01(uint64_t *rng);
/* Exponential with the given mean. */
double lt_rand_exp(uint64_t *rng, double mean);

/* ------------------------------------------------------------------ */
/* Statistics.                                                         */

typedef struct lt_vec {
    double *v;
    size_t n, cap;
} lt_vec_t;

void lt_vec_push(lt_vec_t *a, double x);
void lt_vec_free(lt_vec_t *a);

typedef struct lt_summary {
    size_t n;
    double mean, min, max, p50, p90, p99;
} lt_summary_t;

/* Sorts a->v in place and fills *s (percentiles interpolated linearly
 * between closest ranks, as numpy's default). n == 0 gives all zeros. */
void lt_summarize(lt_vec_t *a, lt_summary_t *s);
/* The q-quantile (0..1) of sorted v[0..n). */
double lt_quantile(const double *v, size_t n, double q);

#endif /* LOADTEST_LT_H */
