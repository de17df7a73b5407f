/*
 * make_model.c - writes a random bf16 checkpoint with the shape of a
 * released model (bench_util.h), for benchmarks of the services:
 *
 *   bench_make_model --shape 0.8b|4b|27b|tiny --out DIR [--layout plain|release]
 *                    [--shard-gb N] [--mtp]
 *
 * plain (default): config.json and one model.safetensors, tied embeddings;
 * with --mtp, the MTP head's mtp.* tensors too.
 * release: as Qwen3.5/3.6 checkpoints ship (bench_util.h): a qwen3_5 config
 * with text_config, model.language_model. tensors, an untied LM head, the
 * vision tower and the MTP head, in shards of --shard-gb GB (default 5)
 * named by model.safetensors.index.json.
 */
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    const char *shape = NULL, *out = NULL, *layout = "plain";
    double shard_gb = 5;
    int bad = 0, mtp = 0;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--mtp")) {
            mtp = 1;
            i--; /* a flag: no value */
        } else if (i + 1 >= argc)
            bad = 1;
        else if (!strcmp(argv[i], "--shape"))
            shape = argv[i + 1];
        else if (!strcmp(argv[i], "--out"))
            out = argv[i + 1];
        else if (!strcmp(argv[i], "--layout"))
            layout = argv[i + 1];
        else if (!strcmp(argv[i], "--shard-gb"))
            shard_gb = atof(argv[i + 1]);
        else
            bad = 1;
    }
    const bench_shape *s = shape ? bench_shape_find(shape) : NULL;
    const int release = !strcmp(layout, "release");
    if (bad || !s || !out || (!release && strcmp(layout, "plain") != 0) || shard_gb <= 0) {
        fprintf(stderr, "usage: bench_make_model --shape 0.8b|4b|27b|tiny --out DIR "
                        "[--layout plain|release] [--shard-gb N] [--mtp]\n");
        return 2;
    }
    char err[512];
    double t0 = bench_now();
    const size_t shard = release ? (size_t)(shard_gb * 1e9) : 0;
    const int flags = (release ? BENCH_LAYOUT_RELEASE : 0) | (mtp ? BENCH_LAYOUT_MTP : 0);
    if (bench_write_model_layout(out, s, flags, shard, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench_make_model: %s\n", err);
        return 1;
    }
    printf("random %s-shaped checkpoint (%s layout%s) in %s (%.1f s)\n", s->name, layout,
           mtp && !release ? ", MTP head" : "", out, bench_now() - t0);
    return 0;
}
