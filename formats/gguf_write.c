/* gguf_write.c - GGUF v3 writer (see gguf_write.h for the phases).
 *
 * Layout written: "GGUF", u32 3, u64 n_tensors, u64 n_kv; each key/value
 * as u64 key length, key bytes, u32 type, value (strings: u64 length then
 * bytes; arrays: u32 element type, u64 count, elements); each tensor info
 * as name string, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset
 * from the start of the data section; zero padding to GGUF_W_ALIGNMENT;
 * the data, each tensor zero-padded to the alignment. All little-endian
 * (the build targets little-endian hosts, as ggml does).
 *
 * Each key's serialized value is kept in memory until write_header; the
 * tensor data never is.
 */
#define LOG_MODULE "gguf"

#include "formats/gguf_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/xmalloc.h"
#include "formats/fmt_util.h"

typedef struct wkv {
    char *key;
    gguf_type_t type;
    unsigned char *val; /* serialized value */
    size_t len;
} wkv_t;

typedef struct wtensor {
    char *name;
    uint32_t type, n_dims;
    uint64_t dims[4];
    uint64_t nbytes, offset;
} wtensor_t;

struct gguf_writer {
    char *path;
    FILE *fp;
    int rc;       /* first failure, sticky */
    int header;   /* header written */
    int finished; /* finish succeeded */
    wkv_t *kvs;
    int64_t n_kvs;
    wtensor_t *tensors;
    int64_t n_tensors;
    int64_t cur;        /* tensor being written */
    uint64_t cur_done;  /* its bytes written so far */
};

/* A growable byte buffer for one value. */
typedef struct bbuf {
    unsigned char *p;
    size_t len, cap;
} bbuf_t;

static void
bb_put(bbuf_t *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = xrealloc(b->p, b->cap);
    }
    if (n > 0) {
        memcpy(b->p + b->len, p, n);
    }
    b->len += n;
}

static void
bb_u32(bbuf_t *b, uint32_t v)
{
    bb_put(b, &v, 4);
}

static void
bb_u64(bbuf_t *b, uint64_t v)
{
    bb_put(b, &v, 8);
}

static void
bb_str(bbuf_t *b, const char *s, size_t n)
{
    bb_u64(b, (uint64_t)n);
    bb_put(b, s, n);
}

int
gguf_w_create(const char *path, gguf_writer_t **out, char *err, size_t errlen)
{
    gguf_writer_t *w;
    FILE *fp = fopen(path, "wb");
    int rc;

    if (fp == NULL) {
        rc = -errno;
        fmt_seterr(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return rc;
    }
    w = xcalloc(1, sizeof(*w));
    w->path = xstrdup(path);
    w->fp = fp;
    *out = w;
    return ST_OK;
}

void
gguf_w_destroy(gguf_writer_t *w)
{
    if (w == NULL) {
        return;
    }
    if (w->fp != NULL) {
        fclose(w->fp);
    }
    if (!w->finished) {
        (void)remove(w->path);
    }
    for (int64_t i = 0; i < w->n_kvs; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].val);
    }
    for (int64_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
    }
    free(w->kvs);
    free(w->tensors);
    free(w->path);
    free(w);
}

/* Stores key's value (takes ownership of val). */
static void
set_kv(gguf_writer_t *w, const char *key, gguf_type_t type, unsigned char *val, size_t len)
{
    CHECK(!w->header);
    for (int64_t i = 0; i < w->n_kvs; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) {
            free(w->kvs[i].val);
            w->kvs[i].type = type;
            w->kvs[i].val = val;
            w->kvs[i].len = len;
            return;
        }
    }
    w->kvs = xrealloc(w->kvs, (size_t)(w->n_kvs + 1) * sizeof(*w->kvs));
    w->kvs[w->n_kvs].key = xstrdup(key);
    w->kvs[w->n_kvs].type = type;
    w->kvs[w->n_kvs].val = val;
    w->kvs[w->n_kvs].len = len;
    w->n_kvs++;
}

static void
set_scalar(gguf_writer_t *w, const char *key, gguf_type_t type, const void *v)
{
    bbuf_t b = {0};

    bb_put(&b, v, gguf_scalar_size(type));
    set_kv(w, key, type, b.p, b.len);
}

void
gguf_w_set_u32(gguf_writer_t *w, const char *key, uint32_t v)
{
    set_scalar(w, key, GGUF_TYPE_UINT32, &v);
}

void
gguf_w_set_i32(gguf_writer_t *w, const char *key, int32_t v)
{
    set_scalar(w, key, GGUF_TYPE_INT32, &v);
}

void
gguf_w_set_f32(gguf_writer_t *w, const char *key, float v)
{
    set_scalar(w, key, GGUF_TYPE_FLOAT32, &v);
}

void
gguf_w_set_bool(gguf_writer_t *w, const char *key, int v)
{
    uint8_t b = v ? 1 : 0;

    set_scalar(w, key, GGUF_TYPE_BOOL, &b);
}

void
gguf_w_set_str(gguf_writer_t *w, const char *key, const char *s, size_t len)
{
    bbuf_t b = {0};

    bb_str(&b, s, len);
    set_kv(w, key, GGUF_TYPE_STRING, b.p, b.len);
}

void
gguf_w_set_arr(gguf_writer_t *w, const char *key, gguf_type_t elem_type, const void *data,
               uint64_t n)
{
    bbuf_t b = {0};
    size_t esz = gguf_scalar_size(elem_type);

    CHECK(esz > 0);
    bb_u32(&b, (uint32_t)elem_type);
    bb_u64(&b, n);
    bb_put(&b, data, (size_t)n * esz);
    set_kv(w, key, GGUF_TYPE_ARRAY, b.p, b.len);
}

void
gguf_w_set_arr_str(gguf_writer_t *w, const char *key, const char *const *s, const size_t *lens,
                   uint64_t n)
{
    bbuf_t b = {0};

    bb_u32(&b, (uint32_t)GGUF_TYPE_STRING);
    bb_u64(&b, n);
    for (uint64_t i = 0; i < n; i++) {
        bb_str(&b, s[i], lens != NULL ? lens[i] : strlen(s[i]));
    }
    set_kv(w, key, GGUF_TYPE_ARRAY, b.p, b.len);
}

void
gguf_w_set_raw(gguf_writer_t *w, const char *key, gguf_type_t type, const void *raw, size_t len)
{
    bbuf_t b = {0};

    bb_put(&b, raw, len);
    set_kv(w, key, type, b.p, b.len);
}

int
gguf_w_add_tensor(gguf_writer_t *w, const char *name, uint32_t type, uint32_t n_dims,
                  const uint64_t *dims, uint64_t nbytes, char *err, size_t errlen)
{
    wtensor_t *t;
    size_t nl = strlen(name);

    CHECK(!w->header);
    if (nl == 0 || nl >= 64 || n_dims < 1 || n_dims > 4) {
        /* ggml's GGML_MAX_NAME is 64 with the NUL. */
        fmt_seterr(err, errlen, "%s: bad tensor '%s' (name length %zu, %u dims)", w->path, name,
                   nl, (unsigned)n_dims);
        return ST_EINVAL;
    }
    for (int64_t i = 0; i < w->n_tensors; i++) {
        if (strcmp(w->tensors[i].name, name) == 0) {
            fmt_seterr(err, errlen, "%s: duplicate tensor '%s'", w->path, name);
            return ST_EINVAL;
        }
    }
    w->tensors = xrealloc(w->tensors, (size_t)(w->n_tensors + 1) * sizeof(*w->tensors));
    t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof(*t));
    t->name = xstrdup(name);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < 4; d++) {
        t->dims[d] = d < n_dims ? dims[d] : 1;
    }
    t->nbytes = nbytes;
    w->n_tensors++;
    return ST_OK;
}

/* fwrite all of p or fail the writer. */
static int
put(gguf_writer_t *w, const void *p, size_t n, char *err, size_t errlen)
{
    if (w->rc != ST_OK) {
        return w->rc;
    }
    if (n > 0 && fwrite(p, 1, n, w->fp) != n) {
        w->rc = errno != 0 ? -errno : ST_EINVAL;
        fmt_seterr(err, errlen, "%s: write failed: %s", w->path, strerror(-w->rc));
    }
    return w->rc;
}

static int
pad(gguf_writer_t *w, uint64_t len, char *err, size_t errlen)
{
    static const unsigned char zeros[GGUF_W_ALIGNMENT];
    uint64_t n = (GGUF_W_ALIGNMENT - len % GGUF_W_ALIGNMENT) % GGUF_W_ALIGNMENT;

    return put(w, zeros, (size_t)n, err, errlen);
}

int
gguf_w_write_header(gguf_writer_t *w, char *err, size_t errlen)
{
    bbuf_t b = {0};
    uint64_t off = 0;
    int rc;

    CHECK(!w->header);
    bb_put(&b, "GGUF", 4);
    bb_u32(&b, 3);
    bb_u64(&b, (uint64_t)w->n_tensors);
    bb_u64(&b, (uint64_t)w->n_kvs);
    for (int64_t i = 0; i < w->n_kvs; i++) {
        bb_str(&b, w->kvs[i].key, strlen(w->kvs[i].key));
        bb_u32(&b, (uint32_t)w->kvs[i].type);
        bb_put(&b, w->kvs[i].val, w->kvs[i].len);
    }
    for (int64_t i = 0; i < w->n_tensors; i++) {
        wtensor_t *t = &w->tensors[i];

        t->offset = off;
        bb_str(&b, t->name, strlen(t->name));
        bb_u32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) {
            bb_u64(&b, t->dims[d]);
        }
        bb_u32(&b, t->type);
        bb_u64(&b, t->offset);
        off += (t->nbytes + GGUF_W_ALIGNMENT - 1) / GGUF_W_ALIGNMENT * GGUF_W_ALIGNMENT;
    }
    w->header = 1;
    rc = put(w, b.p, b.len, err, errlen);
    if (rc == ST_OK) {
        rc = pad(w, b.len, err, errlen);
    }
    free(b.p);
    w->cur = 0;
    w->cur_done = 0;
    return rc;
}

/* Pads and moves past every finished tensor (zero-byte ones included). */
static int
advance(gguf_writer_t *w, char *err, size_t errlen)
{
    while (w->cur < w->n_tensors && w->cur_done == w->tensors[w->cur].nbytes) {
        int rc = pad(w, w->cur_done, err, errlen);

        if (rc != ST_OK) {
            return rc;
        }
        w->cur++;
        w->cur_done = 0;
    }
    return ST_OK;
}

int
gguf_w_write_data(gguf_writer_t *w, const void *p, size_t n, char *err, size_t errlen)
{
    const unsigned char *at = p;
    int rc;

    CHECK(w->header);
    if (w->rc != ST_OK) {
        return w->rc;
    }
    rc = advance(w, err, errlen);
    while (rc == ST_OK && n > 0) {
        uint64_t room, k;

        if (w->cur >= w->n_tensors) {
            fmt_seterr(err, errlen, "%s: more tensor data than declared", w->path);
            w->rc = ST_ERANGE;
            return w->rc;
        }
        room = w->tensors[w->cur].nbytes - w->cur_done;
        k = n < room ? n : room;
        rc = put(w, at, (size_t)k, err, errlen);
        if (rc != ST_OK) {
            return rc;
        }
        at += k;
        n -= (size_t)k;
        w->cur_done += k;
        rc = advance(w, err, errlen);
    }
    return rc;
}

int
gguf_w_finish(gguf_writer_t *w, char *err, size_t errlen)
{
    int rc;

    CHECK(w->header);
    if (w->rc != ST_OK) {
        return w->rc;
    }
    rc = advance(w, err, errlen);
    if (rc != ST_OK) {
        return rc;
    }
    if (w->cur < w->n_tensors) {
        fmt_seterr(err, errlen, "%s: tensor '%s' has %llu of its %llu bytes", w->path,
                   w->tensors[w->cur].name, (unsigned long long)w->cur_done,
                   (unsigned long long)w->tensors[w->cur].nbytes);
        w->rc = ST_EINVAL;
        return w->rc;
    }
    errno = 0;
    if (fflush(w->fp) != 0 || ferror(w->fp)) {
        w->rc = errno != 0 ? -errno : ST_EINVAL;
    }
    if (fclose(w->fp) != 0 && w->rc == ST_OK) {
        w->rc = errno != 0 ? -errno : ST_EINVAL;
    }
    w->fp = NULL;
    if (w->rc != ST_OK) {
        fmt_seterr(err, errlen, "%s: write failed: %s", w->path, strerror(-w->rc));
        return w->rc;
    }
    w->finished = 1;
    return ST_OK;
}
