/*
 * oracle.c - see oracle.h.
 */
#include "oracle.h"

#include "alloc.h"
#include "file.h"

#include <stdlib.h>
#include <string.h>

typedef struct run {
    int32_t *ids;
    int n;
} run;

static run *g_runs;
static int g_n;
static double g_accept = 1.0;

tdm_status tdm_bench_oracle_load(tdm_error *err)
{
    const char *path = getenv("TANDEM_BENCH_ORACLE"), *acc = getenv("TANDEM_BENCH_ACCEPT");
    if (!path || !acc)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "bench_drafter_oracle needs TANDEM_BENCH_ORACLE (recorded runs) and "
                             "TANDEM_BENCH_ACCEPT (acceptance per position)");
    char *end;
    g_accept = strtod(acc, &end);
    if (*end || !(g_accept >= 0 && g_accept <= 1))
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "TANDEM_BENCH_ACCEPT=%s: expected a number in [0, 1]", acc);
    char *text = NULL;
    tdm_status st = tdm_file_read(path, (size_t)1 << 30, &text, NULL, err);
    if (st != TDM_OK)
        return tdm_error_prefix(err, "TANDEM_BENCH_ORACLE");
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        run r = {0};
        int cap = 0;
        for (char *p = line; *p;) {
            long v = strtol(p, &end, 10);
            if (end == p)
                break;
            if (r.n == cap) {
                cap = cap ? 2 * cap : 256;
                r.ids = tdm_xrealloc(r.ids, (size_t)cap * sizeof(int32_t));
            }
            r.ids[r.n++] = (int32_t)v;
            p = end;
        }
        if (r.n == 0) {
            free(r.ids);
            continue;
        }
        g_runs = tdm_xrealloc(g_runs, (size_t)(g_n + 1) * sizeof(*g_runs));
        g_runs[g_n++] = r;
    }
    free(text);
    if (g_n == 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "TANDEM_BENCH_ORACLE=%s: no runs",
                             path);
    return TDM_OK;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static int32_t at(const int32_t *ctx, int n, const int32_t *ext, int i)
{
    return i < n ? ctx[i] : ext[i - n];
}

int32_t tdm_bench_oracle(const int32_t *ctx, int n, const int32_t *ext, int n_ext, int32_t own,
                         int vocab)
{
    const int len = n + n_ext;
    for (int r = 0; r < g_n; r++) {
        const run *R = &g_runs[r];
        if (R->n <= len)
            continue;
        int i = 0;
        while (i < len && R->ids[i] == at(ctx, n, ext, i))
            i++;
        if (i < len)
            continue;
        int32_t truth = R->ids[len];
        double u = (double)(mix(((uint64_t)r << 32) ^ (uint64_t)len) >> 11) / 9007199254740992.0;
        return u < g_accept ? truth : (int32_t)((truth + 1) % vocab);
    }
    return own;
}
