/* fmt_util.c - the file and error helpers of fmt_util.h: read-only mmap
 * of a whole file, small-file reads, error strings.
 */
#include "formats/fmt_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/status.h"
#include "common/xmalloc.h"

void
fmt_seterr(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int
fmt_map_file(const char *path, void **data, size_t *len, char *err, size_t errlen)
{
    struct stat sb;
    void *p;
    int fd, rc;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        fmt_seterr(err, errlen, "%s: %s", path, strerror(errno));
        return rc;
    }
    if (fstat(fd, &sb) != 0) {
        rc = -errno;
        fmt_seterr(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    if (!S_ISREG(sb.st_mode)) {
        fmt_seterr(err, errlen, "%s: not a regular file", path);
        close(fd);
        return ST_EFORMAT;
    }
    if (sb.st_size == 0) {
        fmt_seterr(err, errlen, "%s: empty file", path);
        close(fd);
        return ST_EFORMAT;
    }
    p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        rc = -errno;
        fmt_seterr(err, errlen, "%s: mmap: %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    close(fd);
    *data = p;
    *len = (size_t)sb.st_size;
    return ST_OK;
}

void
fmt_unmap(void *data, size_t len)
{
    if (data != NULL) {
        munmap(data, len);
    }
}

int
fmt_read_file(const char *path, size_t max, char **data, size_t *len, char *err, size_t errlen)
{
    FILE *fp;
    char *buf = NULL;
    size_t cap = 0, n = 0, got;
    int rc;

    fp = fopen(path, "rb");
    if (fp == NULL) {
        rc = -errno;
        fmt_seterr(err, errlen, "%s: %s", path, strerror(errno));
        return rc;
    }
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap == 0 ? 8192 : cap * 2;
            buf = xrealloc(buf, cap);
        }
        got = fread(buf + n, 1, cap - n - 1, fp);
        n += got;
        if (n > max) {
            fmt_seterr(err, errlen, "%s: larger than %zu bytes", path, max);
            rc = ST_EFORMAT;
            goto fail;
        }
        if (got == 0) {
            break;
        }
    }
    if (ferror(fp)) {
        fmt_seterr(err, errlen, "%s: read error", path);
        rc = -EIO;
        goto fail;
    }
    fclose(fp);
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return ST_OK;

fail:
    fclose(fp);
    free(buf);
    return rc;
}
