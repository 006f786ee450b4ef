/* cmd_hash_key.c - `kvserve hash-key [KEY]`: print the SHA-256 digest of an
 * API key, to paste into a tenant's api_key_sha256 (or --api-key-sha256).
 *
 * Without KEY the key is read from stdin (first line, trailing newline and
 * CR stripped), so it does not show up in the shell history or ps.
 */
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "cli/cmds.h"

#define HASH_KEY_MAX 4096

int
cmd_hash_key(int argc, char **argv)
{
    char buf[HASH_KEY_MAX + 2];
    char digest[65];
    const char *key;
    size_t n;

    if (argc > 2 || (argc == 2 && (strcmp(argv[1], "--help") == 0 ||
                                   strcmp(argv[1], "-h") == 0))) {
        FILE *f = argc > 2 ? stderr : stdout;
        fprintf(f, "usage: kvserve hash-key [KEY]\n\n"
                   "Prints SHA-256(KEY) as 64 hex digits for api_key_sha256 in a\n"
                   "[tenant NAME] section. Reads the key from stdin without KEY.\n");
        return argc > 2 ? 2 : 0;
    }
    if (argc == 2) {
        key = argv[1];
    } else {
        if (fgets(buf, sizeof(buf), stdin) == NULL) {
            fprintf(stderr, "kvserve hash-key: no key on stdin\n");
            return 1;
        }
        n = strlen(buf);
        if (n > HASH_KEY_MAX) {
            fprintf(stderr, "kvserve hash-key: key longer than %d bytes\n", HASH_KEY_MAX);
            return 1;
        }
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) {
            buf[--n] = '\0';
        }
        key = buf;
    }
    if (*key == '\0') {
        fprintf(stderr, "kvserve hash-key: empty key\n");
        return 1;
    }
    sha256_hex(key, strlen(key), digest);
    printf("%s\n", digest);
    return 0;
}
