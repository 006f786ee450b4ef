/* chan.c - mutex + list channel; wake only on empty -> non-empty. */
#include "chan.h"

#include <errno.h>
#include <time.h>

static void
chan_wake_cond(chan_t *ch, void *arg)
{
    (void)arg;
    pthread_cond_signal(&ch->cond);
}

void
chan_init(chan_t *ch, chan_wake_cb wake, void *wake_arg)
{
    pthread_mutex_init(&ch->mu, NULL);
    pthread_cond_init(&ch->cond, NULL);
    ch->head = NULL;
    ch->tail = &ch->head;
    ch->wake = wake ? wake : chan_wake_cond;
    ch->wake_arg = wake_arg;
}

void
chan_fini(chan_t *ch)
{
    pthread_mutex_destroy(&ch->mu);
    pthread_cond_destroy(&ch->cond);
}

void
chan_send(chan_t *ch, msg_t *m)
{
    m->next = NULL;
    chan_send_list(ch, m);
}

void
chan_send_list(chan_t *ch, msg_t *head)
{
    msg_t **tail;
    int was_empty;

    if (head == NULL) {
        return;
    }
    for (tail = &head; *tail != NULL; tail = &(*tail)->next) {
    }
    pthread_mutex_lock(&ch->mu);
    was_empty = (ch->head == NULL);
    *ch->tail = head;
    ch->tail = tail;
    if (was_empty && ch->wake == chan_wake_cond) {
        /* Signal under the lock so a waiter cannot miss it. */
        pthread_cond_signal(&ch->cond);
        pthread_mutex_unlock(&ch->mu);
        return;
    }
    pthread_mutex_unlock(&ch->mu);
    if (was_empty) {
        ch->wake(ch, ch->wake_arg);
    }
}

static msg_t *
detach_locked(chan_t *ch)
{
    msg_t *list = ch->head;
    ch->head = NULL;
    ch->tail = &ch->head;
    return list;
}

msg_t *
chan_take_all(chan_t *ch)
{
    msg_t *list;

    pthread_mutex_lock(&ch->mu);
    list = detach_locked(ch);
    pthread_mutex_unlock(&ch->mu);
    return list;
}

msg_t *
chan_wait_all(chan_t *ch, int timeout_ms)
{
    msg_t *list;
    struct timespec ts;

    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&ch->mu);
    while (ch->head == NULL) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&ch->cond, &ch->mu);
        } else if (pthread_cond_timedwait(&ch->cond, &ch->mu, &ts) == ETIMEDOUT) {
            break;
        }
    }
    list = detach_locked(ch);
    pthread_mutex_unlock(&ch->mu);
    return list;
}
