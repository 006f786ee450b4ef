/* sysmem.h - what the host can give the process: available memory and
 * memory locking, for start-up checks that fail early with numbers instead
 * of the OOM killer failing late.
 *
 * DESIGN. The serving daemon commits its large regions (KV pool, swap
 * tier, step scratch) before it reports ready. Before it maps them it asks
 * sysmem_available() whether they fit, and with --mlock it pins every
 * mapped page once they exist (sysmem_lock_all()). Both write a one-line
 * reason with the numbers on failure; neither aborts.
 *
 * Thread: any thread; sysmem_lock_all() is meant for start-up, before the
 * request path allocates.
 */
#ifndef COMMON_SYSMEM_H
#define COMMON_SYSMEM_H

#include <stddef.h>
#include <stdint.h>

/* MemAvailable of /proc/meminfo in bytes (what the kernel estimates can be
 * allocated without swapping), or -1 when it cannot be read. */
int64_t sysmem_available(void);

/* The soft RLIMIT_MEMLOCK in bytes, or INT64_MAX when unlimited. */
int64_t sysmem_memlock_limit(void);

/* Locks every page mapped now (mlockall(MCL_CURRENT)), which also faults
 * them in. On failure returns -errno and writes one line to err naming the
 * resident size, the locked size and RLIMIT_MEMLOCK, and how to raise it;
 * nothing is left locked. ST_EUNSUPPORTED when mlockall succeeds but
 * VmLck stays 0 (sanitizer builds make it a no-op). ST_OK otherwise. */
int sysmem_lock_all(char *err, size_t errlen);

/* Bytes of the calling process's VmRSS, VmLck or another kB field of
 * /proc/self/status (name without the colon), or -1. */
int64_t sysmem_self_field(const char *name);

#endif /* COMMON_SYSMEM_H */
