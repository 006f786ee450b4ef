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
 *   - a thread that waits (an idle worker for the next region, the
 *     caller for chunks other members still run) spins on `pause` for
 *     some tens of microseconds (a decode step's serial gaps between
 *     regions are a few), then calls sched_yield() for up to a couple of
 *     milliseconds, then sleeps on a futex. A yield returns at once when
 *     nothing else wants the core, so on a quiet host it costs a syscall's
 *     latency; on a loaded one (more runnable threads than cores) it hands
 *     the core to whoever holds the work we wait for, where a pure spin
 *     burnt the caller's or the worker's time slice: measured on a shared
 *     2-core host, the worker joined only half of a batch-1 decode's
 *     regions and the caller spent 7% of the step waiting for a
 *     descheduled worker's chunk.
 *
 * Layout: the word idle workers poll (gen), the claim word (next, CASed by
 * every member for every chunk) and the done counter sit on cache lines of
 * their own, so claims do not invalidate the pollers' line.
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
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
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
/* Waiting: pause iterations (about 25 ns each on current x86 cores, up to
 * 50 on some), then sched_yield() rounds until the time below, then a
 * futex sleep. */
#define KN_SPIN_PAUSE 2000
#define KN_YIELD_WORKER_NS 2000000L /* an idle worker: 2 ms */
#define KN_YIELD_MASTER_NS 5000000L /* the caller, on claimed chunks: 5 ms */

#define KN_LINE 64

static struct {
    pthread_mutex_t run_mu; /* one region at a time; guards spawning too */
    int n_workers;
    kn_chunk_fn fn; /* valid while a chunk of the region is claimed */
    void *arg;
    _Atomic uint32_t n_chunks;
    /* polled by idle workers */
    _Alignas(KN_LINE) _Atomic uint32_t gen; /* futex word: bumped when a region opens */
    _Atomic int sleepers;                   /* workers in (or entering) futex wait */
    /* claimed by every member */
    _Alignas(KN_LINE) _Atomic uint64_t next; /* gen << 32 | next unclaimed chunk */
    /* counted by every member, polled by the caller */
    _Alignas(KN_LINE) _Atomic uint32_t done; /* futex word: chunks finished */
    _Atomic int master_waiting;
    char pad_[KN_LINE - sizeof(uint32_t) - sizeof(int)];
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

static long
kn_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* One round of waiting, before a futex sleep: round i < KN_SPIN_PAUSE is
 * a pause; later rounds yield the core until yield_ns have passed since
 * the first of them (*t0, set here). Returns 0 when it is time to sleep. */
static int
kn_wait_round(int i, long *t0, long yield_ns)
{
    if (i < KN_SPIN_PAUSE) {
        kn_pause();
        return 1;
    }
    if (i == KN_SPIN_PAUSE) {
        *t0 = kn_now_ns();
    } else if (kn_now_ns() - *t0 >= yield_ns) {
        return 0;
    }
    sched_yield();
    return 1;
}

/* Claims and runs chunks of generation g until none is left, then counts
 * them in done all at once (one write of the shared counter per member
 * and region, not per chunk; the region stays open until then, since
 * done cannot reach n_chunks before). Returns the number of chunks this
 * thread finished. */
static uint32_t
kn_pool_work(uint32_t g)
{
    uint64_t v = atomic_load(&kn_pool.next);
    uint32_t ran = 0, n = 0;

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
        n = atomic_load_explicit(&kn_pool.n_chunks, memory_order_relaxed);
        kn_pool.fn(kn_pool.arg, (int)c, (int)n);
        ran++;
        v = atomic_load(&kn_pool.next);
    }
    if (ran > 0 && atomic_fetch_add(&kn_pool.done, ran) + ran == n &&
        atomic_load(&kn_pool.master_waiting)) {
        kn_futex_wake((void *)&kn_pool.done);
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
        long t0 = 0;

        while ((g = atomic_load(&kn_pool.gen)) == seen) {
            if (kn_wait_round(spins, &t0, KN_YIELD_WORKER_NS)) {
                spins++;
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
    long t0 = 0;
    uint32_t d;

    while ((d = atomic_load(&kn_pool.done)) != (uint32_t)n_chunks) {
        if (kn_wait_round(spins, &t0, KN_YIELD_MASTER_NS)) {
            spins++;
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
