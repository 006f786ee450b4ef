/* gguf_write.h - GGUF v3 writer: metadata key/values of every type (strings
 * and arrays included), tensor infos in ggml dims order, 32-byte
 * alignment, then the tensor data streamed in the order declared.
 *
 * DESIGN. Use is in three phases: set keys and declare tensors (kept in
 * memory: names, shapes, types; no tensor data), gguf_w_write_header()
 * (writes everything up to the data section), then gguf_w_write_data()
 * with each tensor's bytes in declaration order, in as many pieces as the
 * caller likes (a quantizer writes a row at a time), padded to the
 * alignment between tensors. gguf_w_finish() checks that every declared
 * byte came and closes the file. Plain stdio (fopen / fwrite / fclose).
 * gguf_w_destroy() without a successful finish removes the partial file.
 *
 * Errors are ST_* or -errno (from fopen / fwrite / fclose) with a one-line
 * reason naming the file in err; the writer is then failed and every
 * later call returns the same status.
 *
 * Thread: one writer belongs to one thread.
 */
#ifndef FORMATS_GGUF_WRITE_H
#define FORMATS_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "formats/gguf.h"

#define GGUF_W_ALIGNMENT 32

typedef struct gguf_writer gguf_writer_t;

/* Creates (truncates) path for writing. -errno with the reason in err
 * when it cannot be opened. */
int gguf_w_create(const char *path, gguf_writer_t **out, char *err, size_t errlen);
/* Closes the file; removes it unless gguf_w_finish succeeded. NULL is a
 * no-op. */
void gguf_w_destroy(gguf_writer_t *w);

/* Metadata. Setting a key again replaces its value in place (the key
 * keeps its position). Keys are written in the order first set. Strings
 * are bytes (need not be NUL-terminated). Only before write_header. */
void gguf_w_set_u32(gguf_writer_t *w, const char *key, uint32_t v);
void gguf_w_set_i32(gguf_writer_t *w, const char *key, int32_t v);
void gguf_w_set_f32(gguf_writer_t *w, const char *key, float v);
void gguf_w_set_bool(gguf_writer_t *w, const char *key, int v);
void gguf_w_set_str(gguf_writer_t *w, const char *key, const char *s, size_t len);
/* Numeric array of n elements of elem_type (a scalar type), little-endian
 * elements at data (copied). */
void gguf_w_set_arr(gguf_writer_t *w, const char *key, gguf_type_t elem_type, const void *data,
                    uint64_t n);
/* String array: s[i] of lens[i] bytes (lens NULL: NUL-terminated). */
void gguf_w_set_arr_str(gguf_writer_t *w, const char *key, const char *const *s,
                        const size_t *lens, uint64_t n);
/* A value already serialized as GGUF writes it after the type field
 * (gguf_key_raw of a reader): copied bit for bit. */
void gguf_w_set_raw(gguf_writer_t *w, const char *key, gguf_type_t type, const void *raw,
                    size_t len);

/* Declares the next tensor: ggml type, dims in ggml order (dims[0] the
 * fastest varying; a Hugging Face [out][in] matrix is {in, out}) and its
 * size in bytes. ST_EINVAL (err set) for a duplicate or bad name, or
 * n_dims outside 1..4. Only before write_header. */
int gguf_w_add_tensor(gguf_writer_t *w, const char *name, uint32_t type, uint32_t n_dims,
                      const uint64_t *dims, uint64_t nbytes, char *err, size_t errlen);

/* Writes magic, version 3, counts, key/values, tensor infos (offsets
 * aligned to GGUF_W_ALIGNMENT) and the padding before the data. */
int gguf_w_write_header(gguf_writer_t *w, char *err, size_t errlen);
/* Appends n bytes of tensor data; pieces may span tensors. ST_ERANGE if
 * more bytes come than were declared. */
int gguf_w_write_data(gguf_writer_t *w, const void *p, size_t n, char *err, size_t errlen);
/* Checks every declared byte was written, flushes and closes the file. */
int gguf_w_finish(gguf_writer_t *w, char *err, size_t errlen);

#endif /* FORMATS_GGUF_WRITE_H */
