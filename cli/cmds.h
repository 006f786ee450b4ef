/* cmds.h - the kvserve subcommands dispatched by main.c.
 *
 * Each takes the arguments after the subcommand name (argv[0] is the
 * subcommand) and returns the process exit status: 0 success, 1 runtime
 * failure, 2 usage error.
 *
 * Thread: main thread.
 */
#ifndef CLI_CMDS_H
#define CLI_CMDS_H

int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_hash_key(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_bench_forward(int argc, char **argv);
int cmd_quantize(int argc, char **argv);

#endif /* CLI_CMDS_H */
