/* comm.c - rank threads and the shared-memory all-reduce (see comm.h). */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/status.h"
#include "common/thread.h"
#include "common/xmalloc.h"
#include "kernels/comm.h"

struct kn_comm {
    int n;
    pthread_barrier_t bar;
    float **bufs; /* [n] published buffers (the barrier orders the accesses) */
};

int
kn_comm_create(int n_ranks, kn_comm_t **out)
{
    kn_comm_t *c;
    int rc;

    if (n_ranks < 1) {
        return ST_EINVAL;
    }
    c = xcalloc(1, sizeof(*c));
    c->n = n_ranks;
    c->bufs = xcalloc((size_t)n_ranks, sizeof(*c->bufs));
    rc = pthread_barrier_init(&c->bar, NULL, (unsigned)n_ranks);
    if (rc != 0) {
        free(c->bufs);
        free(c);
        return -rc;
    }
    *out = c;
    return ST_OK;
}

void
kn_comm_destroy(kn_comm_t *c)
{
    if (c == NULL) {
        return;
    }
    pthread_barrier_destroy(&c->bar);
    free(c->bufs);
    free(c);
}

int
kn_comm_size(const kn_comm_t *c)
{
    return c->n;
}

void
kn_comm_barrier(kn_comm_t *c)
{
    if (c->n > 1) {
        pthread_barrier_wait(&c->bar);
    }
}

void
kn_comm_allreduce_sum(kn_comm_t *c, int rank, float *buf, size_t n)
{
    size_t lo, hi;

    if (c->n == 1) {
        return;
    }
    c->bufs[rank] = buf;
    pthread_barrier_wait(&c->bar); /* every buffer published and complete */
    lo = n * (size_t)rank / (size_t)c->n;
    hi = n * (size_t)(rank + 1) / (size_t)c->n;
    for (size_t i = lo; i < hi; i++) {
        float s = c->bufs[0][i];

        for (int r = 1; r < c->n; r++) {
            s += c->bufs[r][i];
        }
        for (int r = 0; r < c->n; r++) {
            c->bufs[r][i] = s;
        }
    }
    pthread_barrier_wait(&c->bar); /* every slice written back */
}

/* ---- rank threads ---------------------------------------------------------- */

typedef struct kn_rank_thread {
    kn_ranks_t *owner;
    int rank;
    pthread_t th;
} kn_rank_thread_t;

struct kn_ranks {
    int n;
    pthread_mutex_t mu;
    pthread_cond_t go;   /* workers wait for a new generation */
    pthread_cond_t done; /* rank 0 waits for n_done == n - 1 */
    uint64_t gen;
    int n_done;
    int quit;
    kn_rank_fn fn;
    void *arg;
    int *rc;              /* [n] */
    kn_rank_thread_t *th; /* [n - 1], ranks 1..n-1 */
    int n_started;
};

static void *
kn_rank_main(void *p)
{
    kn_rank_thread_t *t = p;
    kn_ranks_t *r = t->owner;
    uint64_t seen = 0;

    thread_set_role(THREAD_RANK);
    for (;;) {
        pthread_mutex_lock(&r->mu);
        while (r->gen == seen && !r->quit) {
            pthread_cond_wait(&r->go, &r->mu);
        }
        if (r->quit) {
            pthread_mutex_unlock(&r->mu);
            return NULL;
        }
        seen = r->gen;
        kn_rank_fn fn = r->fn;
        void *arg = r->arg;
        pthread_mutex_unlock(&r->mu);

        int rc = fn(arg, t->rank);

        pthread_mutex_lock(&r->mu);
        r->rc[t->rank] = rc;
        if (++r->n_done == r->n - 1) {
            pthread_cond_signal(&r->done);
        }
        pthread_mutex_unlock(&r->mu);
    }
}

int
kn_ranks_create(int n_ranks, kn_ranks_t **out)
{
    kn_ranks_t *r;
    int rc;

    if (n_ranks < 1) {
        return ST_EINVAL;
    }
    r = xcalloc(1, sizeof(*r));
    r->n = n_ranks;
    r->rc = xcalloc((size_t)n_ranks, sizeof(int));
    r->th = xcalloc((size_t)n_ranks, sizeof(*r->th));
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->go, NULL);
    pthread_cond_init(&r->done, NULL);
    for (int i = 1; i < n_ranks; i++) {
        kn_rank_thread_t *t = &r->th[i - 1];

        t->owner = r;
        t->rank = i;
        rc = pthread_create(&t->th, NULL, kn_rank_main, t);
        if (rc != 0) {
            kn_ranks_destroy(r);
            return -rc;
        }
        r->n_started++;
    }
    *out = r;
    return ST_OK;
}

void
kn_ranks_destroy(kn_ranks_t *r)
{
    if (r == NULL) {
        return;
    }
    pthread_mutex_lock(&r->mu);
    r->quit = 1;
    pthread_cond_broadcast(&r->go);
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < r->n_started; i++) {
        pthread_join(r->th[i].th, NULL);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->go);
    pthread_cond_destroy(&r->done);
    free(r->rc);
    free(r->th);
    free(r);
}

int
kn_ranks_run(kn_ranks_t *r, kn_rank_fn fn, void *arg)
{
    int rc0;

    if (r->n > 1) {
        pthread_mutex_lock(&r->mu);
        r->fn = fn;
        r->arg = arg;
        r->n_done = 0;
        r->gen++;
        pthread_cond_broadcast(&r->go);
        pthread_mutex_unlock(&r->mu);
    }
    rc0 = fn(arg, 0);
    if (r->n == 1) {
        return rc0;
    }
    pthread_mutex_lock(&r->mu);
    while (r->n_done < r->n - 1) {
        pthread_cond_wait(&r->done, &r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    if (rc0 != ST_OK) {
        return rc0;
    }
    for (int i = 1; i < r->n; i++) {
        if (r->rc[i] != ST_OK) {
            return r->rc[i];
        }
    }
    return ST_OK;
}
