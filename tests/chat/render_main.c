/* render_main.c - renders a chat template file over a JSON conversation.
 *
 * Usage: chat_render TEMPLATE.jinja CONVERSATIONS.json NAME
 * CONVERSATIONS.json is tests/chat/conversations.json: bos_token,
 * eos_token, now (epoch seconds for strftime_now) and a list of
 * conversations {name, add_generation_prompt, messages, extra}. Prints the
 * render of conversation NAME to stdout; on a template error prints
 * "ERROR: message" to stderr and exits 1 (2 for usage or I/O errors).
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "text/chat.h"

static char *
read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    if (f == NULL) {
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    buf = malloc((size_t)n + 1);
    if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    buf[n] = '\0';
    fclose(f);
    return buf;
}

int
main(int argc, char **argv)
{
    char err[512];
    char *src, *conv_text, *out = NULL, *extra = NULL;
    cJSON *conv, *item = NULL, *msgs;
    chat_template_t *t;
    chat_message_t *m;
    chat_render_opts_t o = {0};
    int n, rc, status = 0;

    if (argc != 4) {
        fprintf(stderr, "usage: %s TEMPLATE CONVERSATIONS.json NAME\n", argv[0]);
        return 2;
    }
    src = read_file(argv[1]);
    conv_text = read_file(argv[2]);
    if (src == NULL || conv_text == NULL) {
        fprintf(stderr, "cannot read input files\n");
        return 2;
    }
    conv = cJSON_Parse(conv_text);
    if (conv == NULL) {
        fprintf(stderr, "bad conversations JSON\n");
        return 2;
    }
    cJSON_ArrayForEach(item, cJSON_GetObjectItem(conv, "conversations"))
    {
        if (strcmp(cJSON_GetObjectItem(item, "name")->valuestring, argv[3]) == 0) {
            break;
        }
    }
    if (item == NULL) {
        fprintf(stderr, "no conversation named %s\n", argv[3]);
        return 2;
    }
    msgs = cJSON_GetObjectItem(item, "messages");
    n = cJSON_GetArraySize(msgs);
    m = calloc((size_t)n + 1, sizeof(*m));
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_GetArrayItem(msgs, i);

        m[i].role = cJSON_GetObjectItem(e, "role")->valuestring;
        m[i].content = cJSON_GetObjectItem(e, "content")->valuestring;
    }
    o.bos_token = cJSON_GetObjectItem(conv, "bos_token")->valuestring;
    o.eos_token = cJSON_GetObjectItem(conv, "eos_token")->valuestring;
    o.now = (time_t)cJSON_GetObjectItem(conv, "now")->valuedouble;
    o.add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(item, "add_generation_prompt"));
    if (cJSON_GetObjectItem(item, "extra") != NULL) {
        extra = cJSON_PrintUnformatted(cJSON_GetObjectItem(item, "extra"));
        o.extra_json = extra;
    }

    rc = chat_template_compile(src, &t, err, sizeof(err));
    if (rc != ST_OK) {
        fprintf(stderr, "ERROR: compile: %s\n", err);
        status = 1;
        goto done;
    }
    rc = chat_template_render(t, m, (size_t)n, &o, &out, err, sizeof(err));
    chat_template_destroy(t);
    if (rc != ST_OK) {
        fprintf(stderr, "ERROR: %s (%s)\n", err, st_str(rc));
        status = 1;
        goto done;
    }
    fwrite(out, 1, strlen(out), stdout);
    free(out);
done:
    /* Freed on every path, so LeakSanitizer runs of the conformance test
     * stay clean. */
    free(m);
    free(extra);
    cJSON_Delete(conv);
    free(src);
    free(conv_text);
    return status;
}
