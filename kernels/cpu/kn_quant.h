/* kn_quant.h - weights in their file format (f32, f16, bf16 and ggml's
 * q8_0, q4_0, q4_K, q5_K, q6_K blocks): dequantization, quantization, and
 * the matrix products of the forward pass straight from those bytes.
 *
 * DESIGN. A weight is {type, data, row_bytes}: rows of blocks exactly as
 * GGUF stores them (ggml-common.h layouts), so the mmap'd file is the only
 * copy. Products with a Q weight quantize the activations to 8 bits once
 * per input (kn_act_t: blocks of 32 with an f32 scale, shared by every
 * weight reading that input) and run integer dot products: AVX512-VNNI
 * vpdpbusd, else AVX2 / AVX-512BW vpmaddubsw, else C. Every block is read
 * through one decoded form, value = a * s + c per element, with s an 8-bit
 * code, a a scale per 16 elements and c an offset per 16 (the q4_K / q5_K
 * mins, and in the SIMD kernels the zero points they move out of the
 * codes, see kn_quant_body.inc):
 *
 *   dot(row, x) = sum over 16-groups h of  dx_h * (a_h * sum_h(s * xq))
 *                                        + c_h * (dx_h * sum_h(xq))
 *
 * where xq, dx are the activation's codes and block scale. F16 and BF16
 * weights are widened to f32 in registers (F16C; a 16-bit shift) and
 * multiply the f32 activations as they are (FMA); on AVX512-BF16 CPUs
 * BF16 rows up to 4096 wide instead multiply a two-term bf16 form of the
 * activations (x = bh + bl within 2^-18, made once per input, kn_act_t)
 * with vdpbf16ps, two per 32 columns: f32-path accuracy at 1.07-1.15x
 * its rate at 32 tokens (kn_quant_body.inc has the measurements, and why
 * one term is not used by default). F32 weights use kn_cpu_matmul().
 * With kn_act_t's bf16_medium (--matmul-precision medium) BF16 weights
 * read one bf16 term of the activations instead, at every width and
 * every ISA level (kn_bf16m.c): vdpbf16ps on bh alone, or the FMA tile
 * on the rounded values below AVX512-BF16.
 *
 * Products read each weight byte once and split rows over the kernel
 * thread team. On the SIMD levels a Q row is unpacked 256 columns at a
 * time in registers (nibble masks and shifts) and the codes go straight
 * to the integer dots of every token of the batch, one f32 scale per
 * block of 32 (memory-bound at decode on q4_K); from 4 tokens a tiled
 * GEMM decodes each slice of a row once per 64 tokens into a transposed
 * register form that gives the same sums without a reduction. A row's
 * result for a token is the same whatever the batch. The C level decodes 4-row tiles
 * into a buffer; F16 / BF16 run 4 rows x 4 tokens per micro-kernel.
 * q4_K on the CPU backend is repacked at load into KN_W_Q4_K_R8 (below,
 * kn_q4r8.c, kn_q4r8_body.inc): 8 rows interleaved, read against Q8_K
 * activations (one scale per 256) with 8 rows' lanes side by side, 1.1-1.3x
 * the file-layout kernel's rate; q6_K likewise into KN_W_Q6_K_R8
 * (kn_q6r8.c, kn_q6r8_body.inc); q8_0 into KN_W_Q8_0_R16 (kn_q8r16.c,
 * kn_q8r16_body.inc): 16 rows interleaved 4 codes at a time, one lane
 * per row against the Q8_0 activations; the other types keep the file's
 * rows.
 *
 * Thread: the ISA comes from kn_cpu_isa() (set at start-up); functions may
 * be called from any thread; a kn_act_t is used by one caller at a time.
 */
#ifndef KERNELS_CPU_KN_QUANT_H
#define KERNELS_CPU_KN_QUANT_H

#include <stddef.h>
#include <stdint.h>

typedef enum kn_wtype {
    KN_W_F32 = 0,
    KN_W_F16,
    KN_W_BF16,
    KN_W_Q8_0,
    KN_W_Q4_0,
    KN_W_Q4_K,
    KN_W_Q5_K,
    KN_W_Q6_K,
    KN_W_NTYPES, /* the types a file stores: the ones above */
    /* q4_K repacked at load for the CPU kernels, 8 rows interleaved (never
     * in a file, outside [0, KN_W_NTYPES): see kn_q4r8_repack). */
    KN_W_Q4_K_R8 = 16,
    /* q6_K repacked likewise (kn_q6r8_repack, kernels/cpu/kn_q6r8.c). */
    KN_W_Q6_K_R8 = 17,
    /* q8_0 repacked at load, 16 rows interleaved (never in a file: see
     * kn_q8r16_repack). */
    KN_W_Q8_0_R16 = 18
} kn_wtype_t;

/* A weight matrix [rows][cols] (Hugging Face linear layout: rows = d_out,
 * cols = d_in) in its storage format; row r starts at
 * (const char *)data + r * row_bytes. */
typedef struct kn_weight {
    kn_wtype_t type;
    const void *data;
    size_t row_bytes;
    int32_t rows, cols;
} kn_weight_t;

/* "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_k_r8",
 * "q6_k_r8"; "?" if unknown. The size functions give q4_k_r8 256 elements
 * and 144 bytes per row and block (its 8-row block of 1152 bytes shared
 * out), q6_k_r8 256 and 210 (of 1680). */
const char *kn_wtype_name(kn_wtype_t t);
/* Elements per block: 1, 1, 1, 32, 32, 256, 256, 256 (0 if unknown). */
int32_t kn_wtype_block_elems(kn_wtype_t t);
/* Bytes per block: 4, 2, 2, 34, 18, 144, 176, 210 (0 if unknown). */
size_t kn_wtype_block_bytes(kn_wtype_t t);
/* Bytes of a row of cols elements; 0 when cols % block_elems != 0 or cols < 0. */
size_t kn_wtype_row_bytes(kn_wtype_t t, int64_t cols);

/* Decodes n elements (n % block_elems == 0) of src into dst (a file type:
 * not KN_W_Q4_K_R8, whose rows are not contiguous; see kn_weight_row). Bit-exact
 * with ggml's dequantize_row_* for the same block bytes (products
 * evaluated as ggml writes them, never fused). */
void kn_dequant_row(kn_wtype_t t, const void *src, float *dst, int64_t n);
/* Quantizes n floats (n % block_elems == 0) into dst in the type's block
 * layout with ggml's reference algorithms (no importance matrix): q8_0 /
 * q4_0 absmax, q4_K / q5_K the make_qkx2 scale and min search, q6_K the
 * make_qx search; f16 / bf16 round to nearest even; f32 copies. The bytes
 * are what llama.cpp reads. */
void kn_quant_row(kn_wtype_t t, const float *src, void *dst, int64_t n);

/* Activations prepared once per input and shared by every weight reading
 * it. Fields (read-only to callers):
 *   x           (n_tok, d_in) the f32 input (not copied: keep it alive)
 *   d_pad       d_in rounded up to 256 (the decode slice)
 *   q           (n_tok, d_pad) int8 codes, round(x / d) with d = absmax / 127
 *               per block of 32; zero past d_in
 *   dl          (n_tok, d_pad / 4) the block scale d of every 4 codes
 *               (8 copies per block: the C tiles' and the reference's
 *               layout)
 *   s16         (n_tok, d_pad / 16) d * sum(q) per 16 codes (the C
 *               tiles' min terms, the GEMV's q6_K offsets)
 *   d32, s32    (n_tok, d_pad / 32) d and d * sum(q) per block of 32 (the
 *               GEMV's compact forms of dl and s16)
 *   c32         (n_tok, d_pad / 32) -128 * sum(q) per block of 32, exact in
 *               int32 (the VNNI q8_0 kernels read a weight code q as the
 *               unsigned q + 128 and start each block's sum here)
 *   qt          (n_tok, d_pad) q with each 256-column slice transposed as
 *               8 x 8 dwords: bytes 32 i + 4 j .. + 3 hold codes 4 i .. 4 i + 3
 *               of block j (the tiled GEMM's layout: one vpdpbusd lane
 *               per block)
 *   have_q8     whether the 8-bit form is made (lazily, by kn_matmul_w)
 * buf is caller scratch of kn_act_bytes(n_tok, d_in) bytes, any alignment. */
typedef struct kn_act {
    const float *x;
    int32_t n_tok, d_in, d_pad;
    int8_t *q;
    float *dl;
    float *s16;
    float *d32, *s32;
    int32_t *c32;
    int8_t *qt;
    int have_q8;
    /* The Q8_K form, read by KN_W_Q4_K_R8 weights only (kn_act_quantize_q8k):
     *   kq   (n_tok, d_pad) int8 codes, round-half-even(x / kd) with
     *        kd = absmax / 127 per 256 columns; zero past d_in
     *   kd   (n_tok, d_pad / 256) the scale of each 256
     *   kbs  (n_tok, d_pad / 32) exact sum of the codes of each 32 */
    int8_t *kq;
    float *kd;
    int16_t *kbs;
    /*   kc16 (n_tok, d_pad / 16) -16 * the sum of the codes of each 16, exact
     *        (KN_W_Q6_K_R8: each lane of a 16-group's pair starts there, which
     *        moves the q6_K codes' offset of 32 out of the integer dots) */
    int32_t *kc16;
    int have_q8k;
    /* The bf16 form, read by BF16 weights on the AVX512-BF16 level only
     * (vdpbf16ps; made lazily by kn_matmul_w):
     *   bh, bl  (n_tok, d_pad) x = bh + bl + r per element: bh = bf16(x),
     *           bl = bf16(x - bh) (round to nearest even, x - bh exact in
     *           f32), |r| <= 2^-18 |x|; zero past d_in
     * With bf16_medium (below) BF16 weights read one term instead: bh
     * alone on the AVX512-BF16 level (KN_BF16_ONE, bl not made), and on
     * the other levels
     *   br      (n_tok, d_pad) f32 bf16(x) (the same rounding; zero past
     *           d_in), in bh and bl's bytes (KN_BF16_F32)
     * have_bf16 says which form the bytes hold (KN_BF16_*, 0: none). */
    uint16_t *bh, *bl;
    float *br;
    int have_bf16;
    /* Set by the caller after kn_act_init, before any product (0 there):
     * nonzero multiplies BF16 weights by bf16(x), one term, at every ISA
     * level (--matmul-precision medium, kn_bf16m.c); other types ignore it. */
    int bf16_medium;
} kn_act_t;

/* What kn_act_t's bf16 bytes hold. */
enum { KN_BF16_TWO = 1, KN_BF16_ONE = 2, KN_BF16_F32 = 3 };

size_t kn_act_bytes(int32_t n_tok, int32_t d_in);
/* The part of kn_act_bytes(n_tok, d_in) at its end that only the bf16
 * form (BF16 weights on the AVX512-BF16 level) reads and writes: a caller
 * whose weights hold no BF16 matrix need not commit those pages. */
size_t kn_act_bytes_bf16(int32_t n_tok, int32_t d_in);
void kn_act_init(kn_act_t *a, const float *x, int32_t n_tok, int32_t d_in, void *buf);
/* Makes the 8-bit form now; idempotent. kn_matmul_w() calls it on first
 * use by a Q weight. From 2^15 elements the tokens are split over the
 * kernel thread team (each token's forms depend on that token alone). */
void kn_act_quantize_q8(kn_act_t *a);
/* The 8-bit forms of tokens [t0, t1) only, for a caller that splits the
 * tokens over the team itself (kernels/cpu/kn_fused.h: fused with the op
 * that produces them); the same bits as kn_act_quantize_q8. Once every
 * token is made the caller sets a->have_q8 = 1. */
void kn_act_quantize_q8_rows(kn_act_t *a, int32_t t0, int32_t t1);

/* Makes the Q8_K form now; idempotent (kn_matmul_w calls it on first use
 * by a KN_W_Q4_K_R8 or KN_W_Q6_K_R8 weight). Split over the team from 2^15 elements. */
void kn_act_quantize_q8k(kn_act_t *a);

/* ---- q4_K repacked 8 rows at a time (KN_W_Q4_K_R8) ----------------------
 * For each group of 8 rows (G = r / 8) and each 256 columns (k), one block
 * of 1152 bytes (the file's 8 blocks' size) at data + (G * cols / 256 + k)
 * * 1152:
 *     0  f16 d[8]            the 8 rows' super-block scales
 *    16  f16 dmin[8]         and mins
 *    32  u8  sm[4][24]       per g (sub-blocks 2g, 2g + 1), i = 2 row + h:
 *                            byte i (0..15) = scale & 15 | (min & 15) << 4
 *                            of sub-block 2g + h; byte 16 + i / 2 holds
 *                            the top 2 bits of scale (bits 0-1) and min
 *                            (4-5) of even i, of odd i at bits 2-3 / 6-7
 *   128  u8  qs[4][4][8][8]  [g][p][row]: the row's file bytes
 *                            qs[32 g + 8 p .. + 7] (low nibbles: columns
 *                            64 g + 8 p + i, high: + 32)
 * so that one 64-byte load holds 8 columns of all 8 rows, two dword lanes
 * per row, matching an 8-byte broadcast of the activation codes; a few
 * SSE ops unpack a g's 16 scales and mins per block (a byte-per-scale
 * layout, 1184 bytes, measured no faster). kn_dequant_row() and
 * kn_quant_row() do not take this type (its rows are not contiguous);
 * kn_weight_row() and kn_embed_w() do.
 * The product reads the Q8_K activations: per row and 256 columns
 *   S1 = sum_j sc_j * sum_{32} q * xq,   S2 = sum_j mn_j * kbs_j   (exact int32)
 *   acc = fmaf(d * kd, (float)S1, acc);  acc = fmaf(-(dmin * kd), (float)S2, acc)
 * from acc = 0, then + bias, then + y when accumulating: every ISA level
 * and the reference give the same bits (the integer sums are exact). */

/* Bytes of the repacked form of a rows x cols q4_K matrix. */
size_t kn_q4r8_bytes(int32_t rows, int32_t cols);
/* Repacks w (KN_W_Q4_K, rows % 8 == 0, cols % 256 == 0) into dst
 * (kn_q4r8_bytes, any alignment); *out becomes the KN_W_Q4_K_R8 view of
 * dst. ST_EINVAL (nothing written) for another type or shape. */
int kn_q4r8_repack(const kn_weight_t *w, void *dst, kn_weight_t *out);
/* ---- q6_K repacked 8 rows at a time (KN_W_Q6_K_R8) ----------------------
 * For each group of 8 rows (G = r / 8) and each 256 columns (k), one block
 * of 1680 bytes (the file's 8 blocks' size) at data + (G * cols / 256 + k)
 * * 1680:
 *     0  f16  d[8]            the 8 rows' super-block scales
 *    16  int8 sc[16][8]       [group of 16 columns][row]: the file's scales
 *   144  per quarter q (64 columns), 384 bytes at 144 + 384 q:
 *          u8 ql[4][64]       byte 8 row + i of ql[j]: low nibble = low 4
 *                             bits of the code of column 64 q + 8 j + i,
 *                             high nibble = that of column 64 q + 8 (j + 4) + i
 *          u8 qh[2][64]       byte 8 row + i of qh[h]: bits 2 s, 2 s + 1 =
 *                             top 2 bits of the code of column
 *                             64 q + 8 (4 h + s) + i
 * so that one 64-byte vector of codes (8 columns of all 8 rows, a lane
 * pair per row) is unpacked with two masks and two shifts and matches an
 * 8-byte broadcast of the activation codes, and the 16 columns of a scale
 * are two such vectors. The codes stay unsigned (0..63, value d * sc *
 * (q - 32)); the product reads the Q8_K activations: per row and 256 columns
 *   S = sum_g sc_g * (sum_{16} q * xq - 32 * sum_{16} xq)      (exact int32)
 *   acc = fmaf(d * kd, (float)S, acc)
 * from acc = 0, then + bias, then + y when accumulating: every ISA level and
 * the reference give the same bits. kn_weight_row() and kn_embed_w() read
 * it, kn_dequant_row() does not. */

/* Bytes of the repacked form of a rows x cols q6_K matrix. */
size_t kn_q6r8_bytes(int32_t rows, int32_t cols);
/* Repacks w (KN_W_Q6_K, rows % 8 == 0, cols % 256 == 0) into dst
 * (kn_q6r8_bytes, any alignment); *out becomes the KN_W_Q6_K_R8 view of
 * dst. ST_EINVAL (nothing written) for another type or shape. */
int kn_q6r8_repack(const kn_weight_t *w, void *dst, kn_weight_t *out);

/* Row r of w, any type (the repacked ones included), dequantized into dst
 * (w->cols floats), bit for bit kn_dequant_row() of the file's row. */
void kn_weight_row(const kn_weight_t *w, int32_t r, float *dst);

/* ---- q8_0 repacked 16 rows at a time (KN_W_Q8_0_R16, kn_q8r16.c) ------
 * For each group of 16 rows (G = r / 16) and each block of 32 columns
 * (b), 544 bytes (the file's 16 blocks' size) at data + (G * cols / 32 +
 * b) * 544:
 *     0  f16 d[16]           the 16 rows' block scales
 *    32  u8  qs[8][16][4]    [i][row]: the row's codes 4 i .. 4 i + 3 of
 *                            the block, each stored as q + 128 (q ^ 0x80)
 * so that one 64-byte load holds 4 columns of all 16 rows, one dword lane
 * per row, against a 4-byte broadcast of the activation codes
 * (kn_q8r16_body.inc). Size name "q8_0_r16", 32 elements and 34 bytes
 * per row and block. The product reads the Q8_0 activations (q, d32,
 * c32): per row and block, with isum the exact int32 sum of q * xq,
 *   acc = fmaf(d * dx, (float)isum, acc)
 * from acc = 0, then + bias, then + y when accumulating: every ISA level
 * and the reference give the same bits. kn_dequant_row() / kn_quant_row()
 * do not take this type; kn_weight_row() and kn_embed_w() do. */

/* Bytes of the repacked form of a rows x cols q8_0 matrix. */
size_t kn_q8r16_bytes(int32_t rows, int32_t cols);
/* Repacks w (KN_W_Q8_0, rows % 16 == 0, cols % 32 == 0) into dst
 * (kn_q8r16_bytes, any alignment); *out becomes the KN_W_Q8_0_R16 view of
 * dst. ST_EINVAL (nothing written) for another type or shape. */
int kn_q8r16_repack(const kn_weight_t *w, void *dst, kn_weight_t *out);

/* y (n_tok, w->rows) = x W^T (+ bias) (+ y when accumulate); w->cols ==
 * a->d_in; y must not alias x. F32 calls kn_cpu_matmul(). Allocates
 * nothing; splits rows over the kernel thread team when large enough. */
void kn_matmul_w(kn_act_t *a, const kn_weight_t *w, const float *bias, float *y, int accumulate);
/* The products of n weights (n <= KN_MATMUL_MAX) that read the same input
 * (q/k/v, gate/up) as one fork-join region of the thread team: y[i] =
 * x W[i]^T (+ bias[i] when bias != NULL and bias[i] != NULL) (+ y[i] when
 * accumulate). Every w[i]->cols == a->d_in. Each y[i] is bit for bit what
 * kn_matmul_w() gives; only the number of team wake-ups changes. */
#define KN_MATMUL_MAX 4
void kn_matmul_w_n(kn_act_t *a, int n, const kn_weight_t *const w[], const float *const bias[],
                   float *const y[], int accumulate);
/* Scalar reference of the same arithmetic: the same 8-bit activations,
 * exact integer block dots, then the same f32 products of scales (a_h *
 * dx, c_h * s16), all accumulated in double. F16 and F32 accumulate w * x
 * (the f32 activations) in double; BF16 accumulates w * (bh + bl), the
 * two-term form the AVX512-BF16 kernel reads, with subnormal w, bh, bl
 * read as zero as vdpbf16ps does (each product exact in double). The
 * fast path differs only by the order and f32 rounding of its sums
 * (vdpbf16ps: two FMAs per lane pair, round to nearest, subnormal results
 * flushed), and BF16 on the FMA levels by its w * x, within 2^-18 |w x|
 * per product of the reference: the kernel test's 1e-4 sum |w x| covers
 * both. Allocates. */
void kn_matmul_w_ref(const float *x, int32_t n_tok, const kn_weight_t *w, const float *bias,
                     float *y, int accumulate);
/* The reference of a BF16 product with bf16_medium (kernels/cpu/kn_bf16m.c):
 * y = sum bf16(w) * bf16(x) (x rounded to nearest even, as kn_f32_to_bf16;
 * subnormal w or bf16(x) read as zero, as vdpbf16ps does), each product
 * exact in f32 and in double, accumulated in double, then + bias, + y when
 * accumulating, rounded once to f32. Every ISA level computes the same
 * exact products and differs only in the order and f32 rounding of its
 * sums (and, below AVX512-BF16, by not flushing subnormal products: each
 * under 2^-126 |w|). Other types: kn_matmul_w_ref. Allocates. */
void kn_matmul_w_ref_medium(const float *x, int32_t n_tok, const kn_weight_t *w, const float *bias,
                            float *y, int accumulate);
/* out[t] (n_tok, w->cols) = dequantized row tokens[t] of an embedding
 * table w (rows = vocab, cols = dim; any type). Ids must be in range. */
void kn_embed_w(const kn_weight_t *w, const int32_t *tokens, int32_t n_tok, float *out);

#endif /* KERNELS_CPU_KN_QUANT_H */
