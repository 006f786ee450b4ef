/* safetensors.h - safetensors reader: an 8-byte little-endian header
 * length, a JSON header {"name": {"dtype", "shape", "data_offsets"}, ...,
 * "__metadata__": {...}}, then the tensor bytes.
 *
 * st_parse_header() works on a memory buffer holding the whole file (the
 * fuzzing entry point) and borrows it; st_open() mmaps a file read-only.
 * The checks are strict: header length inside the file, valid JSON, known
 * dtype, shape product times element size equal to the byte range, ranges
 * inside the data section and not overlapping. Failures give ST_EFORMAT
 * and a one-line reason in err, never a crash.
 *
 * Thread: a parsed file is immutable; any thread may read it.
 */
#ifndef MODEL_SAFETENSORS_H
#define MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef enum st_dtype {
    ST_DTYPE_F32 = 0,
    ST_DTYPE_F16,
    ST_DTYPE_BF16,
    ST_DTYPE_F64,
    ST_DTYPE_I8,
    ST_DTYPE_U8,
    ST_DTYPE_I16,
    ST_DTYPE_I32,
    ST_DTYPE_I64,
    ST_DTYPE_BOOL,
} st_dtype_t;

#define ST_MAX_DIMS 8
/* Largest JSON header accepted (the reference implementation's limit). */
#define ST_MAX_HEADER (100u * 1024u * 1024u)

typedef struct st_tensor {
    char *name; /* NUL-terminated, owned by the file */
    st_dtype_t dtype;
    uint32_t n_dims;
    uint64_t dims[ST_MAX_DIMS]; /* row-major: dims[0] is the slowest */
    uint64_t n_elems;
    const void *data; /* into the buffer; possibly unaligned */
    uint64_t nbytes;
} st_tensor_t;

typedef struct st_file st_file_t;

/* Parses a whole safetensors file held in data[0..len), which must stay
 * valid and unchanged until st_close(*out). ST_EFORMAT on malformed
 * input, with a reason in err. */
int st_parse_header(const void *data, size_t len, st_file_t **out, char *err, size_t errlen);
/* mmaps path read-only and parses it; *out owns the mapping. -errno when
 * the file cannot be opened or mapped; err names the file. */
int st_open(const char *path, st_file_t **out, char *err, size_t errlen);
/* NULL is a no-op. */
void st_close(st_file_t *f);

int64_t st_n_tensors(const st_file_t *f);
/* NULL if i is out of range. */
const st_tensor_t *st_tensor(const st_file_t *f, int64_t i);
/* NULL if absent. */
const st_tensor_t *st_find(const st_file_t *f, const char *name);

/* "F32", "F16", ... */
const char *st_dtype_name(st_dtype_t dt);
size_t st_dtype_size(st_dtype_t dt);

/* Converts n elements of F32, F16 or BF16 data (possibly unaligned) to
 * f32. ST_EFORMAT for other dtypes. */
int st_to_f32(st_dtype_t dt, const void *src, uint64_t n, float *dst);

/* Scalar conversions, also used by the GGUF loader. */
float st_f16_to_f32(uint16_t h);
float st_bf16_to_f32(uint16_t h);

#endif /* MODEL_SAFETENSORS_H */
