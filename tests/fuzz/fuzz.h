/*
 * fuzz.h - what every harness under tests/fuzz shares.
 *
 * A harness is one file defining LLVMFuzzerTestOneInput (and, when it needs
 * set-up, LLVMFuzzerInitialize). Built with TANDEM_FUZZ it links libFuzzer;
 * otherwise it links replay_main.c, which runs the same entry point on every
 * file of the seed corpus and of the crash reproducers (ctest fuzz_replay_*).
 *
 * A harness calls the library code the services use. It returns 0 for every
 * input; what the code must never do (crash, leak, read out of bounds,
 * undefined behaviour) is caught by the sanitizers, and what it must always
 * do (the invariants a harness checks) by FUZZ_CHECK, which aborts.
 */
#ifndef TANDEM_TESTS_FUZZ_H
#define TANDEM_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* An invariant of the code under test: aborts (a finding) when it fails. */
#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz: invariant failed: %s (%s:%d): ", #cond, __FILE__, __LINE__);    \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Reads the input as a sequence of fields: take_u8 / take_u32 consume bytes
 * from the front (0 once it is empty); take_rest hands out what is left. */
typedef struct fuzz_input {
    const uint8_t *p;
    size_t n;
} fuzz_input;

static inline uint8_t fuzz_take_u8(fuzz_input *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

static inline uint32_t fuzz_take_u32(fuzz_input *in)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)fuzz_take_u8(in) << (8 * i);
    return v;
}

/* Where the bundled demo models are (models/ of the source tree, or
 * $TANDEM_FUZZ_MODELS). */
static inline const char *fuzz_models_dir(void)
{
    const char *env = getenv("TANDEM_FUZZ_MODELS");
    return env && env[0] ? env : TANDEM_FUZZ_MODELS_DIR;
}

#endif
