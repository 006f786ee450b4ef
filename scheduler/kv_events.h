/* kv_events.h - KV-cache events in vLLM's wire format over ZMQ.
 *
 * --kv-events-config takes vLLM's JSON:
 *   {"enable_kv_cache_events": true, "publisher": "zmq",
 *    "endpoint": "tcp://0.0.0.0:5557", "replay_endpoint": "tcp://0.0.0.0:5558",
 *    "topic": "kv-events", "buffer_steps": 10000, "hwm": 100000,
 *    "max_queue_size": 100000}
 * (replay_endpoint, topic, buffer_steps, hwm and max_queue_size are
 * optional; "publisher" must be "zmq").
 *
 * DESIGN
 *   The engine thread never blocks on a socket. blockmgr reports events
 *   through its hook (blockmgr/bm_events.h); kve_on_event copies each into
 *   the batch of the current step (engine-thread memory, fallible
 *   allocation), and kve_flush, after the step, moves the batch onto a
 *   bounded queue under a mutex. A publisher thread takes the queue,
 *   encodes each batch with msgpack-c and sends it on a ZMQ PUB socket as
 *   three frames: topic, an 8-byte big-endian sequence number (one per
 *   batch, from 0), and the payload
 *     EventBatch = [ts (float seconds), [event, ...], data_parallel_rank]
 *     event      = ["BlockStored", [hash], parent_hash | nil, [token ids],
 *                   block_size, lora_id (nil), medium ("GPU" | "CPU")]
 *                | ["BlockRemoved", [hash], medium]
 *                | ["AllBlocksCleared"]
 *   (msgspec's array_like tagged structs, as vLLM's ZmqEventPublisher).
 *   Hashes are 32-byte binaries (blockmgr's SHA-256 chain).
 *   When the queue holds max_queue_size events, a step's batch is dropped
 *   whole and its events counted in `dropped` (kvserve:kv_events_dropped
 *   _total): a subscriber that sees a gap in the sequence numbers resyncs
 *   from the replay socket, and one that missed dropped events only
 *   learns of them by its own misses. The last buffer_steps encoded
 *   batches are kept for replay: a ZMQ ROUTER socket on replay_endpoint
 *   answers a request [empty frame, start seq (8 bytes big-endian)] with
 *   [empty, seq, payload] for each kept batch from start on, then
 *   [empty, -1 (8 bytes), empty].
 *
 * Thread: kve_create / kve_destroy on the engine's creator; kve_on_event
 * and kve_flush on the engine thread; kve_counters on any thread (relaxed
 * atomics); the publisher thread is private.
 */
#ifndef SCHEDULER_KV_EVENTS_H
#define SCHEDULER_KV_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "blockmgr/bm_events.h"

typedef struct kve kve_t;

/* Parses json (vLLM's --kv-events-config). *out is NULL when the JSON
 * leaves events off ("enable_kv_cache_events" false or absent). Else it
 * binds the sockets and starts the publisher thread. Errors: ST_EINVAL
 * (bad JSON, bind failure), ST_EUNSUPPORTED (built without libzmq or
 * msgpack-c), with a reason in err. block_size: tokens per block. */
int kve_create(const char *json, uint32_t block_size, kve_t **out, char *err, size_t errlen);
/* Sends what is queued, stops the thread, closes the sockets. NULL: no-op. */
void kve_destroy(kve_t *k);
/* The bm_event_cb to hand blockmgr (arg is the kve_t). Engine thread. */
void kve_on_event(void *arg, const bm_event_t *ev);
/* Ends the current step's batch: queues it, or drops it when the queue is
 * full. Never blocks on the publisher beyond a short mutex. Engine thread. */
void kve_flush(kve_t *k);
/* Events queued for sending so far, and events dropped. Any thread. */
void kve_counters(const kve_t *k, uint64_t *published, uint64_t *dropped);

#endif /* SCHEDULER_KV_EVENTS_H */
