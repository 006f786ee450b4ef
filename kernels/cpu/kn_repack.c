/* kn_repack.c - the load-time repack loop shared by the interleaved
 * weight types (KN_W_Q4_K_R8, KN_W_Q6_K_R8, KN_W_Q8_0_R16; kn_quant.h):
 * the shape check and the walk over groups of rows x column blocks. Each
 * type's file (kn_q4r8.c, kn_q6r8.c, kn_q8r16.c) supplies only the packer
 * of one block of one group.
 *
 * DESIGN. A repacked weight is its groups of rows one after the other,
 * each group its column blocks one after the other, every block the same
 * size; the packers see the file's blocks of the group's rows and write
 * one block whole, so the layout within a block stays in its type's file
 * beside its dequantizer and reference. Built with kn_quant.c's flags (no
 * FMA contraction), though nothing here computes in floating point.
 *
 * Thread: no state; a call works on the buffers it is given.
 */
#include "common/status.h"
#include "kernels/cpu/kn_quant_int.h"

int
kn__repack(const kn_weight_t *w, const kn_repack_t *rp, void *dst, kn_weight_t *out)
{
    if (w->type != rp->from || w->rows <= 0 || w->rows % rp->group != 0 || w->cols <= 0 ||
        w->cols % rp->blk_cols != 0) {
        return ST_EINVAL;
    }
    int32_t nb = w->cols / rp->blk_cols;
    size_t src_blk = kn_wtype_row_bytes(rp->from, rp->blk_cols);

    for (int32_t g = 0; g < w->rows / rp->group; g++) {
        const uint8_t *rows = (const uint8_t *)w->data + (size_t)g * rp->group * w->row_bytes;

        for (int32_t k = 0; k < nb; k++) {
            rp->pack(rows + (size_t)k * src_blk, w->row_bytes,
                     (uint8_t *)dst + ((size_t)g * nb + k) * rp->blk_bytes);
        }
    }
    *out = (kn_weight_t){rp->to, dst, kn_wtype_row_bytes(rp->to, w->cols), w->rows, w->cols};
    return ST_OK;
}
