/* test_chat_api.c - text/chat: rendering basics, whitespace control,
 * Python semantics, errors, and the limits that keep untrusted templates
 * from crashing or running away. The jinja2 conformance over the real
 * templates is test_chat.py. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "text/chat.h"

static const chat_message_t conv[] = {
    {"system", "Be kind."},
    {"user", "Hello"},
    {"assistant", "Good day."},
    {"user", "Tell me of Emma."},
};

/* Renders src over conv with the given options; returns the status and
 * stores the output (or the error message) in *out (caller frees). */
static int
render(const char *src, const chat_render_opts_t *o, char **out)
{
    chat_template_t *t;
    char err[256];
    int rc = chat_template_compile(src, &t, err, sizeof(err));

    if (rc != ST_OK) {
        *out = strdup(err);
        return rc;
    }
    rc = chat_template_render(t, conv, 4, o, out, err, sizeof(err));
    chat_template_destroy(t);
    if (rc != ST_OK) {
        *out = strdup(err);
    }
    return rc;
}

static void
expect(const char *src, const char *want)
{
    chat_render_opts_t o = {.bos_token = "<s>", .eos_token = "</s>", .add_generation_prompt = 1};
    char *out;
    int rc = render(src, &o, &out);

    ck_assert_msg(rc == ST_OK, "%s: error %s", src, out);
    ck_assert_str_eq(out, want);
    free(out);
}

static void
expect_error(const char *src, int status, const char *msg_part)
{
    char *out;
    int rc = render(src, NULL, &out);

    ck_assert_msg(rc == status, "%s: status %d (%s), want %d", src, rc, out, status);
    if (msg_part != NULL) {
        ck_assert_msg(strstr(out, msg_part) != NULL, "message '%s' lacks '%s'", out, msg_part);
    }
    free(out);
}

START_TEST(test_basic_loop)
{
    expect("{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m['content'] }}\n{% endfor %}"
           "{% if add_generation_prompt %}assistant:{% endif %}",
           "<s>system: Be kind.\nuser: Hello\nassistant: Good day.\nuser: Tell me of Emma.\n"
           "assistant:");
    expect("{% for m in messages if m.role == 'user' %}{{ loop.index }}/{{ loop.length }}"
           "{{ '.' if not loop.last }}{% endfor %}",
           "1/2.2/2");
    expect("{% for m in messages %}{% if loop.first %}F{% elif loop.last %}L{% else %}-{% endif %}"
           "{% endfor %}",
           "F--L");
    expect("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", "a=1;b=2;");
    expect("{% for x in [] %}x{% else %}empty{% endfor %}", "empty");
    expect("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
           "012");
}
END_TEST

START_TEST(test_whitespace_control)
{
    /* trim_blocks drops the newline after a block tag; lstrip_blocks the
     * indentation before it; "-" strips all whitespace on its side. */
    expect("{% if true %}\n  a\n{% endif %}\nb", "  a\nb");
    expect("x\n    {% if true %}\ny{% endif %}", "x\ny");
    expect("a   {{- 'b' -}}   \n c", "abc");
    expect("{# comment #}\nz", "z");
    expect("  {%+ if true %}k{% endif %}", "  k");
    expect("{% raw %}{{ not rendered }}{% endraw %}", "{{ not rendered }}");
}
END_TEST

START_TEST(test_python_semantics)
{
    expect("{{ none }} {{ true }} {{ 1/2 }} {{ 7//2 }} {{ -7 % 3 }} {{ 3.0 }} {{ 1e20 }}",
           "None True 0.5 3 2 3.0 1e+20");
    expect("{{ [1, 'a', none] }} {{ {'k': 'v'} }} {{ (1,) }}", "[1, 'a', None] {'k': 'v'} (1,)");
    expect("{{ 'abcdef'[1:3] }}{{ 'abc'[::-1] }}{{ 'abc'[-1] }}{{ [1,2,3][1:] }}", "bccbac[2, 3]");
    expect("{{ 'caf\xc3\xa9'|length }} {{ 'caf\xc3\xa9'[3] }}", "4 \xc3\xa9");
    expect("{{ '  x y  '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b  c'.split() }}",
           "x y|['a', 'b', '', 'c']|['a', 'b', 'c']");
    expect("{{ 'x</think>y'.split('</think>')[-1] }}{{ 'abc'.startswith(('z', 'a')) }}", "yTrue");
    expect("{{ '{} and {name}'.format(1, name='two') }}", "1 and two");
    expect("{{ undefined_var }}|{{ undefined_var is defined }}|{{ x | default('d') }}", "|False|d");
    expect("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
           "{% endfor %}{{ ns.n }}",
           "4");
    expect("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", "1");
    expect("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') "
           "| join(', ') }}",
           "Hello, Tell me of Emma.");
    expect("{{ {'b': 1, 'a': [true, none, 1.5, 'q\"']} | tojson }}",
           "{\"b\": 1, \"a\": [true, null, 1.5, \"q\\\"\"]}");
    expect("{{ {'a': 1} | tojson(indent=2) }}", "{\n  \"a\": 1\n}");
    expect("{{ 'caf\xc3\xa9' | tojson(ensure_ascii=true) }}", "\"caf\\u00e9\"");
    expect("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}",
           "[1B][23]");
    expect("{% set s %}in{{ 1 }}{% endset %}{{ s | upper }}", "IN1");
    expect("{{ 'a' ~ 1 ~ none }}{{ 'x' if false else 'y' }}{{ 1 < 2 < 3 }}", "a1NoneyTrue");
    expect("{% filter upper %}abc{% endfilter %}", "ABC");
    expect("{{ 'l1\nl2' | indent(2, first=true) }}", "  l1\n  l2");
    /* Markup: |safe + str escapes the str; map / select are generators
     * (always true, no length, not JSON) as in jinja2 */
    expect("{{ '<b>'|safe + '<i>' }}|{{ '<b>' + '<i>' }}", "<b>&lt;i&gt;|<b><i>");
    expect("{{ 'yes' if [] | select else 'no' }}{{ [1, 2] | map('string') | list }}",
           "yes['1', '2']");
}
END_TEST

START_TEST(test_errors)
{
    expect_error("{{ raise_exception('Only user and assistant roles') }}", ST_EFORMAT,
                 "Only user and assistant roles");
    expect_error("{% if x %}", ST_EFORMAT, "endif");
    expect_error("{{ 1 + }}", ST_EFORMAT, "line 1");
    expect_error("a\n{% frobnicate %}", ST_EFORMAT, "line 2");
    expect_error("{{ 'unterminated }}", ST_EFORMAT, "unterminated");
    expect_error("{{ x.y }}", ST_EFORMAT, "undefined");
    expect_error("{{ 1 + 'a' }}", ST_EFORMAT, NULL);
    expect_error("{{ [].append(1) }}", ST_EFORMAT, "unsafe");
    expect_error("{{ x | nosuchfilter }}", ST_EFORMAT, "nosuchfilter");
    expect_error("{{ 1 // 0 }}", ST_EFORMAT, NULL);
    expect_error("{% break %}", ST_EFORMAT, "outside");
    expect_error("{{ [1] | map('string') | tojson }}", ST_EFORMAT, "generator");
    expect_error("{{ [1] | select | length }}", ST_EFORMAT, "generator");
}
END_TEST

START_TEST(test_limits)
{
    chat_render_opts_t o = {.max_output = 1000};
    char *out, deep[4000];
    int rc;

    /* output size */
    rc = render("{% for i in range(100) %}0123456789abcdef{% endfor %}", &o, &out);
    ck_assert_int_eq(rc, ST_ETOOLONG);
    free(out);
    /* iterations */
    expect_error("{% set r = range(1000) %}{% for i in r %}{% for j in r %}{% for k in r %}"
                 "{% endfor %}{% endfor %}{% endfor %}",
                 ST_ETOOLONG, "iteration");
    /* memory: every iteration allocates a new list */
    expect_error("{% set r = range(10000) %}{% for i in range(900) %}{% set x = r + r %}"
                 "{% endfor %}",
                 ST_ETOOLONG, "memory");
    /* recursion */
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", ST_ETOOLONG, "deeply");
    /* parser nesting */
    memset(deep, 0, sizeof(deep));
    strcpy(deep, "{{ ");
    for (int i = 0; i < 1000; i++) {
        strcat(deep, "(");
    }
    strcat(deep, "1");
    for (int i = 0; i < 1000; i++) {
        strcat(deep, ")");
    }
    strcat(deep, " }}");
    expect_error(deep, ST_ETOOLONG, "deeply");
    /* a huge string repetition is refused, not attempted */
    expect_error("{{ 'x' * 10000000000 }}", ST_ETOOLONG, NULL);
    expect_error("{{ range(100000000) | length }}", ST_ETOOLONG, NULL);
    /* quadratic scans end in a work limit, not a hung thread */
    expect_error("{% set s = 'x' * 100000 %}{% for i in range(100000) %}{% if 'y' in s %}"
                 "{% endif %}{% endfor %}",
                 ST_ETOOLONG, "work");
    expect_error("{% set l = range(50000) | list %}{{ (l + l) | unique | list | length }}",
                 ST_ETOOLONG, "work");
}
END_TEST

START_TEST(test_opts)
{
    chat_render_opts_t o = {.extra_json = "{\"enable_thinking\": false, \"tools\": [{\"n\": 1}]}",
                            .now = 86400 * 365};
    char *out;

    ck_assert_int_eq(
        render("{{ enable_thinking }} {{ tools[0].n }} {{ bos_token is defined }}", &o, &out),
        ST_OK);
    ck_assert_str_eq(out, "False 1 False");
    free(out);
    o.extra_json = "[1]";
    ck_assert_int_eq(render("x", &o, &out), ST_EINVAL);
    free(out);
    o.extra_json = NULL;
    setenv("TZ", "UTC", 1);
    ck_assert_int_eq(render("{{ strftime_now('%Y-%m-%d') }}", &o, &out), ST_OK);
    ck_assert_str_eq(out, "1971-01-01");
    free(out);
    chat_template_destroy(NULL);
}
END_TEST

/* A big JSON object (the dict index path), duplicate keys keep the last
 * value in the first position (Python's json), int and float keys agree. */
START_TEST(test_big_dict)
{
    chat_render_opts_t o = {0};
    size_t cap = 20000 * 24 + 64, n = 0;
    char *json = malloc(cap), *out;

    n += (size_t)snprintf(json + n, cap - n, "{\"big\": {");
    for (int i = 0; i < 20000; i++) {
        n += (size_t)snprintf(json + n, cap - n, "%s\"k%d\": %d", i ? ", " : "", i, i);
    }
    snprintf(json + n, cap - n, ", \"k7\": -7}}");
    o.extra_json = json;
    ck_assert_int_eq(render("{{ big | length }} {{ big['k19999'] }} {{ big.k7 }} {{ big.nope is "
                            "defined }} {% set d = {1: 'one', 'x': 2} %}{{ d[1.0] }}",
                            &o, &out),
                     ST_OK);
    ck_assert_str_eq(out, "20000 19999 -7 False one");
    free(out);
    free(json);
}
END_TEST

typedef struct deep_job {
    const char *src;
    int rc;
} deep_job_t;

static void *
deep_render(void *arg)
{
    deep_job_t *job = arg;
    char *out = NULL;

    job->rc = render(job->src, NULL, &out);
    free(out);
    return NULL;
}

/* Deep statement nesting inside recursive macros ends in ST_ETOOLONG, not in
 * a stack overflow, even on a 1 MiB thread stack. */
START_TEST(test_deep_recursion_small_stack)
{
    size_t cap = 16384;
    char *src = malloc(cap);
    deep_job_t job;
    pthread_attr_t attr;
    pthread_t th;

    strcpy(src, "{% macro f(n) %}");
    for (int i = 0; i < 150; i++) {
        strcat(src, "{% if true %}");
    }
    strcat(src, "{{ f(n + 1) }}");
    for (int i = 0; i < 150; i++) {
        strcat(src, "{% endif %}");
    }
    strcat(src, "{% endmacro %}{{ f(0) }}");
    job.rc = 0;
    job.src = src;
    ck_assert_int_eq(pthread_attr_init(&attr), 0);
    ck_assert_int_eq(pthread_attr_setstacksize(&attr, 1 << 20), 0);
    ck_assert_int_eq(pthread_create(&th, &attr, deep_render, &job), 0);
    pthread_join(th, NULL);
    pthread_attr_destroy(&attr);
    ck_assert_int_eq(job.rc, ST_ETOOLONG);
    free(src);
}
END_TEST

Suite *
chat_api_suite(void)
{
    Suite *s = suite_create("chat");
    TCase *tc = tcase_create("api");

    tcase_add_test(tc, test_basic_loop);
    tcase_add_test(tc, test_whitespace_control);
    tcase_add_test(tc, test_python_semantics);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_limits);
    tcase_add_test(tc, test_opts);
    tcase_add_test(tc, test_deep_recursion_small_stack);
    tcase_add_test(tc, test_big_dict);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}
