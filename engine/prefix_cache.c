/*
 * prefix_cache.c - see prefix_cache.h: the entries and their index, LRU
 * eviction of leaves within the budget, and the host copies of sequences'
 * states at block boundaries.
 */
#include "prefix_cache.h"

#include "alloc.h"
#include "capacity.h"
#include "engine_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct entry {
    uint64_t key;
    struct entry *parent; /* the entry of the block before; NULL for the first */
    int children;         /* entries whose parent this is: evictable only at 0 */
    int32_t *tokens;      /* [block] its block's tokens */
    void *payload;        /* host, owned */
    size_t bytes;         /* accounted: payload, tokens and this struct */
    uint64_t used;        /* the use clock when last matched or stored */
    struct entry *next;   /* in its hash bucket */
} entry;

struct tdm_prefix_cache {
    tdm_prefix_params p;
    entry **buckets; /* [nbuckets], a power of two */
    size_t nbuckets;
    uint64_t clock;
    tdm_prefix_stats st;
};

/* The key of the (empty) prefix before the first block. */
#define ROOT_KEY 0x7a6d5f70726566ull

/* FNV-1a over the parent key and the block's token ids, then a
 * splitmix64 finaliser (the index takes the low bits). */
static uint64_t default_hash(uint64_t parent, const int32_t *tokens, int n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 8; i++) {
        h ^= (parent >> (8 * i)) & 0xff;
        h *= 0x100000001b3ull;
    }
    for (int i = 0; i < n; i++) {
        const uint32_t t = (uint32_t)tokens[i];
        for (int b = 0; b < 4; b++) {
            h ^= (t >> (8 * b)) & 0xff;
            h *= 0x100000001b3ull;
        }
    }
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

tdm_prefix_cache *tdm_prefix_cache_create(const tdm_prefix_params *p)
{
    TDM_ASSERT(p->block > 0);
    tdm_prefix_cache *c = tdm_xcalloc(1, sizeof(*c));
    c->p = *p;
    if (!c->p.hash)
        c->p.hash = default_hash;
    c->nbuckets = 64;
    c->buckets = tdm_xcalloc(c->nbuckets, sizeof(*c->buckets));
    return c;
}

static void entry_free(entry *e)
{
    free(e->payload);
    free(e->tokens);
    free(e);
}

void tdm_prefix_cache_destroy(tdm_prefix_cache *c)
{
    if (!c)
        return;
    for (size_t b = 0; b < c->nbuckets; b++)
        for (entry *e = c->buckets[b], *next; e; e = next) {
            next = e->next;
            entry_free(e);
        }
    free(c->buckets);
    free(c);
}

int tdm_prefix_cache_block(const tdm_prefix_cache *c)
{
    return c->p.block;
}

void tdm_prefix_cache_stats(const tdm_prefix_cache *c, tdm_prefix_stats *out)
{
    *out = c->st;
}

/* The entry of the block at tokens (block tokens) after `parent` whose
 * chained key is `key`: same key, same parent, same tokens. */
static entry *find(const tdm_prefix_cache *c, uint64_t key, const entry *parent,
                   const int32_t *tokens)
{
    for (entry *e = c->buckets[key & (c->nbuckets - 1)]; e; e = e->next)
        if (e->key == key && e->parent == parent &&
            memcmp(e->tokens, tokens, (size_t)c->p.block * sizeof(int32_t)) == 0)
            return e;
    return NULL;
}

/* Follows the chain of tokens' blocks for at most nblocks blocks; chain
 * gets the entries found (chain[i]: block i + 1). Returns how many. */
static int walk(const tdm_prefix_cache *c, const int32_t *tokens, int nblocks, entry **chain)
{
    uint64_t key = ROOT_KEY;
    entry *parent = NULL;
    int i = 0;
    for (; i < nblocks; i++) {
        const int32_t *t = tokens + (size_t)i * (size_t)c->p.block;
        key = c->p.hash(key, t, c->p.block);
        entry *e = find(c, key, parent, t);
        if (!e)
            break;
        if (chain)
            chain[i] = e;
        parent = e;
    }
    return i;
}

int tdm_prefix_cache_match(tdm_prefix_cache *c, const int32_t *tokens, int max_tokens,
                           const void **payloads)
{
    const int nblocks = max_tokens > 0 ? max_tokens / c->p.block : 0;
    if (nblocks == 0)
        return 0;
    entry **chain = tdm_xmalloc((size_t)nblocks * sizeof(*chain));
    const int n = walk(c, tokens, nblocks, chain);
    c->clock++;
    for (int i = 0; i < n; i++) {
        chain[i]->used = c->clock;
        if (payloads)
            payloads[i] = chain[i]->payload;
    }
    free(chain);
    return n * c->p.block;
}

bool tdm_prefix_cache_contains(const tdm_prefix_cache *c, const int32_t *tokens, int end)
{
    if (end <= 0 || end % c->p.block != 0)
        return false;
    const int nblocks = end / c->p.block;
    entry **chain = tdm_xmalloc((size_t)nblocks * sizeof(*chain));
    const bool all = walk(c, tokens, nblocks, chain) == nblocks;
    free(chain);
    return all;
}

static void unlink_entry(tdm_prefix_cache *c, entry *e)
{
    for (entry **pp = &c->buckets[e->key & (c->nbuckets - 1)]; *pp; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    if (e->parent)
        e->parent->children--;
    c->st.entries--;
    c->st.bytes -= e->bytes;
}

/* Evicts the least recently used leaf; false when there is none. */
static bool evict_one(tdm_prefix_cache *c)
{
    entry *lru = NULL;
    for (size_t b = 0; b < c->nbuckets; b++)
        for (entry *e = c->buckets[b]; e; e = e->next)
            if (e->children == 0 && (!lru || e->used < lru->used))
                lru = e;
    if (!lru)
        return false;
    unlink_entry(c, lru);
    entry_free(lru);
    c->st.evictions++;
    return true;
}

/* Doubles the index when it holds twice as many entries as buckets. */
static void maybe_grow(tdm_prefix_cache *c)
{
    if (c->st.entries < 2 * c->nbuckets)
        return;
    const size_t n = c->nbuckets * 2;
    entry **b = tdm_xcalloc(n, sizeof(*b));
    for (size_t i = 0; i < c->nbuckets; i++)
        for (entry *e = c->buckets[i], *next; e; e = next) {
            next = e->next;
            e->next = b[e->key & (n - 1)];
            b[e->key & (n - 1)] = e;
        }
    free(c->buckets);
    c->buckets = b;
    c->nbuckets = n;
}

tdm_prefix_put tdm_prefix_cache_insert(tdm_prefix_cache *c, const int32_t *tokens, int end,
                                       void *payload, size_t payload_bytes)
{
    TDM_ASSERT(end > 0 && end % c->p.block == 0);
    const int nblocks = end / c->p.block;
    entry **chain = tdm_xmalloc((size_t)nblocks * sizeof(*chain));
    const int found = walk(c, tokens, nblocks, chain);
    entry *parent = nblocks > 1 && found >= nblocks - 1 ? chain[nblocks - 2] : NULL;
    tdm_prefix_put res;
    const size_t bytes = payload_bytes + (size_t)c->p.block * sizeof(int32_t) + sizeof(entry);
    c->clock++;
    if (found == nblocks) {
        chain[nblocks - 1]->used = c->clock;
        res = TDM_PREFIX_PUT_PRESENT;
    } else if (found < nblocks - 1) {
        res = TDM_PREFIX_PUT_NO_PARENT;
    } else if (bytes > c->p.budget) {
        res = TDM_PREFIX_PUT_OVER_BUDGET;
    } else {
        /* The parent gains its child before eviction, so that neither it
         * nor its ancestors can go to make room. */
        if (parent)
            parent->children++;
        while (c->st.bytes + bytes > c->p.budget && evict_one(c))
            ;
        if (c->st.bytes + bytes > c->p.budget) {
            /* Only the chain itself is left, and it is too large. */
            if (parent)
                parent->children--;
            res = TDM_PREFIX_PUT_OVER_BUDGET;
        } else {
            entry *e = tdm_xcalloc(1, sizeof(*e));
            const int32_t *t = tokens + (size_t)(nblocks - 1) * (size_t)c->p.block;
            e->key = c->p.hash(parent ? parent->key : ROOT_KEY, t, c->p.block);
            e->parent = parent;
            e->tokens = tdm_xmalloc((size_t)c->p.block * sizeof(int32_t));
            memcpy(e->tokens, t, (size_t)c->p.block * sizeof(int32_t));
            e->payload = payload;
            payload = NULL;
            e->bytes = bytes;
            e->used = c->clock;
            maybe_grow(c);
            e->next = c->buckets[e->key & (c->nbuckets - 1)];
            c->buckets[e->key & (c->nbuckets - 1)] = e;
            c->st.entries++;
            c->st.bytes += bytes;
            c->st.inserted++;
            res = TDM_PREFIX_PUT_STORED;
        }
    }
    if (res == TDM_PREFIX_PUT_NO_PARENT || res == TDM_PREFIX_PUT_OVER_BUDGET)
        c->st.refused++;
    free(payload);
    free(chain);
    return res;
}

/* ---- sequences ------------------------------------------------------------ */

/* Floats of one linear layer's conv window and recurrent state, and of one
 * attention layer's K (or V) row. */
static void sizes(const tdm_model_config *cfg, size_t *conv, size_t *rec, size_t *kv_row)
{
    tdm_state_floats f;
    tdm_capacity_state_floats(cfg, TDM_STATE_NO_BUFFER, 0, &f);
    *conv = f.conv;
    *rec = f.rec;
    *kv_row = tdm_capacity_kv_width(cfg);
}

tdm_status tdm_prefix_block_take(const tdm_seq *s, int n, int j, int B, uint8_t *p, tdm_error *err)
{
    const tdm_model_config *cfg = &s->m->cfg;
    size_t conv, rec, kv_row, at = 0;
    sizes(cfg, &conv, &rec, &kv_row);
    tdm_backend *be = s->m->be;
    const bool replay = j >= 0 && s->p.strategy == TDM_STATE_REPLAY;
    float *tmp = replay ? be->alloc(be->ctx, rec * sizeof(float)) : NULL;
    if (replay && !tmp)
        return tdm_error_oom(err, rec * sizeof(float), "a recurrent state to replay into");
    /* Layer order: conv then recurrent per linear layer, K then V of the
     * block's positions per attention layer. */
    const size_t kv_off = (size_t)(n - B) * kv_row, kv_bytes = (size_t)B * kv_row * sizeof(float);
    for (int L = 0; L < cfg->num_layers; L++) {
        if (cfg->layer_types[L] == TDM_LAYER_LINEAR_ATTENTION) {
            const float *cv = j < 0 ? s->conv[L] : s->conv_x[L] + (size_t)j * conv;
            const float *rs = j < 0 ? s->rec[L] : s->rec_x[L] + (size_t)j * rec;
            if (replay) {
                /* The committed state advanced by the record's rows 0..j,
                 * as the commit of j accepted drafts would. */
                be->copy(be->ctx, tmp, s->rec[L], rec * sizeof(float));
                const tdm_gdn_seg g = {.nrows = j + 1, .state = tmp, .inputs = s->rec_x[L]};
                be->gdn_replay(be->ctx, &g, 1, cfg->lin_k_heads, cfg->lin_v_heads, cfg->lin_k_dim,
                               cfg->lin_v_dim);
                rs = tmp;
            }
            be->download(be->ctx, p + at, cv, conv * sizeof(float));
            at += conv * sizeof(float);
            be->download(be->ctx, p + at, rs, rec * sizeof(float));
            if (replay)
                be->sync(be->ctx); /* tmp is reused by the next layer */
            at += rec * sizeof(float);
        } else {
            be->download(be->ctx, p + at, s->k[L] + kv_off, kv_bytes);
            at += kv_bytes;
            be->download(be->ctx, p + at, s->v[L] + kv_off, kv_bytes);
            at += kv_bytes;
        }
    }
    be->sync(be->ctx);
    be->free(be->ctx, tmp);
    TDM_ASSERT(at == tdm_capacity_prefix_block_bytes(cfg, B));
    return TDM_OK;
}

void tdm_prefix_block_give(tdm_seq *s, int i, bool last, int B, const uint8_t *p)
{
    const tdm_model_config *cfg = &s->m->cfg;
    size_t conv, rec, kv_row, at = 0;
    sizes(cfg, &conv, &rec, &kv_row);
    const size_t kv_bytes = (size_t)B * kv_row * sizeof(float);
    tdm_backend *be = s->m->be;
    for (int L = 0; L < cfg->num_layers; L++) {
        if (cfg->layer_types[L] == TDM_LAYER_LINEAR_ATTENTION) {
            /* Only the deepest block's states are the prefix's. */
            if (last) {
                be->upload(be->ctx, s->conv[L], p + at, conv * sizeof(float));
                be->upload(be->ctx, s->rec[L], p + at + conv * sizeof(float), rec * sizeof(float));
            }
            at += (conv + rec) * sizeof(float);
        } else {
            const size_t off = (size_t)i * (size_t)B * kv_row;
            be->upload(be->ctx, s->k[L] + off, p + at, kv_bytes);
            at += kv_bytes;
            be->upload(be->ctx, s->v[L] + off, p + at, kv_bytes);
            at += kv_bytes;
        }
    }
}

/* Copies the state at position n (a block's end) into a new entry, in the
 * checkpoint's layout (a tensor-parallel model's ranks each write their
 * slices into place: group.c), so that entries move between verifiers
 * split any way. */
static tdm_status put_state(tdm_prefix_cache *c, const tdm_seq *s, const int32_t *tokens, int n,
                            int j, tdm_prefix_put *result, tdm_error *err)
{
    const int B = c->p.block;
    *result = TDM_PREFIX_PUT_PRESENT;
    if (tdm_prefix_cache_contains(c, tokens, n)) {
        tdm_prefix_cache_match(c, tokens, n, NULL); /* now the most recently used */
        return TDM_OK;
    }
    if (n > B && !tdm_prefix_cache_contains(c, tokens, n - B)) {
        *result = tdm_prefix_cache_insert(c, tokens, n, NULL, 0); /* counted as refused */
        return TDM_OK;
    }
    const size_t bytes = tdm_capacity_prefix_block_bytes(tdm_model_checkpoint_config(s->m), B);
    uint8_t *p = malloc(bytes ? bytes : 1);
    if (!p)
        return tdm_error_oom(err, bytes, "a prefix-cache block of %d positions", B);
    const tdm_status rc = s->ranks ? tdm_group_prefix_take(s, n, j, B, p, err)
                                   : tdm_prefix_block_take(s, n, j, B, p, err);
    if (rc != TDM_OK) {
        free(p);
        return rc;
    }
    *result = tdm_prefix_cache_insert(c, tokens, n, p, bytes);
    return TDM_OK;
}

tdm_status tdm_prefix_cache_put_seq(tdm_prefix_cache *c, const tdm_seq *s, const int32_t *tokens,
                                    tdm_prefix_put *result, tdm_error *err)
{
    const int n = tdm_seq_length(s);
    TDM_ASSERT(!(s->ranks ? s->ranks[0] : s)->pending && n > 0 && n % c->p.block == 0);
    return put_state(c, s, tokens, n, -1, result, err);
}

tdm_status tdm_prefix_cache_put_pending(tdm_prefix_cache *c, const tdm_seq *s,
                                        const int32_t *tokens, int j, tdm_prefix_put *result,
                                        tdm_error *err)
{
    *result = TDM_PREFIX_PUT_NO_PARENT;
    const tdm_seq *s0 = s->ranks ? s->ranks[0] : s; /* where a group keeps its positions */
    if (s->p.strategy == TDM_STATE_NO_BUFFER)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "state_strategy no_buffer keeps no state inside a verified block "
                             "(only a checkpoint from before it)");
    if (j < 0 || j >= s0->pending)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "row %d of a pending verify of %d rows", j, s0->pending);
    const int n = s0->base + j + 1;
    TDM_ASSERT(n % c->p.block == 0);
    return put_state(c, s, tokens, n, j, result, err);
}

tdm_status tdm_prefix_cache_get_seq(tdm_prefix_cache *c, tdm_model *m, const tdm_seq_params *p,
                                    const int32_t *tokens, int max_tokens, tdm_seq **out,
                                    int *covered, tdm_error *err)
{
    *out = NULL;
    *covered = 0;
    const int B = c->p.block, nblocks = max_tokens > 0 ? max_tokens / B : 0;
    if (nblocks == 0)
        return TDM_OK;
    const void **payloads = tdm_xmalloc((size_t)nblocks * sizeof(*payloads));
    const int n = tdm_prefix_cache_match(c, tokens, max_tokens, payloads);
    if (n == 0) {
        free(payloads);
        return TDM_OK;
    }
    tdm_seq *s = NULL;
    tdm_status rc = tdm_seq_create(m, p, &s, err);
    if (rc == TDM_OK)
        rc = tdm_seq_reserve_kv(s, n, err);
    if (rc == TDM_OK && m->group)
        rc = tdm_group_prefix_give(s, (const void *const *)payloads, n / B, B, err);
    if (rc != TDM_OK) {
        tdm_seq_destroy(s);
        free(payloads);
        return rc;
    }
    if (!m->group) {
        for (int i = 0; i < n / B; i++)
            tdm_prefix_block_give(s, i, i == n / B - 1, B, payloads[i]);
        m->be->sync(m->be->ctx);
        s->n_past = n;
    }
    free(payloads);
    *out = s;
    *covered = n;
    return TDM_OK;
}

/* ---- between replicas ------------------------------------------------------ */

tdm_status tdm_prefix_cache_export(tdm_prefix_cache *c, const tdm_model_config *cfg,
                                   const char *fingerprint, const int32_t *tokens, int max_tokens,
                                   tdm_snap_layout *layout, uint8_t **payload, tdm_error *err)
{
    memset(layout, 0, sizeof(*layout));
    *payload = NULL;
    const int B = c->p.block, nblocks = max_tokens > 0 ? max_tokens / B : 0;
    if (nblocks == 0)
        return TDM_OK;
    const void **payloads = tdm_xmalloc((size_t)nblocks * sizeof(*payloads));
    const int n = tdm_prefix_cache_match(c, tokens, max_tokens, payloads);
    if (n == 0) {
        free(payloads);
        return TDM_OK;
    }
    const size_t bytes = tdm_capacity_prefix_block_bytes(cfg, B);
    uint8_t *p = malloc((size_t)(n / B) * bytes + 1);
    if (!p) {
        free(payloads);
        return tdm_error_oom(err, (size_t)(n / B) * bytes, "a prefix of %d positions", n);
    }
    for (int i = 0; i < n / B; i++)
        memcpy(p + (size_t)i * bytes, payloads[i], bytes);
    free(payloads);
    tdm_snap_layout_expected_prefix(cfg, fingerprint, (uint32_t)n, (uint32_t)B, layout);
    TDM_ASSERT(layout->total_bytes == (uint64_t)(n / B) * bytes);
    layout->tokens = tdm_xmalloc((size_t)n * sizeof(int32_t));
    memcpy(layout->tokens, tokens, (size_t)n * sizeof(int32_t));
    *payload = p;
    return TDM_OK;
}

tdm_status tdm_prefix_cache_import(tdm_prefix_cache *c, const tdm_model_config *cfg,
                                   const tdm_snap_layout *l, const uint8_t *payload, int *stored,
                                   int *covered, tdm_error *err)
{
    *stored = 0;
    *covered = 0;
    const int B = c->p.block;
    if (l->prefix_block != (uint32_t)B)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "layout.prefix_block: the prefix comes in blocks of %u tokens, this "
                             "cache keeps blocks of %d",
                             l->prefix_block, B);
    if (!l->verified)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "the prefix's payload was not checked against its SHA-256");
    const size_t bytes = tdm_capacity_prefix_block_bytes(cfg, B);
    TDM_ASSERT(l->committed % (uint32_t)B == 0 &&
               l->total_bytes == (uint64_t)(l->committed / (uint32_t)B) * bytes);
    for (uint32_t end = (uint32_t)B; end <= l->committed; end += (uint32_t)B) {
        uint8_t *p = malloc(bytes ? bytes : 1);
        if (!p)
            return tdm_error_oom(err, bytes, "a prefix-cache block of %d positions", B);
        memcpy(p, payload + (size_t)(end / (uint32_t)B - 1) * bytes, bytes);
        const tdm_prefix_put r = tdm_prefix_cache_insert(c, l->tokens, (int)end, p, bytes);
        if (r == TDM_PREFIX_PUT_STORED)
            (*stored)++;
        else if (r != TDM_PREFIX_PUT_PRESENT)
            break;
    }
    *covered = tdm_prefix_cache_match(c, l->tokens, (int)l->committed, NULL);
    return TDM_OK;
}
