/* gr_cpset.c - sets of Unicode code-point ranges, the character classes of
 * the GBNF and regex parsers (gr_gbnf.c, gr_regex.c).
 *
 * DESIGN: a growable array of [lo, hi] ranges; gr_cpset_norm sorts and
 * merges it, after which complement and remove keep it sorted.
 *
 * Thread: none (the caller's set).
 */
#include <stdlib.h>

#include "common/xmalloc.h"
#include "grammar/gr_int.h"

void
gr_cpset_add(gr_cpset_t *s, uint32_t lo, uint32_t hi)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->r = xrealloc(s->r, (size_t)s->cap * sizeof(gr_cprange_t));
    }
    s->r[s->n].lo = lo;
    s->r[s->n].hi = hi;
    s->n++;
}

static int
range_cmp(const void *a, const void *b)
{
    const gr_cprange_t *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

void
gr_cpset_norm(gr_cpset_t *s)
{
    int32_t w = 0;

    if (s->n > 1) {
        qsort(s->r, (size_t)s->n, sizeof(gr_cprange_t), range_cmp);
    }
    for (int32_t i = 0; i < s->n; i++) {
        if (w > 0 && s->r[i].lo <= s->r[w - 1].hi + 1) {
            if (s->r[i].hi > s->r[w - 1].hi) {
                s->r[w - 1].hi = s->r[i].hi;
            }
        } else {
            s->r[w++] = s->r[i];
        }
    }
    s->n = w;
}

void
gr_cpset_complement(gr_cpset_t *s)
{
    gr_cpset_t c = {0};
    uint32_t next = 0;

    gr_cpset_norm(s);
    for (int32_t i = 0; i < s->n; i++) {
        if (s->r[i].lo > next) {
            gr_cpset_add(&c, next, s->r[i].lo - 1);
        }
        next = s->r[i].hi + 1;
    }
    if (next <= 0x10FFFF) {
        gr_cpset_add(&c, next, 0x10FFFF);
    }
    free(s->r);
    *s = c;
}

void
gr_cpset_remove(gr_cpset_t *s, uint32_t lo, uint32_t hi)
{
    gr_cpset_t c = {0};

    for (int32_t i = 0; i < s->n; i++) {
        gr_cprange_t r = s->r[i];
        if (r.hi < lo || r.lo > hi) {
            gr_cpset_add(&c, r.lo, r.hi);
            continue;
        }
        if (r.lo < lo) {
            gr_cpset_add(&c, r.lo, lo - 1);
        }
        if (r.hi > hi) {
            gr_cpset_add(&c, hi + 1, r.hi);
        }
    }
    free(s->r);
    *s = c;
}
