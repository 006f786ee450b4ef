/* srv_chat.c - the server's chat template: compiled once at start-up from
 * the model's template (text/chat.h), or the plain fallback, and rendered
 * for /v1/chat/completions and /tokenize with "messages".
 *
 * Thread: srv_chat_init/fini on the thread that runs srv_run(), rendering
 * on the loop thread.
 */
#define LOG_MODULE "http"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "text/chat.h"
#include "server/srv_openai.h"
#include "server/srv_state.h"

int
srv_chat_init(srv_t *s)
{
    char err[256] = "";
    chat_template_t *t = NULL;
    int rc;

    s->chat = NULL;
    if (s->chat_template == NULL) {
        LOG_INFO("the model has no chat template: using the plain one");
        return ST_OK;
    }
    rc = chat_template_compile(s->chat_template, &t, err, sizeof(err));
    if (rc != ST_OK) {
        LOG_ERROR("chat template: %s", err[0] ? err : st_str(rc));
        return rc;
    }
    s->chat = t;
    return ST_OK;
}

void
srv_chat_fini(srv_t *s)
{
    chat_template_destroy(s->chat);
    s->chat = NULL;
}

char *
srv_chat_render(const srv_t *s, const srv_chat_msg_t *msgs, int32_t n, int agp, srv_error_t *err)
{
    return srv_chat_render_extra(s, msgs, n, agp, NULL, err);
}

char *
srv_chat_render_extra(const srv_t *s, const srv_chat_msg_t *msgs, int32_t n, int agp,
                      const char *extra_json, srv_error_t *err)
{
    int32_t bos = tok_bos_id(s->tok), eos = tok_eos_id(s->tok);
    const char *bos_s = bos >= 0 ? tok_token_str(s->tok, bos) : NULL;
    chat_render_opts_t opts;
    chat_message_t *cm;
    char *out = NULL, msg[256] = "";
    int rc;

    if (s->chat == NULL) {
        out = srv_chat_render_plain(msgs, n, agp, bos_s);
        if (out == NULL) {
            srv_err_oom(err);
        }
        return out;
    }
    memset(&opts, 0, sizeof(opts));
    opts.bos_token = bos_s;
    opts.eos_token = eos >= 0 ? tok_token_str(s->tok, eos) : NULL;
    opts.add_generation_prompt = agp;
    opts.max_output = 4u << 20;
    opts.extra_json = extra_json;
    cm = xcalloc_try((size_t)n + 1, sizeof(*cm));
    if (cm == NULL) {
        srv_err_oom(err);
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) {
        cm[i].role = msgs[i].role;
        cm[i].content = msgs[i].content;
    }
    rc = chat_template_render(s->chat, cm, (size_t)n, &opts, &out, msg, sizeof(msg));
    free(cm);
    if (rc == ST_ENOMEM) {
        srv_err_oom(err);
        return NULL;
    }
    if (rc != ST_OK) {
        srv_err_set(err, 400, "messages", "the chat template rejected the conversation: %s",
                    msg[0] ? msg : st_str(rc));
        return NULL;
    }
    return out;
}
