/* tp.h - how tensor parallelism splits a Llama model over T ranks
 * (DESIGN.md section 6), shared by the CPU (model/forward_cpu.c) and CUDA
 * (model/backend_cuda.c) backends.
 *
 *   column-parallel (rows of the HF [out][in] weight, contiguous):
 *       wq, bq: query heads [q0, q0 + n_q)
 *       wk, wv, bk, bv: KV heads [kv0, kv0 + n_kv)
 *       w_gate, w_up: FFN rows [f0, f0 + n_f)
 *   row-parallel (columns of the weight; each rank copies its slice):
 *       wo: columns of its query heads;  w_down: columns [f0, f0 + n_f)
 *   each followed by an all-reduce (sum) of the (n_tok, dim) partial
 *   products before the residual add. Embeddings, norms and the LM head
 *   are replicated; rank 0 computes the logits.
 *
 * KV heads: with n_kv_heads >= T each rank holds n_kv_heads / T of them;
 * with fewer KV heads than ranks (T a multiple of n_kv_heads) each rank
 * holds the one KV head its query heads read, replicated on the
 * T / n_kv_heads ranks that share it.
 *
 * KV blocks: the block manager keeps ONE id space for all ranks. Block b
 * exists on every rank; rank r's copy holds K and V of rank r's KV heads
 * only, laid out [block][local_kv_head][block_size][head_dim] per layer.
 * A block id is allocated, freed, copied (copy-on-write) and swapped on
 * every rank at once, so the block tables in a batch are valid on all
 * ranks and the accounting (free blocks, per-tenant shares, watermark)
 * is the same per rank: a block costs mdl_kv_block_bytes() * n_kv /
 * n_kv_heads bytes on each rank.
 *
 * Thread: any (pure function).
 */
#ifndef MODEL_TP_H
#define MODEL_TP_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

typedef struct mdl_tp_shard {
    int32_t q0, n_q;   /* query heads */
    int32_t kv0, n_kv; /* KV heads */
    int32_t f0, n_f;   /* FFN rows */
} mdl_tp_shard_t;

/* Rank `rank` of `tp`. ST_EUNSUPPORTED with a one-line reason in err when
 * the model cannot be split that way (n_heads or ffn_dim not divisible by
 * tp, or neither n_kv_heads % tp == 0 nor tp % n_kv_heads == 0). */
int mdl_tp_shard(const mdl_config_t *c, int32_t tp, int32_t rank, mdl_tp_shard_t *out, char *err,
                 size_t errlen);

#endif /* MODEL_TP_H */
