/* log.h - leveled logging to stderr with syslog priority prefixes.
 *
 * Each line is formatted into one buffer and written with a single write(2),
 * prefixed "<N>" (syslog priority) so journald keeps the level. Each .c
 * defines LOG_MODULE before including this header. The macros test the
 * level before evaluating their arguments.
 *
 * Thread: any. log_set_level() is meant for start-up.
 */
#ifndef COMMON_LOG_H
#define COMMON_LOG_H

#include <stdint.h>

enum log_level {
    LOG_LEVEL_ERR = 3,
    LOG_LEVEL_WARN = 4,
    LOG_LEVEL_INFO = 6,
    LOG_LEVEL_DEBUG = 7,
    LOG_LEVEL_TRACE = 8, /* printed with priority 7 */
};

extern int log_level_cur;

void log_set_level(int level);
/* Parses "error", "warn", "info", "debug", "trace"; -1 when unknown. */
int log_level_parse(const char *name);
void log_write(int level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#ifndef LOG_MODULE
#define LOG_MODULE "kvserve"
#endif

#define LOG_AT(lvl, ...)                                                   \
    do {                                                                   \
        if ((lvl) <= log_level_cur) {                                      \
            log_write((lvl), LOG_MODULE, __VA_ARGS__);                     \
        }                                                                  \
    } while (0)

#define LOG_ERROR(...) LOG_AT(LOG_LEVEL_ERR, __VA_ARGS__)
#define LOG_WARN(...) LOG_AT(LOG_LEVEL_WARN, __VA_ARGS__)
#define LOG_INFO(...) LOG_AT(LOG_LEVEL_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) LOG_AT(LOG_LEVEL_DEBUG, __VA_ARGS__)
#define LOG_TRACE(...) LOG_AT(LOG_LEVEL_TRACE, __VA_ARGS__)

/* Request-scoped variants: prefix "req=<id> ". */
#define REQ_LOG(lvl, id, fmt, ...)                                         \
    LOG_AT(lvl, "req=%llu " fmt, (unsigned long long)(id), ##__VA_ARGS__)
#define REQ_INFO(id, ...) REQ_LOG(LOG_LEVEL_INFO, id, __VA_ARGS__)
#define REQ_WARN(id, ...) REQ_LOG(LOG_LEVEL_WARN, id, __VA_ARGS__)
#define REQ_DEBUG(id, ...) REQ_LOG(LOG_LEVEL_DEBUG, id, __VA_ARGS__)

#endif /* COMMON_LOG_H */
