/*
 * test_memory.c - the CUDA backend's device memory (backend.cu: dev_alloc
 * and its pool).
 *  - Memory handed out again after a free reads as zeros, as new memory
 *    does, though the pool gives back the same bytes.
 *  - What the pool keeps from freed buffers counts as free (mem_info), and
 *    goes back to the device when a larger allocation needs it: after
 *    holding and freeing 45 % of the free memory, 80 % can be had.
 *  - An allocation larger than the device is NULL, not an abort, and later
 *    allocations work.
 *  - A sequence created where earlier ones ran (their states dirty in the
 *    pool) computes the bits of the first sequence of the process, through
 *    every state strategy; and creating and destroying sequences does not
 *    grow the memory in use (times printed).
 */
#include "cuda_test.h"
#include "util.h"

#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static size_t free_bytes(tdm_backend *be)
{
    size_t f = 0, t = 0;
    CHECK(be->mem_info(be->ctx, &f, &t) == 0, "mem_info");
    return f;
}

static void check_zeroed_reuse(tdm_backend *be)
{
    const size_t n = 3u << 20;
    unsigned char *dirty = malloc(n);
    CHECK(dirty, "out of memory");
    memset(dirty, 0xAB, n);
    for (int round = 0; round < 4; round++) {
        void *p = be->alloc(be->ctx, n);
        CHECK(p, "alloc of %zu bytes", n);
        unsigned char *got = ct_get(be, p, n);
        size_t nonzero = 0;
        for (size_t i = 0; i < n; i++)
            nonzero += got[i] != 0;
        CHECK(nonzero == 0, "round %d: %zu of %zu bytes of a new allocation are not zero", round,
              nonzero, n);
        free(got);
        be->upload(be->ctx, p, dirty, n);
        be->free(be->ctx, p);
    }
    free(dirty);
    printf("  allocations after a free read as zeros (4 rounds of 3 MiB)\n");
}

static void check_pool_returns(tdm_backend *be)
{
    size_t total = 0, f0 = 0;
    CHECK(be->mem_info(be->ctx, &f0, &total) == 0, "mem_info");
    const size_t a = f0 / 100 * 45, b = f0 / 100 * 80;
    void *p = be->alloc(be->ctx, a);
    CHECK(p, "alloc of 45 %% of the free memory (%zu bytes)", a);
    const size_t held = free_bytes(be);
    CHECK(held + a / 2 < f0, "holding %zu bytes: free %zu of %zu before", a, held, f0);
    be->free(be->ctx, p);
    be->sync(be->ctx);
    const size_t f1 = free_bytes(be);
    CHECK(f1 + (64u << 20) >= f0, "after the free, free memory %zu, %zu before", f1, f0);
    void *q = be->alloc(be->ctx, b);
    CHECK(q, "alloc of 80 %% of the free memory (%zu bytes) after 45 %% was freed", b);
    be->free(be->ctx, q);
    void *big = be->alloc(be->ctx, 2 * total);
    CHECK(!big, "an allocation of twice the device (%zu bytes) is NULL", 2 * total);
    void *small = be->alloc(be->ctx, 1u << 20);
    CHECK(small, "alloc after a refused one");
    be->free(be->ctx, small);
    be->sync(be->ctx);
    printf("  free %.1f GiB of %.1f; held 45 %%: %.1f; freed: %.1f; then 80 %% fits; twice the "
           "device is refused\n",
           f0 / 1073741824.0, total / 1073741824.0, held / 1073741824.0, f1 / 1073741824.0);
}

/* Logits of `n` prompt tokens run through a new sequence of strategy st. */
static float *run_prompt(tdm_model *m, tdm_state_strategy st, const int32_t *toks, int n)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    tdm_seq_params p = {st, 4, 0};
    tdm_seq *s;
    tdm_error err;
    CHECK(tdm_seq_create(m, &p, &s, &err) == TDM_OK, "%s", err.msg);
    float *lg = malloc((size_t)n * V * sizeof(float));
    CHECK(lg, "out of memory");
    CHECK(tdm_seq_prefill(s, toks, n, lg, &err) == TDM_OK, "%s", err.msg);
    /* A verify block and a partial commit, so the per-position states are
     * written too. */
    const int32_t block[4] = {toks[0], toks[1], toks[2], toks[3]};
    const int32_t *b = block;
    const int nb = 4;
    CHECK(tdm_seq_verify(&s, 1, &b, &nb, NULL, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_commit(s, 1, &err) == TDM_OK, "%s", err.msg);
    tdm_seq_destroy(s);
    return lg;
}

static void check_sequences(tdm_backend *be)
{
    fixture f;
    fixture_load(&f, "f32_tied");
    tdm_model *m;
    tdm_error err;
    CHECK(tdm_model_load(f.model, be, &m, &err) == TDM_OK, "%s", err.msg);
    const int V = tdm_model_get_config(m)->vocab_size;
    int32_t toks[48];
    for (int i = 0; i < 48; i++)
        toks[i] = (int32_t)ct_rand(V);
    const tdm_state_strategy sts[3] = {TDM_STATE_EXTRA_BUFFER, TDM_STATE_NO_BUFFER,
                                       TDM_STATE_REPLAY};
    const char *names[3] = {"extra_buffer", "no_buffer", "replay"};
    for (int k = 0; k < 3; k++) {
        float *first = run_prompt(m, sts[k], toks, 6);
        free(run_prompt(m, sts[k], toks + 6, 42)); /* dirties states and KV caches */
        float *again = run_prompt(m, sts[k], toks, 6);
        CHECK(memcmp(first, again, (size_t)6 * V * sizeof(float)) == 0,
              "%s: a sequence on reused memory computes other logits than the first", names[k]);
        free(first);
        free(again);
    }
    be->sync(be->ctx);
    const size_t f0 = free_bytes(be);
    tdm_seq_params p = {TDM_STATE_EXTRA_BUFFER, 4, 512};
    const int N = 50;
    double create_ms = 0, destroy_ms = 0;
    for (int i = 0; i < N; i++) {
        tdm_seq *s;
        double t0 = now_ms();
        CHECK(tdm_seq_create(m, &p, &s, &err) == TDM_OK, "%s", err.msg);
        be->sync(be->ctx);
        double t1 = now_ms();
        tdm_seq_destroy(s);
        be->sync(be->ctx);
        create_ms += t1 - t0;
        destroy_ms += now_ms() - t1;
    }
    const size_t f1 = free_bytes(be);
    CHECK(f1 + (16u << 20) >= f0, "%d sequences created and destroyed: free %zu, %zu before", N, f1,
          f0);
    printf("  sequences on reused memory compute the first one's bits (3 strategies); a sequence "
           "of 512 positions: create %.3f ms, destroy %.3f ms (mean of %d)\n",
           create_ms / N, destroy_ms / N, N);
    tdm_model_destroy(m);
    fixture_free(&f);
}

int main(void)
{
    ct_require_gpu();
    tdm_backend *be = ct_gpu();
    check_zeroed_reuse(be);
    check_sequences(be);
    check_pool_returns(be);
    be->destroy(be);
    printf("cuda memory: reuse, return and refusal as documented\n");
    return 0;
}
