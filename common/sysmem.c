/* sysmem.c - available memory and memory locking (common/sysmem.h).
 *
 * Thread: any.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "common/status.h"
#include "common/sysmem.h"

/* The value in kB of the line "name: N kB" of a /proc file, in bytes. */
static int64_t
proc_kb_field(const char *path, const char *name)
{
    FILE *f = fopen(path, "r");
    char line[256];
    size_t n = strlen(name);
    int64_t out = -1;

    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        long long kb;

        if (strncmp(line, name, n) == 0 && line[n] == ':' &&
            sscanf(line + n + 1, "%lld", &kb) == 1 && kb >= 0) {
            out = (int64_t)kb * 1024;
            break;
        }
    }
    fclose(f);
    return out;
}

int64_t
sysmem_available(void)
{
    return proc_kb_field("/proc/meminfo", "MemAvailable");
}

int64_t
sysmem_self_field(const char *name)
{
    return proc_kb_field("/proc/self/status", name);
}

int64_t
sysmem_memlock_limit(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
        rl.rlim_cur > (rlim_t)INT64_MAX) {
        return INT64_MAX;
    }
    return (int64_t)rl.rlim_cur;
}

int
sysmem_lock_all(char *err, size_t errlen)
{
    int64_t lim = sysmem_memlock_limit();
    int e;

    if (mlockall(MCL_CURRENT) == 0) {
        if (sysmem_self_field("VmLck") == 0) {
            /* The sanitizers intercept mlockall as a no-op that succeeds. */
            snprintf(err, errlen, "--mlock: mlockall reported success but nothing is locked "
                                  "(a sanitizer build intercepts it)");
            return ST_EUNSUPPORTED;
        }
        return ST_OK;
    }
    e = errno;
    munlockall();
    if (lim == INT64_MAX) {
        snprintf(err, errlen, "--mlock: mlockall failed (%s) with RLIMIT_MEMLOCK unlimited, %lld "
                 "MiB mapped", strerror(e), (long long)(sysmem_self_field("VmSize") >> 20));
    } else {
        snprintf(err, errlen,
                 "--mlock: cannot lock %lld MiB (resident %lld MiB): RLIMIT_MEMLOCK is %lld KiB "
                 "(%s); raise it (ulimit -l, LimitMEMLOCK= in the systemd unit) or drop --mlock",
                 (long long)(sysmem_self_field("VmSize") >> 20),
                 (long long)(sysmem_self_field("VmRSS") >> 20), (long long)(lim >> 10),
                 strerror(e));
    }
    return -e;
}
