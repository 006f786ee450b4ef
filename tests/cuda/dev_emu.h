/* dev_emu.h - the CUDA backend's forward pass (model/dev_fwd.c) on emulated
 * device operations, for the tests of tests/cuda (test_devemu.c,
 * test_spec_emu.c, test_mass_emu.c).
 *
 * DESIGN
 *   The operations: "device" memory is host memory, kernels are the
 *   bodies of kernels/cuda/kn_cuda_body.h under the thread-block emulator
 *   (kn_emu.h), the GEMM is a reference loop over the 16-bit operands with
 *   f32 output (what cublasGemmEx computes), the all-reduce is
 *   kernels/comm.h's. Everything else is the code the CUDA backend runs.
 *
 *   emu_dev_t: T = rc->tp_size emulated ranks on rank threads, driven
 *   step by step (emu_side_*). emu_backend: the same as an mdl_backend_t
 *   named "cuda-emu" (registered with mdl_backend_register_test), so the
 *   runtime and the whole engine -- scheduler, block manager, speculative
 *   decoding with its draft model -- run on it as on model/backend_cuda.c
 *   (the same weight dtype rule: f16 with an f16 KV cache, else bf16; the
 *   same KV dtypes).
 *
 * Thread: the test's thread (rank threads inside kn_ranks_run).
 */
#ifndef TESTS_CUDA_DEV_EMU_H
#define TESTS_CUDA_DEV_EMU_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/comm.h"
#include "model/backend.h"
#include "model/dev_fwd.h"
#include "model/model.h"

/* The model directory of the tests: $KVSERVE_TEST_MODEL, else the default
 * model of the source tree. */
const char *emu_model_dir(void);
/* That model, loaded (a failed load fails the test). */
mdl_model_t *emu_load_model(void);

/* The emulated device operations at T > 1 (allreduce set). */
extern const mdl_dev_ops_t emu_ops;

typedef int (*emu_exec_fn)(void *ctx, const void *args, int32_t n);

typedef struct emu_rec_op {
    emu_exec_fn fn;
    int32_t n;
    union {
        max_align_t align_;
        unsigned char b[sizeof(kn_kq_attn_args_t) + 64];
    } args;
} emu_rec_op_t;

typedef struct emu_graph {
    emu_rec_op_t *ops;
    size_t n, cap;
} emu_graph_t;

typedef struct emu_counts {
    int64_t kernels, gemms, copies, syncs, allreduces, graph_launches;
} emu_counts_t;

typedef struct emu_ctx {
    kn_comm_t *comm;
    int rank;
    emu_graph_t *rec; /* recording, or NULL */
    int replaying;    /* inside graph_launch: replayed ops are not host launches */
    int fail_record;  /* test hook: graph_end fails */
    int64_t n_unsafe; /* alloc / upload / sync attempted while recording */
    emu_counts_t cnt; /* host-side calls, eager only */
    int64_t n_split_attn; /* attention ops run split-K, eager or replayed */
} emu_ctx_t;

typedef struct emu_dev {
    int32_t tp;
    mdl_dev_ops_t ops;
    emu_ctx_t ctx[4];
    mdl_dev_rank_t fw[4];
    kn_comm_t *comm;
    kn_ranks_t *threads;
    const mdl_batch_t *b;
    const kv_op_t *kv;
    int32_t n_kv;
} emu_dev_t;

/* T = rc->tp_size emulated ranks with weights in dt and their KV pools;
 * wstage_cap and upload_host as mdl_dev_rank_t's (0: the defaults).
 * Fails the running test on an error. */
emu_dev_t *emu_dev_create_opt(const mdl_model_t *m, const mdl_runtime_config_t *rc, kn_dt_t dt,
                              size_t wstage_cap, int upload_host);
emu_dev_t *emu_dev_create(const mdl_model_t *m, const mdl_runtime_config_t *rc, kn_dt_t dt);
void emu_dev_destroy(emu_dev_t *e);

/* The logits of one step, from the CPU runtime or an emulated device. */
typedef struct emu_side {
    mdl_runtime_t *cpu; /* or */
    emu_dev_t *dev;
} emu_side_t;

/* One forward: [b->n_logits][vocab], valid until the side's next forward. */
const float *emu_side_forward(emu_side_t *s, const mdl_batch_t *b);
void emu_side_kv(emu_side_t *s, const kv_op_t *ops, int32_t n);

/* Logits comparison: per row, NMSE below nmse_bound and the same argmax
 * wherever the reference's top-2 margin is above margin (0: 0.1); worst keeps the
 * largest NMSE seen. */
typedef struct emu_cmp {
    double nmse_bound;
    double worst;
    int32_t vocab;
    float margin; /* argmax must agree where the reference's top-2 margin is above; 0: 0.1 */
} emu_cmp_t;

void emu_compare(emu_cmp_t *c, const float *ref, const float *got, int32_t rows);

/* "cuda-emu": model/backend_cuda.c's backend on emulated operations. */
extern const mdl_backend_t emu_backend;
/* Steps with more tokens than sequences (verification steps) that
 * emu_backend ran by replaying a graph, over all its instances. */
extern int64_t emu_backend_verify_replays;

#endif /* TESTS_CUDA_DEV_EMU_H */
