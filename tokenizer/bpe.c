/*
 * bpe.c - one pre-tokenized word -> ids. The word's byte-level symbols are
 * merged as HF's Word::merge_all does (a heap of candidate merges, lowest
 * rank first, leftmost on ties). Short words go through a direct-mapped cache
 * that all encoders of a tokenizer share, taken with trylock so that no
 * encoder ever waits for it.
 */
#include "tokenizer_internal.h"

#include <string.h>

tdm_status tok__cache_init(tdm_tokenizer *tok)
{
    if (tok->nfc && tok__nfc_inert_init(tok) != TDM_OK)
        return TDM_ERR_RESOURCE_EXHAUSTED;
    tok->cache = calloc(TOK_CACHE_SLOTS, sizeof(*tok->cache));
    return tok->cache ? TDM_OK : TDM_ERR_RESOURCE_EXHAUSTED;
}

void tok__cache_free(tdm_tokenizer *tok)
{
    free(tok->cache);
    tok->cache = NULL;
    free(tok->nfc_inert);
    tok->nfc_inert = NULL;
}

/* A pending merge of the symbol at `pos` with its right neighbour. */
struct bpe_merge {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
};

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *n = realloc(*p, c * elem);
    if (n == NULL)
        return false;
    *p = n;
    *cap = c;
    return true;
}

static inline bool merge_less(const bpe_merge *a, const bpe_merge *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(bpe_merge *h, size_t *n, bpe_merge m)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(&m, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static bpe_merge heap_pop(bpe_merge *h, size_t *n)
{
    bpe_merge top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= *n)
            break;
        size_t m = (l + 1 < *n && merge_less(&h[l + 1], &h[l])) ? l + 1 : l;
        if (!merge_less(&h[m], &last))
            break;
        h[i] = h[m];
        i = m;
    }
    h[i] = last;
    return top;
}

/* BPE over one word's symbols, exactly as HF's Word::merge_all: a heap of
 * candidate merges ordered by (rank, position); a popped candidate whose
 * pair changed since it was pushed is stale and skipped. */
static bool bpe_word(enc_ctx *c, const unsigned char *w, size_t n)
{
    const tdm_tokenizer *tok = c->tok;
    if (n > c->sym_cap) {
        size_t cap = c->sym_cap ? c->sym_cap : 64;
        while (cap < n)
            cap *= 2;
        int32_t *a = realloc(c->sym_id, cap * sizeof(int32_t));
        if (a)
            c->sym_id = a;
        int32_t *b = realloc(c->sym_prev, cap * sizeof(int32_t));
        if (b)
            c->sym_prev = b;
        int32_t *d = realloc(c->sym_next, cap * sizeof(int32_t));
        if (d)
            c->sym_next = d;
        bool *e = realloc(c->sym_dead, cap * sizeof(bool));
        if (e)
            c->sym_dead = e;
        if (!a || !b || !d || !e)
            return false;
        c->sym_cap = cap;
    }
    if (!grow((void **)&c->heap, &c->heap_cap, 2 * n + 2, sizeof(bpe_merge)))
        return false;

    /* Bytes without a token are dropped, as HF does without unk_token. */
    int32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = tok->byte_id[w[i]];
        if (id < 0)
            continue;
        c->sym_id[m] = id;
        c->sym_prev[m] = m - 1;
        c->sym_next[m] = m + 1;
        c->sym_dead[m] = false;
        m++;
    }
    if (m == 0)
        return true;
    c->sym_next[m - 1] = -1;
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < m; i++) {
        const tok_mergeslot *ms = tok__merge_get(&tok->merges, c->sym_id[i], c->sym_id[i + 1]);
        if (ms)
            heap_push(c->heap, &hn, (bpe_merge){ms->rank, i, ms->new_id});
    }
    while (hn > 0) {
        bpe_merge top = heap_pop(c->heap, &hn);
        int32_t p = top.pos;
        if (c->sym_dead[p] || c->sym_next[p] < 0)
            continue;
        int32_t q = c->sym_next[p];
        const tok_mergeslot *ms = tok__merge_get(&tok->merges, c->sym_id[p], c->sym_id[q]);
        if (ms == NULL || ms->new_id != top.new_id)
            continue;
        c->sym_id[p] = top.new_id;
        c->sym_dead[q] = true;
        c->sym_next[p] = c->sym_next[q];
        if (c->sym_next[q] >= 0)
            c->sym_prev[c->sym_next[q]] = p;
        if (!grow((void **)&c->heap, &c->heap_cap, hn + 2, sizeof(bpe_merge)))
            return false;
        if (c->sym_prev[p] >= 0) {
            int32_t l = c->sym_prev[p];
            ms = tok__merge_get(&tok->merges, c->sym_id[l], c->sym_id[p]);
            if (ms)
                heap_push(c->heap, &hn, (bpe_merge){ms->rank, l, ms->new_id});
        }
        if (c->sym_next[p] >= 0) {
            ms = tok__merge_get(&tok->merges, c->sym_id[p], c->sym_id[c->sym_next[p]]);
            if (ms)
                heap_push(c->heap, &hn, (bpe_merge){ms->rank, p, ms->new_id});
        }
    }
    for (int32_t i = 0; i >= 0; i = c->sym_next[i])
        if (!tok__emit(c, c->sym_id[i]))
            return false;
    return true;
}

/* One pre-tokenized word -> ids, through the word cache when it fits; with
 * ignore_merges a word that is a vocabulary entry is that entry. */
bool tok__encode_word(enc_ctx *c, const unsigned char *w, size_t n)
{
    const tdm_tokenizer *tok = c->tok;
    if (n == 1) {
        int32_t id = tok->byte_id[w[0]];
        return id < 0 || tok__emit(c, id);
    }
    bool cacheable = n <= TOK_CACHE_MAX_WORD;
    uint64_t h = 0;
    tok_cache_slot *slot = NULL;
    if (cacheable) {
        h = tok__hash_bytes((const char *)w, n);
        slot = &c->tok_mut->cache[h & (TOK_CACHE_SLOTS - 1)];
        if (pthread_mutex_trylock(&c->tok_mut->cache_lock) == 0) {
            bool hit = slot->klen == n && slot->hash == h && memcmp(slot->key, w, n) == 0;
            int32_t ids[TOK_CACHE_MAX_IDS];
            uint8_t k = slot->n_ids;
            if (hit)
                memcpy(ids, slot->ids, k * sizeof(int32_t));
            pthread_mutex_unlock(&c->tok_mut->cache_lock);
            if (hit) {
                for (uint8_t i = 0; i < k; i++)
                    if (!tok__emit(c, ids[i]))
                        return false;
                return true;
            }
        }
    }
    size_t before = c->n;
    bool whole = false;
    if (tok->ignore_merges) {
        if (!grow((void **)&c->word, &c->word_cap, 2 * n, 1))
            return false;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(c->word + k, tok->bl_utf8[w[i]], 2);
            k += tok->bl_len[w[i]];
        }
        int32_t id = tok__strmap_get(&tok->vocab, c->word, k);
        if (id >= 0) {
            if (!tok__emit(c, id))
                return false;
            whole = true;
        }
    }
    if (!whole && !bpe_word(c, w, n))
        return false;
    size_t k = c->n - before;
    if (cacheable && k <= TOK_CACHE_MAX_IDS &&
        pthread_mutex_trylock(&c->tok_mut->cache_lock) == 0) {
        slot->hash = h;
        slot->klen = (uint8_t)n;
        slot->n_ids = (uint8_t)k;
        memcpy(slot->key, w, n);
        memcpy(slot->ids, c->ids + before, k * sizeof(int32_t));
        pthread_mutex_unlock(&c->tok_mut->cache_lock);
    }
    return true;
}
