/* thread.h - thread roles and debug assertions on them.
 *
 * Thread: any; each thread sets its own role once at start.
 */
#ifndef COMMON_THREAD_H
#define COMMON_THREAD_H

#include <assert.h>

enum thread_role {
    THREAD_OTHER = 0,
    THREAD_LOOP,
    THREAD_ENGINE,
    THREAD_RANK, /* tensor-parallel worker */
};

void thread_set_role(enum thread_role role);
enum thread_role thread_role(void);

#define ASSERT_THREAD(role) assert(thread_role() == THREAD_##role || thread_role() == THREAD_OTHER)

#endif /* COMMON_THREAD_H */
