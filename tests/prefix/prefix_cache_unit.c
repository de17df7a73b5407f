/*
 * prefix_cache_unit.c - the prefix-state cache (engine/prefix_cache.h) on
 * its own and on a model:
 *  - the hash chain: a prefix matches block by block, a different token in
 *    block i stops the match before i, a match never passes max_tokens;
 *  - collision safety: with a hash that maps every block to one key, each
 *    lookup still returns only the entries whose every token matches;
 *  - the budget and LRU: the cache never holds more than its budget; the
 *    least recently used leaf goes first, a used chain stays, a parent is
 *    never evicted before its children, an entry larger than the budget is
 *    refused, a block whose parent is gone is refused;
 *  - states: a sequence restored from the cache at a block boundary and run
 *    on gives the logits of a sequence that prefilled everything, to the
 *    bit, under every state strategy, also from states taken inside a
 *    verified block before its commit (extra_buffer, replay; no_buffer
 *    refuses them);
 *  - between replicas: a cache's prefix exported as chunks
 *    (engine/snapshot.h's wire format, a prefix layout) and assembled and
 *    imported into another cache restores the same logits; a corrupt chunk,
 *    another block size, a sequence's assembler and a payload not checked
 *    against its SHA-256 are refused.
 */
#include "capacity.h"
#include "prefix_cache.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 4

static void *blob(size_t n)
{
    void *p = malloc(n ? n : 1);
    memset(p, 0xab, n);
    return p;
}

static const size_t ENTRY_OVERHEAD_MAX = 256; /* the entry's struct and tokens, generously */

static void test_chain(void)
{
    tdm_prefix_params p = {.block = B, .budget = 1 << 20};
    tdm_prefix_cache *c = tdm_prefix_cache_create(&p);
    int32_t a[16], b[16];
    for (int i = 0; i < 16; i++)
        a[i] = b[i] = 100 + i;
    b[9] = 7; /* b differs from a in block 3 */
    CHECK(tdm_prefix_cache_match(c, a, 16, NULL) == 0, "an empty cache matches nothing");
    CHECK(tdm_prefix_cache_insert(c, a, 8, blob(10), 10) == TDM_PREFIX_PUT_NO_PARENT,
          "block 2 without block 1 is refused");
    for (int end = B; end <= 16; end += B)
        CHECK(tdm_prefix_cache_insert(c, a, end, blob(10), 10) == TDM_PREFIX_PUT_STORED,
              "block ending at %d stored", end);
    CHECK(tdm_prefix_cache_insert(c, a, 8, blob(10), 10) == TDM_PREFIX_PUT_PRESENT,
          "stored twice is present");
    CHECK(tdm_prefix_cache_match(c, a, 16, NULL) == 16, "the whole chain matches");
    CHECK(tdm_prefix_cache_match(c, a, 15, NULL) == 12, "a match stays within max_tokens");
    CHECK(tdm_prefix_cache_match(c, a, 3, NULL) == 0, "less than a block matches nothing");
    CHECK(tdm_prefix_cache_match(c, b, 16, NULL) == 8, "a different token in block 3 stops there");
    CHECK(tdm_prefix_cache_contains(c, a, 12) && !tdm_prefix_cache_contains(c, b, 12),
          "contains follows the tokens");
    /* b's own blocks 3 and 4 hang off the shared first two. */
    CHECK(tdm_prefix_cache_insert(c, b, 12, blob(10), 10) == TDM_PREFIX_PUT_STORED, "b block 3");
    CHECK(tdm_prefix_cache_match(c, b, 16, NULL) == 12, "b matches its own block 3");
    const void *pl[4];
    CHECK(tdm_prefix_cache_match(c, a, 16, pl) == 16 && pl[0] && pl[3], "payloads given");
    tdm_prefix_stats st;
    tdm_prefix_cache_stats(c, &st);
    CHECK(st.entries == 5 && st.inserted == 5 && st.refused == 1 && st.evictions == 0,
          "stats: %llu entries, %llu inserted, %llu refused", (unsigned long long)st.entries,
          (unsigned long long)st.inserted, (unsigned long long)st.refused);
    tdm_prefix_cache_destroy(c);
}

static uint64_t one_key(uint64_t parent, const int32_t *tokens, int n)
{
    (void)parent;
    (void)tokens;
    (void)n;
    return 42;
}

static void test_collisions(void)
{
    tdm_prefix_params p = {.block = B, .budget = 1 << 20, .hash = one_key};
    tdm_prefix_cache *c = tdm_prefix_cache_create(&p);
    int32_t x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {1, 2, 3, 4, 5, 6, 7, 9},
            z[8] = {9, 2, 3, 4, 5, 6, 7, 8}, w[8] = {5, 6, 7, 8, 1, 2, 3, 4};
    int *tag[3];
    int32_t *seqs[3] = {x, y, z};
    for (int i = 0; i < 3; i++) {
        tdm_prefix_cache_insert(c, seqs[i], 4, blob(8), 8);
        tag[i] = malloc(sizeof(int));
        *tag[i] = i;
        CHECK(tdm_prefix_cache_insert(c, seqs[i], 8, tag[i], sizeof(int)) == TDM_PREFIX_PUT_STORED,
              "colliding block %d stored", i);
    }
    for (int i = 0; i < 3; i++) {
        const void *pl[2];
        CHECK(tdm_prefix_cache_match(c, seqs[i], 8, pl) == 8, "sequence %d matches in full", i);
        CHECK(*(const int *)pl[1] == i, "sequence %d gets its own block 2 despite one key", i);
    }
    /* w's second block equals x's first: same key, same tokens, but another
     * parent: not a match. */
    CHECK(tdm_prefix_cache_match(c, w, 8, NULL) == 0, "a block under another parent is no match");
    tdm_prefix_cache_destroy(c);
}

static void test_budget_lru(void)
{
    const size_t pay = 1000;
    /* Room for 5 entries, not 6. */
    const size_t budget = 5 * (pay + B * sizeof(int32_t)) + 5 * ENTRY_OVERHEAD_MAX / 2;
    tdm_prefix_params p = {.block = B, .budget = budget};
    tdm_prefix_cache *c = tdm_prefix_cache_create(&p);
    int32_t t[6][2 * B];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 2 * B; j++)
            t[i][j] = 1000 * i + j;
    /* A chain of two blocks (0) and three single blocks (1..3). */
    tdm_prefix_cache_insert(c, t[0], B, blob(pay), pay);
    tdm_prefix_cache_insert(c, t[0], 2 * B, blob(pay), pay);
    for (int i = 1; i <= 3; i++)
        tdm_prefix_cache_insert(c, t[i], B, blob(pay), pay);
    tdm_prefix_stats st;
    tdm_prefix_cache_stats(c, &st);
    CHECK(st.entries == 5 && st.evictions == 0 && st.bytes <= budget, "5 entries fit (%llu)",
          (unsigned long long)st.entries);
    /* Use chain 0 (its root is the oldest entry) and block 2. */
    CHECK(tdm_prefix_cache_match(c, t[0], 2 * B, NULL) == 2 * B, "chain 0 matches");
    CHECK(tdm_prefix_cache_match(c, t[2], B, NULL) == B, "block 2 matches");
    /* A sixth entry evicts the least recently used leaf: block 1. */
    CHECK(tdm_prefix_cache_insert(c, t[4], B, blob(pay), pay) == TDM_PREFIX_PUT_STORED, "4");
    tdm_prefix_cache_stats(c, &st);
    CHECK(st.evictions == 1 && st.bytes <= budget, "one eviction (%llu)",
          (unsigned long long)st.evictions);
    CHECK(tdm_prefix_cache_match(c, t[1], B, NULL) == 0, "block 1 (LRU) evicted");
    CHECK(tdm_prefix_cache_match(c, t[3], B, NULL) == B, "block 3 kept");
    CHECK(tdm_prefix_cache_match(c, t[0], 2 * B, NULL) == 2 * B, "chain 0 kept");
    /* Now the LRU entry is block 2; then chain 0's root is older than its
     * leaf only by use order, but a parent never goes before its child. */
    CHECK(tdm_prefix_cache_insert(c, t[5], B, blob(pay), pay) == TDM_PREFIX_PUT_STORED, "5");
    CHECK(tdm_prefix_cache_match(c, t[2], B, NULL) == 0, "block 2 (LRU) evicted");
    /* Fill with new blocks until chain 0 has to go: its leaf first. */
    for (int round = 0; round < 6; round++) {
        int32_t n[B] = {50000 + round, 1, 2, 3};
        tdm_prefix_cache_insert(c, n, B, blob(pay), pay);
        tdm_prefix_cache_stats(c, &st);
        CHECK(st.bytes <= budget, "within the budget after insert %d", round);
        const int m = tdm_prefix_cache_match(c, t[0], 2 * B, NULL);
        CHECK(m == 2 * B || m == B || m == 0, "chain 0 matches %d", m);
        /* Undo the match's touch: compare with contains, which does not. */
        CHECK(
            !(tdm_prefix_cache_contains(c, t[0], 2 * B) && !tdm_prefix_cache_contains(c, t[0], B)),
            "a child never outlives its parent");
    }
    /* Larger than the whole budget. */
    int32_t big[B] = {7, 7, 7, 7};
    CHECK(tdm_prefix_cache_insert(c, big, B, blob(budget), budget) == TDM_PREFIX_PUT_OVER_BUDGET,
          "an entry over the budget is refused");
    CHECK(tdm_prefix_cache_match(c, big, B, NULL) == 0, "and not stored");
    tdm_prefix_cache_destroy(c);
}

/* A sequence restored from the cache continues with the bits of one that
 * prefilled everything. */
static void test_states(tdm_model *m, tdm_state_strategy strat)
{
    const int V = tdm_model_get_config(m)->vocab_size, blk = 8, n = 29;
    int32_t toks[40];
    for (int i = 0; i < 40; i++)
        toks[i] = (i * 7919 + 13) % V;
    tdm_error err = {0};
    tdm_seq_params sp = {.strategy = strat, .max_draft = 4};
    tdm_prefix_params pp = {.block = blk, .budget = 64u << 20};
    tdm_prefix_cache *c = tdm_prefix_cache_create(&pp);

    /* The reference: prefill n tokens at once, logits of every position. */
    float *ref = malloc((size_t)n * V * sizeof(float)),
          *got = malloc((size_t)n * V * sizeof(float));
    tdm_seq *a = NULL;
    CHECK(tdm_seq_create(m, &sp, &a, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(a, toks, n, ref, &err) == TDM_OK, "%s", err.msg);

    /* Filling the cache: prefill a block at a time, storing each boundary. */
    tdm_seq *f = NULL;
    CHECK(tdm_seq_create(m, &sp, &f, &err) == TDM_OK, "%s", err.msg);
    for (int at = 0; at + blk <= n; at += blk) {
        CHECK(tdm_seq_prefill(f, toks + at, blk, NULL, &err) == TDM_OK, "%s", err.msg);
        tdm_prefix_put res;
        CHECK(tdm_prefix_cache_put_seq(c, f, toks, &res, &err) == TDM_OK, "%s", err.msg);
        CHECK(res == TDM_PREFIX_PUT_STORED, "block ending at %d stored (%d)", at + blk, res);
    }
    tdm_seq_destroy(f);

    /* Restored at every boundary up to max_tokens, then the rest. */
    for (int max = 1; max <= n; max += 5) {
        tdm_seq *h = NULL;
        int covered = -1;
        CHECK(tdm_prefix_cache_get_seq(c, m, &sp, toks, max, &h, &covered, &err) == TDM_OK, "%s",
              err.msg);
        CHECK(covered == max / blk * blk, "max %d covers %d", max, covered);
        if (covered == 0) {
            CHECK(h == NULL, "no sequence without a hit");
            continue;
        }
        CHECK(tdm_seq_length(h) == covered, "restored length %d", tdm_seq_length(h));
        CHECK(tdm_seq_prefill(h, toks + covered, n - covered, got, &err) == TDM_OK, "%s", err.msg);
        CHECK(memcmp(got, ref + (size_t)covered * V, (size_t)(n - covered) * V * sizeof(float)) ==
                  0,
              "%s: logits after a hit at %d are those of a full prefill",
              tdm_state_strategy_name(strat), covered);
        /* And a decode step after it. */
        float la[4096], lb[4096];
        CHECK(V <= 4096, "vocab");
        tdm_seq *a2 = NULL;
        CHECK(tdm_seq_fork(a, &a2, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_decode(&a2, 1, &toks[n], la, &err) == TDM_OK, "%s", err.msg);
        CHECK(tdm_seq_decode(&h, 1, &toks[n], lb, &err) == TDM_OK, "%s", err.msg);
        CHECK(memcmp(la, lb, (size_t)V * sizeof(float)) == 0, "decode after a hit");
        tdm_seq_destroy(a2);
        tdm_seq_destroy(h);
    }
    tdm_seq_destroy(a);
    free(ref);
    free(got);
    tdm_prefix_cache_destroy(c);
}

/* States taken inside a verified block (before its commit) are those a
 * prefill reaches at the same boundary: a sequence restored from them
 * continues with the bits of a full prefill. no_buffer cannot give them. */
static void test_pending(tdm_model *m, tdm_state_strategy strat)
{
    const int V = tdm_model_get_config(m)->vocab_size, blk = 8, n = 29;
    int32_t toks[40];
    for (int i = 0; i < 40; i++)
        toks[i] = (i * 104729 + 7) % V;
    tdm_error err = {0};
    tdm_seq_params sp = {.strategy = strat, .max_draft = 11};
    tdm_prefix_params pp = {.block = blk, .budget = 64u << 20};
    tdm_prefix_cache *c = tdm_prefix_cache_create(&pp);
    float *ref = malloc((size_t)n * V * sizeof(float)),
          *got = malloc((size_t)n * V * sizeof(float));
    float *vl = malloc((size_t)12 * V * sizeof(float));
    tdm_seq *a = NULL, *f = NULL;
    CHECK(tdm_seq_create(m, &sp, &a, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(a, toks, n, ref, &err) == TDM_OK, "%s", err.msg);

    /* 8 prefilled and stored, 5 more, then a verify of 12 rows (positions
     * 13..24) holding the boundaries 16 (row 2) and 24 (row 10). */
    CHECK(tdm_seq_create(m, &sp, &f, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(f, toks, blk, NULL, &err) == TDM_OK, "%s", err.msg);
    tdm_prefix_put res;
    CHECK(tdm_prefix_cache_put_seq(c, f, toks, &res, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(f, toks + blk, 5, NULL, &err) == TDM_OK, "%s", err.msg);
    const int32_t *vt = toks + 13;
    const int nv = 12;
    CHECK(tdm_seq_verify(&f, 1, &vt, &nv, vl, &err) == TDM_OK, "%s", err.msg);
    const int rows[2] = {2, 10};
    for (int i = 0; i < 2; i++) {
        tdm_status rc = tdm_prefix_cache_put_pending(c, f, toks, rows[i], &res, &err);
        if (strat == TDM_STATE_NO_BUFFER) {
            CHECK(rc == TDM_ERR_FAILED_PRECONDITION, "no_buffer refuses a state inside a block");
            continue;
        }
        CHECK(rc == TDM_OK && res == TDM_PREFIX_PUT_STORED, "row %d stored: %s (%d)", rows[i],
              err.msg, res);
    }
    CHECK(tdm_seq_commit(f, 6, &err) == TDM_OK, "%s", err.msg);
    tdm_seq_destroy(f);
    tdm_seq *h = NULL;
    int covered = 0;
    CHECK(tdm_prefix_cache_get_seq(c, m, &sp, toks, n, &h, &covered, &err) == TDM_OK, "%s",
          err.msg);
    const int want = strat == TDM_STATE_NO_BUFFER ? blk : 24;
    CHECK(covered == want, "%s: covers %d, want %d", tdm_state_strategy_name(strat), covered, want);
    CHECK(tdm_seq_prefill(h, toks + covered, n - covered, got, &err) == TDM_OK, "%s", err.msg);
    CHECK(memcmp(got, ref + (size_t)covered * V, (size_t)(n - covered) * V * sizeof(float)) == 0,
          "%s: logits after a hit on states from a verified block are a full prefill's",
          tdm_state_strategy_name(strat));
    tdm_seq_destroy(h);
    tdm_seq_destroy(a);
    free(ref);
    free(got);
    free(vl);
    tdm_prefix_cache_destroy(c);
}

/* Feeds an assembler the chunks of (layout, payload), chunk_bytes each,
 * flipping a byte of data chunk `corrupt` (0: none). Returns the first
 * refusal, else the finish's result (*l, *pl moved out). */
static tdm_status send_chunks(tdm_snap_asm *a, const tdm_snap_layout *layout,
                              const uint8_t *payload, uint32_t chunk_bytes, uint32_t corrupt,
                              tdm_snap_layout *l, uint8_t **pl, tdm_error *err)
{
    const size_t nt = layout->n_tensors;
    Tandem__V1__SnapshotTensor *pt = calloc(nt + 1, sizeof(*pt));
    Tandem__V1__SnapshotTensor **pp = calloc(nt + 1, sizeof(*pp));
    uint64_t(*shapes)[3] = calloc(nt + 1, sizeof(*shapes));
    Tandem__V1__SnapshotLayout lp;
    tdm_snap_layout_to_proto(layout, &lp, pt, pp, shapes);
    const uint32_t n = tdm_snap_chunk_count(layout->total_bytes, chunk_bytes);
    uint8_t *scratch = malloc(chunk_bytes);
    tdm_status rc = TDM_OK;
    for (uint32_t i = 0; i < n && rc == TDM_OK; i++) {
        Tandem__V1__SnapshotChunk c = TANDEM__V1__SNAPSHOT_CHUNK__INIT;
        c.snapshot_id = "test";
        c.index = i;
        c.last = i == n - 1;
        if (i == 0) {
            c.layout = &lp;
        } else {
            const uint64_t off = (uint64_t)(i - 1) * chunk_bytes, left = layout->total_bytes - off;
            c.offset = off;
            c.data.len = (size_t)(left < chunk_bytes ? left : chunk_bytes);
            c.crc32c = tdm_crc32c(0, payload + off, c.data.len);
            memcpy(scratch, payload + off, c.data.len);
            if (i == corrupt)
                scratch[c.data.len / 2] ^= 0x10;
            c.data.data = scratch;
        }
        rc = tdm_snap_asm_add(a, &c, err);
    }
    if (rc == TDM_OK)
        rc = tdm_snap_asm_finish(a, l, pl, err);
    free(scratch);
    free(pt);
    free(pp);
    free(shapes);
    return rc;
}

/* A prefix moved from one cache to another as chunks restores the state a
 * full prefill reaches. */
static void test_between_caches(tdm_model *m)
{
    const tdm_model_config *cfg = tdm_model_get_config(m);
    const int V = cfg->vocab_size, blk = 8, n = 29;
    int32_t toks[40];
    for (int i = 0; i < 40; i++)
        toks[i] = (i * 6151 + 3) % V;
    tdm_error err = {0};
    tdm_seq_params sp = {.strategy = TDM_STATE_EXTRA_BUFFER, .max_draft = 4};
    tdm_prefix_params pp = {.block = blk, .budget = 64u << 20};
    tdm_prefix_cache *src = tdm_prefix_cache_create(&pp), *dst = tdm_prefix_cache_create(&pp);
    float *ref = malloc((size_t)n * V * sizeof(float)),
          *got = malloc((size_t)n * V * sizeof(float));
    tdm_seq *a = NULL, *f = NULL;
    CHECK(tdm_seq_create(m, &sp, &a, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_prefill(a, toks, n, ref, &err) == TDM_OK, "%s", err.msg);
    CHECK(tdm_seq_create(m, &sp, &f, &err) == TDM_OK, "%s", err.msg);
    for (int at = 0; at + blk <= n; at += blk) {
        CHECK(tdm_seq_prefill(f, toks + at, blk, NULL, &err) == TDM_OK, "%s", err.msg);
        tdm_prefix_put res;
        CHECK(tdm_prefix_cache_put_seq(src, f, toks, &res, &err) == TDM_OK, "%s", err.msg);
    }
    tdm_seq_destroy(f);

    tdm_snap_layout x, l;
    uint8_t *payload = NULL, *pl = NULL;
    CHECK(tdm_prefix_cache_export(src, cfg, "fp", toks, 7, &x, &payload, &err) == TDM_OK &&
              x.committed == 0 && payload == NULL,
          "less than a block exports nothing");
    CHECK(tdm_prefix_cache_export(src, cfg, "fp", toks, n, &x, &payload, &err) == TDM_OK, "%s",
          err.msg);
    CHECK(x.committed == 24 && x.prefix_block == (uint32_t)blk, "exports 24 (%u)", x.committed);
    CHECK(x.total_bytes == 3 * tdm_capacity_prefix_block_bytes(cfg, blk), "3 blocks of bytes");
    tdm_snap_seal(&x, payload);

    /* Refusals: a corrupt chunk, another block size, a sequence's
     * assembler, another model. */
    const uint32_t max = (uint32_t)cfg->max_position_embeddings;
    tdm_snap_asm *as = tdm_snap_asm_create_prefix(cfg, "fp", max, (uint32_t)blk);
    CHECK(send_chunks(as, &x, payload, 4096, 2, &l, &pl, &err) == TDM_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "crc32c"),
          "a corrupt chunk is refused: %s", err.msg);
    tdm_snap_asm_destroy(as);
    as = tdm_snap_asm_create_prefix(cfg, "fp", max, 16);
    CHECK(send_chunks(as, &x, payload, 4096, 0, &l, &pl, &err) == TDM_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "prefix_block"),
          "another block size is refused: %s", err.msg);
    tdm_snap_asm_destroy(as);
    as = tdm_snap_asm_create(cfg, "fp", max);
    CHECK(send_chunks(as, &x, payload, 4096, 0, &l, &pl, &err) == TDM_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "prefix_block"),
          "a sequence's assembler refuses a prefix: %s", err.msg);
    tdm_snap_asm_destroy(as);
    as = tdm_snap_asm_create_prefix(cfg, "other", max, (uint32_t)blk);
    CHECK(send_chunks(as, &x, payload, 4096, 0, &l, &pl, &err) == TDM_ERR_FAILED_PRECONDITION &&
              strstr(err.msg, "model_fingerprint"),
          "another model's prefix is refused: %s", err.msg);
    tdm_snap_asm_destroy(as);
    CHECK(tdm_prefix_cache_import(dst, cfg, &x, payload, &(int){0}, &(int){0}, &err) ==
              TDM_ERR_INVALID_ARGUMENT,
          "an unchecked payload is refused");
    tdm_seq *h = NULL;
    CHECK(tdm_seq_from_snapshot(m, &sp, "fp", &x, payload, &h, &err) ==
                  TDM_ERR_FAILED_PRECONDITION &&
              !h,
          "a prefix is no sequence snapshot");

    /* The good stream, then the import and a hit on it. */
    as = tdm_snap_asm_create_prefix(cfg, "fp", max, (uint32_t)blk);
    CHECK(send_chunks(as, &x, payload, 4096, 0, &l, &pl, &err) == TDM_OK, "%s", err.msg);
    tdm_snap_asm_destroy(as);
    int stored = 0, covered = 0;
    CHECK(tdm_prefix_cache_import(dst, cfg, &l, pl, &stored, &covered, &err) == TDM_OK, "%s",
          err.msg);
    CHECK(stored == 3 && covered == 24, "3 blocks stored (%d), 24 covered (%d)", stored, covered);
    CHECK(tdm_prefix_cache_import(dst, cfg, &l, pl, &stored, &covered, &err) == TDM_OK &&
              stored == 0 && covered == 24,
          "importing again stores nothing");
    CHECK(tdm_prefix_cache_get_seq(dst, m, &sp, toks, n, &h, &covered, &err) == TDM_OK &&
              covered == 24,
          "a hit on the imported prefix: %s", err.msg);
    CHECK(tdm_seq_prefill(h, toks + covered, n - covered, got, &err) == TDM_OK, "%s", err.msg);
    CHECK(memcmp(got, ref + (size_t)covered * V, (size_t)(n - covered) * V * sizeof(float)) == 0,
          "logits after a hit on a fetched prefix are a full prefill's");
    tdm_seq_destroy(h);
    tdm_seq_destroy(a);
    tdm_snap_layout_free(&x);
    tdm_snap_layout_free(&l);
    free(payload);
    free(pl);
    free(ref);
    free(got);
    tdm_prefix_cache_destroy(src);
    tdm_prefix_cache_destroy(dst);
}

int main(void)
{
    test_chain();
    test_collisions();
    test_budget_lru();
    tdm_backend *be = test_backend();
    tdm_model *m = fixture_model("f32_tied", be);
    const tdm_state_strategy kinds[3] = {TDM_STATE_EXTRA_BUFFER, TDM_STATE_NO_BUFFER,
                                         TDM_STATE_REPLAY};
    for (int i = 0; i < 3; i++) {
        test_states(m, kinds[i]);
        test_pending(m, kinds[i]);
    }
    test_between_caches(m);
    tdm_model_destroy(m);
    be->destroy(be);
    printf("prefix cache: ok\n");
    return 0;
}
