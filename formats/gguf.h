/* gguf.h - GGUF v3 reader: metadata key/values of every type (arrays and
 * string arrays included), tensor infos, alignment, and tensor data.
 *
 * gguf_parse() works on a memory buffer it borrows (the fuzzing entry
 * point); gguf_open() mmaps a file read-only and parses it. Every offset
 * and length read from the file is bounds-checked before use: a malformed
 * file gives ST_EFORMAT with a one-line reason in err, never a crash.
 * Strings returned are views into the buffer: NOT NUL-terminated, valid
 * until gguf_close(). Tensor names are NUL-terminated copies.
 *
 * Thread: a parsed file is immutable; any thread may read it.
 */
#ifndef FORMATS_GGUF_H
#define FORMATS_GGUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct gguf_file gguf_file_t;

typedef enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
} gguf_type_t;

/* ggml tensor types this reader knows the size of (others: ST_EFORMAT). */
enum {
    GGUF_TENSOR_F32 = 0,
    GGUF_TENSOR_F16 = 1,
    GGUF_TENSOR_Q4_0 = 2,
    GGUF_TENSOR_Q4_1 = 3,
    GGUF_TENSOR_Q5_0 = 6,
    GGUF_TENSOR_Q5_1 = 7,
    GGUF_TENSOR_Q8_0 = 8,
    GGUF_TENSOR_Q4_K = 12,
    GGUF_TENSOR_Q5_K = 13,
    GGUF_TENSOR_Q6_K = 14,
    GGUF_TENSOR_BF16 = 30,
};

/* Opens and mmaps path read-only, then parses it. On success *out owns the
 * mapping (released by gguf_close). Errors: -errno from open/mmap,
 * ST_EFORMAT for a malformed file; err gets a reason naming the file. */
int gguf_open(const char *path, gguf_file_t **out, char *err, size_t errlen);
/* Parses data[0..len), which must stay valid and unchanged until
 * gguf_close(*out). ST_EFORMAT with a reason in err on malformed input,
 * ST_ENOMEM never (small allocations abort). */
int gguf_parse(const void *data, size_t len, gguf_file_t **out, char *err, size_t errlen);
/* NULL is a no-op. Unmaps the file when it came from gguf_open. */
void gguf_close(gguf_file_t *g);

uint32_t gguf_version(const gguf_file_t *g);
uint64_t gguf_alignment(const gguf_file_t *g);

/* Metadata keys. Index i in [0, gguf_n_keys). */
int64_t gguf_n_keys(const gguf_file_t *g);
/* Index of key, or -1 if absent. */
int64_t gguf_find_key(const gguf_file_t *g, const char *key);
/* Key name of index i (NUL-terminated copy, lives as long as g). */
const char *gguf_key_name(const gguf_file_t *g, int64_t i);
gguf_type_t gguf_key_type(const gguf_file_t *g, int64_t i);
/* The value of key i exactly as serialized after its type field (a
 * scalar's bytes; a string's u64 length and bytes; an array's element
 * type, count and elements), borrowed from the buffer: what a writer
 * copies to keep a value bit for bit. ST_ERANGE if i is out of range. */
int gguf_key_raw(const gguf_file_t *g, int64_t i, const void **data, size_t *len);

/* Scalars: ST_OK, ST_ENOENT if absent, ST_EFORMAT if the type does not
 * convert (any integer type converts to another if the value fits; f32
 * accepts FLOAT32 and FLOAT64; bool accepts BOOL and integers). *out is
 * written only on ST_OK. */
int gguf_get_i64(const gguf_file_t *g, const char *key, int64_t *out);
int gguf_get_u32(const gguf_file_t *g, const char *key, uint32_t *out);
int gguf_get_f32(const gguf_file_t *g, const char *key, float *out);
int gguf_get_bool(const gguf_file_t *g, const char *key, int *out);
/* String value: not NUL-terminated; borrowed from the buffer. */
int gguf_get_str(const gguf_file_t *g, const char *key, const char **s, size_t *len);

/* Arrays: element type and count; numeric arrays give a pointer to the raw
 * little-endian elements (possibly unaligned: read with memcpy). For
 * string arrays *data is NULL; use gguf_get_arr_str. ST_EFORMAT if the
 * key is not an array. */
int gguf_get_arr(const gguf_file_t *g, const char *key, gguf_type_t *elem_type, uint64_t *n,
                 const void **data);
/* String arrays: element i in O(1). ST_ERANGE if i >= n, ST_EFORMAT if
 * the key is not an array of strings. */
int gguf_get_arr_str(const gguf_file_t *g, const char *key, uint64_t i, const char **s,
                     size_t *len);

/* Tensors. dims[0] is the fastest-varying dimension (ggml order: a HF
 * [out][in] matrix has dims = { in, out }); unused dims are 1. data points
 * into the buffer, nbytes is checked to lie inside it. */
typedef struct gguf_tensor {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t dims[4];
    const void *data;
    uint64_t nbytes;
} gguf_tensor_t;

int64_t gguf_n_tensors(const gguf_file_t *g);
/* NULL if i is out of range. */
const gguf_tensor_t *gguf_tensor(const gguf_file_t *g, int64_t i);
/* NULL if absent. */
const gguf_tensor_t *gguf_find_tensor(const gguf_file_t *g, const char *name);

/* Bytes of one value of a scalar metadata type; 0 for string, array or
 * unknown. */
size_t gguf_scalar_size(uint32_t t);
/* "F32", "Q8_0", ... or "unknown". */
const char *gguf_tensor_type_name(uint32_t type);

/* 1 if gguf_tensor_to_f32 converts this ggml type. */
int gguf_tensor_convertible(uint32_t type);

/* Converts a tensor's elements to f32 (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): dst holds n_elems = product of dims
 * floats. ST_EFORMAT for other types. */
int gguf_tensor_to_f32(const gguf_tensor_t *t, float *dst);

#endif /* FORMATS_GGUF_H */
