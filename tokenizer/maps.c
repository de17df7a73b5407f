/*
 * maps.c - the tokenizer's storage: the string -> id and (left, right) ->
 * merge hash maps (open addressing, linear probing), the arena that holds
 * every token string for the tokenizer's whole life, and the growable byte
 * buffer that normalization, decoding and ChatML build their text in.
 */
#include "tokenizer_internal.h"

#include <string.h>

/* ------------------------------------------------------------------------ */
/* Hash tables                                                              */
/* ------------------------------------------------------------------------ */

uint64_t tok__hash_bytes(const char *s, size_t n)
{
    /* FNV-1a, 64 bit: tokens are short, and this needs no alignment. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

size_t tok__pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

bool tok__strmap_init(tok_strmap *m, size_t expected)
{
    m->cap = tok__pow2_at_least(expected * 2 + 1);
    m->n = 0;
    m->slots = calloc(m->cap, sizeof(*m->slots));
    return m->slots != NULL;
}

/* Keys point into storage the tokenizer owns for its whole life. Inserting
 * an existing key replaces its value (HF: the later entry wins). */
void tok__strmap_put(tok_strmap *m, const char *s, uint32_t len, int32_t value)
{
    TDM_ASSERT(m->n * 2 < m->cap);
    uint64_t h = tok__hash_bytes(s, len);
    size_t i = (size_t)h & (m->cap - 1);
    for (;;) {
        tok_strslot *e = &m->slots[i];
        if (e->key == NULL) {
            e->key = s;
            e->len = len;
            e->hash = h;
            e->value = value;
            m->n++;
            return;
        }
        if (e->hash == h && e->len == len && memcmp(e->key, s, len) == 0) {
            e->value = value;
            return;
        }
        i = (i + 1) & (m->cap - 1);
    }
}

int32_t tok__strmap_get(const tok_strmap *m, const char *s, size_t len)
{
    if (m->cap == 0)
        return -1;
    uint64_t h = tok__hash_bytes(s, len);
    size_t i = (size_t)h & (m->cap - 1);
    for (;;) {
        const tok_strslot *e = &m->slots[i];
        if (e->key == NULL)
            return -1;
        if (e->hash == h && e->len == len && memcmp(e->key, s, len) == 0)
            return e->value;
        i = (i + 1) & (m->cap - 1);
    }
}

static inline uint64_t pair_key(int32_t a, int32_t b)
{
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

static inline size_t pair_slot(uint64_t key, size_t cap)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

/* Later duplicates of a pair replace earlier ones, as HF's HashMap collect. */
void tok__mergemap_put(tok_mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id)
{
    uint64_t key = pair_key(a, b);
    size_t i = pair_slot(key, m->cap);
    for (;;) {
        tok_mergeslot *e = &m->slots[i];
        if (e->new_id < 0) {
            e->key = key;
            e->rank = rank;
            e->new_id = new_id;
            return;
        }
        if (e->key == key) {
            e->rank = rank;
            e->new_id = new_id;
            return;
        }
        i = (i + 1) & (m->cap - 1);
    }
}

const tok_mergeslot *tok__merge_get(const tok_mergemap *m, int32_t a, int32_t b)
{
    uint64_t key = pair_key(a, b);
    size_t i = pair_slot(key, m->cap);
    for (;;) {
        const tok_mergeslot *e = &m->slots[i];
        if (e->new_id < 0)
            return NULL;
        if (e->key == key)
            return e;
        i = (i + 1) & (m->cap - 1);
    }
}

/* ------------------------------------------------------------------------ */
/* Arena                                                                    */
/* ------------------------------------------------------------------------ */

/* Copies a string into the tokenizer's arena; returns NULL on OOM. */
char *tok__arena_dup(tdm_tokenizer *tok, const char *s, size_t len)
{
    if (tok->arena_used + len + 1 > tok->arena_cap) {
        size_t cap = tok->arena_cap ? tok->arena_cap : 1 << 16;
        while (cap < len + 1)
            cap *= 2;
        tok_arena_block *b = malloc(sizeof(*b) + cap);
        if (b == NULL)
            return NULL;
        b->next = tok->arena;
        tok->arena = b;
        tok->arena_used = 0;
        tok->arena_cap = cap;
    }
    char *p = tok->arena->data + tok->arena_used;
    memcpy(p, s, len);
    p[len] = '\0';
    tok->arena_used += len + 1;
    return p;
}

/* ------------------------------------------------------------------------ */
/* Byte buffer                                                              */
/* ------------------------------------------------------------------------ */

bool tok__buf_reserve(tok_buf *b, size_t more)
{
    if (b->len + more + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *n = realloc(b->p, cap);
    if (n == NULL)
        return false;
    b->p = n;
    b->cap = cap;
    return true;
}

bool tok__buf_append(tok_buf *b, const char *s, size_t n)
{
    if (!tok__buf_reserve(b, n))
        return false;
    if (n > 0) /* s may be NULL when n is 0 */
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}
