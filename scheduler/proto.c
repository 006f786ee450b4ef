/* proto.c - what the thread protocol (proto.h) needs as code: freeing a
 * message and what it owns.
 *
 * Thread: any; a message belongs to whoever holds it.
 */
#include "scheduler/proto.h"

#include <stdlib.h>

#include "scheduler/kv_map.h"

void
eng_msg_free(msg_t *m)
{
    if (m == NULL) {
        return;
    }
    if (m->type == ENG_MSG_SUBMIT) {
        eng_msg_submit_t *sm = (eng_msg_submit_t *)m;
        free(sm->req.prompt);
        free((void *)sm->req.sampling.bias);
        gr_grammar_destroy(sm->req.grammar);
    }
    if (m->type == ENG_MSG_ADMIN || m->type == ENG_MSG_ADMIN_REPLY) {
        free(((eng_msg_admin_t *)m)->buf);
    }
    free(m);
}
