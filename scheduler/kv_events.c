/* kv_events.c - the KV-cache event queue and its ZMQ publisher thread
 * (kv_events.h has the wire format and the design).
 *
 * Thread: see kv_events.h. The queue (q_head/q_tail/q_events) and stop
 * flag are under mu; the ring of encoded batches and both sockets belong
 * to the publisher thread alone.
 */
#define LOG_MODULE "kvevents"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "kvserve_config.h"
#include "scheduler/kv_events.h"

#if KVSERVE_HAVE_ZMQ
#include <msgpack.h>
#include <zmq.h>
#endif

#define KVE_DEFAULT_QUEUE 100000
#define KVE_DEFAULT_BUFFER 10000
#define KVE_POLL_MS 20

/* One event as blockmgr reported it; tokens follow for STORED. */
typedef struct kve_ev {
    uint8_t kind, medium, has_parent;
    uint8_t hash[BM_EVENT_HASH_LEN];
    uint8_t parent[BM_EVENT_HASH_LEN];
    uint32_t n_tokens;
    int32_t tokens[];
} kve_ev_t;

/* The events of one engine step. */
typedef struct kve_batch {
    struct kve_batch *next;
    double ts;
    uint32_t n, cap;
    kve_ev_t **ev;
} kve_batch_t;

/* An encoded batch kept for replay. */
typedef struct kve_sent {
    uint64_t seq;
    size_t len;
    char *data;
} kve_sent_t;

struct kve {
    uint32_t block_size;
    uint32_t max_queue;  /* events */
    uint32_t n_buffer;   /* batches kept for replay */
    int32_t dp_rank;
    char topic[256];
    char endpoint[256];
    char replay_endpoint[256];

    kve_batch_t *cur; /* engine thread: the step being collected */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    kve_batch_t *q_head, *q_tail;
    uint64_t q_events;
    int stop;

    _Atomic uint64_t published, dropped;

    pthread_t thread;
    int thread_started;
    void *zctx, *pub, *replay;
    kve_sent_t *ring; /* [n_buffer] */
    uint64_t next_seq;
};

static void
batch_free(kve_batch_t *b)
{
    if (b == NULL) {
        return;
    }
    for (uint32_t i = 0; i < b->n; i++) {
        free(b->ev[i]);
    }
    free(b->ev);
    free(b);
}

void
kve_counters(const kve_t *k, uint64_t *published, uint64_t *dropped)
{
    *published = k ? atomic_load_explicit(&k->published, memory_order_relaxed) : 0;
    *dropped = k ? atomic_load_explicit(&k->dropped, memory_order_relaxed) : 0;
}

void
kve_on_event(void *arg, const bm_event_t *ev)
{
    kve_t *k = arg;
    kve_batch_t *b = k->cur;
    uint32_t nt = ev->kind == BM_EVENT_STORED ? ev->n_tokens : 0;
    kve_ev_t *e;

    if (b == NULL) {
        b = k->cur = xcalloc_try(1, sizeof(*b));
        if (b == NULL) {
            atomic_fetch_add_explicit(&k->dropped, 1, memory_order_relaxed);
            return;
        }
    }
    if (b->n == b->cap) {
        uint32_t cap = b->cap ? 2 * b->cap : 16;
        kve_ev_t **grown = xrealloc_try(b->ev, (size_t)cap * sizeof(*grown));
        if (grown == NULL) {
            atomic_fetch_add_explicit(&k->dropped, 1, memory_order_relaxed);
            return;
        }
        b->ev = grown;
        b->cap = cap;
    }
    e = xmalloc_try(sizeof(*e) + (size_t)nt * sizeof(int32_t));
    if (e == NULL) {
        atomic_fetch_add_explicit(&k->dropped, 1, memory_order_relaxed);
        return;
    }
    e->kind = (uint8_t)ev->kind;
    e->medium = (uint8_t)ev->medium;
    e->has_parent = ev->parent != NULL;
    memset(e->hash, 0, sizeof(e->hash));
    memset(e->parent, 0, sizeof(e->parent));
    if (ev->hash != NULL) {
        memcpy(e->hash, ev->hash, BM_EVENT_HASH_LEN);
    }
    if (ev->parent != NULL) {
        memcpy(e->parent, ev->parent, BM_EVENT_HASH_LEN);
    }
    e->n_tokens = nt;
    if (nt > 0) {
        memcpy(e->tokens, ev->tokens, (size_t)nt * sizeof(int32_t));
    }
    b->ev[b->n++] = e;
}

void
kve_flush(kve_t *k)
{
    kve_batch_t *b;
    struct timespec ts;
    int queued = 0;

    if (k == NULL || k->cur == NULL || k->cur->n == 0) {
        return;
    }
    b = k->cur;
    k->cur = NULL;
    clock_gettime(CLOCK_REALTIME, &ts);
    b->ts = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    pthread_mutex_lock(&k->mu);
    if (k->q_events + b->n <= k->max_queue) {
        if (k->q_tail != NULL) {
            k->q_tail->next = b;
        } else {
            k->q_head = b;
        }
        k->q_tail = b;
        k->q_events += b->n;
        queued = 1;
        pthread_cond_signal(&k->cv);
    }
    pthread_mutex_unlock(&k->mu);
    if (queued) {
        atomic_fetch_add_explicit(&k->published, b->n, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&k->dropped, b->n, memory_order_relaxed);
        batch_free(b);
    }
}

#if KVSERVE_HAVE_ZMQ

static const char *
medium_name(int medium)
{
    return medium == BM_MEDIUM_CPU ? "CPU" : "GPU";
}

static void
pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);

    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void
pack_hash(msgpack_packer *pk, const uint8_t *h)
{
    msgpack_pack_bin(pk, BM_EVENT_HASH_LEN);
    msgpack_pack_bin_body(pk, h, BM_EVENT_HASH_LEN);
}

/* The msgpack EventBatch of b (see kv_events.h). */
static void
encode(const kve_t *k, const kve_batch_t *b, msgpack_sbuffer *sb)
{
    msgpack_packer pk;

    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, b->ts);
    msgpack_pack_array(&pk, b->n);
    for (uint32_t i = 0; i < b->n; i++) {
        const kve_ev_t *e = b->ev[i];
        switch (e->kind) {
        case BM_EVENT_STORED:
            msgpack_pack_array(&pk, 7);
            pack_str(&pk, "BlockStored");
            msgpack_pack_array(&pk, 1);
            pack_hash(&pk, e->hash);
            if (e->has_parent) {
                pack_hash(&pk, e->parent);
            } else {
                msgpack_pack_nil(&pk);
            }
            msgpack_pack_array(&pk, e->n_tokens);
            for (uint32_t t = 0; t < e->n_tokens; t++) {
                msgpack_pack_int32(&pk, e->tokens[t]);
            }
            msgpack_pack_uint32(&pk, k->block_size);
            msgpack_pack_nil(&pk); /* lora_id */
            pack_str(&pk, medium_name(e->medium));
            break;
        case BM_EVENT_REMOVED:
            msgpack_pack_array(&pk, 3);
            pack_str(&pk, "BlockRemoved");
            msgpack_pack_array(&pk, 1);
            pack_hash(&pk, e->hash);
            pack_str(&pk, medium_name(e->medium));
            break;
        default:
            msgpack_pack_array(&pk, 1);
            pack_str(&pk, "AllBlocksCleared");
            break;
        }
    }
    msgpack_pack_int32(&pk, k->dp_rank);
}

static void
seq_bytes(uint64_t seq, uint8_t out[8])
{
    for (int i = 0; i < 8; i++) {
        out[i] = (uint8_t)(seq >> (56 - 8 * i));
    }
}

/* Encodes, sends and keeps one batch. */
static void
publish(kve_t *k, const kve_batch_t *b)
{
    msgpack_sbuffer sb;
    uint8_t sq[8];
    kve_sent_t *slot;

    msgpack_sbuffer_init(&sb);
    encode(k, b, &sb);
    seq_bytes(k->next_seq, sq);
    /* PUB never blocks: past its high-water mark ZMQ drops for slow subscribers. */
    zmq_send(k->pub, k->topic, strlen(k->topic), ZMQ_SNDMORE);
    zmq_send(k->pub, sq, 8, ZMQ_SNDMORE);
    zmq_send(k->pub, sb.data, sb.size, 0);
    if (k->ring != NULL) {
        slot = &k->ring[k->next_seq % k->n_buffer];
        free(slot->data);
        slot->seq = k->next_seq;
        slot->len = sb.size;
        slot->data = sb.data; /* taken from the sbuffer */
        sb.data = NULL;
    }
    msgpack_sbuffer_destroy(&sb);
    k->next_seq++;
}

/* Answers one replay request: [identity, empty, start seq]. */
static void
serve_replay(kve_t *k)
{
    zmq_msg_t part[3];
    int n = 0, more = 1;
    uint64_t start = 0;
    static const uint8_t end_seq[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, k->replay, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        more = zmq_msg_more(&m);
        if (n < 3) {
            part[n++] = m;
        } else {
            zmq_msg_close(&m);
            n = 4; /* too many frames: ignored */
        }
    }
    if (n == 3 && zmq_msg_size(&part[2]) == 8) {
        const uint8_t *p = zmq_msg_data(&part[2]);
        for (int i = 0; i < 8; i++) {
            start = start << 8 | p[i];
        }
        const void *id = zmq_msg_data(&part[0]);
        size_t id_len = zmq_msg_size(&part[0]);
        uint64_t first = k->next_seq > k->n_buffer ? k->next_seq - k->n_buffer : 0;
        for (uint64_t s = start > first ? start : first; s < k->next_seq; s++) {
            const kve_sent_t *slot = &k->ring[s % k->n_buffer];
            uint8_t sq[8];
            seq_bytes(slot->seq, sq);
            zmq_send(k->replay, id, id_len, ZMQ_SNDMORE);
            zmq_send(k->replay, "", 0, ZMQ_SNDMORE);
            zmq_send(k->replay, sq, 8, ZMQ_SNDMORE);
            zmq_send(k->replay, slot->data, slot->len, 0);
        }
        zmq_send(k->replay, id, id_len, ZMQ_SNDMORE);
        zmq_send(k->replay, "", 0, ZMQ_SNDMORE);
        zmq_send(k->replay, end_seq, 8, ZMQ_SNDMORE);
        zmq_send(k->replay, "", 0, 0);
    }
    for (int i = 0; i < n && i < 3; i++) {
        zmq_msg_close(&part[i]);
    }
}

static void *
publisher_main(void *arg)
{
    kve_t *k = arg;
    int stop = 0;

    while (!stop) {
        kve_batch_t *b;

        if (k->replay != NULL) {
            zmq_pollitem_t it = {k->replay, 0, ZMQ_POLLIN, 0};
            if (zmq_poll(&it, 1, KVE_POLL_MS) > 0 && (it.revents & ZMQ_POLLIN)) {
                serve_replay(k);
            }
            pthread_mutex_lock(&k->mu);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += KVE_POLL_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_mutex_lock(&k->mu);
            if (k->q_head == NULL && !k->stop) {
                pthread_cond_timedwait(&k->cv, &k->mu, &ts);
            }
        }
        b = k->q_head;
        k->q_head = k->q_tail = NULL;
        k->q_events = 0;
        stop = k->stop;
        pthread_mutex_unlock(&k->mu);
        while (b != NULL) {
            kve_batch_t *next = b->next;
            publish(k, b);
            batch_free(b);
            b = next;
        }
    }
    return NULL;
}

static int
open_socket(kve_t *k, int type, const char *endpoint, void **out, char *err, size_t errlen)
{
    void *s = zmq_socket(k->zctx, type);
    int linger = 1000;

    if (s == NULL) {
        snprintf(err, errlen, "zmq_socket: %s", zmq_strerror(zmq_errno()));
        return ST_EINVAL;
    }
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_bind(s, endpoint) != 0) {
        snprintf(err, errlen, "--kv-events-config: cannot bind %s: %s", endpoint,
                 zmq_strerror(zmq_errno()));
        zmq_close(s);
        return ST_EINVAL;
    }
    *out = s;
    return ST_OK;
}

#endif /* KVSERVE_HAVE_ZMQ */

/* Copies a string member of obj into dst; 0 when present but not a string
 * or too long. */
static int
json_str(const cJSON *obj, const char *key, char *dst, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);

    if (v == NULL || cJSON_IsNull(v)) {
        return 1;
    }
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap) {
        return 0;
    }
    snprintf(dst, cap, "%s", v->valuestring);
    return 1;
}

static int
json_uint(const cJSON *obj, const char *key, uint32_t *dst, uint32_t min, uint32_t max)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);

    if (v == NULL || cJSON_IsNull(v)) {
        return 1;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble < min || v->valuedouble > max) {
        return 0;
    }
    *dst = (uint32_t)v->valuedouble;
    return 1;
}

int
kve_create(const char *json, uint32_t block_size, kve_t **out, char *err, size_t errlen)
{
    cJSON *root = cJSON_Parse(json);
    const cJSON *en;
    char publisher[32] = "zmq";
    kve_t *k;
    int rc = ST_EINVAL;

    *out = NULL;
    if (root == NULL || !cJSON_IsObject(root)) {
        snprintf(err, errlen, "--kv-events-config: not a JSON object");
        cJSON_Delete(root);
        return ST_EINVAL;
    }
    en = cJSON_GetObjectItemCaseSensitive(root, "enable_kv_cache_events");
    if (en == NULL || cJSON_IsFalse(en)) {
        cJSON_Delete(root);
        return ST_OK;
    }
    k = xcalloc(1, sizeof(*k));
    k->block_size = block_size;
    k->max_queue = KVE_DEFAULT_QUEUE;
    k->n_buffer = KVE_DEFAULT_BUFFER;
    snprintf(k->endpoint, sizeof(k->endpoint), "tcp://*:5557");
    uint32_t hwm = 100000, dp = 0;
    if (!cJSON_IsTrue(en) || !json_str(root, "publisher", publisher, sizeof(publisher)) ||
        !json_str(root, "endpoint", k->endpoint, sizeof(k->endpoint)) ||
        !json_str(root, "replay_endpoint", k->replay_endpoint, sizeof(k->replay_endpoint)) ||
        !json_str(root, "topic", k->topic, sizeof(k->topic)) ||
        !json_uint(root, "buffer_steps", &k->n_buffer, 1, 1u << 24) ||
        !json_uint(root, "hwm", &hwm, 0, 1u << 30) ||
        !json_uint(root, "max_queue_size", &k->max_queue, 1, 1u << 30) ||
        !json_uint(root, "data_parallel_rank", &dp, 0, 1u << 16)) {
        snprintf(err, errlen,
                 "--kv-events-config: enable_kv_cache_events must be a boolean, publisher, "
                 "endpoint, replay_endpoint and topic strings, buffer_steps, hwm and "
                 "max_queue_size non-negative integers");
        goto fail;
    }
    k->dp_rank = (int32_t)dp;
    if (strcmp(publisher, "zmq") != 0) {
        snprintf(err, errlen, "--kv-events-config: publisher \"%s\" is not supported (\"zmq\")",
                 publisher);
        goto fail;
    }
#if KVSERVE_HAVE_ZMQ
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    k->zctx = zmq_ctx_new();
    if (k->zctx == NULL) {
        snprintf(err, errlen, "zmq_ctx_new failed");
        goto fail;
    }
    rc = open_socket(k, ZMQ_PUB, k->endpoint, &k->pub, err, errlen);
    if (rc != ST_OK) {
        goto fail;
    }
    int h = (int)hwm;
    zmq_setsockopt(k->pub, ZMQ_SNDHWM, &h, sizeof(h));
    if (k->replay_endpoint[0] != '\0') {
        rc = open_socket(k, ZMQ_ROUTER, k->replay_endpoint, &k->replay, err, errlen);
        if (rc != ST_OK) {
            goto fail;
        }
    }
    k->ring = xcalloc(k->n_buffer, sizeof(*k->ring));
    if (pthread_create(&k->thread, NULL, publisher_main, k) != 0) {
        snprintf(err, errlen, "cannot start the KV events publisher thread");
        rc = ST_ENOMEM;
        goto fail;
    }
    k->thread_started = 1;
    LOG_INFO("KV events: publishing on %s (replay %s, topic \"%s\", queue %u events)",
             k->endpoint, k->replay_endpoint[0] ? k->replay_endpoint : "off", k->topic,
             k->max_queue);
    cJSON_Delete(root);
    *out = k;
    return ST_OK;
#else
    (void)hwm;
    snprintf(err, errlen, "--kv-events-config: this kvserve was built without libzmq/msgpack-c");
    rc = ST_EUNSUPPORTED;
#endif
fail:
    cJSON_Delete(root);
    kve_destroy(k);
    return rc;
}

void
kve_destroy(kve_t *k)
{
    if (k == NULL) {
        return;
    }
#if KVSERVE_HAVE_ZMQ
    if (k->thread_started) {
        pthread_mutex_lock(&k->mu);
        k->stop = 1;
        pthread_cond_signal(&k->cv);
        pthread_mutex_unlock(&k->mu);
        pthread_join(k->thread, NULL);
    }
    if (k->pub != NULL) {
        zmq_close(k->pub);
    }
    if (k->replay != NULL) {
        zmq_close(k->replay);
    }
    if (k->zctx != NULL) {
        zmq_ctx_term(k->zctx);
    }
    for (uint32_t i = 0; k->ring != NULL && i < k->n_buffer; i++) {
        free(k->ring[i].data);
    }
    free(k->ring);
    if (k->zctx != NULL || k->thread_started) {
        pthread_mutex_destroy(&k->mu);
        pthread_cond_destroy(&k->cv);
    }
#endif
    while (k->q_head != NULL) {
        kve_batch_t *next = k->q_head->next;
        batch_free(k->q_head);
        k->q_head = next;
    }
    batch_free(k->cur);
    free(k);
}
