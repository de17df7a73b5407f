/*
 * tokenizer_bench - encode/decode throughput of the tokenizer (tokenizer.h)
 * on the reference corpus, measured the way tools/tokenizer_fixtures.py
 * measures HF `tokenizers`, so the numbers sit side by side in RESULTS.md.
 *
 *   bench_tokenizer_bench TOKENIZER.json CORPUS.jsonl [REPEAT=8]
 *
 * corpus loop: encode every corpus string, one call each (best of 3 passes;
 *              the first, cold-cache pass is reported too);
 * big doc:     one call on "\n".join(corpus) * REPEAT (best of 2);
 * decode:      decode every string's ids (best of 3), MB of text out.
 * Single-threaded throughout.
 */
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *slurp(const char *path)
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
    if (b == NULL || fread(b, 1, (size_t)n, f) != (size_t)n)
        exit(2);
    b[n] = '\0';
    fclose(f);
    return b;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s TOKENIZER.json CORPUS.jsonl [REPEAT]\n", argv[0]);
        return 2;
    }
    int repeat = argc > 3 ? atoi(argv[3]) : 8;
    tdm_error err = {0};
    tdm_tokenizer *tok;
    double t0 = now();
    if (tdm_tok_load(argv[1], &tok, &err) != TDM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    double load_s = now() - t0;

    char *buf = slurp(argv[2]);
    size_t n = 0, cap = 1024, bytes = 0;
    char **texts = malloc(cap * sizeof(*texts));
    size_t *lens = malloc(cap * sizeof(*lens));
    for (char *p = buf; *p;) {
        char *e = strchr(p, '\n');
        if (e)
            *e = '\0';
        cJSON *j = cJSON_Parse(p);
        if (j) {
            if (n == cap) {
                cap *= 2;
                texts = realloc(texts, cap * sizeof(*texts));
                lens = realloc(lens, cap * sizeof(*lens));
            }
            texts[n] = strdup(cJSON_GetObjectItem(j, "text")->valuestring);
            lens[n] = strlen(texts[n]);
            bytes += lens[n];
            n++;
            cJSON_Delete(j);
        }
        if (!e)
            break;
        p = e + 1;
    }
    free(buf);

    int32_t **ids = calloc(n, sizeof(*ids));
    size_t *n_ids = calloc(n, sizeof(*n_ids));
    double best = 1e30, cold = 0;
    size_t total_ids = 0;
    for (int pass = 0; pass < 3; pass++) {
        t0 = now();
        for (size_t i = 0; i < n; i++) {
            free(ids[i]);
            if (tdm_tok_encode(tok, texts[i], lens[i], &ids[i], &n_ids[i], &err) != TDM_OK) {
                fprintf(stderr, "encode: %s\n", err.msg);
                return 1;
            }
        }
        double dt = now() - t0;
        if (pass == 0)
            cold = dt;
        best = dt < best ? dt : best;
    }
    for (size_t i = 0; i < n; i++)
        total_ids += n_ids[i];

    size_t joined_len = bytes + (n ? n - 1 : 0);
    size_t doc_len = joined_len * (size_t)repeat;
    char *doc = malloc(doc_len + 1);
    size_t o = 0;
    for (int r = 0; r < repeat; r++)
        for (size_t i = 0; i < n; i++) {
            memcpy(doc + o, texts[i], lens[i]);
            o += lens[i];
            if (i + 1 < n)
                doc[o++] = '\n';
        }
    double best_doc = 1e30;
    size_t doc_ids = 0;
    for (int pass = 0; pass < 2; pass++) {
        int32_t *d;
        t0 = now();
        if (tdm_tok_encode(tok, doc, doc_len, &d, &doc_ids, &err) != TDM_OK) {
            fprintf(stderr, "encode doc: %s\n", err.msg);
            return 1;
        }
        double dt = now() - t0;
        best_doc = dt < best_doc ? dt : best_doc;
        free(d);
    }

    double best_dec = 1e30;
    size_t out_bytes = 0;
    for (int pass = 0; pass < 3; pass++) {
        out_bytes = 0;
        t0 = now();
        for (size_t i = 0; i < n; i++) {
            char *text;
            size_t len;
            if (tdm_tok_decode(tok, ids[i], n_ids[i], false, &text, &len, &err) != TDM_OK)
                return 1;
            out_bytes += len;
            free(text);
        }
        double dt = now() - t0;
        best_dec = dt < best_dec ? dt : best_dec;
    }

    printf("tokenizer %s (vocab %zu), load %.1f ms\n", argv[1], tdm_tok_vocab_size(tok),
           load_s * 1e3);
    printf("corpus loop: %zu strings, %zu bytes, %zu ids: %.2f MB/s (cold pass %.2f MB/s)\n", n,
           bytes, total_ids, (double)bytes / best / 1e6, (double)bytes / cold / 1e6);
    printf("big doc:     %zu bytes, %zu ids: %.2f MB/s\n", doc_len, doc_ids,
           (double)doc_len / best_doc / 1e6);
    printf("decode:      %zu bytes out: %.2f MB/s\n", out_bytes,
           (double)out_bytes / best_dec / 1e6);

    for (size_t i = 0; i < n; i++) {
        free(ids[i]);
        free(texts[i]);
    }
    free(ids);
    free(n_ids);
    free(texts);
    free(lens);
    free(doc);
    tdm_tok_destroy(tok);
    return 0;
}
