/*
 * check.h - the assertion macros of the configuration and compatibility
 * tests: a failed check prints where and why and is counted; the test's main
 * exits non-zero when any failed (the tests go on after a failure so that
 * one run shows everything that is wrong).
 */
#ifndef TANDEM_TESTS_CHECK_H
#define TANDEM_TESTS_CHECK_H

#include <stdio.h>
#include <string.h>

static int g_failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            g_failures++;                                                                          \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

#define CHECK_STR(a, b) CHECK(strcmp((a), (b)) == 0, "got '%s', want '%s'", (a), (b))
#define CHECK_HAS(hay, needle)                                                                     \
    CHECK(strstr((hay), (needle)) != NULL, "'%s' does not contain '%s'", (hay), (needle))

#endif
