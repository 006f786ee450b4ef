/* cpu_repack.c - the CPU backend's load-time repack of q4_K and q8_0
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

#include "common/status.h"
#include "model/cpu_repack.h"

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

static int
repack_enabled(const char *var)
{
    const char *e = getenv(var);

    return e == NULL || strcmp(e, "0") != 0;
}

size_t
mdl__cpu_repack(const mdl_model_t *m, kn_weight_t *w, void **own, void **src_own)
{
    size_t src_len = (size_t)w->rows * w->row_bytes, bytes;
    int file = src_own == NULL && in_file_map(m, w->data, src_len);
    kn_weight_t r8;
    void *dst;

    /* q8_0: 16 rows at a time (kernels/cpu/kn_q8r16.c) */
    int q8 = w->type == KN_W_Q8_0 && w->rows % 16 == 0 && w->cols % 32 == 0 &&
             repack_enabled("KVSERVE_Q8_REPACK");

    *own = NULL;
    if ((!q8 && (w->type != KN_W_Q4_K || w->rows % 8 != 0 || w->cols % 256 != 0 ||
                 !repack_enabled("KVSERVE_Q4K_REPACK"))) ||
        (src_own == NULL && !file)) {
        return 0;
    }
    bytes = q8 ? kn_q8r16_bytes(w->rows, w->cols) : kn_q4r8_bytes(w->rows, w->cols);
    dst = malloc(bytes);
    if (dst == NULL) { /* the file's layout still works */
        return 0;
    }
    if ((q8 ? kn_q8r16_repack(w, dst, &r8) : kn_q4r8_repack(w, dst, &r8)) != ST_OK) {
        free(dst);
        return 0;
    }
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
