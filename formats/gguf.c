/* gguf.c - GGUF v2/v3 parser over a borrowed buffer, with mmap opening.
 *
 * Layout: "GGUF", u32 version, u64 n_tensors, u64 n_kv, then n_kv
 * key/value pairs (string key, u32 type, value), n_tensors tensor infos
 * (string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset),
 * padding to general.alignment (default 32), then the tensor data.
 *
 * A cursor with the bytes left guards every read; counts are bounded by
 * the bytes left before anything is allocated from them, so a 16-byte
 * file claiming 2^60 keys fails fast instead of allocating. Nested arrays,
 * duplicate keys or tensor names, unknown value or tensor types,
 * misaligned or out-of-bounds tensor data are all ST_EFORMAT.
 */
#define LOG_MODULE "gguf"

#include "formats/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/xmalloc.h"
#include "formats/fmt_util.h"
#include "formats/safetensors.h"

#define GGUF_MAX_NAME 256
#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct gguf_kv {
    char *key;
    gguf_type_t type;
    const unsigned char *val;   /* scalar bytes, string bytes or array elements */
    uint64_t len;               /* string length, or array element count */
    gguf_type_t elem_type;      /* arrays */
    const unsigned char **strs; /* string arrays: each element's length field */
    const unsigned char *raw;   /* the serialized value (after the type field) */
    uint64_t raw_len;
} gguf_kv_t;

struct gguf_file {
    const unsigned char *data;
    size_t len;
    uint32_t version;
    uint64_t alignment;
    gguf_kv_t *kvs;
    int64_t n_kvs;
    gguf_tensor_t *tensors;
    int64_t n_tensors;
    void *map; /* set by gguf_open only */
    size_t map_len;
};

typedef struct cursor {
    const unsigned char *p;
    size_t left;
} cursor_t;

size_t
gguf_scalar_size(uint32_t t)
{
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL:
        return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16:
        return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32:
        return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

/* ggml type -> block size in elements and bytes per block; 0 if unknown. */
static int
ggml_type_info(uint32_t t, uint64_t *blk, uint64_t *bytes, const char **name)
{
    static const struct {
        uint32_t type;
        uint32_t blk, bytes;
        const char *name;
    } tab[] = {
        {0, 1, 4, "F32"},       {1, 1, 2, "F16"},       {2, 32, 18, "Q4_0"},
        {3, 32, 20, "Q4_1"},    {6, 32, 22, "Q5_0"},    {7, 32, 24, "Q5_1"},
        {8, 32, 34, "Q8_0"},    {9, 32, 36, "Q8_1"},    {10, 256, 84, "Q2_K"},
        {11, 256, 110, "Q3_K"}, {12, 256, 144, "Q4_K"}, {13, 256, 176, "Q5_K"},
        {14, 256, 210, "Q6_K"}, {15, 256, 292, "Q8_K"}, {24, 1, 1, "I8"},
        {25, 1, 2, "I16"},      {26, 1, 4, "I32"},      {27, 1, 8, "I64"},
        {28, 1, 8, "F64"},      {30, 1, 2, "BF16"},
    };
    for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
        if (tab[i].type == t) {
            *blk = tab[i].blk;
            *bytes = tab[i].bytes;
            if (name != NULL) {
                *name = tab[i].name;
            }
            return 1;
        }
    }
    return 0;
}

static int
rd(cursor_t *c, void *dst, size_t n)
{
    if (c->left < n) {
        return 0;
    }
    memcpy(dst, c->p, n);
    c->p += n;
    c->left -= n;
    return 1;
}

static int
skip(cursor_t *c, uint64_t n)
{
    if (c->left < n) {
        return 0;
    }
    c->p += n;
    c->left -= (size_t)n;
    return 1;
}

/* A string: u64 length then bytes. *s points into the buffer. */
static int
rd_str(cursor_t *c, const unsigned char **s, uint64_t *n)
{
    if (!rd(c, n, 8) || *n > c->left) {
        return 0;
    }
    *s = c->p;
    c->p += *n;
    c->left -= (size_t)*n;
    return 1;
}

static int
parse_value(gguf_file_t *g, cursor_t *c, gguf_kv_t *kv, char *err, size_t errlen)
{
    size_t esz;
    uint32_t et;
    uint64_t n;

    if (kv->type == GGUF_TYPE_STRING) {
        if (!rd_str(c, &kv->val, &kv->len)) {
            fmt_seterr(err, errlen, "key '%s': truncated string value", kv->key);
            return ST_EFORMAT;
        }
        return ST_OK;
    }
    if (kv->type != GGUF_TYPE_ARRAY) {
        esz = gguf_scalar_size(kv->type);
        if (esz == 0) {
            fmt_seterr(err, errlen, "key '%s': unknown value type %u", kv->key,
                       (unsigned)kv->type);
            return ST_EFORMAT;
        }
        kv->val = c->p;
        kv->len = 1;
        if (!skip(c, esz)) {
            fmt_seterr(err, errlen, "key '%s': truncated value", kv->key);
            return ST_EFORMAT;
        }
        return ST_OK;
    }
    if (!rd(c, &et, 4) || !rd(c, &n, 8)) {
        fmt_seterr(err, errlen, "key '%s': truncated array header", kv->key);
        return ST_EFORMAT;
    }
    kv->elem_type = (gguf_type_t)et;
    kv->len = n;
    kv->val = c->p;
    if (et == GGUF_TYPE_STRING) {
        /* Each element needs at least its 8-byte length. */
        if (n > c->left / 8) {
            fmt_seterr(err, errlen, "key '%s': %llu strings do not fit in the file", kv->key,
                       (unsigned long long)n);
            return ST_EFORMAT;
        }
        kv->strs = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(*kv->strs));
        for (uint64_t i = 0; i < n; i++) {
            const unsigned char *s;
            uint64_t sl;

            kv->strs[i] = c->p;
            if (!rd_str(c, &s, &sl)) {
                fmt_seterr(err, errlen, "key '%s': truncated string %llu", kv->key,
                           (unsigned long long)i);
                return ST_EFORMAT;
            }
        }
        return ST_OK;
    }
    esz = gguf_scalar_size(et);
    if (esz == 0) {
        fmt_seterr(err, errlen, "key '%s': unsupported array element type %u", kv->key,
                   (unsigned)et);
        return ST_EFORMAT;
    }
    if (n > c->left / esz) {
        fmt_seterr(err, errlen, "key '%s': array of %llu elements runs past the end", kv->key,
                   (unsigned long long)n);
        return ST_EFORMAT;
    }
    skip(c, n * esz);
    (void)g;
    return ST_OK;
}

static int
parse_tensor_info(gguf_file_t *g, cursor_t *c, gguf_tensor_t *t, uint64_t *offset, char *err,
                  size_t errlen)
{
    const unsigned char *s;
    uint64_t n, nel = 1, blk, bytes;
    const char *tname;

    if (!rd_str(c, &s, &n)) {
        fmt_seterr(err, errlen, "truncated tensor info %lld", (long long)g->n_tensors);
        return ST_EFORMAT;
    }
    if (n == 0 || n > GGUF_MAX_NAME || memchr(s, '\0', (size_t)n) != NULL) {
        fmt_seterr(err, errlen, "tensor %lld: bad name", (long long)g->n_tensors);
        return ST_EFORMAT;
    }
    t->name = xstrndup((const char *)s, (size_t)n);
    if (!rd(c, &t->n_dims, 4)) {
        fmt_seterr(err, errlen, "tensor '%s': truncated info", t->name);
        return ST_EFORMAT;
    }
    if (t->n_dims == 0 || t->n_dims > 4) {
        fmt_seterr(err, errlen, "tensor '%s': %u dimensions (1 to 4 allowed)", t->name,
                   (unsigned)t->n_dims);
        return ST_EFORMAT;
    }
    for (uint32_t d = 0; d < 4; d++) {
        t->dims[d] = 1;
    }
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (!rd(c, &t->dims[d], 8)) {
            fmt_seterr(err, errlen, "tensor '%s': truncated info", t->name);
            return ST_EFORMAT;
        }
        if (t->dims[d] == 0 || t->dims[d] > (1ull << 40) || nel > (1ull << 40) / t->dims[d]) {
            fmt_seterr(err, errlen, "tensor '%s': bad dimension %llu", t->name,
                       (unsigned long long)t->dims[d]);
            return ST_EFORMAT;
        }
        nel *= t->dims[d];
    }
    if (!rd(c, &t->type, 4) || !rd(c, offset, 8)) {
        fmt_seterr(err, errlen, "tensor '%s': truncated info", t->name);
        return ST_EFORMAT;
    }
    if (!ggml_type_info(t->type, &blk, &bytes, &tname)) {
        fmt_seterr(err, errlen, "tensor '%s': unknown ggml type %u", t->name, (unsigned)t->type);
        return ST_EFORMAT;
    }
    if (t->dims[0] % blk != 0) {
        fmt_seterr(err, errlen, "tensor '%s': row of %llu is not a multiple of the %s block",
                   t->name, (unsigned long long)t->dims[0], tname);
        return ST_EFORMAT;
    }
    t->nbytes = nel / blk * bytes;
    return ST_OK;
}

static int
cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A name that occurs twice among n strings found every stride bytes from
 * first, or NULL. O(n log n), so hostile counts stay cheap. */
static const char *
first_dup(char *const *first, size_t stride, int64_t n)
{
    const char **v;
    const char *dup = NULL;

    if (n < 2) {
        return NULL;
    }
    v = xmalloc((size_t)n * sizeof(*v));
    for (int64_t i = 0; i < n; i++) {
        v[i] = *(char *const *)((const char *)first + (size_t)i * stride);
    }
    qsort(v, (size_t)n, sizeof(*v), cmp_str);
    for (int64_t i = 1; i < n && dup == NULL; i++) {
        if (strcmp(v[i - 1], v[i]) == 0) {
            dup = v[i];
        }
    }
    free(v);
    return dup;
}

int
gguf_parse(const void *data, size_t len, gguf_file_t **out, char *err, size_t errlen)
{
    gguf_file_t *g;
    cursor_t c = {data, len};
    uint64_t n_tensors, n_kv, *offsets = NULL, data_off;
    const char *dup;
    int64_t ai;
    int rc = ST_EFORMAT;

    if (len < 4 || memcmp(data, "GGUF", 4) != 0) {
        fmt_seterr(err, errlen, "not a GGUF file (bad magic)");
        return ST_EFORMAT;
    }
    g = xcalloc(1, sizeof(*g));
    g->data = data;
    g->len = len;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    skip(&c, 4);
    if (!rd(&c, &g->version, 4)) {
        fmt_seterr(err, errlen, "truncated header");
        goto fail;
    }
    if (g->version != 2 && g->version != 3) {
        fmt_seterr(err, errlen, "unsupported GGUF version %u (2 and 3 are read)",
                   (unsigned)g->version);
        goto fail;
    }
    if (!rd(&c, &n_tensors, 8) || !rd(&c, &n_kv, 8)) {
        fmt_seterr(err, errlen, "truncated header");
        goto fail;
    }
    /* A key/value takes at least 13 bytes, a tensor info at least 24. */
    if (n_kv > c.left / 13 || n_tensors > c.left / 24) {
        fmt_seterr(err, errlen,
                   "header claims %llu keys and %llu tensors, more than the file "
                   "holds",
                   (unsigned long long)n_kv, (unsigned long long)n_tensors);
        goto fail;
    }

    g->kvs = xcalloc((size_t)(n_kv > 0 ? n_kv : 1), sizeof(*g->kvs));
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv_t *kv = &g->kvs[i];
        const unsigned char *s;
        uint64_t n;
        uint32_t type;

        if (!rd_str(&c, &s, &n) || !rd(&c, &type, 4)) {
            fmt_seterr(err, errlen, "truncated key/value %llu", (unsigned long long)i);
            goto fail;
        }
        if (n == 0 || n > GGUF_MAX_NAME || memchr(s, '\0', (size_t)n) != NULL) {
            fmt_seterr(err, errlen, "key/value %llu: bad key", (unsigned long long)i);
            goto fail;
        }
        kv->key = xstrndup((const char *)s, (size_t)n);
        g->n_kvs++;
        kv->type = (gguf_type_t)type;
        kv->raw = c.p;
        rc = parse_value(g, &c, kv, err, errlen);
        if (rc != ST_OK) {
            goto fail;
        }
        kv->raw_len = (uint64_t)(c.p - kv->raw);
        rc = ST_EFORMAT;
    }
    dup = first_dup(&g->kvs[0].key, sizeof(g->kvs[0]), g->n_kvs);
    if (dup != NULL) {
        fmt_seterr(err, errlen, "duplicate key '%s'", dup);
        goto fail;
    }

    ai = gguf_find_key(g, "general.alignment");
    if (ai >= 0) {
        uint32_t a;

        if (gguf_get_u32(g, "general.alignment", &a) != ST_OK || a == 0 || (a & (a - 1)) != 0) {
            fmt_seterr(err, errlen, "general.alignment must be a power of two");
            goto fail;
        }
        g->alignment = a;
    }

    g->tensors = xcalloc((size_t)(n_tensors > 0 ? n_tensors : 1), sizeof(*g->tensors));
    offsets = xcalloc((size_t)(n_tensors > 0 ? n_tensors : 1), sizeof(*offsets));
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor_t *t = &g->tensors[i];

        rc = parse_tensor_info(g, &c, t, &offsets[i], err, errlen);
        g->n_tensors += t->name != NULL;
        if (rc != ST_OK) {
            goto fail;
        }
        rc = ST_EFORMAT;
    }
    dup = first_dup((char *const *)&g->tensors[0].name, sizeof(g->tensors[0]), g->n_tensors);
    if (dup != NULL) {
        fmt_seterr(err, errlen, "duplicate tensor '%s'", dup);
        goto fail;
    }

    data_off = (uint64_t)(len - c.left);
    data_off = (data_off + g->alignment - 1) / g->alignment * g->alignment;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor_t *t = &g->tensors[i];

        if (offsets[i] % g->alignment != 0) {
            fmt_seterr(err, errlen, "tensor '%s': offset %llu is not aligned to %llu", t->name,
                       (unsigned long long)offsets[i], (unsigned long long)g->alignment);
            goto fail;
        }
        if (data_off > len || offsets[i] > len - data_off ||
            t->nbytes > len - data_off - offsets[i]) {
            fmt_seterr(err, errlen,
                       "tensor '%s': data [%llu, +%llu) outside the file "
                       "(%zu bytes)",
                       t->name, (unsigned long long)(data_off + offsets[i]),
                       (unsigned long long)t->nbytes, len);
            goto fail;
        }
        t->data = g->data + data_off + offsets[i];
    }
    free(offsets);
    *out = g;
    return ST_OK;

fail:
    free(offsets);
    gguf_close(g);
    return rc;
}

int
gguf_open(const char *path, gguf_file_t **out, char *err, size_t errlen)
{
    void *data;
    size_t len;
    char why[256];
    int rc;

    rc = fmt_map_file(path, &data, &len, err, errlen);
    if (rc != ST_OK) {
        return rc;
    }
    rc = gguf_parse(data, len, out, why, sizeof(why));
    if (rc != ST_OK) {
        fmt_seterr(err, errlen, "%s: %s", path, why);
        fmt_unmap(data, len);
        return rc;
    }
    (*out)->map = data;
    (*out)->map_len = len;
    return ST_OK;
}

void
gguf_close(gguf_file_t *g)
{
    if (g == NULL) {
        return;
    }
    for (int64_t i = 0; i < g->n_kvs; i++) {
        free(g->kvs[i].key);
        free(g->kvs[i].strs);
    }
    free(g->kvs);
    for (int64_t i = 0; i < g->n_tensors; i++) {
        free((char *)g->tensors[i].name);
    }
    free(g->tensors);
    fmt_unmap(g->map, g->map_len);
    free(g);
}

uint32_t
gguf_version(const gguf_file_t *g)
{
    return g->version;
}

uint64_t
gguf_alignment(const gguf_file_t *g)
{
    return g->alignment;
}

int64_t
gguf_n_keys(const gguf_file_t *g)
{
    return g->n_kvs;
}

int64_t
gguf_find_key(const gguf_file_t *g, const char *key)
{
    for (int64_t i = 0; i < g->n_kvs; i++) {
        if (strcmp(g->kvs[i].key, key) == 0) {
            return i;
        }
    }
    return -1;
}

const char *
gguf_key_name(const gguf_file_t *g, int64_t i)
{
    if (i < 0 || i >= g->n_kvs) {
        return NULL;
    }
    return g->kvs[i].key;
}

gguf_type_t
gguf_key_type(const gguf_file_t *g, int64_t i)
{
    if (i < 0 || i >= g->n_kvs) {
        return (gguf_type_t)-1;
    }
    return g->kvs[i].type;
}

int
gguf_key_raw(const gguf_file_t *g, int64_t i, const void **data, size_t *len)
{
    if (i < 0 || i >= g->n_kvs) {
        return ST_ERANGE;
    }
    *data = g->kvs[i].raw;
    *len = (size_t)g->kvs[i].raw_len;
    return ST_OK;
}

static const gguf_kv_t *
find(const gguf_file_t *g, const char *key)
{
    int64_t i = gguf_find_key(g, key);

    return i < 0 ? NULL : &g->kvs[i];
}

/* Integer value as signed (is_neg) magnitude; 0 when not an integer. */
static int
kv_int(const gguf_kv_t *kv, int *neg, uint64_t *mag)
{
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
    } v;
    int64_t s;

    if (kv->type == GGUF_TYPE_STRING || kv->type == GGUF_TYPE_ARRAY ||
        gguf_scalar_size(kv->type) == 0) {
        return 0; /* val may sit at the very end of the buffer: read nothing */
    }
    memcpy(&v, kv->val, gguf_scalar_size(kv->type));
    switch (kv->type) {
    case GGUF_TYPE_UINT8:
        *neg = 0, *mag = v.u8;
        return 1;
    case GGUF_TYPE_UINT16:
        *neg = 0, *mag = v.u16;
        return 1;
    case GGUF_TYPE_UINT32:
        *neg = 0, *mag = v.u32;
        return 1;
    case GGUF_TYPE_UINT64:
        *neg = 0, *mag = v.u64;
        return 1;
    case GGUF_TYPE_INT8:
        s = v.i8;
        break;
    case GGUF_TYPE_INT16:
        s = v.i16;
        break;
    case GGUF_TYPE_INT32:
        s = v.i32;
        break;
    case GGUF_TYPE_INT64:
        s = v.i64;
        break;
    default:
        return 0;
    }
    *neg = s < 0;
    *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return 1;
}

int
gguf_get_i64(const gguf_file_t *g, const char *key, int64_t *out)
{
    const gguf_kv_t *kv = find(g, key);
    uint64_t mag;
    int neg;

    if (kv == NULL) {
        return ST_ENOENT;
    }
    if (!kv_int(kv, &neg, &mag)) {
        return ST_EFORMAT;
    }
    if (neg) {
        if (mag > (uint64_t)INT64_MAX + 1) {
            return ST_EFORMAT;
        }
        *out = mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
    } else {
        if (mag > (uint64_t)INT64_MAX) {
            return ST_EFORMAT;
        }
        *out = (int64_t)mag;
    }
    return ST_OK;
}

int
gguf_get_u32(const gguf_file_t *g, const char *key, uint32_t *out)
{
    const gguf_kv_t *kv = find(g, key);
    uint64_t mag;
    int neg;

    if (kv == NULL) {
        return ST_ENOENT;
    }
    if (!kv_int(kv, &neg, &mag) || (neg && mag != 0) || mag > UINT32_MAX) {
        return ST_EFORMAT;
    }
    *out = (uint32_t)mag;
    return ST_OK;
}

int
gguf_get_f32(const gguf_file_t *g, const char *key, float *out)
{
    const gguf_kv_t *kv = find(g, key);
    uint64_t mag;
    int neg;

    if (kv == NULL) {
        return ST_ENOENT;
    }
    if (kv->type == GGUF_TYPE_FLOAT32) {
        memcpy(out, kv->val, 4);
        return ST_OK;
    }
    if (kv->type == GGUF_TYPE_FLOAT64) {
        double d;

        memcpy(&d, kv->val, 8);
        *out = (float)d;
        return ST_OK;
    }
    if (kv_int(kv, &neg, &mag)) {
        *out = neg ? -(float)mag : (float)mag;
        return ST_OK;
    }
    return ST_EFORMAT;
}

int
gguf_get_bool(const gguf_file_t *g, const char *key, int *out)
{
    const gguf_kv_t *kv = find(g, key);
    uint64_t mag;
    int neg;

    if (kv == NULL) {
        return ST_ENOENT;
    }
    if (kv->type == GGUF_TYPE_BOOL) {
        *out = kv->val[0] != 0;
        return ST_OK;
    }
    if (kv_int(kv, &neg, &mag)) {
        *out = mag != 0;
        return ST_OK;
    }
    return ST_EFORMAT;
}

int
gguf_get_str(const gguf_file_t *g, const char *key, const char **s, size_t *len)
{
    const gguf_kv_t *kv = find(g, key);

    if (kv == NULL) {
        return ST_ENOENT;
    }
    if (kv->type != GGUF_TYPE_STRING) {
        return ST_EFORMAT;
    }
    *s = (const char *)kv->val;
    *len = (size_t)kv->len;
    return ST_OK;
}

int
gguf_get_arr(const gguf_file_t *g, const char *key, gguf_type_t *elem_type, uint64_t *n,
             const void **data)
{
    const gguf_kv_t *kv = find(g, key);

    if (kv == NULL) {
        return ST_ENOENT;
    }
    if (kv->type != GGUF_TYPE_ARRAY) {
        return ST_EFORMAT;
    }
    *elem_type = kv->elem_type;
    *n = kv->len;
    *data = kv->elem_type == GGUF_TYPE_STRING ? NULL : kv->val;
    return ST_OK;
}

int
gguf_get_arr_str(const gguf_file_t *g, const char *key, uint64_t i, const char **s, size_t *len)
{
    const gguf_kv_t *kv = find(g, key);
    uint64_t n;

    if (kv == NULL) {
        return ST_ENOENT;
    }
    if (kv->type != GGUF_TYPE_ARRAY || kv->elem_type != GGUF_TYPE_STRING) {
        return ST_EFORMAT;
    }
    if (i >= kv->len) {
        return ST_ERANGE;
    }
    memcpy(&n, kv->strs[i], 8);
    *s = (const char *)kv->strs[i] + 8;
    *len = (size_t)n;
    return ST_OK;
}

int64_t
gguf_n_tensors(const gguf_file_t *g)
{
    return g->n_tensors;
}

const gguf_tensor_t *
gguf_tensor(const gguf_file_t *g, int64_t i)
{
    if (i < 0 || i >= g->n_tensors) {
        return NULL;
    }
    return &g->tensors[i];
}

const gguf_tensor_t *
gguf_find_tensor(const gguf_file_t *g, const char *name)
{
    for (int64_t i = 0; i < g->n_tensors; i++) {
        if (strcmp(g->tensors[i].name, name) == 0) {
            return &g->tensors[i];
        }
    }
    return NULL;
}

const char *
gguf_tensor_type_name(uint32_t type)
{
    uint64_t blk = 1, bytes = 0;
    const char *name;

    return ggml_type_info(type, &blk, &bytes, &name) ? name : "unknown";
}

static float
half_at(const unsigned char *p)
{
    uint16_t h;

    memcpy(&h, p, 2);
    return sft_f16_to_f32(h);
}

/* 32-element blocks: Q8_0 {d, q[32]}; Q4_0 {d, nibbles}: element j < 16
 * is the low nibble of byte j, element j + 16 its high nibble, value
 * (q - 8) d; Q4_1 {d, m, nibbles}: q d + m; Q5_0 {d, qh[4], nibbles}: bit
 * j of qh is the fifth bit of element j, value (q - 16) d; Q5_1
 * {d, m, qh[4], nibbles}: q d + m. */
static void
dequant_block32(uint32_t type, const unsigned char *b, float *o)
{
    float d = half_at(b), m = 0.0f;
    const unsigned char *qs;
    uint32_t qh = 0;

    switch (type) {
    case GGUF_TENSOR_Q8_0:
        for (int i = 0; i < 32; i++) {
            o[i] = d * (float)(int8_t)b[2 + i];
        }
        return;
    case GGUF_TENSOR_Q4_0:
        for (int j = 0; j < 16; j++) {
            o[j] = d * (float)((b[2 + j] & 0x0f) - 8);
            o[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
        return;
    case GGUF_TENSOR_Q4_1:
        m = half_at(b + 2);
        for (int j = 0; j < 16; j++) {
            o[j] = d * (float)(b[4 + j] & 0x0f) + m;
            o[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
        return;
    case GGUF_TENSOR_Q5_0:
    case GGUF_TENSOR_Q5_1:
        if (type == GGUF_TENSOR_Q5_1) {
            m = half_at(b + 2);
            b += 2;
        }
        memcpy(&qh, b + 2, 4);
        qs = b + 6;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
            int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);

            if (type == GGUF_TENSOR_Q5_0) {
                o[j] = d * (float)(lo - 16);
                o[j + 16] = d * (float)(hi - 16);
            } else {
                o[j] = d * (float)lo + m;
                o[j + 16] = d * (float)hi + m;
            }
        }
        return;
    default:
        return;
    }
}

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block:
 * bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7,
 * bytes 4-7 the same for the mins, bytes 8-11 the low 4 bits of scale
 * (low nibble) and min (high nibble) 4-7. */
static void
k_scale_min(const unsigned char *sc, int j, int *scale, int *min)
{
    if (j < 4) {
        *scale = sc[j] & 63;
        *min = sc[j + 4] & 63;
    } else {
        *scale = (sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4);
        *min = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

/* 256-element super-blocks. Q4_K {d, dmin, scales[12], qs[128]} and Q5_K
 * {d, dmin, scales[12], qh[32], qs[128]}: eight sub-blocks of 32, value
 * d scale q - dmin min; byte l of each 32-byte group of qs holds element l
 * (low nibble) and l + 32 (high nibble) of a 64-element chunk; for Q5_K,
 * bit 2c / 2c+1 of qh[l] is the fifth bit of those in chunk c.
 * Q6_K {ql[128], qh[64], scales[16] int8, d}: per 128-element half, with
 * l < 32, elements l, l+32, l+64, l+96 take their low 4 bits from ql[l],
 * ql[l+32], ql[l] >> 4, ql[l+32] >> 4 and their top 2 bits from bits
 * 0-1, 2-3, 4-5, 6-7 of qh[l]; value d scale[e / 16] (q - 32). */
static void
dequant_block256(uint32_t type, const unsigned char *b, float *o)
{
    if (type == GGUF_TENSOR_Q4_K || type == GGUF_TENSOR_Q5_K) {
        float d = half_at(b), dmin = half_at(b + 2);
        const unsigned char *sc = b + 4;
        const unsigned char *qh = type == GGUF_TENSOR_Q5_K ? b + 16 : NULL;
        const unsigned char *qs = type == GGUF_TENSOR_Q5_K ? b + 48 : b + 16;

        for (int c = 0; c < 4; c++) {
            int s0, m0, s1, m1;

            k_scale_min(sc, 2 * c, &s0, &m0);
            k_scale_min(sc, 2 * c + 1, &s1, &m1);
            for (int l = 0; l < 32; l++) {
                int lo = qs[32 * c + l] & 0x0f, hi = qs[32 * c + l] >> 4;

                if (qh != NULL) {
                    lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                    hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                }
                o[64 * c + l] = d * (float)s0 * (float)lo - dmin * (float)m0;
                o[64 * c + 32 + l] = d * (float)s1 * (float)hi - dmin * (float)m1;
            }
        }
        return;
    }
    if (type == GGUF_TENSOR_Q6_K) {
        const unsigned char *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = half_at(b + 208);

        for (int h = 0; h < 2; h++) {
            const unsigned char *L = ql + 64 * h, *H = qh + 32 * h;
            const int8_t *S = sc + 8 * h;
            float *y = o + 128 * h;

            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((L[l] & 0x0f) | (((H[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((L[l + 32] & 0x0f) | (((H[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32;

                y[l] = d * (float)S[is] * (float)q1;
                y[l + 32] = d * (float)S[is + 2] * (float)q2;
                y[l + 64] = d * (float)S[is + 4] * (float)q3;
                y[l + 96] = d * (float)S[is + 6] * (float)q4;
            }
        }
    }
}

int
gguf_tensor_convertible(uint32_t type)
{
    switch (type) {
    case GGUF_TENSOR_F32:
    case GGUF_TENSOR_F16:
    case GGUF_TENSOR_BF16:
    case GGUF_TENSOR_Q8_0:
    case GGUF_TENSOR_Q4_0:
    case GGUF_TENSOR_Q4_1:
    case GGUF_TENSOR_Q5_0:
    case GGUF_TENSOR_Q5_1:
    case GGUF_TENSOR_Q4_K:
    case GGUF_TENSOR_Q5_K:
    case GGUF_TENSOR_Q6_K:
        return 1;
    default:
        return 0;
    }
}

int
gguf_tensor_to_f32(const gguf_tensor_t *t, float *dst)
{
    const unsigned char *p = t->data;
    uint64_t n = t->dims[0] * t->dims[1] * t->dims[2] * t->dims[3];
    uint64_t blk = 1, bytes = 0;

    switch (t->type) {
    case GGUF_TENSOR_F32:
        memcpy(dst, p, n * 4);
        return ST_OK;
    case GGUF_TENSOR_F16:
        return sft_to_f32(SFT_DTYPE_F16, p, n, dst);
    case GGUF_TENSOR_BF16:
        return sft_to_f32(SFT_DTYPE_BF16, p, n, dst);
    case GGUF_TENSOR_Q8_0:
    case GGUF_TENSOR_Q4_0:
    case GGUF_TENSOR_Q4_1:
    case GGUF_TENSOR_Q5_0:
    case GGUF_TENSOR_Q5_1:
        ggml_type_info(t->type, &blk, &bytes, NULL);
        for (uint64_t b = 0; b < n / 32; b++) {
            dequant_block32(t->type, p + b * bytes, dst + b * 32);
        }
        return ST_OK;
    case GGUF_TENSOR_Q4_K:
    case GGUF_TENSOR_Q5_K:
    case GGUF_TENSOR_Q6_K:
        ggml_type_info(t->type, &blk, &bytes, NULL);
        for (uint64_t b = 0; b < n / 256; b++) {
            dequant_block256(t->type, p + b * bytes, dst + b * 256);
        }
        return ST_OK;
    default:
        return ST_EFORMAT;
    }
}
