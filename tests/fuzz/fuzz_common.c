/* fuzz_common.c - helpers shared by the fuzz targets (see fuzz_common.h). */
#include "tests/fuzz/fuzz_common.h"

#include "kvserve_config.h"

int fuzz_replay;

int
fuzz_utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;

    while (i < n) {
        unsigned c = s[i];
        size_t len;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (n - i < len) {
            return 0;
        }
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) {
                return 0;
            }
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff)) {
            return 0;
        }
        i += len;
    }
    return 1;
}

const char *
fuzz_source_root(void)
{
    const char *env = getenv("KVSERVE_SOURCE_ROOT");

    return env != NULL && env[0] != '\0' ? env : KVSERVE_SOURCE_ROOT;
}
