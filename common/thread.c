/* thread.c - per-thread role for ASSERT_THREAD. */
#include "thread.h"

static _Thread_local enum thread_role role_cur = THREAD_OTHER;

void
thread_set_role(enum thread_role role)
{
    role_cur = role;
}

enum thread_role
thread_role(void)
{
    return role_cur;
}
