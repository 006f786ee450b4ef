/* kv_quant.h - compressed paged KV cache for the CPU backend: f16, bf16,
 * FP8 (E4M3) and asymmetric INT8 / INT4 blocks in the KIVI layout, the
 * full-precision residual of blocks still being filled, and paged attention
 * that reads the compressed blocks directly.
 *
 * DESIGN. A block is the quantization group (KIVI, Liu et al. 2024): keys
 * are quantized per channel over the block's tokens, values per token over
 * head_dim, because key outliers live in fixed channels and value outliers
 * in tokens. Per layer and kind the store keeps one region
 *
 *   [num_blocks][ data: [n_kv][block_size][head_dim] codes | meta | pad ]
 *
 *   K meta: [n_kv][head_dim]   scale (+ zero point) as f16
 *   V meta: [n_kv][block_size] scale (+ zero point) as f16
 *
 * (fp8 keeps only the scale; f16 / bf16 / f32 keep no meta). INT4 packs
 * channel i (low nibble) with channel i + head_dim/2 (high nibble), the two
 * halves RoPE pairs, so unpacking writes two contiguous runs; a row is whole
 * 32-bit words of eight channels, so INT4 needs head_dim % 8 == 0. The meta sits
 * beside the codes in the same block, so a block copy (copy-on-write, swap,
 * prefix cache) moves the scales with it and stays bit-exact.
 *
 * Residual: the scaled formats (fp8, int8, int4) cannot quantize a key
 * block before its last token exists. A block being filled lives in a
 * full-precision slot (f32, every layer, K and V) taken from a small pool
 * per tier; the write of the block's last token quantizes that layer, and
 * at the end of that step (kn_kvq_end_step) the slot returns to the pool.
 * Decoding thus never re-quantizes. Slots follow blocks through COPY / SWAP ops, and
 * DROP ops (block freed while partial) give them back. When a tier's slots
 * run out, the least recently written one is flushed: its partial block is
 * quantized over the rows written so far, and a later write into it takes
 * a slot again, starting from the dequantized rows (the one case that
 * re-quantizes; the store counts it).
 *
 * Attention reads the codes directly and never builds a dequantized tile:
 * key scales are per channel, so q . k_t = sum_c (q_c s_c) code_tc +
 * sum_c q_c z_c (q scaled once per block, then dotted with the codes);
 * value scales are per token, so sum_t p_t (s_t code_t + z_t) =
 * sum_t (p_t s_t) code_t + sum_t p_t z_t (one scalar per code row, one
 * zero-point sum per head). Codes are widened to f32 in registers
 * (generic, AVX2+FMA or AVX-512 copy picked at run time from
 * kn_cpu_isa()); the online softmax is the f32 kernel's. A quantized block
 * with a pending SHIFT rotates the query by +shift instead of the keys.
 *
 * tq3 / tq4 (kv_tq.h) are whole-row codes: each token is encoded as it is
 * written (no residual slot, no meta), its data region holding
 * [n_kv][block_size][row] rows of kernels/kn_tq.h; kn_kvq_quantize_block()
 * and kn_kvq_dequant_rows() do not take them (they need the layer's
 * rotation: kn_kvq_read_rows() does).
 *
 * Thread: a store belongs to one thread (the engine); kn_kvq_attention()
 * fans out over the kernel thread team internally.
 */
#ifndef KERNELS_CPU_KV_QUANT_H
#define KERNELS_CPU_KV_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "common/kvop.h"
#include "kernels/cpu/kn_cpu.h"

typedef enum kn_kvq_fmt {
    KN_KVQ_F32 = 0,
    KN_KVQ_F16,
    KN_KVQ_BF16,
    KN_KVQ_FP8, /* E4M3 (OCP "fn": no infinities, max 448), scaled */
    KN_KVQ_INT8,
    KN_KVQ_INT4,
    KN_KVQ_TQ3, /* TurboQuant-style rows, 3 / 4 bits per coordinate (kv_tq.h) */
    KN_KVQ_TQ4,
} kn_kvq_fmt_t;

/* Byte sizes of one block of one layer, per kind. */
typedef struct kn_kvq_layout {
    kn_kvq_fmt_t fmt;
    int32_t n_kv_heads;
    int32_t block_size;
    int32_t head_dim;
    size_t data_bytes; /* codes: n_kv * bs * hd * bits / 8 */
    size_t k_meta;     /* bytes of K scales (+ zeros) */
    size_t v_meta;
    size_t k_stride; /* data + K meta, rounded up to 16 bytes */
    size_t v_stride;
    int32_t head0; /* tq: global index of the first KV head (rotation seeds); 0 from init */
} kn_kvq_layout_t;

const char *kn_kvq_fmt_name(kn_kvq_fmt_t fmt);
/* Whether fmt carries scales (and so a residual for partial blocks). */
int kn_kvq_scaled(kn_kvq_fmt_t fmt);

/* Bits per coordinate of a tq format (3 or 4), 0 for the others. */
int kn_kvq_tq_bits(kn_kvq_fmt_t fmt);

/* Fills *out. ST_EUNSUPPORTED with a reason in err for shapes a format
 * cannot group (INT4 with head_dim % 8 != 0; tq with head_dim not a power
 * of two in 16 .. 256; any odd head_dim), ST_EINVAL
 * for non-positive sizes. */
int kn_kvq_layout_init(kn_kvq_layout_t *out, kn_kvq_fmt_t fmt, int32_t n_kv_heads,
                       int32_t block_size, int32_t head_dim, char *err, size_t errlen);

/* ---- element codecs (exposed for the tests) ---------------------------- */

uint16_t kn_f32_to_f16(float x); /* round to nearest even, saturating to inf */
float kn_f16_to_f32(uint16_t h);
uint16_t kn_f32_to_bf16(float x); /* round to nearest even */
float kn_bf16_to_f32(uint16_t h);
uint8_t kn_f32_to_e4m3(float x); /* round to nearest even, saturating to 448 */
float kn_e4m3_to_f32(uint8_t v);

/* ---- one block (exposed for the tests) --------------------------------- */

/* Quantizes rows [0, n_rows) of one kind of one block from f32
 *   src: [n_kv][block_size][head_dim]
 * into dst (a block of stride k_stride / v_stride); kind 0 = K (per
 * channel), 1 = V (per token). Rows >= n_rows are written as zeros. */
void kn_kvq_quantize_block(const kn_kvq_layout_t *L, int kind, const float *src, int32_t n_rows,
                           uint8_t *dst);
/* Dequantizes rows [r0, r0 + n) of head h of one block into out (n, hd). */
void kn_kvq_dequant_rows(const kn_kvq_layout_t *L, int kind, const uint8_t *blk, int32_t h,
                         int32_t r0, int32_t n, float *out);

/* ---- the store ---------------------------------------------------------- */

typedef struct kn_kvq_store kn_kvq_store_t;

typedef struct kn_kvq_stats {
    uint64_t quantized;   /* blocks quantized (all layers) when filled */
    uint64_t flushed;     /* partial blocks quantized early (slots ran out) */
    uint64_t requantized; /* writes into an already quantized block */
    int32_t slots_dev;    /* residual slots per tier */
    int32_t slots_swap;
    int32_t slots_dev_used;
    int32_t slots_swap_used;
} kn_kvq_stats_t;

/* Allocates the device pool (num_blocks), the swap tier (swap_blocks, may
 * be 0) and the residual slot pools (res_slots per tier; clamped to the
 * tier's block count; unused for unscaled formats) as anonymous mappings.
 * ST_ENOMEM / ST_EUNSUPPORTED / ST_EINVAL with a reason in err. */
int kn_kvq_store_create(const kn_kvq_layout_t *L, int32_t n_layers, int32_t num_blocks,
                        int32_t swap_blocks, int32_t res_slots, kn_kvq_store_t **out, char *err,
                        size_t errlen);
void kn_kvq_store_destroy(kn_kvq_store_t *st); /* NULL is a no-op */
const kn_kvq_layout_t *kn_kvq_store_layout(const kn_kvq_store_t *st);
/* Bytes mapped for the pool, the swap tier and the residual slots. */
size_t kn_kvq_store_bytes(const kn_kvq_store_t *st, size_t *swap_bytes, size_t *res_bytes);
void kn_kvq_store_stats(const kn_kvq_store_t *st, kn_kvq_stats_t *out);

/* Writes new tokens' K and V of one layer (same contract as
 * kn_cpu_kv_write: k, v (n_tok, n_kv * hd), slot = block * bs + offset,
 * negative skipped). Layers must be written in order 0 .. n_layers - 1
 * within a step. */
void kn_kvq_write(kn_kvq_store_t *st, int32_t layer, const float *k, const float *v,
                  const int32_t *slot, int32_t n_tok);

/* Paged attention of one layer over the store: a's k_cache / v_cache are
 * ignored; everything else as kn_cpu_attention(). A query reads the rows of
 * its own block in full precision (the residual) and earlier blocks as
 * codes (KIVI), whatever the step split. Uses the ISA kn_cpu_set_isa()
 * selected (tests force each one); allocates nothing. */
void kn_kvq_attention(const kn_kvq_store_t *st, int32_t layer, const kn_attn_args_t *a);

/* Ends a forward step: residual slots of blocks quantized during it return
 * to the pool (they served the queries of those blocks until now). */
void kn_kvq_end_step(kn_kvq_store_t *st);

/* RoPE frequencies (head_dim / 2 floats, copied) for KV_OP_SHIFT. */
void kn_kvq_store_set_rope(kn_kvq_store_t *st, const float *inv_freq);

/* Runs COPY / SWAP_OUT / SWAP_IN / DROP / DROP_SWAP / SHIFT ops in order
 * (ids validated by the caller). ST_EINVAL for a swap op without a swap
 * tier, or a SHIFT before kn_kvq_store_set_rope().
 *
 * SHIFT never re-quantizes: a block holding a residual slot has its f32
 * key rows rotated in place; a quantized block keeps its codes and records
 * the shift, and every read of its keys rotates the dequantized tile by
 * -shift in registers (a COPY / SWAP carries the shift along). */
int kn_kvq_ops(kn_kvq_store_t *st, const kv_op_t *ops, int32_t n_ops);

/* Borrowed bytes of one block (tier 0 device, 1 swap) of one layer and
 * kind, k_stride / v_stride long, for tests comparing blocks bit for bit. */
const uint8_t *kn_kvq_block_ptr(const kn_kvq_store_t *st, int tier, int32_t layer, int kind,
                                int32_t block);
/* Whether a block currently holds a full-precision residual slot. */
int kn_kvq_block_is_residual(const kn_kvq_store_t *st, int tier, int32_t block);
/* Reads rows [r0, r0 + n) of head h of a device block as queries of later
 * blocks see them (residual rows while the block has no codes for the
 * layer, else dequantized codes) into out (n, hd). */
void kn_kvq_read_rows(const kn_kvq_store_t *st, int32_t layer, int kind, int32_t block, int32_t h,
                      int32_t r0, int32_t n, float *out);

/* Rotates n rows of head_dim floats (RoPE "rotate_half" pairs i, i + hd/2)
 * by -delta positions in place: the key rows' re-rotation of a SHIFT.
 * inv_freq: (hd / 2). Used by the f32 pool too. */
void kn_kvq_rotate_rows(float *rows, int32_t n, int32_t head_dim, const float *inv_freq,
                        int32_t delta);

#endif /* KERNELS_CPU_KV_QUANT_H */
