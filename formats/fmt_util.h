/* fmt_util.h - file and error helpers shared by the weight-file parsers
 * (formats/) and the model loaders (model/config.c, model/model.c):
 * read-only mmap of a whole file, small-file reads, error strings.
 *
 * DESIGN: the helpers live here, below model/, so that the parsers need
 * nothing from model/. Errors are ST_* (common/status.h) or -errno, with
 * a one-line reason naming the file in the caller's err buffer.
 *
 * Thread: any; nothing here keeps state.
 */
#ifndef FORMATS_FMT_UTIL_H
#define FORMATS_FMT_UTIL_H

#include <stdarg.h>
#include <stddef.h>

/* snprintf into err (when err is not NULL and errlen > 0). */
void fmt_seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* mmaps path read-only. -errno when it cannot be opened or mapped,
 * ST_EFORMAT when empty; err names the file. Release with fmt_unmap. */
int fmt_map_file(const char *path, void **data, size_t *len, char *err, size_t errlen);
void fmt_unmap(void *data, size_t len);

/* Reads a whole (small) file into a NUL-terminated malloc'd buffer owned
 * by the caller. -errno (ST_ENOENT when absent), ST_EFORMAT above max. */
int fmt_read_file(const char *path, size_t max, char **data, size_t *len, char *err,
                  size_t errlen);

#endif /* FORMATS_FMT_UTIL_H */
