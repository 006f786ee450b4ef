/* chan.h - the cross-thread channel (inbox and outbox between threads).
 *
 * A mutex-protected singly linked list of messages. Senders wake the
 * receiver only on the empty -> non-empty transition; receivers detach the
 * whole list, because wake-ups coalesce (uv_async_send). The wake function
 * is chosen by the receiver: chan_init() with NULL uses the channel's own
 * condition variable (for chan_wait_all); the loop thread passes a function
 * that calls uv_async_send.
 *
 * A message belongs to whoever holds it. msg_t is embedded as the first
 * member of a concrete message struct.
 *
 * Thread: chan_send from any thread; take/wait from the one consumer.
 */
#ifndef COMMON_CHAN_H
#define COMMON_CHAN_H

#include <pthread.h>
#include <stdint.h>

typedef struct msg {
    struct msg *next;
    int type;
} msg_t;

typedef struct chan chan_t;
typedef void (*chan_wake_cb)(chan_t *ch, void *arg);

struct chan {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    msg_t *head;
    msg_t **tail;
    chan_wake_cb wake;
    void *wake_arg;
};

void chan_init(chan_t *ch, chan_wake_cb wake, void *wake_arg);
void chan_fini(chan_t *ch);
/* Takes ownership of m. */
void chan_send(chan_t *ch, msg_t *m);
/* Takes ownership of the NULL-terminated list head (linked through next)
 * and queues it in order, in one step: a receiver sees all of it or none. */
void chan_send_list(chan_t *ch, msg_t *head);
/* Detaches every queued message in FIFO order; NULL when empty. */
msg_t *chan_take_all(chan_t *ch);
/* Like chan_take_all but blocks until at least one message is queued or
 * timeout_ms passes (timeout_ms < 0: forever). Only for condvar channels. */
msg_t *chan_wait_all(chan_t *ch, int timeout_ms);

#endif /* COMMON_CHAN_H */
