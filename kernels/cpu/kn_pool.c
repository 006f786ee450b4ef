/* kn_pool.c - the kernels' thread team: fork-join regions split into
 * chunks that any member may claim, with a short spin and then a futex
 * sleep.
 *
 * DESIGN. Why not OpenMP's team: libgomp's idle threads spin for about
 * 300k iterations after each region (OMP_WAIT_POLICY is read only at
 * program start), and a region's barrier waits for every member. On a
 * shared host (the serving daemon also runs its HTTP loop; CI runs many
 * jobs on few cores) a member that is not scheduled stalls the region for
 * a whole scheduler time slice, and a decode step runs ~100 regions: we
 * measured decode five to ten times slower than on one thread. Here:
 *
 *   - a region is n_chunks independent chunks; the caller starts claiming
 *     at once and the workers join when they wake, so a descheduled
 *     worker costs nothing (the caller just does its chunks too);
 *   - the caller waits only for chunks already claimed, never for a
 *     worker to show up;
 *   - idle workers spin for a few microseconds (enough to catch the next
 *     region of the same step) and then sleep on a futex.
 *
 * Claims are generation-tagged: `next` holds (generation << 32 | next
 * chunk), and a worker claims with a compare-and-swap that names the
 * generation it woke for. A late worker therefore can never claim a chunk
 * of a later region, and while any chunk of a region is claimed but not
 * done the caller is still waiting, so that region's fn/arg stay valid.
 *
 * Thread: kn__pool_run() from any thread, one region at a time (a second
 * concurrent caller runs its region alone); workers are created lazily and
 * re-created after fork() in the child.
 */
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/cpu/kn_int.h"

/* A test build (tests/kernels/test_kn_pool.c includes this file) defines
 * these to widen race windows: after a worker reads the claim word, and
 * between the steps of opening a region. Empty in the product. */
#ifndef KN_POOL_TEST_POINT_CLAIM
#define KN_POOL_TEST_POINT_CLAIM() ((void)0)
#endif
#ifndef KN_POOL_TEST_POINT_OPEN
#define KN_POOL_TEST_POINT_OPEN() ((void)0)
#endif

#define KN_POOL_MAX 64
#define KN_SPIN_WORKER 20000  /* pause iterations before a worker sleeps */
#define KN_SPIN_MASTER 200000 /* before the caller sleeps on claimed chunks */

static struct {
    pthread_mutex_t run_mu; /* one region at a time; guards spawning too */
    int n_workers;
    _Atomic uint32_t gen;  /* futex word: bumped when a region opens */
    _Atomic uint64_t next; /* gen << 32 | next unclaimed chunk */
    _Atomic uint32_t done; /* futex word: chunks finished */
    _Atomic int sleepers;  /* workers in (or entering) futex wait */
    _Atomic int master_waiting;
    kn_chunk_fn fn; /* valid while a chunk of the region is claimed */
    void *arg;
    _Atomic uint32_t n_chunks;
} kn_pool = {
    .run_mu = PTHREAD_MUTEX_INITIALIZER,
};

static void
kn_futex_wait(void *addr, uint32_t val)
{
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void
kn_futex_wake(void *addr)
{
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static inline void
kn_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claims and runs chunks of generation g until none is left. Returns the
 * number of chunks this thread finished. */
static uint32_t
kn_pool_work(uint32_t g)
{
    uint64_t v = atomic_load(&kn_pool.next);
    uint32_t ran = 0;

    for (;;) {
        if ((uint32_t)(v >> 32) != g) {
            break;
        }
        uint32_t c = (uint32_t)v;

        KN_POOL_TEST_POINT_CLAIM();
        if (c >= atomic_load_explicit(&kn_pool.n_chunks, memory_order_relaxed)) {
            break;
        }
        if (!atomic_compare_exchange_weak(&kn_pool.next, &v, v + 1)) {
            continue; /* v was reloaded */
        }
        /* Claimed: the region stays open until this chunk is done, so its
         * fields cannot change under us. */
        uint32_t n = atomic_load_explicit(&kn_pool.n_chunks, memory_order_relaxed);

        kn_pool.fn(kn_pool.arg, (int)c, (int)n);
        ran++;
        if (atomic_fetch_add(&kn_pool.done, 1) + 1 == n && atomic_load(&kn_pool.master_waiting)) {
            kn_futex_wake((void *)&kn_pool.done);
        }
        v = atomic_load(&kn_pool.next);
    }
    return ran;
}

static uint32_t kn_start_gen[KN_POOL_MAX];

static void *
kn_worker_main(void *p)
{
    uint32_t seen = kn_start_gen[(intptr_t)p];

    for (;;) {
        uint32_t g;
        int spins = 0;

        while ((g = atomic_load(&kn_pool.gen)) == seen) {
            if (++spins < KN_SPIN_WORKER) {
                kn_pause();
                continue;
            }
            atomic_fetch_add(&kn_pool.sleepers, 1);
            if (atomic_load(&kn_pool.gen) == seen) {
                kn_futex_wait((void *)&kn_pool.gen, seen);
            }
            atomic_fetch_sub(&kn_pool.sleepers, 1);
        }
        seen = g;
        kn_pool_work(g);
    }
    return NULL;
}

/* In a fork()ed child the workers do not exist: start over. */
static void
kn_pool_atfork_child(void)
{
    pthread_mutex_init(&kn_pool.run_mu, NULL);
    kn_pool.n_workers = 0;
    atomic_store(&kn_pool.sleepers, 0);
    atomic_store(&kn_pool.master_waiting, 0);
}

static pthread_once_t kn_pool_once = PTHREAD_ONCE_INIT;

static void
kn_pool_register(void)
{
    pthread_atfork(NULL, NULL, kn_pool_atfork_child);
}

/* Makes sure members 1..want-1 exist (run_mu held: no region in flight).
 * Returns the team size available. */
static int
kn_pool_spawn(int want)
{
    if (want > KN_POOL_MAX) {
        want = KN_POOL_MAX;
    }
    while (kn_pool.n_workers < want - 1) {
        int idx = kn_pool.n_workers + 1;
        pthread_t th;
        pthread_attr_t at;
        int rc;

        kn_start_gen[idx] = atomic_load(&kn_pool.gen);
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&th, &at, kn_worker_main, (void *)(intptr_t)idx);
        pthread_attr_destroy(&at);
        if (rc != 0) {
            break;
        }
        kn_pool.n_workers++;
    }
    return kn_pool.n_workers + 1 < want ? kn_pool.n_workers + 1 : want;
}

void
kn__pool_run(int team, int n_chunks, kn_chunk_fn fn, void *arg)
{
    if (n_chunks <= 0) {
        return;
    }
    pthread_once(&kn_pool_once, kn_pool_register);
    if (team <= 1 || n_chunks == 1 || pthread_mutex_trylock(&kn_pool.run_mu) != 0) {
        for (int c = 0; c < n_chunks; c++) {
            fn(arg, c, n_chunks);
        }
        return;
    }
    if (kn_pool_spawn(team) <= 1) {
        pthread_mutex_unlock(&kn_pool.run_mu);
        for (int c = 0; c < n_chunks; c++) {
            fn(arg, c, n_chunks);
        }
        return;
    }

    /* Open the region. First close the claim word under the new
     * generation: a straggler of the previous region may still hold a
     * claim word it read long ago (all chunks taken) and would otherwise
     * compare it with the NEW n_chunks, win its compare-and-swap against
     * the old word, run a chunk of this region and count it in done: done
     * then overshoots n_chunks and the wait below never ends (seen as a
     * hung soak run; tests/kernels/test_kn_pool.c forces it). Then the
     * fields, then open the claim word, then wake. */
    uint32_t g = atomic_load(&kn_pool.gen) + 1;

    atomic_store(&kn_pool.next, ((uint64_t)g << 32) | UINT32_MAX);
    KN_POOL_TEST_POINT_OPEN();
    kn_pool.fn = fn;
    kn_pool.arg = arg;
    atomic_store(&kn_pool.n_chunks, (uint32_t)n_chunks);
    KN_POOL_TEST_POINT_OPEN();
    atomic_store(&kn_pool.done, 0);
    KN_POOL_TEST_POINT_OPEN();
    atomic_store(&kn_pool.next, (uint64_t)g << 32);
    atomic_store(&kn_pool.gen, g);
    if (atomic_load(&kn_pool.sleepers) > 0) {
        kn_futex_wake((void *)&kn_pool.gen);
    }

    kn_pool_work(g);

    /* Everything is claimed; wait for chunks other members still run. */
    int spins = 0;
    uint32_t d;

    while ((d = atomic_load(&kn_pool.done)) != (uint32_t)n_chunks) {
        if (++spins < KN_SPIN_MASTER) {
            kn_pause();
            continue;
        }
        atomic_store(&kn_pool.master_waiting, 1);
        if ((d = atomic_load(&kn_pool.done)) != (uint32_t)n_chunks) {
            kn_futex_wait((void *)&kn_pool.done, d);
        }
        atomic_store(&kn_pool.master_waiting, 0);
    }
    pthread_mutex_unlock(&kn_pool.run_mu);
}
