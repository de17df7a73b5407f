/*
 * tok_test.h - helpers shared by the tokenizer tests: a CHECK that counts
 * failures instead of stopping, and whole-file / JSON Lines reading.
 */
#ifndef TANDEM_TESTS_TOK_TEST_H
#define TANDEM_TESTS_TOK_TEST_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tok_test_failures __attribute__((unused));

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            tok_test_failures++;                                                                   \
        }                                                                                          \
    } while (0)

/* The whole file, NUL-terminated; the caller frees. Exits on failure: a
 * missing fixture is a broken test setup, not a test result. */
static inline char *tok_test_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b == NULL || fread(b, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    b[n] = '\0';
    fclose(f);
    if (len)
        *len = (size_t)n;
    return b;
}

/* Parses a JSON Lines file: one cJSON per non-empty line (cJSON_Delete each,
 * free the array). */
static inline cJSON **tok_test_jsonl(const char *path, size_t *n_out)
{
    char *buf = tok_test_slurp(path, NULL);
    size_t cap = 1024, n = 0;
    cJSON **v = malloc(cap * sizeof(*v));
    for (char *p = buf; *p;) {
        char *e = strchr(p, '\n');
        if (e)
            *e = '\0';
        if (*p) {
            cJSON *j = cJSON_Parse(p);
            if (j == NULL) {
                fprintf(stderr, "%s line %zu: bad JSON\n", path, n + 1);
                exit(2);
            }
            if (n == cap)
                v = realloc(v, (cap *= 2) * sizeof(*v));
            v[n++] = j;
        }
        if (!e)
            break;
        p = e + 1;
    }
    free(buf);
    *n_out = n;
    return v;
}

#endif
