/* loader_int.h - helpers shared by the model loaders (config.c,
 * safetensors.c, gguf.c, model.c). Not for use outside model/.
 *
 * Thread: any; nothing here keeps state.
 */
#ifndef MODEL_LOADER_INT_H
#define MODEL_LOADER_INT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

typedef struct gguf_file gguf_file_t;

/* snprintf into err (when err is not NULL and errlen > 0). */
void mdl__seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* mmaps path read-only. -errno when it cannot be opened or mapped,
 * ST_EFORMAT when empty; err names the file. Release with mdl__unmap. */
int mdl__map_file(const char *path, void **data, size_t *len, char *err, size_t errlen);
void mdl__unmap(void *data, size_t len);

/* Reads a whole (small) file into a NUL-terminated malloc'd buffer owned
 * by the caller. -errno (ST_ENOENT when absent), ST_EFORMAT above max. */
int mdl__read_file(const char *path, size_t max, char **data, size_t *len, char *err,
                   size_t errlen);

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
