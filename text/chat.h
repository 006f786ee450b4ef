/* chat.h - chat templates: a Jinja subset interpreter.
 *
 * Renders a model's chat_template (tokenizer_config.json, GGUF metadata or
 * --chat-template FILE) the way Hugging Face's apply_chat_template does with
 * Python's jinja2: an ImmutableSandboxedEnvironment with trim_blocks and
 * lstrip_blocks, the loopcontrols extension ({% break %}, {% continue %}),
 * {% generation %} blocks, HF's tojson (json.dumps, no HTML escaping) and
 * the globals raise_exception() and strftime_now().
 *
 * Supported: {{ }}, {% %}, {# #}, whitespace control (- and +), if / elif /
 * else, for (tuple targets, loop.*, else, inline if filter), set (also
 * ns.attr and block set), macro, filter blocks, Python-like expressions
 * (and/or/not, comparisons, in, is tests, ~, arithmetic, subscripts and
 * slices, attribute access, literals), the common str / dict / list
 * methods, and the usual filters (trim, length, tojson, join, default, map,
 * selectattr, dictsort, ...). Strings are UTF-8; length, indexing and
 * slicing count code points as Python does; upper/lower/title change ASCII
 * letters only. jinja2 quirks kept: map / select / selectattr / unique /
 * items give generators (always true, no length, not JSON serializable,
 * errors deferred until iterated), |safe strings are Markup (Markup + str
 * escapes the str), none prints as None.
 *
 * Not supported (a clear error): extends / include / import / block,
 * {% call %} blocks, recursive loops, the batch / slice / format / urlize
 * filters, format specs in str.format. A generator can be iterated more than
 * once here (jinja2's is exhausted after the first pass).
 *
 * Safety: the interpreter is meant for untrusted templates. Parsing depth,
 * evaluation nesting (the C stack stays under about 1 MiB), macro call
 * depth, loop iterations, work (string scans and comparisons, about a
 * second's worth), memory and output size are bounded; exceeding a bound
 * is an error (ST_ETOOLONG), never a crash or a hang. Lists, dicts
 * and strings are immutable (as in jinja2's immutable sandbox); only
 * namespace() objects can be assigned to.
 *
 * Thread: a compiled template is immutable and may be rendered from several
 * threads at once; each render uses its own memory.
 */
#ifndef TEXT_CHAT_H
#define TEXT_CHAT_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef struct chat_template chat_template_t;

typedef struct chat_message {
    const char *role;    /* "system", "user", "assistant", ... */
    const char *content; /* UTF-8 text; NULL renders as none */
} chat_message_t;

typedef struct chat_render_opts {
    const char *bos_token;     /* NULL: undefined in the template */
    const char *eos_token;     /* NULL: undefined in the template */
    int add_generation_prompt; /* bool */
    /* Optional JSON object text whose members become extra template
     * variables (e.g. {"enable_thinking": false, "tools": [...]}); NULL for
     * none. Members named like the built-in variables override them. */
    const char *extra_json;
    time_t now;        /* strftime_now() time; 0: the current time */
    size_t max_output; /* bytes; 0: CHAT_DEFAULT_MAX_OUTPUT */
} chat_render_opts_t;

#define CHAT_DEFAULT_MAX_OUTPUT ((size_t)16 << 20)

/* Compiles template source src (NUL-terminated UTF-8). On success *out owns
 * the template (chat_template_destroy). On failure returns ST_EFORMAT (syntax
 * error) or ST_ETOOLONG (nesting or size limit), writes a one-line message
 * with the line number into err (if errlen > 0) and leaves *out unchanged. */
int chat_template_compile(const char *src, chat_template_t **out, char *err, size_t errlen);

/* Renders t over msgs[0..n). On success *out is a NUL-terminated string the
 * caller frees with free(). Errors: ST_EFORMAT for a template runtime error
 * (raise_exception, undefined value misuse, type errors; err holds the
 * message, e.g. the raise_exception text), ST_ETOOLONG when the output,
 * memory, loop or recursion limits are exceeded, ST_EINVAL for bad
 * arguments or extra_json that is not a JSON object. *out unchanged on error. */
int chat_template_render(const chat_template_t *t, const chat_message_t *msgs, size_t n,
                         const chat_render_opts_t *opts, char **out, char *err, size_t errlen);

/* Frees t; NULL is fine. */
void chat_template_destroy(chat_template_t *t);

#endif /* TEXT_CHAT_H */
