/* cpu_repack.h - the CPU backend's load-time repack of q4_K and q6_K
 * weights into the 8-row interleaved forms of its kernels (KN_W_Q4_K_R8,
 * KN_W_Q6_K_R8, kernels/cpu/kn_quant.h), and of q8_0 weights into the
 * 16-row form (KN_W_Q8_0_R16, rows % 16 == 0).
 *
 * DESIGN. The model's weights stay in their file's layout (the CUDA
 * upload reads it); each CPU rank repacks its own
 * views (after the tensor-parallel row and column split, so a shard never
 * starts inside a group of 8) into buffers it owns, and the source's whole
 * pages are dropped when they lie in one of the model's file mappings:
 * the repacked copy is then the only resident one (a reader of the file
 * layout faults its pages back in). A source in a buffer the model owns
 * (the q / k rows un-permuted at load) is left as it is, since dropping
 * it would lose it; a rank's own column copy is freed.
 * The backend repacks lm_head once (rank 0 computes the logits) and, when
 * the embedding is tied to it, looks tokens up in the repacked copy
 * (kn_embed_w reads it bit for bit as the file's rows).
 * KVSERVE_Q4K_REPACK=0 in the environment turns the q4_K and q6_K repack
 * off (A/B runs), KVSERVE_Q6K_REPACK=0 that of q6_K only,
 * KVSERVE_Q8_REPACK=0 that of q8_0.
 *
 * Thread: the thread creating the backend.
 */
#ifndef MODEL_CPU_REPACK_H
#define MODEL_CPU_REPACK_H

#include <stddef.h>

#include "kernels/cpu/kn_quant.h"
#include "model/model_int.h"

/* Repacks *w when it is q4_K or q6_K with rows % 8 == 0 (or q8_0 with
 * rows % 16 == 0), and its source can be
 * released (see above): *w becomes the repacked view of a new buffer
 * stored in *own (the caller frees it). src_own: the caller's buffer *w
 * points into (a column copy), freed here and set to NULL once repacked;
 * NULL when *w points into the model. Returns the bytes repacked, 0 when
 * *w is left as it is. */
size_t mdl__cpu_repack(const mdl_model_t *m, kn_weight_t *w, void **own, void **src_own);

#endif /* MODEL_CPU_REPACK_H */
