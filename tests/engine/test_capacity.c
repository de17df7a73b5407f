/*
 * test_capacity.c - capacity.h's estimates are what the engine allocates.
 *
 * The bundled demo target model is loaded onto the CPU backend behind a
 * counting shim (every alloc, free and weight_map is tallied), then, for
 * each state strategy and a few (max_draft, max_positions):
 *  - the backend bytes tdm_seq_create takes equal tdm_capacity_seq_bytes,
 *    kind by kind as tdm_seq_memory_usage reports them;
 *  - a step over a whole block, prefill and decode allocate no KV beyond
 *    the sequence's positions;
 *  - the workspace reserved for n rows takes tdm_capacity_workspace_bytes;
 *  - the weights mapped and allocated at load are tdm_capacity_weight_bytes;
 *  - tdm_capacity_compute's count is the largest that fits its budget.
 */
#include "capacity.h"
#include "model_config.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TANDEM_DEMO_MODEL
#error "TANDEM_DEMO_MODEL must name models/demo-target"
#endif

/* ---- a backend that counts its memory ---------------------------------- */

#define MAX_LIVE 65536

static tdm_backend *inner;
static struct {
    void *p;
    size_t n;
} live[MAX_LIVE];
static size_t n_live, bytes_live, bytes_mapped;

static void *count_alloc(void *ctx, size_t nbytes)
{
    (void)ctx;
    void *p = inner->alloc(inner->ctx, nbytes);
    CHECK(n_live < MAX_LIVE, "too many live allocations");
    if (p) {
        live[n_live].p = p;
        live[n_live++].n = nbytes;
        bytes_live += nbytes;
    }
    return p;
}

static void count_free(void *ctx, void *p)
{
    (void)ctx;
    if (!p)
        return;
    for (size_t i = 0; i < n_live; i++)
        if (live[i].p == p) {
            bytes_live -= live[i].n;
            live[i] = live[--n_live];
            break;
        }
    inner->free(inner->ctx, p);
}

static const void *count_weight_map(void *ctx, const void *host, size_t nbytes, int *owned)
{
    (void)ctx;
    bytes_mapped += nbytes;
    return inner->weight_map(inner->ctx, host, nbytes, owned);
}

static tdm_backend counting;

static tdm_backend *counting_backend(void)
{
    inner = test_backend();
    counting = *inner;
    counting.alloc = count_alloc;
    counting.free = count_free;
    counting.weight_map = count_weight_map;
    counting.destroy = NULL;
    return &counting;
}

/* ---- checks ------------------------------------------------------------ */

static void check_seq(tdm_model *m, tdm_state_strategy st, int k, int positions)
{
    const tdm_model_config *c = tdm_model_get_config(m);
    tdm_seq_bytes est;
    tdm_capacity_seq_bytes(c, st, k, positions, &est);
    const size_t before = bytes_live;
    tdm_seq_params p = {st, k, positions};
    tdm_seq *s;
    tdm_error err;
    CHECK(tdm_seq_create(m, &p, &s, &err) == TDM_OK, "%s", err.msg);
    const size_t took = bytes_live - before;
    tdm_seq_memory mem;
    tdm_seq_memory_usage(s, &mem);
    const char *name = tdm_state_strategy_name(st);
    CHECK(took == tdm_seq_bytes_total(&est),
          "%s k=%d positions=%d: tdm_seq_create took %zu bytes, the estimate is %zu", name, k,
          positions, took, tdm_seq_bytes_total(&est));
    CHECK(mem.kv_bytes == est.kv && mem.recurrent_bytes == est.recurrent &&
              mem.conv_bytes == est.conv && mem.strategy_bytes == est.strategy,
          "%s k=%d: usage kv %zu rec %zu conv %zu strategy %zu; estimate %zu %zu %zu %zu", name, k,
          mem.kv_bytes, mem.recurrent_bytes, mem.conv_bytes, mem.strategy_bytes, est.kv,
          est.recurrent, est.conv, est.strategy);
    /* Run it to its positions: a prompt, decodes, and a verify block of k
     * drafts that ends exactly at the last position. The KV it holds must
     * not grow. */
    const int prompt = positions - (k + 1) - 3;
    CHECK(prompt >= 1, "positions %d too few for k %d", positions, k);
    int32_t *toks = calloc((size_t)positions, sizeof(int32_t));
    for (int i = 0; i < positions; i++)
        toks[i] = (i * 7 + 3) % c->vocab_size;
    CHECK(tdm_seq_prefill(s, toks, prompt, NULL, &err) == TDM_OK, "%s", err.msg);
    for (int i = 0; i < 3; i++) {
        tdm_seq *one[1] = {s};
        CHECK(tdm_seq_decode(one, 1, toks + prompt + i, NULL, &err) == TDM_OK, "%s", err.msg);
    }
    if (k > 0) {
        tdm_seq *one[1] = {s};
        const int32_t *blk[1] = {toks + prompt + 3};
        int n[1] = {k + 1};
        CHECK(tdm_seq_verify(one, 1, blk, n, NULL, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_commit(s, k / 2, &err) == TDM_OK, "%s", err.msg);
    }
    tdm_seq_memory_usage(s, &mem);
    CHECK(mem.kv_bytes == est.kv, "%s k=%d: after running, KV %zu bytes, estimate %zu", name, k,
          mem.kv_bytes, est.kv);
    free(toks);
    tdm_seq_destroy(s);
    CHECK(bytes_live == before, "%s: %zu bytes left after destroy", name, bytes_live - before);
}

int main(void)
{
    tdm_backend *be = counting_backend();
    tdm_model *m;
    tdm_error err;
    CHECK(tdm_model_load(TANDEM_DEMO_MODEL, be, &m, &err) == TDM_OK, "%s", err.msg);
    tdm_model_config c;
    CHECK(tdm_model_config_load(TANDEM_DEMO_MODEL, &c, &err) == TDM_OK, "%s", err.msg);

    /* Weights: the demo model is bf16; the CPU maps matrices and copies
     * vectors to f32. */
    const size_t weights = bytes_mapped + bytes_live;
    CHECK(weights == tdm_capacity_weight_bytes(&c, 2),
          "weights: %zu bytes mapped and allocated at load, the estimate is %zu", weights,
          tdm_capacity_weight_bytes(&c, 2));

    /* Workspace: reserving n rows on a fresh model takes what the
     * estimate says. */
    const int rows = tdm_capacity_step_rows(5, 8);
    CHECK(rows == 128 && tdm_capacity_step_rows(20, 8) == 180, "step rows %d", rows);
    size_t before = bytes_live;
    CHECK(tdm_model_reserve_workspace(m, 180, &err) == TDM_OK, "%s", err.msg);
    size_t ws = bytes_live - before;
    CHECK(ws == tdm_capacity_workspace_bytes(&c, 180, NULL),
          "workspace of 180 rows: %zu bytes allocated, the estimate is %zu", ws,
          tdm_capacity_workspace_bytes(&c, 180, NULL));

    const tdm_state_strategy all[] = {TDM_STATE_EXTRA_BUFFER, TDM_STATE_NO_BUFFER,
                                      TDM_STATE_REPLAY};
    const int ks[] = {0, 3, 8};
    const int positions[] = {40, 300};
    for (size_t a = 0; a < TDM_ARRAY_LEN(all); a++)
        for (size_t b = 0; b < TDM_ARRAY_LEN(ks); b++)
            for (size_t d = 0; d < TDM_ARRAY_LEN(positions); d++)
                check_seq(m, all[a], ks[b], positions[d]);

    /* The strategies differ as the design says: no_buffer least, then
     * replay, then extra_buffer. */
    tdm_seq_bytes e, n, r;
    tdm_capacity_seq_bytes(&c, TDM_STATE_EXTRA_BUFFER, 8, 1024, &e);
    tdm_capacity_seq_bytes(&c, TDM_STATE_NO_BUFFER, 8, 1024, &n);
    tdm_capacity_seq_bytes(&c, TDM_STATE_REPLAY, 8, 1024, &r);
    CHECK(n.strategy < r.strategy && r.strategy < e.strategy,
          "strategy bytes: no_buffer %zu, replay %zu, extra_buffer %zu", n.strategy, r.strategy,
          e.strategy);

    /* The count: the largest n that fits, and n + 1 does not. */
    tdm_capacity_params p = {.cfg = c,
                             .strategy = TDM_STATE_REPLAY,
                             .max_draft = 8,
                             .max_context = 1024,
                             .matrix_elem_bytes = 2,
                             .budget = 64u << 20};
    tdm_capacity cap;
    tdm_capacity_compute(&p, &cap);
    CHECK(cap.max_sequences > 0, "64 MiB holds no sequence");
    const size_t n_fit =
        cap.weights +
        tdm_capacity_workspace_bytes(&c, tdm_capacity_step_rows(cap.max_sequences, 8), NULL) +
        (size_t)cap.max_sequences * cap.seq_total;
    const size_t n1 =
        cap.weights +
        tdm_capacity_workspace_bytes(&c, tdm_capacity_step_rows(cap.max_sequences + 1, 8), NULL) +
        (size_t)(cap.max_sequences + 1) * cap.seq_total;
    CHECK(n_fit <= p.budget && n1 > p.budget && cap.used == n_fit,
          "max_sequences %d: %zu bytes at n, %zu at n + 1, budget %zu", cap.max_sequences, n_fit,
          n1, p.budget);
    char text[2048];
    tdm_capacity_format(&p, &cap, "# ", text, sizeof(text));
    printf("%s", text);
    CHECK(strstr(text, "max sequences: "), "format: %s", text);
    p.budget = cap.weights; /* nothing left for a sequence */
    tdm_capacity_compute(&p, &cap);
    CHECK(cap.max_sequences == 0, "a budget of the weights alone holds %d", cap.max_sequences);

    tdm_model_destroy(m);
    CHECK(bytes_live == 0, "%zu bytes left after the model", bytes_live);
    inner->destroy(inner);
    printf("engine_capacity: ok\n");
    return 0;
}
