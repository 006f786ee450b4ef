/* safetensors.h - safetensors reader: an 8-byte little-endian header
 * length, a JSON header {"name": {"dtype", "shape", "data_offsets"}, ...,
 * "__metadata__": {...}}, then the tensor bytes.
 *
 * sft_parse_header() works on a memory buffer holding the whole file (the
 * fuzzing entry point) and borrows it; sft_open() mmaps a file read-only.
 * The checks are strict: header length inside the file, valid JSON, known
 * dtype, shape product times element size equal to the byte range, ranges
 * inside the data section and not overlapping. Failures give ST_EFORMAT
 * and a one-line reason in err, never a crash.
 *
 * Thread: a parsed file is immutable; any thread may read it.
 */
#ifndef FORMATS_SAFETENSORS_H
#define FORMATS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef enum sft_dtype {
    SFT_DTYPE_F32 = 0,
    SFT_DTYPE_F16,
    SFT_DTYPE_BF16,
    SFT_DTYPE_F64,
    SFT_DTYPE_I8,
    SFT_DTYPE_U8,
    SFT_DTYPE_I16,
    SFT_DTYPE_I32,
    SFT_DTYPE_I64,
    SFT_DTYPE_BOOL,
} sft_dtype_t;

#define SFT_MAX_DIMS 8
/* Largest JSON header accepted (the reference implementation's limit). */
#define SFT_MAX_HEADER (100u * 1024u * 1024u)

typedef struct sft_tensor {
    char *name; /* NUL-terminated, owned by the file */
    sft_dtype_t dtype;
    uint32_t n_dims;
    uint64_t dims[SFT_MAX_DIMS]; /* row-major: dims[0] is the slowest */
    uint64_t n_elems;
    const void *data; /* into the buffer; possibly unaligned */
    uint64_t nbytes;
} sft_tensor_t;

typedef struct sft_file sft_file_t;

/* Parses a whole safetensors file held in data[0..len), which must stay
 * valid and unchanged until sft_close(*out). ST_EFORMAT on malformed
 * input, with a reason in err. */
int sft_parse_header(const void *data, size_t len, sft_file_t **out, char *err, size_t errlen);
/* mmaps path read-only and parses it; *out owns the mapping. -errno when
 * the file cannot be opened or mapped; err names the file. */
int sft_open(const char *path, sft_file_t **out, char *err, size_t errlen);
/* NULL is a no-op. */
void sft_close(sft_file_t *f);

int64_t sft_n_tensors(const sft_file_t *f);
/* NULL if i is out of range. */
const sft_tensor_t *sft_tensor(const sft_file_t *f, int64_t i);
/* NULL if absent. */
const sft_tensor_t *sft_find(const sft_file_t *f, const char *name);

/* "F32", "F16", ... */
const char *sft_dtype_name(sft_dtype_t dt);
size_t sft_dtype_size(sft_dtype_t dt);

/* Converts n elements of F32, F16 or BF16 data (possibly unaligned) to
 * f32. ST_EFORMAT for other dtypes. */
int sft_to_f32(sft_dtype_t dt, const void *src, uint64_t n, float *dst);

/* Scalar conversions, also used by the GGUF loader. */
float sft_f16_to_f32(uint16_t h);
float sft_bf16_to_f32(uint16_t h);

#endif /* FORMATS_SAFETENSORS_H */
