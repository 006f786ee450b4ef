/* fuzz_safetensors.c - fuzz target: sft_parse_header() on a whole
 * safetensors file held in memory.
 *
 * Properties: a parsed file has tensor names that are valid UTF-8 (the
 * header is JSON), known dtypes, n_dims <= SFT_MAX_DIMS, n_elems equal to the
 * product of dims, nbytes = n_elems * dtype size, and data lying inside the
 * buffer; sft_find() finds each tensor by its name; a failure is ST_EFORMAT
 * with a reason. Parsing is linear in the header size.
 */
#include <string.h>

#include "common/status.h"
#include "formats/safetensors.h"
#include "tests/fuzz/fuzz_common.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sft_file_t *f = NULL;
    char err[256] = "";
    int rc = sft_parse_header(data, size, &f, err, sizeof(err));

    if (rc != ST_OK) {
        FUZZ_CHECK(rc == ST_EFORMAT, "rc %d", rc);
        FUZZ_CHECK(err[0] != '\0', "no reason");
        return 0;
    }
    int64_t n = sft_n_tensors(f);
    FUZZ_CHECK(n >= 0, "n_tensors %lld", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        const sft_tensor_t *t = sft_tensor(f, i);
        FUZZ_CHECK(t != NULL && t->name != NULL, "tensor %lld", (long long)i);
        FUZZ_CHECK(fuzz_utf8_valid(t->name, strlen(t->name)), "name not UTF-8");
        FUZZ_CHECK((int)t->dtype >= SFT_DTYPE_F32 && (int)t->dtype <= SFT_DTYPE_BOOL, "dtype");
        FUZZ_CHECK(t->n_dims <= SFT_MAX_DIMS, "n_dims %u", t->n_dims);
        unsigned __int128 prod = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            prod *= t->dims[d];
            FUZZ_CHECK(prod <= UINT64_MAX, "dims overflow");
        }
        FUZZ_CHECK(prod == t->n_elems, "n_elems %llu", (unsigned long long)t->n_elems);
        FUZZ_CHECK((unsigned __int128)t->n_elems * sft_dtype_size(t->dtype) == t->nbytes,
                   "nbytes %llu", (unsigned long long)t->nbytes);
        if (t->nbytes > 0) {
            const uint8_t *p = t->data;
            FUZZ_CHECK(p >= data && t->nbytes <= size && (size_t)(p - data) <= size - t->nbytes,
                       "data outside the buffer");
        }
        const sft_tensor_t *found = sft_find(f, t->name);
        FUZZ_CHECK(found != NULL && strcmp(found->name, t->name) == 0, "sft_find %s", t->name);
    }
    FUZZ_CHECK(sft_tensor(f, n) == NULL && sft_tensor(f, -1) == NULL, "out of range");
    sft_close(f);
    return 0;
}

/* n tensors of dtype F32 and shape [1], data offsets consecutive. */
static uint8_t *
gen_tensors(size_t k, size_t *len)
{
    size_t cap = 64 + k * 80;
    char *hdr = malloc(cap);
    size_t o = 0;

    o += (size_t)sprintf(hdr + o, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < k; i++) {
        o += (size_t)sprintf(hdr + o, ",\"layer.%zu.weight\":{\"dtype\":\"F32\",\"shape\":[1],"
                                      "\"data_offsets\":[%zu,%zu]}",
                             i, i * 4, i * 4 + 4);
    }
    hdr[o++] = '}';
    uint8_t *b = malloc(8 + o + k * 4);
    uint64_t hl = o;
    for (int i = 0; i < 8; i++) {
        b[i] = (uint8_t)(hl >> (8 * i));
    }
    memcpy(b + 8, hdr, o);
    memset(b + 8 + o, 0, k * 4);
    free(hdr);
    *len = 8 + o + k * 4;
    return b;
}

static void
run_st(const uint8_t *data, size_t len)
{
    sft_file_t *f = NULL;
    char err[256];

    FUZZ_CHECK(sft_parse_header(data, len, &f, err, sizeof(err)) == ST_OK, "%s", err);
    sft_close(f);
}

const fuzz_linear_case_t fuzz_linear_cases[] = {
    {"safetensors many tensors", gen_tensors, run_st, 256},
    {NULL, NULL, NULL, 0},
};
