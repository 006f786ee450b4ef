/* log.c - one write(2) per line, "<N>" syslog priority prefix. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int log_level_cur = LOG_LEVEL_INFO;

void
log_set_level(int level)
{
    log_level_cur = level;
}

int
log_level_parse(const char *name)
{
    static const struct {
        const char *name;
        int level;
    } tab[] = {
        {"error", LOG_LEVEL_ERR}, {"warn", LOG_LEVEL_WARN},   {"warning", LOG_LEVEL_WARN},
        {"info", LOG_LEVEL_INFO}, {"debug", LOG_LEVEL_DEBUG}, {"trace", LOG_LEVEL_TRACE},
    };
    for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
        if (strcasecmp(name, tab[i].name) == 0) {
            return tab[i].level;
        }
    }
    return -1;
}

void
log_write(int level, const char *module, const char *fmt, ...)
{
    char buf[2048];
    int prio = level > LOG_LEVEL_DEBUG ? LOG_LEVEL_DEBUG : level;
    int n = snprintf(buf, sizeof(buf), "<%d>%s: ", prio, module);
    va_list ap;

    if (n < 0) {
        return;
    }
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0) {
        return;
    }
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof(buf) - 2) {
        len = sizeof(buf) - 2;
    }
    buf[len++] = '\n';
    ssize_t w = write(2, buf, len);
    (void)w;
}
