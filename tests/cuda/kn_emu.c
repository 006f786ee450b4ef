/* kn_emu.c - the thread-block emulator behind the cuda-emu tests (see
 * kn_emu.h). Coroutines have 64 KiB stacks; the scheduler runs the
 * threads round-robin between barrier releases. makecontext/setcontext
 * start a coroutine; every later switch is _setjmp/_longjmp, which (unlike
 * swapcontext) makes no sigprocmask system call: a shuffle costs two
 * switches per lane, and the emulated forward pass makes millions.
 * Under AddressSanitizer every switch is swapcontext, which ASan follows
 * (its fake stacks for use-after-return detection do not survive
 * _longjmp between coroutine stacks).
 */
#undef _FORTIFY_SOURCE /* longjmp_chk rejects jumps between stacks */
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include "common/xmalloc.h"
#include "tests/cuda/kn_emu.h"

enum { EMU_RUN, EMU_WAIT_BLOCK, EMU_WAIT_WARP, EMU_DONE };

#define EMU_STACK (64 * 1024)

#if defined(__SANITIZE_ADDRESS__)
#define EMU_UCONTEXT 1
#else
#define EMU_UCONTEXT 0
#endif

typedef struct emu_thread {
    ucontext_t ctx; /* the start */
    jmp_buf jb;     /* where it waits */
    int started;
    int state;
    kn_thr_t thr;
    char *stack;
} emu_thread_t;

typedef struct emu_block {
    jmp_buf sched;
    ucontext_t sched_uc; /* EMU_UCONTEXT */
    emu_thread_t *th;
    int nthr;
    int cur;
    float *shfl; /* [nthr] shuffle exchange slots */
    float *smem;
    kn_emu_body_fn body;
    const void *args;
} emu_block_t;

static _Thread_local emu_block_t *emu_cur; /* the block this thread is running */

static void
emu_entry(void)
{
    emu_block_t *b = emu_cur;
    emu_thread_t *t = &b->th[b->cur];

    b->body(&t->thr, b->smem, b->args);
    t->state = EMU_DONE;
    if (!EMU_UCONTEXT) {
        _longjmp(b->sched, 1); /* never returns */
    }
    /* EMU_UCONTEXT: uc_link resumes the scheduler. */
}

static void
emu_wait(emu_block_t *b, int state)
{
    emu_thread_t *t = &b->th[b->cur];

    t->state = state;
    if (EMU_UCONTEXT) {
        swapcontext(&t->ctx, &b->sched_uc);
    } else if (_setjmp(t->jb) == 0) {
        _longjmp(b->sched, 1);
    }
}

void
kn_emu_sync(void *emu)
{
    emu_wait(emu, EMU_WAIT_BLOCK);
}

float
kn_emu_shfl_xor(void *emu, int tid, float v, int lane_mask)
{
    emu_block_t *b = emu;
    float r;

    b->shfl[tid] = v;
    emu_wait(b, EMU_WAIT_WARP);
    r = b->shfl[tid ^ lane_mask];
    emu_wait(b, EMU_WAIT_WARP); /* nobody overwrites a slot before all read */
    return r;
}

/* Releases the barriers whose scope is complete. Returns the number of
 * threads released, or -1 on a misuse. */
static int
emu_release(emu_block_t *b)
{
    int released = 0, n_block = 0, n_done = 0, n_warp = 0;

    for (int w0 = 0; w0 < b->nthr; w0 += KN_WARP) {
        int w1 = w0 + KN_WARP < b->nthr ? w0 + KN_WARP : b->nthr;
        int waiting = 0, live = 0;

        for (int i = w0; i < w1; i++) {
            if (b->th[i].state != EMU_DONE) {
                live++;
            }
            if (b->th[i].state == EMU_WAIT_WARP) {
                waiting++;
            }
        }
        if (waiting == 0) {
            continue;
        }
        if (waiting != live || live != w1 - w0) {
            fprintf(stderr, "kn_emu: warp %d: shuffle reached by %d of %d lanes (%d live)\n",
                    w0 / KN_WARP, waiting, w1 - w0, live);
            return -1;
        }
        for (int i = w0; i < w1; i++) {
            b->th[i].state = EMU_RUN;
        }
        released += w1 - w0;
    }
    if (released > 0) {
        return released;
    }
    for (int i = 0; i < b->nthr; i++) {
        n_block += b->th[i].state == EMU_WAIT_BLOCK;
        n_done += b->th[i].state == EMU_DONE;
        n_warp += b->th[i].state == EMU_WAIT_WARP;
    }
    if (n_block == 0) {
        return 0;
    }
    if (n_done > 0 || n_warp > 0) {
        fprintf(stderr, "kn_emu: __syncthreads reached by %d of %d threads (%d exited)\n", n_block,
                b->nthr, n_done);
        return -1;
    }
    for (int i = 0; i < b->nthr; i++) {
        b->th[i].state = EMU_RUN;
    }
    return b->nthr;
}

/* Runs thread i until it waits or ends. Its own frame, so that the
 * scheduler loop's variables never live across a _setjmp. */
static __attribute__((noinline)) void
emu_resume(emu_block_t *b, int i)
{
    b->cur = i;
    if (EMU_UCONTEXT) {
        swapcontext(&b->sched_uc, &b->th[i].ctx);
        return;
    }
    if (_setjmp(b->sched) == 0) {
        if (!b->th[i].started) {
            b->th[i].started = 1;
            setcontext(&b->th[i].ctx);
        }
        _longjmp(b->th[i].jb, 1);
    }
}

static int
emu_run_block(emu_block_t *b)
{
    for (int epoch = 0;; epoch++) {
        for (int k = 0; k < b->nthr; k++) {
            int i = (epoch & 1) ? b->nthr - 1 - k : k;

            if (b->th[i].state == EMU_RUN) {
                emu_resume(b, i);
            }
        }
        int r = emu_release(b);

        if (r < 0) {
            return -1;
        }
        if (r == 0) {
            for (int i = 0; i < b->nthr; i++) {
                if (b->th[i].state != EMU_DONE) {
                    fprintf(stderr, "kn_emu: thread %d stuck\n", i);
                    return -1;
                }
            }
            return 0;
        }
    }
}

int
kn_emu_launch(kn_emu_body_fn body, const void *args, int gx, int gy, int nthr, size_t smem_floats)
{
    emu_block_t b;
    int rc = 0;

    memset(&b, 0, sizeof(b));
    b.nthr = nthr;
    b.body = body;
    b.args = args;
    b.th = xcalloc((size_t)nthr, sizeof(*b.th));
    b.shfl = xcalloc((size_t)nthr, sizeof(float));
    b.smem = xmalloc((smem_floats + 1) * sizeof(float));
    for (int i = 0; i < nthr; i++) {
        b.th[i].stack = xmalloc(EMU_STACK);
    }
    emu_cur = &b;

    for (int by = 0; by < gy && rc == 0; by++) {
        for (int bx = 0; bx < gx && rc == 0; bx++) {
            for (size_t i = 0; i <= smem_floats; i++) {
                b.smem[i] = NAN;
            }
            for (int i = 0; i < nthr; i++) {
                emu_thread_t *t = &b.th[i];

                t->state = EMU_RUN;
                t->started = 0;
                t->thr.tid = i;
                t->thr.nthr = nthr;
                t->thr.bx = bx;
                t->thr.by = by;
                t->thr.gx = gx;
                t->thr.gy = gy;
                t->thr.emu = &b;
                getcontext(&t->ctx);
                t->ctx.uc_stack.ss_sp = t->stack;
                t->ctx.uc_stack.ss_size = EMU_STACK;
                t->ctx.uc_link = &b.sched_uc;
                makecontext(&t->ctx, emu_entry, 0);
            }
            rc = emu_run_block(&b);
        }
    }

    emu_cur = NULL;
    for (int i = 0; i < nthr; i++) {
        free(b.th[i].stack);
    }
    free(b.th);
    free(b.shfl);
    free(b.smem);
    return rc;
}
