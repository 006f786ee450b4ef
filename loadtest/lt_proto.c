/* lt_proto.c - HTTP/1.1 response parsing, SSE splitting, distributions and
 * percentiles for kvs-loadtest (see lt.h).
 */
#include "loadtest/lt.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/xmalloc.h"

/* ------------------------------------------------------------------ */
/* HTTP.                                                               */

void
lt_http_init(lt_http_t *h)
{
    memset(h, 0, sizeof(*h));
    h->state = LT_HTTP_STATUS;
    h->content_length = -1;
    h->keep_alive = 1;
}

/* Case-insensitive "name:" prefix match; returns the trimmed value or NULL. */
static const char *
header_value(const char *line, const char *name)
{
    size_t n = strlen(name);

    if (strncasecmp(line, name, n) != 0 || line[n] != ':') {
        return NULL;
    }
    line += n + 1;
    while (*line == ' ' || *line == '\t') {
        line++;
    }
    return line;
}

static int
parse_status_line(lt_http_t *h, const char *line)
{
    if (strncmp(line, "HTTP/1.", 7) != 0 || (line[7] != '0' && line[7] != '1') ||
        line[8] != ' ' || !isdigit((unsigned char)line[9]) ||
        !isdigit((unsigned char)line[10]) || !isdigit((unsigned char)line[11])) {
        return -1;
    }
    h->keep_alive = line[7] == '1';
    h->status = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
    return 0;
}

static int
parse_header(lt_http_t *h, const char *line)
{
    const char *v;

    if ((v = header_value(line, "content-length")) != NULL) {
        char *end;
        long long n = strtoll(v, &end, 10);
        if (end == v || n < 0 || (h->content_length >= 0 && h->content_length != n)) {
            return -1;
        }
        h->content_length = n;
    } else if ((v = header_value(line, "transfer-encoding")) != NULL) {
        h->chunked = strcasestr(v, "chunked") != NULL;
    } else if ((v = header_value(line, "connection")) != NULL) {
        if (strcasestr(v, "close") != NULL) {
            h->keep_alive = 0;
        } else if (strcasestr(v, "keep-alive") != NULL) {
            h->keep_alive = 1;
        }
    } else if ((v = header_value(line, "content-type")) != NULL) {
        h->event_stream = strncasecmp(v, "text/event-stream", 17) == 0;
    } else if ((v = header_value(line, "retry-after")) != NULL) {
        size_t n = strlen(v);
        n = n < sizeof(h->retry_after) - 1 ? n : sizeof(h->retry_after) - 1;
        memcpy(h->retry_after, v, n);
        h->retry_after[n] = '\0';
    }
    return 0;
}

/* Called at the blank line ending the headers. */
static void
headers_done(lt_http_t *h)
{
    if (h->status / 100 == 1 && h->status != 101) {
        /* 1xx interim response: a real one follows. */
        int ka = h->keep_alive;
        lt_http_init(h);
        h->keep_alive = ka;
        return;
    }
    if (h->status == 204 || h->status == 304) {
        h->state = LT_HTTP_DONE;
    } else if (h->chunked) {
        h->state = LT_HTTP_CHUNK_SIZE;
    } else if (h->content_length >= 0) {
        h->remaining = h->content_length;
        h->state = h->remaining == 0 ? LT_HTTP_DONE : LT_HTTP_BODY_LEN;
    } else {
        h->state = LT_HTTP_BODY_EOF;
        h->keep_alive = 0;
    }
}

/* Accumulates one CRLF- (or LF-) terminated line. Returns 1 when h->line
 * holds a complete line (terminator stripped), 0 when more input is needed,
 * -1 when the line is too long. *used counts the bytes taken. */
static int
take_line(lt_http_t *h, const char *data, size_t n, size_t *used)
{
    const char *nl = memchr(data, '\n', n);
    size_t take = nl != NULL ? (size_t)(nl - data) + 1 : n;

    if (h->line_len + take >= sizeof(h->line)) {
        return -1;
    }
    memcpy(h->line + h->line_len, data, take);
    h->line_len += take;
    *used = take;
    if (nl == NULL) {
        return 0;
    }
    h->line_len--; /* drop '\n' */
    if (h->line_len > 0 && h->line[h->line_len - 1] == '\r') {
        h->line_len--;
    }
    h->line[h->line_len] = '\0';
    h->line_len = 0;
    return 1;
}

size_t
lt_http_feed(lt_http_t *h, const char *data, size_t n, lt_body_fn body, void *arg)
{
    size_t off = 0;

    while (off < n && h->state != LT_HTTP_DONE && h->state != LT_HTTP_ERROR) {
        size_t used = 0;
        int r;

        switch (h->state) {
        case LT_HTTP_STATUS:
        case LT_HTTP_HEADERS:
        case LT_HTTP_CHUNK_SIZE:
        case LT_HTTP_CHUNK_CRLF:
        case LT_HTTP_TRAILERS:
            r = take_line(h, data + off, n - off, &used);
            off += used;
            if (r < 0) {
                h->state = LT_HTTP_ERROR;
                break;
            }
            if (r == 0) {
                break;
            }
            if (h->state == LT_HTTP_STATUS) {
                h->state = parse_status_line(h, h->line) == 0 ? LT_HTTP_HEADERS : LT_HTTP_ERROR;
            } else if (h->state == LT_HTTP_HEADERS) {
                if (h->line[0] == '\0') {
                    headers_done(h);
                } else if (parse_header(h, h->line) != 0) {
                    h->state = LT_HTTP_ERROR;
                }
            } else if (h->state == LT_HTTP_CHUNK_SIZE) {
                char *end;
                long long sz = strtoll(h->line, &end, 16);
                if (end == h->line || sz < 0 || (*end != '\0' && *end != ';' && *end != ' ')) {
                    h->state = LT_HTTP_ERROR;
                } else if (sz == 0) {
                    h->state = LT_HTTP_TRAILERS;
                } else {
                    h->remaining = sz;
                    h->state = LT_HTTP_CHUNK_DATA;
                }
            } else if (h->state == LT_HTTP_CHUNK_CRLF) {
                h->state = h->line[0] == '\0' ? LT_HTTP_CHUNK_SIZE : LT_HTTP_ERROR;
            } else if (h->line[0] == '\0') {
                h->state = LT_HTTP_DONE; /* end of trailers */
            }
            break;
        case LT_HTTP_BODY_LEN:
        case LT_HTTP_CHUNK_DATA: {
            size_t take = n - off;
            if ((int64_t)take > h->remaining) {
                take = (size_t)h->remaining;
            }
            if (body != NULL && take > 0) {
                body(arg, data + off, take);
            }
            off += take;
            h->remaining -= (int64_t)take;
            if (h->remaining == 0) {
                h->state = h->state == LT_HTTP_BODY_LEN ? LT_HTTP_DONE : LT_HTTP_CHUNK_CRLF;
            }
            break;
        }
        case LT_HTTP_BODY_EOF:
            if (body != NULL) {
                body(arg, data + off, n - off);
            }
            off = n;
            break;
        case LT_HTTP_DONE:
        case LT_HTTP_ERROR:
            break;
        }
    }
    return off;
}

int
lt_http_eof(lt_http_t *h)
{
    if (h->state == LT_HTTP_BODY_EOF) {
        h->state = LT_HTTP_DONE;
    }
    return h->state == LT_HTTP_DONE;
}

/* ------------------------------------------------------------------ */
/* SSE.                                                                */

void
lt_sse_init(lt_sse_t *s, size_t max_event)
{
    memset(s, 0, sizeof(*s));
    s->max = max_event;
}

void
lt_sse_free(lt_sse_t *s)
{
    free(s->buf);
    memset(s, 0, sizeof(*s));
}

/* Dispatches the event in buf[0..len): joins its data: lines. */
static void
sse_dispatch(char *ev, size_t len, lt_event_fn fn, void *arg)
{
    char *out = ev; /* rewritten in place: output never outruns input */
    size_t o = 0;
    int any = 0;
    size_t i = 0;

    while (i < len) {
        char *line = ev + i;
        char *nl = memchr(line, '\n', len - i);
        size_t ll = nl != NULL ? (size_t)(nl - line) : len - i;
        size_t next = i + ll + 1;
        if (ll > 0 && line[ll - 1] == '\r') {
            ll--;
        }
        if (ll >= 5 && memcmp(line, "data:", 5) == 0) {
            size_t skip = 5 + (ll > 5 && line[5] == ' ' ? 1 : 0);
            if (any) {
                out[o++] = '\n';
            }
            memmove(out + o, line + skip, ll - skip);
            o += ll - skip;
            any = 1;
        }
        i = next;
    }
    if (any) {
        out[o] = '\0';
        fn(arg, out, o);
    }
}

int
lt_sse_feed(lt_sse_t *s, const char *data, size_t n, lt_event_fn ev, void *arg)
{
    size_t start = 0;

    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap > 0 ? s->cap : 4096;
        while (cap < s->len + n + 1) {
            cap *= 2;
        }
        s->buf = xrealloc(s->buf, cap);
        s->cap = cap;
    }
    memcpy(s->buf + s->len, data, n);
    s->len += n;

    /* Events end at a blank line: "\n\n" or "\r\n\r\n" (or mixed). */
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] != '\n') {
            continue;
        }
        size_t j = i + 1;
        if (j < s->len && s->buf[j] == '\r') {
            j++;
        }
        if (j < s->len && s->buf[j] == '\n') {
            sse_dispatch(s->buf + start, i - start, ev, arg);
            start = j + 1;
            i = j;
        }
    }
    if (start > 0) {
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
    return s->len > s->max ? -1 : 0;
}

/* ------------------------------------------------------------------ */
/* Random numbers and distributions.                                   */

double
lt_rand01(uint64_t *rng)
{
    uint64_t x = *rng;

    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *rng = x;
    return (double)((x * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}

double
lt_rand_exp(uint64_t *rng, double mean)
{
    return -mean * log(1.0 - lt_rand01(rng));
}

int
lt_dist_parse(const char *spec, lt_dist_t *d)
{
    char *end;

    memset(d, 0, sizeof(*d));
    if (strncmp(spec, "normal:", 7) == 0) {
        d->kind = 2;
        d->a = strtod(spec + 7, &end);
        if (end == spec + 7 || *end != ':') {
            return -1;
        }
        const char *p = end + 1;
        d->b = strtod(p, &end);
        return end != p && *end == '\0' && d->a >= 1 && d->b >= 0 ? 0 : -1;
    }
    if (strncmp(spec, "exp:", 4) == 0) {
        d->kind = 3;
        d->a = strtod(spec + 4, &end);
        return end != spec + 4 && *end == '\0' && d->a >= 1 ? 0 : -1;
    }
    d->a = strtod(spec, &end);
    if (end == spec || d->a < 1 || d->a != floor(d->a)) {
        return -1;
    }
    if (*end == '\0') {
        d->kind = 0;
        return 0;
    }
    if (*end != '-') {
        return -1;
    }
    const char *p = end + 1;
    d->kind = 1;
    d->b = strtod(p, &end);
    return end != p && *end == '\0' && d->b >= d->a && d->b == floor(d->b) ? 0 : -1;
}

int32_t
lt_dist_draw(const lt_dist_t *d, uint64_t *rng)
{
    double v;

    switch (d->kind) {
    case 1:
        v = d->a + floor(lt_rand01(rng) * (d->b - d->a + 1));
        break;
    case 2: {
        /* Box-Muller. */
        double u1 = 1.0 - lt_rand01(rng), u2 = lt_rand01(rng);
        v = d->a + d->b * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
        v = floor(v + 0.5);
        break;
    }
    case 3:
        v = floor(lt_rand_exp(rng, d->a) + 0.5);
        break;
    default:
        v = d->a;
        break;
    }
    if (v < 1) {
        v = 1;
    }
    if (v > 1e7) {
        v = 1e7;
    }
    return (int32_t)v;
}

/* ------------------------------------------------------------------ */
/* Statistics.                                                         */

void
lt_vec_push(lt_vec_t *a, double x)
{
    if (a->n == a->cap) {
        a->cap = a->cap > 0 ? a->cap * 2 : 256;
        a->v = xrealloc(a->v, a->cap * sizeof(*a->v));
    }
    a->v[a->n++] = x;
}

void
lt_vec_free(lt_vec_t *a)
{
    free(a->v);
    memset(a, 0, sizeof(*a));
}

static int
cmp_dbl(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;

    return (a > b) - (a < b);
}

double
lt_quantile(const double *v, size_t n, double q)
{
    double pos, frac;
    size_t lo;

    if (n == 0) {
        return 0;
    }
    pos = q * (double)(n - 1);
    lo = (size_t)floor(pos);
    if (lo + 1 >= n) {
        return v[n - 1];
    }
    frac = pos - (double)lo;
    return v[lo] + (v[lo + 1] - v[lo]) * frac;
}

void
lt_summarize(lt_vec_t *a, lt_summary_t *s)
{
    double sum = 0;

    memset(s, 0, sizeof(*s));
    if (a->n == 0) {
        return;
    }
    qsort(a->v, a->n, sizeof(*a->v), cmp_dbl);
    for (size_t i = 0; i < a->n; i++) {
        sum += a->v[i];
    }
    s->n = a->n;
    s->mean = sum / (double)a->n;
    s->min = a->v[0];
    s->max = a->v[a->n - 1];
    s->p50 = lt_quantile(a->v, a->n, 0.50);
    s->p90 = lt_quantile(a->v, a->n, 0.90);
    s->p99 = lt_quantile(a->v, a->n, 0.99);
}
