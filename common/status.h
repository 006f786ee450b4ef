/* status.h - status codes shared by every module, and the always-on CHECK.
 *
 * Functions that can fail return int: ST_OK (0) or a negative code.
 * OS failures pass through as -errno; project codes are below -4096.
 * ST_EAGAIN means a managed resource (KV blocks, swap space, token budget)
 * is exhausted and nothing was changed: the caller preempts, swaps or waits.
 *
 * Thread: any.
 */
#ifndef COMMON_STATUS_H
#define COMMON_STATUS_H

#include <errno.h>

enum {
    ST_OK = 0,
    ST_ENOMEM = -ENOMEM,
    ST_EINVAL = -EINVAL,
    ST_EAGAIN = -EAGAIN,
    ST_ENOENT = -ENOENT,
    ST_ERANGE = -ERANGE,
    ST_ECANCELED = -ECANCELED,
    ST_ECUDA = -5001,     /* CUDA / cuBLAS failure */
    ST_ENCCL = -5002,     /* NCCL failure */
    ST_EFORMAT = -5003,   /* bad weights, tokenizer, template or config */
    ST_ESHUTDOWN = -5004, /* the engine is shutting down */
    ST_EQUEUE = -5005,    /* a tenant's waiting queue is full */
    ST_ETOOLONG = -5006,  /* request exceeds a context or capacity limit */
    ST_ENODEV = -5007,    /* no device for the requested backend */
    ST_EUNSUPPORTED = -5008,
};

/* Never NULL. Knows every ST_* and falls back to strerror(-status). */
const char *st_str(int status);

_Noreturn void check_fail(const char *expr, const char *file, int line);

/* Cheap invariant that stays on in release builds. */
#define CHECK(c) ((c) ? (void)0 : check_fail(#c, __FILE__, __LINE__))

#endif /* COMMON_STATUS_H */
