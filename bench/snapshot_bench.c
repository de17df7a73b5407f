/*
 * snapshot_bench.c - what a state snapshot costs (engine/snapshot.h).
 *
 *   bench_snapshot_bench [--model DIR] [--backend cpu|cuda] [--positions N,...]
 *                        [--chunk BYTES]
 *
 * For each committed length: the snapshot's size, and the time (best of 5) to
 * take it from a sequence (tdm_seq_snapshot: download of every state plus
 * the SHA-256), to cut it into chunks with their CRC32C (what ExportSnapshot
 * does before writing), to check and assemble those chunks (the
 * ImportSnapshot side: CRC32C, order, SHA-256) and to import it into a new
 * sequence (tdm_seq_from_snapshot: layout check, SHA-256, upload).
 * Default: models/demo-target on the CPU backend, 1 MiB chunks.
 */
#include "bench_util.h"
#include "engine.h"
#include "runtime.h"
#include "snapshot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what, const tdm_error *err)
{
    fprintf(stderr, "snapshot_bench: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

int main(int argc, char **argv)
{
    const char *model = "models/demo-target", *backend = "cpu", *positions = "128,1024,4000";
    uint32_t chunk = TDM_SNAPSHOT_DEFAULT_CHUNK;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0)
            model = argv[i + 1];
        else if (strcmp(argv[i], "--backend") == 0)
            backend = argv[i + 1];
        else if (strcmp(argv[i], "--positions") == 0)
            positions = argv[i + 1];
        else if (strcmp(argv[i], "--chunk") == 0)
            chunk = (uint32_t)atol(argv[i + 1]);
    }
    tdm_error err;
    tdm_runtime *rt;
    if (tdm_runtime_open(model, backend, 0, &rt, &err) != TDM_OK)
        die("open", &err);
    tdm_model *m = rt->model;
    const tdm_model_config *cfg = tdm_model_get_config(m);
    printf("model %s, backend %s, chunks of %u bytes\n", model, backend, chunk);
    printf("%9s %10s %10s %10s %10s %10s %9s\n", "positions", "MiB", "take ms", "chunk ms",
           "assemble", "import ms", "GB/s e2e");
    for (const char *p = positions; *p;) {
        int n = atoi(p);
        tdm_seq_params sp = {TDM_STATE_EXTRA_BUFFER, 8, 0};
        tdm_seq *s;
        if (tdm_seq_create(m, &sp, &s, &err) != TDM_OK)
            die("seq", &err);
        int32_t *toks = malloc((size_t)n * sizeof(int32_t));
        for (int i = 0; i < n; i++)
            toks[i] = (int32_t)((i * 7919 + 13) % cfg->vocab_size);
        if (tdm_seq_prefill(s, toks, n, NULL, &err) != TDM_OK)
            die("prefill", &err);
        double best[4] = {1e30, 1e30, 1e30, 1e30};
        uint64_t total = 0;
        for (int rep = 0; rep < 5; rep++) {
            tdm_snap_layout l;
            uint8_t *payload;
            double t0 = bench_now();
            if (tdm_seq_snapshot(s, "bench", toks, n, &l, &payload, &err) != TDM_OK)
                die("snapshot", &err);
            double t1 = bench_now();
            total = l.total_bytes;
            const size_t nt = l.n_tensors;
            Tandem__V1__SnapshotTensor *pt = calloc(nt, sizeof(*pt));
            Tandem__V1__SnapshotTensor **pp = calloc(nt, sizeof(*pp));
            uint64_t(*shapes)[3] = calloc(nt, sizeof(*shapes));
            Tandem__V1__SnapshotLayout pl;
            tdm_snap_layout_to_proto(&l, &pl, pt, pp, shapes);
            const uint32_t nc = tdm_snap_chunk_count(l.total_bytes, chunk);
            Tandem__V1__SnapshotChunk *cs = calloc(nc, sizeof(*cs));
            for (uint32_t i = 0; i < nc; i++) {
                Tandem__V1__SnapshotChunk *c = &cs[i];
                tandem__v1__snapshot_chunk__init(c);
                c->index = i;
                c->last = i == nc - 1;
                if (i == 0) {
                    c->layout = &pl;
                    continue;
                }
                uint64_t off = (uint64_t)(i - 1) * chunk, left = l.total_bytes - off;
                c->offset = off;
                c->data.data = payload + off;
                c->data.len = (size_t)(left < chunk ? left : chunk);
                c->crc32c = tdm_crc32c(0, c->data.data, c->data.len);
            }
            double t2 = bench_now();
            tdm_snap_asm *a =
                tdm_snap_asm_create(cfg, "bench", (uint32_t)cfg->max_position_embeddings);
            for (uint32_t i = 0; i < nc; i++)
                if (tdm_snap_asm_add(a, &cs[i], &err) != TDM_OK)
                    die("assemble", &err);
            tdm_snap_layout l2;
            uint8_t *p2;
            if (tdm_snap_asm_finish(a, &l2, &p2, &err) != TDM_OK)
                die("finish", &err);
            tdm_snap_asm_destroy(a);
            double t3 = bench_now();
            tdm_seq *s2;
            if (tdm_seq_from_snapshot(m, &sp, "bench", &l2, p2, &s2, &err) != TDM_OK)
                die("import", &err);
            double t4 = bench_now();
            double d[4] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3};
            for (int k = 0; k < 4; k++)
                best[k] = d[k] < best[k] ? d[k] : best[k];
            tdm_seq_destroy(s2);
            tdm_snap_layout_free(&l2);
            free(p2);
            free(cs);
            free(pt);
            free(pp);
            free(shapes);
            tdm_snap_layout_free(&l);
            free(payload);
        }
        const double sum = best[0] + best[1] + best[2] + best[3];
        printf("%9d %10.2f %10.3f %10.3f %10.3f %10.3f %9.2f\n", n, (double)total / 1048576.0,
               best[0] * 1e3, best[1] * 1e3, best[2] * 1e3, best[3] * 1e3,
               (double)total / sum / 1e9);
        tdm_seq_destroy(s);
        free(toks);
        p = strchr(p, ',');
        if (!p)
            break;
        p++;
    }
    tdm_runtime_close(rt);
    return 0;
}
