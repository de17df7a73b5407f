/*
 * util.h - helpers for the engine tests: fixtures (meta.json + .npy logits),
 * comparisons, files.
 */
#ifndef TANDEM_TESTS_ENGINE_UTIL_H
#define TANDEM_TESTS_ENGINE_UTIL_H

#include "engine.h"

#include <stddef.h>
#include <stdint.h>

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct fixture {
    char dir[512];   /* the fixture folder */
    char model[600]; /* its model/ folder */
    char dtype[16];  /* storage dtype: float32, bfloat16, float16 */
    int ncalls;
    int32_t *calls[3]; /* prefill, continuation, decode */
    int ncall[3];
    int total; /* positions */
} fixture;

void fixture_load(fixture *f, const char *name);
void fixture_free(fixture *f);
/* The model of fixture `name` loaded onto be; exits on error. */
tdm_model *fixture_model(const char *name, tdm_backend *be);
/* The fixture's calls on m the cached way (prefill, prefill, decode) under
 * strat: host logits [total, vocab] (caller frees). */
float *fixture_run(tdm_model *m, const fixture *f, tdm_state_strategy strat);
/* The same positions as a verify block (prefill, then calls 1+2 verified and
 * fully accepted) under both strategies: must give the bits of `cached`
 * (fixture_run's logits). */
void fixture_check_verify_path(tdm_model *m, const fixture *f, const float *cached);
/* Reads an .npy of [rows, cols] float32; exits on error. */
float *npy_load2(const char *path, int64_t *rows, int64_t *cols);
float max_abs(const float *x, size_t n);
/* A draft vocabulary for tests: every third token id of V and the last
 * (ascending; caller frees), *n of them. */
int32_t *every_third_ids(int V, int *n);
float max_abs_diff(const float *a, const float *b, size_t n);
int argmax_row(const float *x, int n);
/* Whole file into memory (caller frees); exits on error. */
unsigned char *file_read(const char *path, size_t *len);
void file_write(const char *path, const void *data, size_t len);
/* Copies every regular file of src into dst (created). */
void dir_copy(const char *src, const char *dst);
void dir_remove(const char *dir);
tdm_backend *test_backend(void);

/* A sequence and the tokens committed in it (snapshots carry them). */
typedef struct tracked {
    tdm_seq *s;
    int32_t toks[512];
    int n;
} tracked;
/* A fresh sequence of m; exits on error. */
void tracked_make(tdm_model *m, tdm_state_strategy st, int max_draft, tracked *t);
/* Verifies nt tokens of blk (logits host [nt, vocab]), commits acc drafts
 * and records the acc + 1 committed tokens; exits on error. */
void tracked_verify(tracked *t, const int32_t *blk, int nt, int acc, float *logits);

#endif
