/* kv_map.h - the web console's admin queries to the engine (issue 19): a
 * snapshot of the KV block map, one block's detail, a prefix-cache reset,
 * and the engine's statistics, as one message pair of the thread protocol
 * (proto.h): ENG_MSG_ADMIN in the inbox, ENG_MSG_ADMIN_REPLY back.
 *
 * DESIGN
 *   The engine applies an ADMIN message where it applies every inbox
 *   message, at an iteration boundary (no step is planned or running), so
 *   the snapshot is consistent: refcounts equal the tables, and what the
 *   map shows is what the next step starts from. The engine only copies:
 *   fixed-size arrays per tier (a state byte, a 16-bit tenant and a 32-bit
 *   refcount per block) and at most ENG_KV_MAX_SEQS sequences with their
 *   block tables, into one buffer allocated (fallibly) per reply; JSON is
 *   written on the loop thread (server/srv_admin.c). eng_kv_admin_ns in
 *   the reply is the engine time the query took; bench_blockmgr measures
 *   the map at 100,000 blocks.
 *
 *   Token ids of a block go only to the tenant that may see them: the
 *   viewer (a tenant index the loop thread found from the request's
 *   X-Kvserve-Tenant-Key) gets them when one of its sequences holds the
 *   block, or for a CACHED block no sequence holds, when the viewer's
 *   prefix-cache salt is that of the block's tenant (blockmgr/bm_map.h).
 *   Otherwise the reply says why not and carries no token.
 *
 * Thread: plain data, like proto.h; eng_kv_admin() runs on the engine
 * thread only.
 */
#ifndef SCHEDULER_KV_MAP_H
#define SCHEDULER_KV_MAP_H

#include <stdint.h>

#include "scheduler/proto.h"

typedef struct bm_pool bm_pool_t;

enum eng_admin_op {
    ENG_ADMIN_MAP = 1, /* the block map */
    ENG_ADMIN_BLOCK,   /* one block (tier, block, viewer) */
    ENG_ADMIN_RESET,   /* drop every CACHED block of both tiers */
    ENG_ADMIN_STATS,   /* eng_stats_t, as ENG_MSG_STATS */
};

enum eng_kv_hidden {
    ENG_KV_SHOWN = 0,      /* tokens[] holds the block's token ids */
    ENG_KV_NOTHING,        /* a FREE or null block: no tokens to show */
    ENG_KV_OTHER_TENANT,   /* another tenant's block */
    ENG_KV_NO_VIEWER,      /* no (valid) tenant key given */
    ENG_KV_NOT_KEPT,       /* a cached block whose token ids are not kept */
};

#define ENG_KV_MAX_SEQS 256
#define ENG_KV_MAX_HOLDERS 64
#define ENG_KV_NO_TENANT 0xffffu

typedef struct eng_kv_tier {
    uint32_t n_blocks; /* device: including the null block 0 */
    uint8_t *state;    /* [n_blocks] 'f' free, 'c' cached, 'u' used, 'n' the null block */
    uint16_t *tenant;  /* [n_blocks] tenant index, ENG_KV_NO_TENANT for none */
    uint32_t *ref;     /* [n_blocks] sequences' table entries naming it */
} eng_kv_tier_t;

typedef struct eng_kv_seq {
    uint64_t id;       /* blockmgr sequence id (a request's choice; not the request id) */
    uint32_t tenant;   /* tenant index */
    uint32_t n_tokens; /* tokens with KV */
    uint32_t n_blocks; /* entries of its table in seq_blocks[first ..] */
    uint32_t first;
    int swapped;       /* its blocks are on the cpu tier */
} eng_kv_seq_t;

typedef struct eng_kv_block {
    uint8_t state;   /* as eng_kv_tier_t.state */
    uint16_t tenant; /* as eng_kv_tier_t.tenant */
    uint32_t ref;
    int hashed;
    uint8_t hash[32];
    uint32_t n_holders; /* in all; the first ENG_KV_MAX_HOLDERS are listed */
    uint64_t holders[ENG_KV_MAX_HOLDERS];
    int hidden;        /* enum eng_kv_hidden */
    int32_t n_tokens;  /* ENG_KV_SHOWN: tokens[0 .. n_tokens) */
    int32_t *tokens;   /* into the message's buffer */
} eng_kv_block_t;

typedef struct eng_msg_admin {
    msg_t hdr;
    uint64_t cookie; /* the loop thread's request id, echoed */
    int32_t op;      /* enum eng_admin_op */
    int32_t status;  /* reply: ST_OK, ST_EINVAL (no such block), ST_ENOMEM */
    /* ENG_ADMIN_BLOCK request */
    int32_t tier;    /* 0 device, 1 cpu */
    uint32_t block;
    int32_t viewer;  /* tenant index, -1: none */
    /* reply */
    uint64_t step;     /* engine steps so far */
    uint64_t ns;       /* engine-thread nanoseconds the query took */
    eng_kv_tier_t tiers[2];
    uint32_t n_seqs;       /* listed */
    uint32_t n_seqs_total; /* in the pool (more than n_seqs: truncated) */
    eng_kv_seq_t *seqs;    /* [n_seqs] */
    int32_t *seq_blocks;   /* the listed sequences' tables */
    eng_kv_block_t blk;    /* ENG_ADMIN_BLOCK */
    uint32_t blocks_freed; /* ENG_ADMIN_RESET: CACHED blocks dropped, both tiers */
    eng_stats_t stats;     /* ENG_ADMIN_STATS */
    void *buf;             /* owns every array above (one allocation) */
} eng_msg_admin_t;

/* Answers m (MAP, BLOCK or RESET) from pool, in place: fills the reply
 * fields and status. ST_ENOMEM when the reply buffer cannot be allocated
 * (nothing else changes). Engine thread, between steps. */
void eng_kv_admin(eng_msg_admin_t *m, bm_pool_t *pool);

#endif /* SCHEDULER_KV_MAP_H */
