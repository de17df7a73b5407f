/*
 * fuzz_npy.c - a NumPy .npy image read as the CLI and the tests read logits
 * (tdm_npy_read_f32_mem). An accepted array has at most 4 dimensions and as
 * many float32 values as its shape says, all of them inside the image.
 */
#include "fuzz.h"

#include "npy.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    float *values = NULL;
    int ndim = -1;
    int64_t shape[4];
    tdm_error err;
    if (tdm_npy_read_f32_mem(data, size, "<fuzz>.npy", &values, &ndim, shape, &err) != TDM_OK) {
        FUZZ_CHECK(values == NULL, "refused, but handed out data");
        FUZZ_CHECK(err.msg[0] != '\0', "a refusal without a message");
        return 0;
    }
    FUZZ_CHECK(ndim >= 0 && ndim <= 4, "%d dimensions", ndim);
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        FUZZ_CHECK(shape[i] >= 0, "dim %d is %lld", i, (long long)shape[i]);
        FUZZ_CHECK(!__builtin_mul_overflow(count, (uint64_t)shape[i], &count),
                   "the shape's element count overflows");
    }
    FUZZ_CHECK(count <= size / sizeof(float), "%llu values from %zu bytes",
               (unsigned long long)count, size);
    volatile float sum = 0;
    for (uint64_t i = 0; i < count; i++)
        sum += values[i];
    (void)sum;
    free(values);
    return 0;
}
