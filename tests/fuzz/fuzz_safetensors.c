/*
 * fuzz_safetensors.c - a .safetensors image (8-byte header length, JSON
 * header, data) opened from memory with the checks a checkpoint file gets.
 * Every tensor of an accepted image must lie inside it, with the byte count
 * its dtype and shape need, and be found by its name.
 */
#include "fuzz.h"

#include "safetensors.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tdm_st_file *f = NULL;
    tdm_error err;
    if (tdm_st_open_memory(data, size, "<fuzz>.safetensors", &f, &err) != TDM_OK) {
        FUZZ_CHECK(err.msg[0] != '\0', "a refusal without a message");
        return 0;
    }
    FUZZ_CHECK(tdm_st_file_count(f) == 1, "one image, one file");
    for (size_t i = 0; i < tdm_st_count(f); i++) {
        const tdm_st_tensor *t = tdm_st_at(f, i);
        const uint8_t *d = t->data;
        FUZZ_CHECK(d >= data + 8 && d + t->nbytes <= data + size, "tensor '%s' outside the image",
                   t->name);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= TDM_ST_MAX_DIMS, "tensor '%s': %d dims", t->name,
                   t->ndim);
        uint64_t numel = 1;
        for (int k = 0; k < t->ndim; k++) {
            FUZZ_CHECK(t->shape[k] >= 0, "tensor '%s': negative dim", t->name);
            numel *= (uint64_t)t->shape[k];
        }
        FUZZ_CHECK((uint64_t)t->numel == numel, "tensor '%s': numel", t->name);
        FUZZ_CHECK((uint64_t)t->nbytes == numel * tdm_st_dtype_size(t->dtype),
                   "tensor '%s': %zu bytes for %llu elements of %s", t->name, t->nbytes,
                   (unsigned long long)numel, tdm_st_dtype_name(t->dtype));
        FUZZ_CHECK(tdm_st_find(f, t->name) == t, "tensor '%s' not found by name", t->name);
        char shape[256];
        tdm_st_shape_str(t, shape, sizeof(shape));
        /* Reading every byte is what the engine does with a tensor. */
        volatile uint8_t sum = 0;
        for (size_t b = 0; b < t->nbytes; b++)
            sum ^= d[b];
        (void)sum;
    }
    tdm_st_close(f);
    return 0;
}
