/* steps.c - see steps.h. */
#include "steps.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per thread: the ranks of a split model run the script side by side. */
static _Thread_local uint64_t steps_rng;

static int32_t tok(int V)
{
    steps_rng ^= steps_rng << 13;
    steps_rng ^= steps_rng >> 7;
    steps_rng ^= steps_rng << 17;
    return (int32_t)(steps_rng % (uint64_t)V);
}

/* Logits of one call, in the model's host memory like the services'. */
static float *lbuf(tdm_model *m, int rows)
{
    const size_t V = (size_t)tdm_model_get_config(m)->vocab_size;
    float *p = tdm_model_host_alloc(m, (size_t)rows * V * sizeof(float));
    CHECK(p, "host_alloc of logits for %d rows failed", rows);
    return p;
}

static void keep(tdm_model *m, steps_run *r, float *lg, int rows)
{
    const size_t n = (size_t)rows * (size_t)tdm_model_get_config(m)->vocab_size;
    if (r->n + n > r->cap) {
        r->cap = 2 * (r->n + n);
        r->logits = realloc(r->logits, r->cap * sizeof(float));
        CHECK(r->logits, "out of memory");
    }
    memcpy(r->logits + r->n, lg, n * sizeof(float));
    r->n += n;
    r->calls++;
    tdm_model_host_free(m, lg);
}

/* A row of draft ids kept like logits: drafts[0][0..k[0]), then
 * drafts[1][0..k[1]), ..., then -1 to the row's end. */
static void id_row(float *row, int V, const int32_t *const *drafts, const int *k, int n)
{
    int x = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k[i]; j++)
            row[x++] = (float)drafts[i][j];
    while (x < V)
        row[x++] = -1.0f;
}

static _Thread_local tdm_error err;

#define OK(call) CHECK((call) == TDM_OK, "%s: %s", #call, err.msg)

void steps_run_script(tdm_model *m, steps_run *r)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    memset(r, 0, sizeof(*r));
    steps_rng = 0x2545f4914f6cdd1dull;
    /* A, B: extra_buffer; C: no_buffer; D: replay. */
    for (int i = 0; i < STEPS_NSEQ; i++) {
        tdm_seq_params p = {i == 2   ? TDM_STATE_NO_BUFFER
                            : i == 3 ? TDM_STATE_REPLAY
                                     : TDM_STATE_EXTRA_BUFFER,
                            4, 0};
        OK(tdm_seq_create(m, &p, &r->seqs[i], &err));
    }
    tdm_seq *A = r->seqs[0], *B = r->seqs[1], *C = r->seqs[2], *D = r->seqs[3];

    /* Prompts: with logits, and one of two chunks (128 + 2) without. */
    const int plen[STEPS_NSEQ] = {20, 33, 7, 130};
    int32_t prompt[130];
    for (int i = 0; i < STEPS_NSEQ; i++) {
        for (int j = 0; j < plen[i]; j++)
            prompt[j] = tok(V);
        if (i == 3) {
            OK(tdm_seq_prefill(r->seqs[i], prompt, plen[i], NULL, &err));
            continue;
        }
        float *lg = lbuf(m, plen[i]);
        OK(tdm_seq_prefill(r->seqs[i], prompt, plen[i], lg, &err));
        keep(m, r, lg, plen[i]);
    }

    /* Decode rounds; A crosses 64 positions (KV growth) on the way, and the
     * batches change members and order between rounds of the same size. */
    for (int round = 0; round < 50; round++) {
        tdm_seq *abc[] = {A, B, C}, *ca[] = {C, A}, *bacd[] = {B, A, C, D}, *ac[] = {A, C};
        tdm_seq **b = round % 4 == 0 ? abc : round % 4 == 1 ? ca : round % 4 == 2 ? bacd : ac;
        const int n = round % 4 == 0 ? 3 : round % 4 == 2 ? 4 : 2;
        int32_t t[4];
        for (int i = 0; i < n; i++)
            t[i] = tok(V);
        float *lg = lbuf(m, n);
        OK(tdm_seq_decode(b, n, t, lg, &err));
        keep(m, r, lg, n);
    }

    /* Verifier rounds: A (extra_buffer) and C (no_buffer) verify 1 + k
     * tokens beside a decode row of B, then commit a varying prefix (C
     * recomputes it on a partial accept). */
    for (int round = 0; round < 12; round++) {
        const int k = 1 + round % 4;
        int32_t ta[5], tb[1], tc[5];
        for (int j = 0; j <= k; j++) {
            ta[j] = tok(V);
            tc[j] = tok(V);
        }
        tb[0] = tok(V);
        tdm_seq *b[] = {A, B, C};
        const int32_t *tp[] = {ta, tb, tc};
        const int nt[] = {k + 1, 1, k + 1};
        float *lg = lbuf(m, 2 * k + 3);
        OK(tdm_seq_step(b, 3, tp, nt, lg, &err));
        keep(m, r, lg, 2 * k + 3);
        OK(tdm_seq_commit(A, round % (k + 1), &err));
        OK(tdm_seq_commit(C, (round + 1) % (k + 1), &err));
    }

    /* Drafter rounds: D (replay) and B draft one token at a time (appended
     * verify rows), then roll back to an accepted prefix. */
    for (int round = 0; round < 3; round++) {
        for (int j = 0; j < 3; j++) {
            tdm_seq *b[] = {D, B};
            int32_t t[2] = {tok(V), tok(V)};
            const int32_t *tp[] = {&t[0], &t[1]};
            const int one[] = {1, 1};
            float *lg = lbuf(m, 2);
            OK(tdm_seq_verify(b, 2, tp, one, lg, &err));
            keep(m, r, lg, 2);
        }
        OK(tdm_seq_commit(D, round % 3, &err));
        OK(tdm_seq_commit(B, 2 - round % 3, &err));
    }

    /* Drafting on the device (tdm_seq_draft): D (replay) drafts 3 after 2
     * lead tokens and B (extra_buffer) 2 after 1, their own argmaxes fed
     * back, then both roll back; three rounds of one shape (a graph's
     * first, second and third sight), then one with forced proposals. The
     * drafts are kept as a row of their ids. */
    for (int round = 0; round < 4; round++) {
        tdm_seq *b[] = {D, B};
        int32_t ld[2] = {tok(V), tok(V)}, lb[1] = {tok(V)}, fd[3], fb[2];
        for (int j = 0; j < 3; j++)
            fd[j] = tok(V);
        for (int j = 0; j < 2; j++)
            fb[j] = tok(V);
        const int32_t *lead[] = {ld, lb}, *forced[] = {fd, fb};
        const int nlead[] = {2, 1}, k[] = {3, 2};
        int32_t dd[3], db[2];
        int32_t *const drafts[] = {dd, db};
        OK(tdm_seq_draft(b, 2, lead, nlead, k, round == 3 ? forced : NULL, drafts, &err));
        float *lg = lbuf(m, 1);
        id_row(lg, V, (const int32_t *const *)drafts, k, 2);
        keep(m, r, lg, 1);
        OK(tdm_seq_commit(D, round % 4, &err));
        OK(tdm_seq_commit(B, (round + 1) % 2, &err));
    }

    /* Sampled drafting (tdm_seq_draft_sampled): D draws 3 drafts under
     * top-k 5 at temperature 0.9 beside B's 2 greedy ones in one call (a
     * graph's first and second sight), then both roll back. D's drafts'
     * distributions are kept, and a row of every draft's id. */
    for (int round = 0; round < 2; round++) {
        tdm_seq *b[] = {D, B};
        int32_t ld[1] = {tok(V)}, lb[1] = {tok(V)};
        const int32_t *lead[] = {ld, lb};
        const int nlead[] = {1, 1}, k[] = {3, 2};
        int32_t dd[3], db[2];
        int32_t *const drafts[] = {dd, db};
        const double u[3] = {0.1 + 0.6 * round, 0.5, 0.93};
        float *lg = lbuf(m, 4);
        const tdm_draft_sampling ds = {0.9f, 0.0f, 5, u, lg};
        const tdm_draft_sampling *sp[] = {&ds, NULL};
        OK(tdm_seq_draft_sampled(b, 2, lead, nlead, k, sp, drafts, &err));
        id_row(lg + 3 * (size_t)V, V, (const int32_t *const *)drafts, k, 2);
        keep(m, r, lg, 4);
        OK(tdm_seq_commit(D, round, &err));
        OK(tdm_seq_commit(B, round - 1, &err));
    }

    /* A block drafted ahead of its verdict: a second chain on top of the
     * first one's pending rows (its lead the first chain's last draft),
     * then commits that keep some of the rows, or none (the ahead block's
     * first draft and the block's own rejected). */
    for (int round = 0; round < 3; round++) {
        tdm_seq *b[] = {D, B};
        int32_t ld[1] = {tok(V)}, lb[1] = {tok(V)};
        const int32_t *lead[] = {ld, lb};
        const int nlead[] = {1, 1}, k[] = {2, 2};
        int32_t dd[2], db[2], ad[2], ab[2];
        int32_t *const drafts[] = {dd, db}, *const ahead[] = {ad, ab};
        OK(tdm_seq_draft(b, 2, lead, nlead, k, NULL, drafts, &err));
        const int32_t *lead2[] = {&dd[1], &db[1]};
        OK(tdm_seq_draft(b, 2, lead2, nlead, k, NULL, ahead, &err));
        float *lg = lbuf(m, 1);
        const int32_t *all[] = {dd, db, ad, ab};
        const int two[] = {2, 2, 2, 2};
        id_row(lg, V, all, two, 4);
        keep(m, r, lg, 1);
        OK(tdm_seq_commit(D, round - 1, &err));
        OK(tdm_seq_commit(B, (round * 2 + 1) % 4, &err));
    }

    /* All four decode, twice. */
    for (int round = 0; round < 2; round++) {
        int32_t t[4] = {tok(V), tok(V), tok(V), tok(V)};
        float *lg = lbuf(m, 4);
        OK(tdm_seq_decode(r->seqs, 4, t, lg, &err));
        keep(m, r, lg, 4);
    }
}

void steps_run_free(steps_run *r)
{
    for (int i = 0; i < STEPS_NSEQ; i++)
        tdm_seq_destroy(r->seqs[i]);
    free(r->logits);
    memset(r, 0, sizeof(*r));
}

/* n bytes of a sequence's backend memory, to the host (malloc). */
static void *fetch(const tdm_seq *s, const void *dev, size_t n)
{
    tdm_backend *be = s->m->be;
    void *h = malloc(n ? n : 1);
    CHECK(h, "out of memory");
    be->download(be->ctx, h, dev, n);
    return h;
}

static int same_bytes(const tdm_seq *a, const void *da, const tdm_seq *b, const void *db, size_t n)
{
    void *ha = fetch(a, da, n), *hb = fetch(b, db, n);
    const int same = memcmp(ha, hb, n) == 0;
    free(ha);
    free(hb);
    return same;
}

int steps_same_state(const tdm_seq *a, const tdm_seq *b)
{
    const tdm_model *m = a->m;
    const tdm_model_config *c = &m->cfg;
    if (a->n_past != b->n_past || a->pending || b->pending)
        return 0;
    const size_t conv = (size_t)(c->conv_kernel - 1) * (size_t)m->conv_dim * sizeof(float);
    const size_t rec =
        (size_t)c->lin_v_heads * (size_t)c->lin_k_dim * (size_t)c->lin_v_dim * sizeof(float);
    const size_t kv =
        (size_t)a->n_past * (size_t)c->num_kv_heads * (size_t)c->head_dim * sizeof(float);
    for (int L = 0; L < c->num_layers; L++) {
        if (a->conv[L] && (!same_bytes(a, a->conv[L], b, b->conv[L], conv) ||
                           !same_bytes(a, a->rec[L], b, b->rec[L], rec)))
            return 0;
        if (a->k[L] &&
            (!same_bytes(a, a->k[L], b, b->k[L], kv) || !same_bytes(a, a->v[L], b, b->v[L], kv)))
            return 0;
    }
    return 1;
}
