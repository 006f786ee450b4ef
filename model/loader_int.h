/* loader_int.h - helpers shared by the model loaders (config.c,
 * model.c). Not for use outside model/. The file and error helpers they
 * share with the parsers are in formats/fmt_util.h.
 *
 * Thread: any; nothing here keeps state.
 */
#ifndef MODEL_LOADER_INT_H
#define MODEL_LOADER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

typedef struct gguf_file gguf_file_t;

/* config.json text (required) and generation_config.json text (NULL when
 * the file is absent) -> cfg. ST_EFORMAT (bad JSON, missing or invalid
 * field) or ST_EUNSUPPORTED (unknown architecture or rope scaling), with
 * the reason in err. */
int mdl__config_parse_hf(const char *config_json, size_t config_len, const char *gen_json,
                         size_t gen_len, mdl_config_t *cfg, char *err, size_t errlen);
/* Reads dir/config.json and dir/generation_config.json. */
int mdl__config_load_hf(const char *dir, mdl_config_t *cfg, char *err, size_t errlen);
/* GGUF metadata (general.architecture, <arch>.*, tokenizer.ggml.*) -> cfg. */
int mdl__config_from_gguf(const gguf_file_t *g, mdl_config_t *cfg, char *err, size_t errlen);
/* Range and consistency checks shared by both sources. */
int mdl__config_check(const mdl_config_t *cfg, char *err, size_t errlen);

/* Undoes llama.cpp's q/k row permutation in place on a [rows][cols]
 * matrix (cols = 1 for a bias) with rows = n_head * head_dim. */
void mdl__unpermute_rows(float *w, int64_t n_head, int64_t head_dim, int64_t cols);

#endif /* MODEL_LOADER_INT_H */
