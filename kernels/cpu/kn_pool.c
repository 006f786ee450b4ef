/* kn_pool.c - the kernels' thread team: fork-join regions with a short
 * spin and then a futex sleep.
 *
 * DESIGN. Why not OpenMP's team: libgomp's idle threads spin for about
 * 300k iterations after each region (OMP_WAIT_POLICY is read only at
 * program start). On a dedicated machine that buys latency; on a shared
 * one (a serving host also runs the HTTP loop; CI runs many jobs) the
 * spinning thread takes the core the engine thread needs, and a decode
 * step with ~100 regions slowed down five-fold in our measurements. Here
 * workers spin for a few microseconds (enough to catch the next region of
 * the same step) and then sleep on a futex; the caller does the same
 * while it waits for the team. The caller is always member 0.
 *
 * Invariants: one region at a time (a mutex; a second concurrent caller
 * runs its region alone on its own thread instead of waiting). `gen` is
 * bumped once per region; a worker runs member idx of every generation it
 * sees, and `pending` counts team members still running.
 *
 * Thread: kn__pool_run() from any thread; workers are created lazily and
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

#define KN_POOL_MAX 64
#define KN_SPIN_WORKER 20000 /* pause iterations (a few tens of microseconds) */
#define KN_SPIN_MASTER 200000

static struct {
    pthread_mutex_t run_mu;   /* one region at a time; guards spawning too */
    int n_workers;            /* threads created (members 1..n_workers) */
    _Atomic uint32_t gen;     /* futex word: region generation */
    _Atomic int sleepers;     /* workers in (or about to enter) futex wait */
    _Atomic int pending;      /* futex word: members still running */
    _Atomic int master_waiting;
    kn_region_fn fn;
    void *arg;
    int team;
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

static uint32_t kn_start_gen[KN_POOL_MAX];

static void *
kn_worker_main(void *p)
{
    int idx = (int)(intptr_t)p;
    uint32_t seen = kn_start_gen[idx];

    for (;;) {
        uint32_t g;
        int spins = 0;

        while ((g = atomic_load_explicit(&kn_pool.gen, memory_order_acquire)) == seen) {
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
        /* Every worker acknowledges every region, member or not, so none
         * can lag into the next region with stale fn/arg/team. */
        if (idx < kn_pool.team) {
            kn_pool.fn(kn_pool.arg, idx, kn_pool.team);
        }
        if (atomic_fetch_sub(&kn_pool.pending, 1) == 1 && atomic_load(&kn_pool.master_waiting)) {
            kn_futex_wake((void *)&kn_pool.pending);
        }
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
    atomic_store(&kn_pool.pending, 0);
    atomic_store(&kn_pool.master_waiting, 0);
}

static pthread_once_t kn_pool_once = PTHREAD_ONCE_INIT;

static void
kn_pool_register(void)
{
    pthread_atfork(NULL, NULL, kn_pool_atfork_child);
}

/* Makes sure members 1..want-1 exist; returns the team size available.
 * Called with run_mu held, so no region is in flight and gen is stable. */
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
kn__pool_run(int team, kn_region_fn fn, void *arg)
{
    pthread_once(&kn_pool_once, kn_pool_register);
    if (team <= 1 || pthread_mutex_trylock(&kn_pool.run_mu) != 0) {
        fn(arg, 0, 1);
        return;
    }
    team = kn_pool_spawn(team);
    if (team <= 1) {
        pthread_mutex_unlock(&kn_pool.run_mu);
        fn(arg, 0, 1);
        return;
    }
    kn_pool.fn = fn;
    kn_pool.arg = arg;
    kn_pool.team = team;
    atomic_store(&kn_pool.pending, kn_pool.n_workers);
    atomic_fetch_add(&kn_pool.gen, 1); /* seq_cst: publishes fn/arg/team */
    if (atomic_load(&kn_pool.sleepers) > 0) {
        kn_futex_wake((void *)&kn_pool.gen);
    }

    fn(arg, 0, team);

    int spins = 0, p;

    while ((p = atomic_load(&kn_pool.pending)) != 0) {
        if (++spins < KN_SPIN_MASTER) {
            kn_pause();
            continue;
        }
        atomic_store(&kn_pool.master_waiting, 1);
        if ((p = atomic_load(&kn_pool.pending)) != 0) {
            kn_futex_wait((void *)&kn_pool.pending, (uint32_t)p);
        }
        atomic_store(&kn_pool.master_waiting, 0);
    }
    pthread_mutex_unlock(&kn_pool.run_mu);
}
