/* comm.h - tensor-parallel plumbing for the CPU backend: one thread per
 * rank and a shared-memory all-reduce between them.
 *
 * kn_ranks_t keeps T - 1 worker threads parked; kn_ranks_run() hands every
 * rank the same function (the engine thread is rank 0 and runs its share
 * itself), which is how the engine "broadcasts" a step: the batch is host
 * memory that every rank reads while the call runs.
 *
 * kn_comm_allreduce_sum() is the CPU stand-in for ncclAllReduce(ncclSum):
 * each rank publishes its buffer, then rank r sums slice r of every
 * buffer in rank order 0, 1, ..., T - 1 and writes the sum back into slice
 * r of every buffer. Slices are disjoint, so no rank reads what another
 * writes; the fixed order makes the result bitwise identical on all ranks
 * and from run to run. Two barriers per call. (The CUDA backend uses NCCL
 * for the same step; model/backend_cuda.c.)
 *
 * Thread: kn_ranks_* from one controlling thread (the engine);
 * kn_comm_allreduce_sum from inside a kn_ranks_run() function, every rank
 * calling it the same number of times with the same n.
 */
#ifndef KERNELS_COMM_H
#define KERNELS_COMM_H

#include <stddef.h>

typedef struct kn_comm kn_comm_t;
typedef struct kn_ranks kn_ranks_t;

/* n_ranks >= 1. ST_OK, ST_EINVAL or -errno from pthreads. */
int kn_comm_create(int n_ranks, kn_comm_t **out);
void kn_comm_destroy(kn_comm_t *c); /* NULL is a no-op */
int kn_comm_size(const kn_comm_t *c);

/* buf: (n) f32 host memory of this rank, summed in place over all ranks. */
void kn_comm_allreduce_sum(kn_comm_t *c, int rank, float *buf, size_t n);
/* Every rank waits for every other. */
void kn_comm_barrier(kn_comm_t *c);

/* Rank function: returns ST_OK or a negative ST_*. */
typedef int (*kn_rank_fn)(void *arg, int rank);

/* Starts n_ranks - 1 worker threads (role THREAD_RANK). ST_OK, ST_EINVAL
 * or -errno from pthread_create. */
int kn_ranks_create(int n_ranks, kn_ranks_t **out);
/* Joins the workers; NULL is a no-op. */
void kn_ranks_destroy(kn_ranks_t *r);
/* Runs fn(arg, rank) on every rank at once (rank 0 on the calling thread)
 * and returns when all are done: ST_OK, or the first failing rank's
 * status. */
int kn_ranks_run(kn_ranks_t *r, kn_rank_fn fn, void *arg);

#endif /* KERNELS_COMM_H */
