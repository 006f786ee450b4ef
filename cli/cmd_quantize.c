/* cmd_quantize.c - `kvserve quantize IN OUT --type TYPE`: writes a model
 * (Hugging Face directory or GGUF file) as a GGUF file in one weight type
 * or llama.cpp's Q4_K_M / Q5_K_M mix (mdl_quantize, model/quantize.c).
 */
#define LOG_MODULE "quantize"

#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "model/model.h"
#include "cli/cmds.h"

static void
quantize_usage(FILE *f)
{
    fprintf(f,
            "usage: kvserve quantize IN OUT --type TYPE\n"
            "\n"
            "Writes the model IN (a Hugging Face directory with config.json, safetensors\n"
            "and tokenizer.json, or a GGUF file) to OUT as a GGUF v3 file that llama.cpp\n"
            "and kvserve load.\n"
            "\n"
            "  --type TYPE   f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m\n"
            "  --help        show this help\n"
            "\n"
            "Every matrix is requantized a row at a time (decoded to f32, then quantized\n"
            "with ggml's reference algorithms, no importance matrix); a matrix already in\n"
            "the target type is copied as it is. Norms, biases and other vectors stay f32.\n"
            "Plain types put every matrix in that type (llama-quantize --pure). The mixes\n"
            "follow llama.cpp's recipe, simplified: q4_k_m (q5_k_m) is q4_k (q5_k) except\n"
            "output.weight (token_embd.weight when tied) in q6_k, and attn_v.weight and\n"
            "ffn_down.weight in q6_k in the first and last eighth of the layers and every\n"
            "third layer between. A row length that is not a multiple of the type's block\n"
            "(256 for the k types, 32 for q8_0 and q4_0) falls back to q8_0 (rows of a\n"
            "multiple of 32) or f16, with one log line per tensor.\n"
            "\n"
            "From a GGUF file every metadata key is kept (general.file_type is set) and\n"
            "tensors keep their names and order. From a Hugging Face directory the\n"
            "hyperparameters, tensor names, q/k row order and tokenizer are written as\n"
            "llama.cpp's convert_hf_to_gguf.py writes them.\n");
}

int
cmd_quantize(int argc, char **argv)
{
    const char *paths[2] = {NULL, NULL}, *type = NULL;
    int n_paths = 0, rc;
    mdl_quant_t q;
    char err[512] = "";

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            quantize_usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--type") == 0 && i + 1 < argc) {
            type = argv[++i];
        } else if (strncmp(argv[i], "--type=", 7) == 0) {
            type = argv[i] + 7;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "kvserve quantize: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        } else if (n_paths < 2) {
            paths[n_paths++] = argv[i];
        } else {
            fprintf(stderr, "kvserve quantize: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (n_paths != 2 || type == NULL) {
        fprintf(stderr, "kvserve quantize: IN, OUT and --type are required (see --help)\n");
        return 2;
    }
    if (mdl_quant_parse(type, &q) != ST_OK) {
        fprintf(stderr,
                "kvserve quantize: unknown --type '%s' (f32, f16, bf16, q8_0, q4_0, q4_k, "
                "q5_k, q6_k, q4_k_m, q5_k_m)\n",
                type);
        return 2;
    }
    rc = mdl_quantize(paths[0], paths[1], q, err, sizeof(err));
    if (rc != ST_OK) {
        fprintf(stderr, "kvserve quantize: %s\n", err[0] ? err : st_str(rc));
        return 1;
    }
    return 0;
}
