/* safetensors.c - safetensors parsing with strict bounds checks and the
 * f16/bf16 conversions (the file helpers are in fmt_util.c).
 *
 * Every number taken from the file is checked before it is used as a
 * size or an offset: the header length against the file size, each
 * data_offsets pair against the data section, each shape's element count
 * (with overflow checks) against its byte range. Tensors may not overlap.
 */
#define LOG_MODULE "safetensors"

#include "formats/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"
#include "common/util.h"
#include "common/xmalloc.h"
#include "formats/fmt_util.h"

struct sft_file {
    sft_tensor_t *tensors;
    int64_t n_tensors;
    void *map; /* set by sft_open only */
    size_t map_len;
};

static const struct {
    const char *name;
    sft_dtype_t dt;
    size_t size;
} sft_dtypes[] = {
    {"F32", SFT_DTYPE_F32, 4},   {"F16", SFT_DTYPE_F16, 2}, {"BF16", SFT_DTYPE_BF16, 2},
    {"F64", SFT_DTYPE_F64, 8},   {"I8", SFT_DTYPE_I8, 1},   {"U8", SFT_DTYPE_U8, 1},
    {"I16", SFT_DTYPE_I16, 2},   {"I32", SFT_DTYPE_I32, 4}, {"I64", SFT_DTYPE_I64, 8},
    {"BOOL", SFT_DTYPE_BOOL, 1},
};

const char *
sft_dtype_name(sft_dtype_t dt)
{
    for (size_t i = 0; i < sizeof(sft_dtypes) / sizeof(sft_dtypes[0]); i++) {
        if (sft_dtypes[i].dt == dt) {
            return sft_dtypes[i].name;
        }
    }
    return "?";
}

size_t
sft_dtype_size(sft_dtype_t dt)
{
    for (size_t i = 0; i < sizeof(sft_dtypes) / sizeof(sft_dtypes[0]); i++) {
        if (sft_dtypes[i].dt == dt) {
            return sft_dtypes[i].size;
        }
    }
    return 0;
}

float
sft_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    float f;

    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 */
        f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    memcpy(&f, &bits, sizeof(f));
    return f;
}

float
sft_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;

    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* Every f16 value as f32 (256 KB), built once: a lookup beats the
 * branches of sft_f16_to_f32 by several times on bulk conversions. */
static float f16_table[65536];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;

static void
f16_table_init(void)
{
    for (uint32_t i = 0; i < 65536; i++) {
        f16_table[i] = sft_f16_to_f32((uint16_t)i);
    }
}

int
sft_to_f32(sft_dtype_t dt, const void *src, uint64_t n, float *dst)
{
    const unsigned char *p = src;
    int64_t nn = (int64_t)n;

    switch (dt) {
    case SFT_DTYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        return ST_OK;
    case SFT_DTYPE_F16:
        pthread_once(&f16_once, f16_table_init);
        for (int64_t i = 0; i < nn; i++) {
            uint16_t h;

            memcpy(&h, p + 2 * i, 2);
            dst[i] = f16_table[h];
        }
        return ST_OK;
    case SFT_DTYPE_BF16:
        for (int64_t i = 0; i < nn; i++) {
            uint16_t h;

            memcpy(&h, p + 2 * i, 2);
            dst[i] = sft_bf16_to_f32(h);
        }
        return ST_OK;
    default:
        return ST_EFORMAT;
    }
}

/* A JSON number that is a non-negative integer exactly representable in a
 * double (below 2^53). */
static int
json_u64(const cJSON *j, uint64_t *out)
{
    double d;

    if (!cJSON_IsNumber(j)) {
        return 0;
    }
    d = j->valuedouble;
    if (!(d >= 0.0) || d > 9007199254740992.0 || d != floor(d)) {
        return 0;
    }
    *out = (uint64_t)d;
    return 1;
}

static int
cmp_range(const void *a, const void *b)
{
    const sft_tensor_t *x = *(const sft_tensor_t *const *)a;
    const sft_tensor_t *y = *(const sft_tensor_t *const *)b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;

    if (px != py) {
        return px < py ? -1 : 1;
    }
    return x->nbytes < y->nbytes ? -1 : (x->nbytes > y->nbytes);
}

static int
cmp_name(const void *a, const void *b)
{
    const sft_tensor_t *x = *(const sft_tensor_t *const *)a;
    const sft_tensor_t *y = *(const sft_tensor_t *const *)b;

    return strcmp(x->name, y->name);
}

static int
parse_tensor(const cJSON *item, const unsigned char *data_sec, uint64_t data_len, sft_tensor_t *t,
             char *err, size_t errlen)
{
    const cJSON *dtype, *shape, *offs, *dim;
    uint64_t begin, end, n = 1, esz, d;
    size_t k;
    int found = 0;

    if (!cJSON_IsObject(item)) {
        fmt_seterr(err, errlen, "tensor '%s': entry is not an object", t->name);
        return ST_EFORMAT;
    }
    dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs)) {
        fmt_seterr(err, errlen, "tensor '%s': needs dtype, shape and data_offsets", t->name);
        return ST_EFORMAT;
    }
    for (k = 0; k < sizeof(sft_dtypes) / sizeof(sft_dtypes[0]); k++) {
        if (strcmp(sft_dtypes[k].name, dtype->valuestring) == 0) {
            t->dtype = sft_dtypes[k].dt;
            found = 1;
            break;
        }
    }
    if (!found) {
        fmt_seterr(err, errlen, "tensor '%s': unknown dtype '%.16s'", t->name, dtype->valuestring);
        return ST_EFORMAT;
    }
    esz = sft_dtypes[k].size;
    if (cJSON_GetArraySize(shape) > SFT_MAX_DIMS) {
        fmt_seterr(err, errlen, "tensor '%s': more than %d dimensions", t->name, SFT_MAX_DIMS);
        return ST_EFORMAT;
    }
    t->n_dims = 0;
    cJSON_ArrayForEach(dim, shape)
    {
        if (!json_u64(dim, &d)) {
            fmt_seterr(err, errlen, "tensor '%s': bad shape entry", t->name);
            return ST_EFORMAT;
        }
        if (d != 0 && n > UINT64_MAX / d) {
            fmt_seterr(err, errlen, "tensor '%s': shape overflows", t->name);
            return ST_EFORMAT;
        }
        n *= d;
        t->dims[t->n_dims++] = d;
    }
    if (cJSON_GetArraySize(offs) != 2 || !json_u64(cJSON_GetArrayItem(offs, 0), &begin) ||
        !json_u64(cJSON_GetArrayItem(offs, 1), &end)) {
        fmt_seterr(err, errlen, "tensor '%s': data_offsets must be two integers", t->name);
        return ST_EFORMAT;
    }
    if (begin > end || end > data_len) {
        fmt_seterr(err, errlen,
                   "tensor '%s': data_offsets [%llu, %llu] outside the data section (%llu bytes)",
                   t->name, (unsigned long long)begin, (unsigned long long)end,
                   (unsigned long long)data_len);
        return ST_EFORMAT;
    }
    if (n > UINT64_MAX / esz || n * esz != end - begin) {
        fmt_seterr(err, errlen, "tensor '%s': shape does not match its %llu bytes of %s", t->name,
                   (unsigned long long)(end - begin), sft_dtypes[k].name);
        return ST_EFORMAT;
    }
    t->n_elems = n;
    t->data = data_sec + begin;
    t->nbytes = end - begin;
    return ST_OK;
}

int
sft_parse_header(const void *data, size_t len, sft_file_t **out, char *err, size_t errlen)
{
    const unsigned char *p = data;
    uint64_t hlen = 0;
    cJSON *root = NULL;
    const cJSON *item;
    sft_file_t *f = NULL;
    sft_tensor_t **sorted = NULL;
    int64_t n, i;
    int rc;

    if (len < 8) {
        fmt_seterr(err, errlen, "truncated: %zu bytes, no header length", len);
        return ST_EFORMAT;
    }
    for (int b = 7; b >= 0; b--) {
        hlen = (hlen << 8) | p[b];
    }
    if (hlen > SFT_MAX_HEADER) {
        fmt_seterr(err, errlen, "header length %llu is larger than the %u limit",
                   (unsigned long long)hlen, SFT_MAX_HEADER);
        return ST_EFORMAT;
    }
    if (hlen > len - 8) {
        fmt_seterr(err, errlen, "truncated: header length %llu exceeds the %zu bytes of the file",
                   (unsigned long long)hlen, len - 8);
        return ST_EFORMAT;
    }
    if (hlen < 2 || p[8] != '{') {
        fmt_seterr(err, errlen, "header is not a JSON object");
        return ST_EFORMAT;
    }
    if (!utf8_valid((const char *)p + 8, (size_t)hlen)) {
        /* JSON text is UTF-8 (RFC 8259); the reference parser rejects it too. */
        fmt_seterr(err, errlen, "header is not valid UTF-8");
        return ST_EFORMAT;
    }
    root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
    if (root == NULL || !cJSON_IsObject(root)) {
        fmt_seterr(err, errlen, "header is not valid JSON");
        rc = ST_EFORMAT;
        goto fail;
    }

    f = xcalloc(1, sizeof(*f));
    n = 0;
    cJSON_ArrayForEach(item, root)
    {
        n++;
    }
    f->tensors = xcalloc((size_t)(n > 0 ? n : 1), sizeof(*f->tensors));
    cJSON_ArrayForEach(item, root)
    {
        sft_tensor_t *t;

        if (item->string == NULL) {
            fmt_seterr(err, errlen, "header entry without a name");
            rc = ST_EFORMAT;
            goto fail;
        }
        if (strcmp(item->string, "__metadata__") == 0) {
            continue;
        }
        t = &f->tensors[f->n_tensors++];
        t->name = xstrdup(item->string);
        rc = parse_tensor(item, p + 8 + hlen, len - 8 - hlen, t, err, errlen);
        if (rc != ST_OK) {
            goto fail;
        }
    }

    /* No name twice (JSON allows it) and no two tensors sharing bytes;
     * sorting keeps both checks O(n log n) on hostile headers. */
    sorted = xcalloc((size_t)(f->n_tensors > 0 ? f->n_tensors : 1), sizeof(*sorted));
    for (i = 0; i < f->n_tensors; i++) {
        sorted[i] = &f->tensors[i];
    }
    qsort(sorted, (size_t)f->n_tensors, sizeof(*sorted), cmp_name);
    for (i = 1; i < f->n_tensors; i++) {
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            fmt_seterr(err, errlen, "duplicate tensor '%s'", sorted[i]->name);
            rc = ST_EFORMAT;
            goto fail;
        }
    }
    qsort(sorted, (size_t)f->n_tensors, sizeof(*sorted), cmp_range);
    for (i = 1; i < f->n_tensors; i++) {
        const unsigned char *prev_end =
            (const unsigned char *)sorted[i - 1]->data + sorted[i - 1]->nbytes;
        if (sorted[i]->nbytes > 0 && (const unsigned char *)sorted[i]->data < prev_end) {
            fmt_seterr(err, errlen, "tensors '%s' and '%s' overlap", sorted[i - 1]->name,
                       sorted[i]->name);
            rc = ST_EFORMAT;
            goto fail;
        }
    }
    free(sorted);
    cJSON_Delete(root);
    *out = f;
    return ST_OK;

fail:
    free(sorted);
    cJSON_Delete(root);
    sft_close(f);
    return rc;
}

int
sft_open(const char *path, sft_file_t **out, char *err, size_t errlen)
{
    void *data;
    size_t len;
    char why[256];
    int rc;

    rc = fmt_map_file(path, &data, &len, err, errlen);
    if (rc != ST_OK) {
        return rc;
    }
    rc = sft_parse_header(data, len, out, why, sizeof(why));
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
sft_close(sft_file_t *f)
{
    if (f == NULL) {
        return;
    }
    for (int64_t i = 0; i < f->n_tensors; i++) {
        free(f->tensors[i].name);
    }
    free(f->tensors);
    fmt_unmap(f->map, f->map_len);
    free(f);
}

int64_t
sft_n_tensors(const sft_file_t *f)
{
    return f->n_tensors;
}

const sft_tensor_t *
sft_tensor(const sft_file_t *f, int64_t i)
{
    if (i < 0 || i >= f->n_tensors) {
        return NULL;
    }
    return &f->tensors[i];
}

const sft_tensor_t *
sft_find(const sft_file_t *f, const char *name)
{
    for (int64_t i = 0; i < f->n_tensors; i++) {
        if (strcmp(f->tensors[i].name, name) == 0) {
            return &f->tensors[i];
        }
    }
    return NULL;
}
