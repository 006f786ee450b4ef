/* main.c - the kvserve command line: dispatch to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "kvserve_config.h"
#include "cli/cmds.h"

typedef struct cmd {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} cmd_t;

static const cmd_t cmds[] = {
    /* Each subcommand adds its line here once it is built. */
    {"serve", cmd_serve, "run the OpenAI-compatible HTTP server"},
    {"hash-key", cmd_hash_key, "print the SHA-256 digest of an API key for the config"},
    {"tokenize", cmd_tokenize, "print the token ids of a text as JSON"},
    {"bench", cmd_bench, "offline throughput benchmark of the engine (no HTTP)"},
    {"generate", cmd_generate, "generate text from a prompt on the CPU"},
    {"bench-forward", cmd_bench_forward, "forward-pass tokens/s and memory roofline"},
    {"perplexity", cmd_perplexity, "perplexity of a text under a KV cache dtype and policy"},
    {"quantize", cmd_quantize, "write a model as a GGUF file in a weight type (q4_k_m, q8_0, ...)"},
    {NULL, NULL, NULL},
};

static void
usage(FILE *f)
{
    fprintf(f, "usage: kvserve COMMAND [OPTIONS]\n\ncommands:\n");
    for (const cmd_t *c = cmds; c->name != NULL; c++) {
        fprintf(f, "  %-16s %s\n", c->name, c->help);
    }
    fprintf(f, "\n'kvserve COMMAND --help' describes a command's options.\n");
}

int
main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("kvserve %s\n", KVSERVE_VERSION);
        return 0;
    }
    for (const cmd_t *c = cmds; c->name != NULL; c++) {
        if (strcmp(argv[1], c->name) == 0) {
            return c->fn(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "kvserve: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
