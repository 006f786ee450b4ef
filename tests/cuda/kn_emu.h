/* kn_emu.h - a CPU emulator for the CUDA kernel bodies of
 * kernels/cuda/kn_cuda_body.h.
 *
 * kn_emu_launch() runs a grid one thread block at a time; inside a block
 * every CUDA thread is a ucontext coroutine with its own stack. A thread
 * runs until it reaches KN_SYNC (block barrier) or a warp shuffle (warp
 * barrier) and the scheduler releases a barrier once every live thread of
 * its scope waits on it. Threads run in forward order in even barrier
 * epochs and in reverse order in odd ones, so a missing __syncthreads
 * lets some thread read shared memory its producer has not written yet;
 * shared memory starts as NaN, so such a read poisons the result.
 *
 * Errors the emulator reports instead of hanging: a __syncthreads not
 * reached by every thread of the block, a shuffle not reached by every
 * lane of the warp, threads waiting on different barriers.
 *
 * Thread: any; one launch at a time per thread (rank threads of the
 * emulated tensor-parallel tests each run their own).
 */
#ifndef TESTS_CUDA_KN_EMU_H
#define TESTS_CUDA_KN_EMU_H

#include <stddef.h>

#include "kernels/cuda/kn_cuda_body.h"

typedef void (*kn_emu_body_fn)(const kn_thr_t *t, float *smem, const void *args);

/* Runs body over grid (gx, gy) with nthr threads per block (shuffles need
 * a multiple of 32) and smem_floats floats of shared memory per block.
 * Returns 0, or -1 with a message on stderr when a barrier was misused. */
int kn_emu_launch(kn_emu_body_fn body, const void *args, int gx, int gy, int nthr,
                  size_t smem_floats);

#endif /* TESTS_CUDA_KN_EMU_H */
