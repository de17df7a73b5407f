/*
 * make_model.c - writes a random bf16 checkpoint with the shape of a
 * released model (bench_util.h), for benchmarks of the services:
 *
 *   bench_make_model --shape 0.8b|4b|27b --out DIR
 */
#include "bench_util.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    const char *shape = NULL, *out = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--shape"))
            shape = argv[i + 1];
        else if (!strcmp(argv[i], "--out"))
            out = argv[i + 1];
    }
    const bench_shape *s = shape ? bench_shape_find(shape) : NULL;
    if (!s || !out) {
        fprintf(stderr, "usage: bench_make_model --shape 0.8b|4b|27b --out DIR\n");
        return 2;
    }
    char err[512];
    double t0 = bench_now();
    if (bench_write_model(out, s, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench_make_model: %s\n", err);
        return 1;
    }
    printf("random %s-shaped checkpoint in %s (%.1f s)\n", s->name, out, bench_now() - t0);
    return 0;
}
