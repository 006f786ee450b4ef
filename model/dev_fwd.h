/* dev_fwd.h - one tensor-parallel rank of the GPU forward pass, written
 * against a table of device operations (mdl_dev_ops_t) instead of the
 * CUDA API.
 *
 * model/backend_cuda.c supplies the operations with CUDA (cudaMalloc,
 * cudaMemcpyAsync on the rank's stream, the kernels of kernels/cuda,
 * cublasGemmEx, ncclAllReduce); tests/cuda/test_devemu.c supplies them on
 * the host (the same kernel bodies under the thread-block emulator, a
 * reference GEMM, the CPU all-reduce of kernels/comm.h). So everything the
 * CUDA backend does besides calling CUDA -- weight sharding and upload
 * (the file's bytes, in bounded chunks, dequantized to 16-bit on the
 * device), buffer shapes and strides, the batch staging layout, the layer
 * loop, the KV pool regions and the copy/swap plan -- runs in CI and is
 * compared with the CPU backend.
 *
 * Memory: "device" pointers come from ops->alloc, "pinned" host pointers
 * from ops->alloc_host. A rank allocates everything in mdl_dev_rank_init()
 * and mdl_dev_rank_alloc_kv(); forward and kv_ops allocate nothing.
 *
 * Thread: each rank's functions on that rank's own thread (the one that
 * owns the device).
 */
#ifndef MODEL_DEV_FWD_H
#define MODEL_DEV_FWD_H

#include <stddef.h>
#include <stdint.h>

#include "common/kvop.h"
#include "kernels/cpu/kv_slots.h"
#include "kernels/cuda/kn_cuda_body.h"
#include "kernels/cuda/kn_kvcopy.h"
#include "kernels/cuda/kn_mass_body.h"
#include "model/model.h"
#include "model/tp.h"

/* Every function returns ST_OK or a negative ST_* (after logging the
 * failing call by name). ctx is the rank's context. Asynchronous ones are
 * ordered on the rank's one stream; sync waits for all of them. */
typedef struct mdl_dev_ops {
    int (*alloc)(void *ctx, void **p, size_t bytes);      /* device, zeroed */
    void (*free)(void *ctx, void *p);                     /* NULL is a no-op */
    int (*alloc_host)(void *ctx, void **p, size_t bytes); /* pinned host, zeroed */
    void (*free_host)(void *ctx, void *p);
    int (*upload)(void *ctx, void *dst, const void *src, size_t bytes); /* synchronous */
    /* dst <- src, bytes, on the stream; kind says which sides are host:
     * KV_OP_COPY device->device, KV_OP_SWAP_OUT device->host,
     * KV_OP_SWAP_IN host->device. */
    int (*copy)(void *ctx, void *dst, const void *src, size_t bytes, kv_op_kind_t kind);
    int (*sync)(void *ctx);
    /* Kernels, launch shapes as kn_cuda_body.h documents. */
    int (*embed)(void *ctx, const kn_embed_args_t *a, int32_t n_tok);
    int (*rmsnorm)(void *ctx, const kn_rmsnorm_args_t *a, int32_t n_tok);
    int (*rope)(void *ctx, const kn_rope_args_t *a, int32_t n_tok);
    int (*bias)(void *ctx, const kn_bias_args_t *a, int32_t n_tok);
    int (*kv_write)(void *ctx, const kn_kv_write_args_t *a, int32_t n_tok);
    int (*silu_mul)(void *ctx, const kn_silu_mul_args_t *a, int32_t n_tok);
    int (*add)(void *ctx, const kn_add_args_t *a);
    int (*gather)(void *ctx, const kn_gather_args_t *a, int32_t n_rows);
    int (*attention)(void *ctx, const kn_attn_cuda_args_t *a, int32_t n_tok);
    int (*attention_prefill)(void *ctx, const kn_attn_prefill_args_t *a, int32_t n_tiles);
    /* Quantized KV (fp8_e4m3 / int8 / int4), kn_cuda_body.h: residual
     * write (grid n_tok), block quantization (n jobs), dequantization
     * into a slot (n unused), attention over codes (grid n_tok). The
     * quantize / dequantize ops also run on the pinned swap tier, which
     * the device reaches through unified addressing. */
    int (*kq_res_write)(void *ctx, const kn_kq_res_write_args_t *a, int32_t n_tok);
    int (*kq_quant)(void *ctx, const kn_kq_quant_args_t *a, int32_t n_jobs);
    int (*kq_dequant)(void *ctx, const kn_kq_dequant_args_t *a, int32_t n);
    int (*kq_attention)(void *ctx, const kn_kq_attn_args_t *a, int32_t n_tok);
    /* tq3 / tq4 KV (kernels/kn_tq.h rows, kn_cuda_body.h): the new rows of
     * one layer (grid n_tok, n_kv), attention over tq blocks (grid n_tok,
     * n_kv), KV_OP_SHIFT of one block's keys in every layer (grid n_kv,
     * n_layers: decoded, rotated, encoded again). */
    int (*tq_write)(void *ctx, const kn_tq_write_args_t *a, int32_t n_tok);
    int (*tq_attention)(void *ctx, const kn_tq_attn_args_t *a, int32_t n_tok);
    int (*tq_shift)(void *ctx, const kn_tq_shift_args_t *a, int32_t n_layers);
    /* KV_OP_SHIFT: key rows rotated by -a->delta in place, grid
     * (n_heads, n_layers) (kn_kv_rotate_body). */
    int (*kv_rotate)(void *ctx, const kn_kv_rotate_args_t *a, int32_t n_heads, int32_t n_layers);
    /* H2O / SnapKV (kn_mass_body.h, model/dev_mass.c): the mass of the
     * rows that accumulate, one layer (grid n_kv, n_seqs); the mass of n
     * slots (grid n); KV_OP_COPY_SLOT moves (grid n_kv, n_layers). NULL:
     * a runtime with kv_mass is refused. */
    int (*attn_mass)(void *ctx, const kn_attn_mass_args_t *a, int32_t n_seqs);
    int (*mass_gather)(void *ctx, const kn_mass_gather_args_t *a, int32_t n);
    int (*kv_move)(void *ctx, const kn_kv_move_args_t *a, int32_t n_layers);
    /* Weight upload: n rows of blocks in their file type (device staging)
     * -> 16-bit rows, grid n (kn_wdequant_body). */
    int (*wdequant)(void *ctx, const kn_wdequant_args_t *a, int32_t n);
    /* y (n_tok, d_out) f32 = x (n_tok, d_in) 16-bit @ w^T (acc: y +=), w
     * (d_out, d_in) 16-bit; row-major device memory, f32 accumulation. */
    int (*gemm)(void *ctx, kn_dt_t dt, const uint16_t *x, const uint16_t *w, float *y,
                int32_t n_tok, int32_t d_in, int32_t d_out, int acc);
    /* In-place sum over the ranks of (n) f32 device memory; NULL at T = 1. */
    int (*allreduce)(void *ctx, float *buf, size_t n);
    /* Graphs (model/dev_graph.c); NULL: the device has none and every step
     * runs eagerly. Between graph_begin and graph_end the operations above
     * are recorded with their arguments, by value, and not run (CUDA:
     * stream capture); alloc, upload and sync are not allowed there.
     * graph_end always ends the recording and on ST_OK stores a replayable
     * graph in *graph; graph_launch enqueues it on the stream. graph_free
     * takes NULL. */
    int (*graph_begin)(void *ctx);
    int (*graph_end)(void *ctx, void **graph);
    int (*graph_launch)(void *ctx, void *graph);
    void (*graph_free)(void *ctx, void *graph);
} mdl_dev_ops_t;

/* Token-count buckets of the step graphs: 1, 2, 4, ..., 2^30 and the
 * largest step's own size at most. */
#define MDL_DEV_MAX_BUCKETS 33

typedef struct mdl_dev_layer {
    uint16_t *attn_norm, *ffn_norm; /* (dim) */
    uint16_t *wqkv;                 /* (n_q * hd + 2 * n_kv * hd, dim): wq | wk | wv rows */
    uint16_t *wq;                   /* (n_q * hd, dim), view into wqkv */
    uint16_t *wk, *wv;              /* (n_kv * hd, dim), views into wqkv */
    uint16_t *bqkv;                 /* (n_q * hd + 2 * n_kv * hd): bq | bk | bv, or NULL */
    uint16_t *bq, *bk, *bv;         /* views into bqkv, or NULL */
    uint16_t *wo;                   /* (dim, n_q * hd): this rank's columns */
    uint16_t *w_gu;                 /* (2 * n_f, dim): w_gate | w_up rows */
    uint16_t *w_gate, *w_up;        /* (n_f, dim), views into w_gu */
    uint16_t *w_down;               /* (dim, n_f): this rank's columns */
} mdl_dev_layer_t;

/* Residual slots of one tier (device pool or swap tier) of a quantized
 * KV pool: host bookkeeping of which block holds which slot, as the CPU
 * store keeps it (kernels/cpu/kv_quant.h), and the slots' memory. */
typedef struct mdl_dev_kq_tier {
    int32_t n_blocks;
    kn_kvslots_t sl; /* which slot holds which block (the CPU store's rules) */
    float *res;      /* [sl.n_slots][n_layers][2][n_kv][bs][hd] f32: device / pinned */
    uint8_t *qv;     /* [n_blocks] the codes hold rows */
    /* KV_OP_SHIFT of blocks holding codes: the pending re-rotation of
     * their keys, which attention applies to the query (host; tier 0 also
     * on the device, uploaded before a step when changed). */
    int32_t *shift;     /* [n_blocks] host */
    int32_t *shift_dev; /* [n_blocks] device (tier 0) */
    int32_t *shift_pin; /* [n_blocks] pinned staging of the upload (tier 0) */
    int shift_dirty;
} mdl_dev_kq_tier_t;

typedef struct mdl_dev_rank {
    const mdl_dev_ops_t *ops;
    void *ctx;
    const mdl_model_t *m;
    mdl_runtime_config_t rc;
    kn_dt_t dt; /* weights, KV cache, GEMM inputs */
    int32_t rank;
    mdl_tp_shard_t sh;
    mdl_dev_layer_t *layers; /* [n_layers] (host array of device pointers) */
    uint16_t *embd;          /* (vocab, dim) */
    uint16_t *out_norm;      /* (dim) */
    uint16_t *lm_head;       /* (vocab, dim), rank 0 only */
    float *inv_freq;         /* (hd / 2) */
    size_t blk_bytes;        /* one block of one layer and kind */
    uint8_t *kv;             /* [n_layers][2][num_blocks][blk_bytes] device */
    uint8_t *swap;           /* [n_layers][2][swap_blocks][blk_bytes] pinned, or NULL */
    kn_kvcopy_t *plan;       /* [2 * n_layers * (num_blocks + swap_blocks)] host */
    /* Quantized KV (kq.fmt != 0): per layer | K [num_blocks][k_stride] |
     * V [num_blocks][v_stride] | in kv and swap, residual slots per tier
     * (tier 0 device, 1 swap), blocks filled this step. */
    kn_kq_geom_t kq;
    mdl_dev_kq_tier_t kqt[2];
    uint64_t kq_stamp;
    int32_t *kq_filled; /* (T) host: slots quantized this step, freed after it */
    int32_t kq_n_filled;
    /* tq3 / tq4 KV (tq_bits != 0): per layer | K [num_blocks][tq_kstride] |
     * V [num_blocks][tq_vstride] | in kv and swap, the CPU store's layout
     * (every row encoded when written: no residual slots); the rotation
     * signs and (tq4) sketches of this rank's KV heads, as kn_tq_create()
     * makes them for a pool of n_kv heads, on the device. */
    int tq_bits;
    size_t tq_kstride, tq_vstride;
    float *tq_sg; /* (n_layers, n_kv, hd) */
    float *tq_S;  /* (n_layers, n_kv, hd, hd), tq4 only, else NULL */
    /* Activations, device, T = max_num_batched_tokens rows, S = max_num_seqs. */
    float *x, *part;     /* (T, dim) residual, row-parallel partial (T > 1) */
    float *qkv;          /* (T, n_q * hd + 2 * n_kv * hd): q | k | v per row */
    float *q, *k, *v;    /* views into qkv: row stride n_q * hd + 2 * n_kv * hd */
    float *gu;           /* (T, 2 * n_f): gate | up per row */
    float *gate, *up;    /* views into gu: row stride 2 * n_f */
    uint16_t *h16;       /* (T, max(dim, n_f, n_q * hd)) GEMM input */
    /* Split-K decode attention partials (kn_attention_split_body):
     * kn_attn_split_floats(n_q, n_kv, hd, T) f32, NULL when no step of
     * up to T tokens splits (then attention always runs in one pass). */
    float *attn_part;
    float *hrows;        /* (S, dim) */
    float *logits_dev;   /* (S, vocab), rank 0 */
    float *logits_host;  /* (S, vocab) pinned, rank 0 */
    int32_t *stage_host; /* pinned batch staging */
    int32_t *stage_dev;
    size_t stage_len; /* int32 entries */
    /* Step graphs (model/dev_graph.c) of decode and verification steps,
     * one per token-count bucket: graph_rows[i] tokens and as many
     * sequence slots (1, 2, 4, ... and the largest step), the graph or
     * NULL until its second use. graphs_off: rc.cuda_graphs is 0, the
     * device has no graph ops, or the KV is quantized (every step eager,
     * unpadded); graph_failed: a recording failed (those steps still
     * padded to their bucket, run eagerly). Counters for the tests and
     * the log: graphs recorded, steps replayed, steps run eagerly. */
    int32_t n_buckets;
    int32_t graph_rows[MDL_DEV_MAX_BUCKETS];
    void *graph[MDL_DEV_MAX_BUCKETS];
    /* The same for decode steps with rows that accumulate attention mass
     * (H2O / SnapKV): their graphs also run the mass kernels. */
    void *graph_mass[MDL_DEV_MAX_BUCKETS];
    int graphs_off, graph_failed;
    int64_t n_graph_captures, n_graph_steps, n_eager_steps;
    /* H2O / SnapKV (rc.kv_mass, model/dev_mass.c; 16-bit KV only): the
     * accumulated attention mass, [n_layers][num_blocks * block_size]
     * [n_kv] f32 device (this rank's KV heads), counted with the KV pool;
     * the staging of a mass read (up to mass_cap slots: slots and their
     * n_layers * n_kv floats, device and pinned) and of slot moves
     * (mass_cap pairs, device; host copy in mass_moves). */
    float *mass;
    size_t mass_cells; /* floats per layer */
    int32_t mass_cap;
    int32_t *mass_slots_dev, *mass_slots_pin;
    float *mass_out_dev, *mass_out_pin;
    int32_t *mass_moves_dev, *mass_moves;
    float *mass_zero; /* (block_size * n_kv) zeros, device: SWAP_IN's cells */
    int64_t n_mass_steps; /* steps that ran the mass kernels (tests) */
    /* Weight upload (mdl_dev_rank_init). In, set by the caller or left 0:
     * wstage_cap bounds each staging buffer (bytes; 0: MDL_DEV_WSTAGE),
     * upload_host forces the host path (tests). Out: wstage_bytes, the
     * size each staging buffer reached (pinned host and device, freed
     * before init returns), and n_host_uploads, the matrices that took the
     * host path. */
    size_t wstage_cap;
    int upload_host;
    size_t wstage_bytes;
    int32_t n_host_uploads;
    uint8_t *wst_host, *wst_dev; /* the staging buffers while init runs */
} mdl_dev_rank_t;

/* Default bound of each weight staging buffer: 64 MiB. */
#define MDL_DEV_WSTAGE ((size_t)64 << 20)

/* Shards and uploads the weights of rank `rank` of rc->tp_size and
 * allocates its activations (not the KV pool). rk is zeroed by the
 * caller, who may then set wstage_cap and upload_host; on failure the
 * caller still calls mdl_dev_rank_fini(). Weights travel in their file's
 * type, at most one staging buffer (pinned host + device) at a time, and
 * are dequantized to 16-bit dt on the device (wdequant); host memory
 * beyond the model's mapped file is the staging buffer. */
int mdl_dev_rank_init(mdl_dev_rank_t *rk, const mdl_dev_ops_t *ops, void *ctx, const mdl_model_t *m,
                      const mdl_runtime_config_t *rc, int32_t rank, kn_dt_t dt);
/* Bytes of the KV pool (device) that mdl_dev_rank_alloc_kv() will take:
 * blocks (with their scales) and, for fp8 / int8 / int4, the residual
 * slots of blocks being filled and the blocks' pending shifts (int32);
 * tq3 / tq4 blocks are rows only. */
size_t mdl_dev_rank_kv_bytes(const mdl_dev_rank_t *rk);
/* The KV pool (device) and swap tier (pinned host). */
int mdl_dev_rank_alloc_kv(mdl_dev_rank_t *rk);
/* Frees everything; safe on a partly initialized rank. */
void mdl_dev_rank_fini(mdl_dev_rank_t *rk);

/* H2O / SnapKV: out[i][layer][rk->sh.kv0 + h] = the accumulated mass of
 * slots[i] (validated), for this rank's n_kv heads h, in a row of
 * n_kv_all heads per layer; other columns are left alone. One gather
 * kernel, one copy back and a sync per call (mass_cap slots at a time).
 * ST_EUNSUPPORTED without rc.kv_mass. */
int mdl_dev_rank_kv_mass(mdl_dev_rank_t *rk, const int32_t *slots, int32_t n, float *out,
                         int32_t n_kv_all);

/* Validated ops, enqueued in order on the stream (the next forward runs
 * behind them; its sync, or fini, waits for them). KV_OP_SHIFT (dst >= 0, else
 * ST_EINVAL) re-rotates the keys of a 16-bit block, or of a quantized
 * block's residual slot, in place; a quantized block without a slot keeps
 * its codes and records the shift for attention; a tq block's keys are
 * decoded, rotated and encoded again (kernels/cpu/kv_quant.h's store, step
 * for step). */
int mdl_dev_rank_kv_ops(mdl_dev_rank_t *rk, const kv_op_t *ops, int32_t n_ops);
/* One step (b validated by the runtime) then sync. Rank 0 leaves
 * [b->n_logits][vocab] f32 in rk->logits_host. Every rank must run it:
 * the all-reduces pair the ranks up. A decode or verification step
 * (mdl__dev_step_short) goes through mdl__dev_graph_forward() when graphs
 * are on; eagerly it too uses the per-token attention kernel. */
int mdl_dev_rank_forward(mdl_dev_rank_t *rk, const mdl_batch_t *b);

/* ---- internal: shared by dev_fwd.c and dev_graph.c ------------------------- */

/* One step's shape and where its inputs sit in stage_dev (int32 offsets):
 *   tokens [0, T) | positions o_pos | slots o_slot | query_start o_qs
 *   (S + 1) | context_len o_ctx (S) | logits_rows o_rows (n_logits) |
 *   block_tables o_bt (S x max_blocks) | query tiles o_tiles (n_tiles) |
 *   quantized KV: residual slot o_rs (T), own slot o_own (T), fill jobs
 *   o_jobs (3 x n_jobs)
 * Everything mdl__dev_fwd_run() enqueues depends on this struct, the
 * rank's fixed buffers and the device data in stage_dev alone. */
typedef struct mdl_dev_step {
    int32_t T, S, n_logits, max_blocks;
    size_t o_pos, o_slot, o_qs, o_ctx, o_rows, o_bt, o_tiles, o_rs, o_own, o_jobs;
    int32_t n_tiles, q_tile, n_jobs;
    size_t o_mass; /* mass rows (T), with mass */
    int mass;      /* rows accumulate attention mass: the mass kernels run */
    int kq; /* fp8 / int8 / int4 blocks (residual slots) */
    int tq; /* tq3 / tq4 blocks (rows encoded in place) */
} mdl_dev_step_t;

/* Enqueues the step from stage_dev: embedding, the layers, and on rank 0
 * with n_logits > 0 the final norm and LM head into logits_dev (not the
 * copy to the host, not a sync). */
int mdl__dev_fwd_run(mdl_dev_rank_t *rk, const mdl_dev_step_t *p);
/* model/dev_mass.c. Init: checks rc.kv_mass against the KV dtype and the
 * ops (ST_EUNSUPPORTED, logged) and sizes the staging; alloc: the
 * accumulator and staging (called by mdl_dev_rank_alloc_kv); bytes: what
 * alloc takes for n_blocks (device); fini frees. */
int mdl__dev_mass_init(mdl_dev_rank_t *rk);
int mdl__dev_mass_alloc(mdl_dev_rank_t *rk);
size_t mdl__dev_mass_bytes(const mdl_config_t *c, const mdl_runtime_config_t *rc, int32_t n_kv,
                           int32_t n_blocks);
void mdl__dev_mass_fini(mdl_dev_rank_t *rk);
/* The mass side of a run of copy / swap ops (16-bit pool, after their
 * block copies are enqueued): COPY copies the blocks' cells, SWAP_IN
 * zeroes them (the swap tier keeps no mass). */
int mdl__dev_mass_block_ops(mdl_dev_rank_t *rk, const kv_op_t *ops, int32_t n_ops);
/* A run of KV_OP_COPY_SLOT ops (16-bit pool), in order. */
int mdl__dev_mass_moves(mdl_dev_rank_t *rk, const kv_op_t *ops, int32_t n_ops);
/* The mass kernel of layer l after its attention (p->mass set). */
int mdl__dev_mass_layer(mdl_dev_rank_t *rk, const mdl_dev_step_t *p,
                        const kn_attn_cuda_args_t *aa, int32_t l);
/* Sets up the buckets (init); no device call. */
void mdl__dev_graph_init(mdl_dev_rank_t *rk);
/* Whether every sequence of b has at most 1 + rc.spec_k new tokens (a
 * decode or verification step: per-token attention, no query tiles). */
int mdl__dev_step_short(const mdl_dev_rank_t *rk, const mdl_batch_t *b);
/* Whether b is a step the graphs take (short rows, no hidden rows, at
 * most n_tokens logits rows, a bucket fits its tokens). */
int mdl__dev_graph_takes(const mdl_dev_rank_t *rk, const mdl_batch_t *b);
/* The step b (mdl__dev_graph_takes() true) padded to its bucket: staged,
 * uploaded, run (the bucket's first step eagerly, then recorded; later
 * ones by launching its graph), the n_logits logits rows copied, sync. */
int mdl__dev_graph_forward(mdl_dev_rank_t *rk, const mdl_batch_t *b);
/* Frees the graphs (fini). */
void mdl__dev_graph_fini(mdl_dev_rank_t *rk);

#endif /* MODEL_DEV_FWD_H */
