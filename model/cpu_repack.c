/* cpu_repack.c - the CPU backend's load-time repack of q4_K, q6_K and q8_0
 * weights (model/cpu_repack.h).
 *
 * DESIGN. See the header. The repack reads each source row once and the
 * pages are dropped right after each matrix, so the resident set grows
 * by at most one matrix while a rank is created.
 *
 * Thread: the thread creating the backend.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/status.h"
#include "model/cpu_repack.h"

#define REPACK_SLAB 1024 /* rows per slab: a multiple of 16 */
#define REPACK_HUGE ((size_t)2 << 20) /* x86-64's transparent huge page */

/* A buffer of bytes for a repacked matrix (free() releases it), asking
 * for transparent huge pages on its whole 2 MB pages: the kernels stream
 * it once per token, and on 4 KB pages bench_quant streamed q4_K / q6_K
 * at 8192 x 2048 22-24 GB/s against 29-30 on 2 MB pages (one thread).
 * The tail below 2 MB keeps 4 KB pages, so no page is resident unused;
 * where THP is off ("never") the advice is ignored. */
static void *
repack_alloc(size_t bytes)
{
    void *p = NULL;

    if (bytes < REPACK_HUGE) {
        return malloc(bytes);
    }
    if (posix_memalign(&p, REPACK_HUGE, bytes) != 0) {
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes / REPACK_HUGE * REPACK_HUGE, MADV_HUGEPAGE);
#endif
    return p;
}

/* Whether [p, p + len) lies in one of m's file mappings. */
static int
in_file_map(const mdl_model_t *m, const void *p, size_t len)
{
    uintptr_t a = (uintptr_t)p;

    for (int i = 0; i < m->n_maps; i++) {
        uintptr_t lo = (uintptr_t)m->maps[i];

        if (a >= lo && a + len <= lo + m->map_lens[i]) {
            return 1;
        }
    }
    return 0;
}

/* Whether the environment leaves the repack of t on (see the header). */
static int
repack_enabled(kn_wtype_t t)
{
    const char *e = getenv("KVSERVE_Q4K_REPACK"), *e6 = getenv("KVSERVE_Q6K_REPACK"),
               *e8 = getenv("KVSERVE_Q8_REPACK");

    if (t == KN_W_Q8_0) {
        return e8 == NULL || strcmp(e8, "0") != 0;
    }
    if (e != NULL && strcmp(e, "0") == 0) {
        return 0;
    }
    return t != KN_W_Q6_K || e6 == NULL || strcmp(e6, "0") != 0;
}

/* Bytes of w's repacked form, or 0 when its type or shape has none. */
static size_t
repack_bytes(const kn_weight_t *w)
{
    switch (w->type) {
    case KN_W_Q4_K:
        return w->rows % 8 == 0 && w->cols % 256 == 0 ? kn_q4r8_bytes(w->rows, w->cols) : 0;
    case KN_W_Q6_K:
        return w->rows % 8 == 0 && w->cols % 256 == 0 ? kn_q6r8_bytes(w->rows, w->cols) : 0;
    case KN_W_Q8_0: /* 16 rows at a time (kernels/cpu/kn_q8r16.c) */
        return w->rows % 16 == 0 && w->cols % 32 == 0 ? kn_q8r16_bytes(w->rows, w->cols) : 0;
    default:
        return 0;
    }
}

size_t
mdl__cpu_repack(const mdl_model_t *m, kn_weight_t *w, void **own, void **src_own)
{
    size_t src_len = (size_t)w->rows * w->row_bytes, bytes = repack_bytes(w);
    int file = src_own == NULL && in_file_map(m, w->data, src_len), rc;
    kn_weight_t r8;
    void *dst;

    *own = NULL;
    if (bytes == 0 || !repack_enabled(w->type) || (src_own == NULL && !file)) {
        return 0;
    }
    dst = repack_alloc(bytes);
    if (dst == NULL) { /* the file's layout still works */
        return 0;
    }
    /* REPACK_SLAB rows at a time, each slab's file pages dropped right
     * after it, so a large matrix (a tied lm_head of 128k rows) and its
     * copy are both resident for one slab only, not whole: the repacked
     * forms keep each group of 8 / 16 rows contiguous, so a slab is the
     * same repack of a shorter matrix at its group's offset. A page
     * dropped before a failure is read from the file again. */
    int32_t group = w->type == KN_W_Q8_0 ? 16 : 8;
    size_t group_bytes = bytes / (size_t)(w->rows / group);

    rc = ST_OK;
    for (int32_t r0 = 0; r0 < w->rows && rc == ST_OK; r0 += REPACK_SLAB) {
        kn_weight_t part = *w;
        void *at = (char *)dst + (size_t)(r0 / group) * group_bytes;

        part.data = (const char *)w->data + (size_t)r0 * w->row_bytes;
        part.rows = w->rows - r0 < REPACK_SLAB ? w->rows - r0 : REPACK_SLAB;
        rc = w->type == KN_W_Q4_K   ? kn_q4r8_repack(&part, at, &r8)
             : w->type == KN_W_Q6_K ? kn_q6r8_repack(&part, at, &r8)
                                    : kn_q8r16_repack(&part, at, &r8);
        if (rc == ST_OK && file) {
            mdl__drop_pages(part.data, (size_t)part.rows * w->row_bytes);
        }
    }
    if (rc != ST_OK) {
        free(dst);
        return 0;
    }
    r8.data = dst;
    r8.rows = w->rows;
    if (file) {
        mdl__drop_pages(w->data, src_len);
    } else {
        free(*src_own);
        *src_own = NULL;
    }
    *w = r8;
    *own = dst;
    return bytes;
}
