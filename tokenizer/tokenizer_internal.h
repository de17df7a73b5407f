/*
 * tokenizer_internal.h - what the tokenizer's files share: struct
 * tdm_tokenizer, its hash maps and arena, the growable buffer, the state of
 * one encode call and the functions one file calls in another. Not part of
 * the API (tok__ prefix); that is tokenizer.h.
 *
 * What each part owns:
 *   maps.c    the string -> id and pair -> merge hash maps, the arena that
 *             holds every token string, the growable byte buffer;
 *   utf8.c    UTF-8 classification and checking, code point read/write,
 *             GPT-2's byte-level alphabet and the bytes a token decodes to;
 *   load.c    tokenizer.json -> struct tdm_tokenizer (the tables below are
 *             filled there, while loading, and only read afterwards), the
 *             fingerprint, tdm_tok_load*, tdm_tok_destroy and the lookups;
 *   encode.c  tdm_tok_encode up to the word: added-token splitting, NFC and
 *             the regex pre-tokenizer; it owns enc_ctx and its output ids;
 *   bpe.c     one word -> ids: the BPE merge heap and the word cache (the
 *             only part of a loaded tokenizer that changes, under its lock);
 *   decode.c  ids -> text, one-shot and streaming, and ChatML.
 */
#ifndef TANDEM_TOKENIZER_INTERNAL_H
#define TANDEM_TOKENIZER_INTERNAL_H

#include "tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>

/* String -> id, open addressing; keys point into the tokenizer's arena. */
typedef struct tok_strslot {
    const char *key; /* NULL = empty slot */
    uint32_t len;
    int32_t value;
    uint64_t hash;
} tok_strslot;

typedef struct tok_strmap {
    tok_strslot *slots; /* (cap) */
    size_t cap, n;      /* cap is a power of two, at least twice n */
} tok_strmap;

/* (left id, right id) -> merge rank and the id the pair becomes. */
typedef struct tok_mergeslot {
    uint64_t key;   /* left << 32 | right */
    int32_t rank;   /* position in model.merges: lower merges first */
    int32_t new_id; /* -1 = empty slot */
} tok_mergeslot;

typedef struct tok_mergemap {
    tok_mergeslot *slots; /* (cap) */
    size_t cap;
} tok_mergemap;

/* Everything known about one id. */
typedef struct tok_idinfo {
    const char *str; /* token as in the file (added content wins), NULL = no token */
    uint32_t len;
    const char *vocab_str; /* the model.vocab entry for this id, NULL if none */
    uint32_t vocab_len;
    uint32_t dec_off; /* its decoded bytes: dec_bytes[dec_off .. +dec_len) */
    uint32_t dec_len;
    bool in_vocab;
    bool special;
} tok_idinfo;

typedef struct tok_added {
    int32_t id;
    const char *content; /* as in the file */
    uint32_t len;
    const char *match; /* what is searched for: content, NFC'd when normalized */
    uint32_t mlen;
    bool special, normalized, lstrip, rstrip;
} tok_added;

/* Added tokens of one kind (normalized or not), grouped by first byte:
 * list[first[b] .. first[b+1]) start with byte b, longest first. */
typedef struct tok_matcher {
    tok_added **list; /* (n), pointers into tokenizer.added */
    size_t n;
    uint32_t first[257];
} tok_matcher;

#define TOK_MAX_STEPS 8

/* One regex split of the pre-tokenizer (behaviour Isolated). */
typedef struct tok_step {
    pcre2_code *re;
    const char *pattern;  /* as in the file, for the fingerprint */
    bool literal;         /* {"String": ...} rather than {"Regex": ...} */
    bool from_byte_level; /* the GPT-2 regex of ByteLevel(use_regex=true) */
} tok_step;

typedef struct tok_arena_block {
    struct tok_arena_block *next;
    char data[];
} tok_arena_block;

/* Word cache: direct-mapped, words up to TOK_CACHE_MAX_WORD bytes. Guarded by
 * cache_lock, taken with trylock so that concurrent encoders never wait: a
 * busy cache is simply skipped. */
#define TOK_CACHE_SLOTS 8192
#define TOK_CACHE_MAX_WORD 48
#define TOK_CACHE_MAX_IDS 16

typedef struct tok_cache_slot {
    uint64_t hash;
    uint8_t klen; /* 0 = empty */
    uint8_t n_ids;
    char key[TOK_CACHE_MAX_WORD];
    int32_t ids[TOK_CACHE_MAX_IDS];
} tok_cache_slot;

struct tdm_tokenizer {
    tok_idinfo *ids; /* (ids_cap), n_ids used: one past the largest id */
    size_t n_ids, ids_cap;
    size_t n_vocab_entries;
    tok_strmap vocab;     /* model.vocab */
    tok_strmap added_map; /* added token content -> id */
    tok_mergemap merges;
    int32_t *merge_list; /* (n_merges, 2): left, right ids in rank order */
    size_t n_merges;
    int32_t byte_id[256]; /* id of the byte-level char of each byte, -1 if none */
    bool ignore_merges;
    bool nfc;
    bool has_byte_level;
    bool byte_level_regex;
    tok_step steps[TOK_MAX_STEPS];
    size_t n_steps;
    tok_added *added; /* (n_added), sorted by id */
    size_t n_added;
    tok_matcher match_raw;   /* normalized == false: matched before NFC */
    tok_matcher match_norm;  /* normalized == true: matched after NFC */
    char *dec_bytes;         /* decoded bytes of all ids, see tok_idinfo */
    uint8_t bl_utf8[256][2]; /* byte-level char of each byte, UTF-8 */
    uint8_t bl_len[256];
    tdm_tok_specials specials;
    char fingerprint[65];
    uint8_t *nfc_inert;    /* (TOK_NFC_INERT_LIMIT / 8) bit per code point, see encode.c */
    tok_cache_slot *cache; /* (TOK_CACHE_SLOTS) */
    pthread_mutex_t cache_lock;
    tok_arena_block *arena; /* all strings; freed as a whole */
    size_t arena_used, arena_cap;
};

/* Code points below this have an NFC-inertness bit (planes 0 and 1). */
#define TOK_NFC_INERT_LIMIT 0x20000

/* A growable NUL-terminated byte string; p is malloc'd, owned by whoever
 * holds the tok_buf. */
typedef struct tok_buf {
    char *p;
    size_t len, cap;
} tok_buf;

/* A pending merge of two adjacent symbols (bpe.c). */
typedef struct bpe_merge bpe_merge;

/* Per-call scratch: nothing here is shared between threads. */
typedef struct enc_ctx {
    const tdm_tokenizer *tok;
    tdm_tokenizer *tok_mut; /* for the cache only, under its lock */
    int32_t *ids;           /* (cap) the output */
    size_t n, cap;
    pcre2_match_data *md;
    int32_t *sym_id, *sym_prev, *sym_next; /* (sym_cap) BPE symbols of one word */
    bool *sym_dead;
    size_t sym_cap;
    bpe_merge *heap; /* (heap_cap) pending merges, bpe.c */
    size_t heap_cap;
    char *word; /* (word_cap) a word in the byte-level alphabet */
    size_t word_cap;
    tdm_error *err;
} enc_ctx;

/* maps.c */

/* FNV-1a, 64 bit. */
uint64_t tok__hash_bytes(const char *s, size_t n);
/* The smallest power of two >= n, at least 16: a table capacity. */
size_t tok__pow2_at_least(size_t n);
/* Empty map with room for `expected` keys; false on OOM. */
bool tok__strmap_init(tok_strmap *m, size_t expected);
/* Keys are not copied: they must live as long as the map. */
void tok__strmap_put(tok_strmap *m, const char *s, uint32_t len, int32_t value);
/* The value of s[0..len), -1 when absent. */
int32_t tok__strmap_get(const tok_strmap *m, const char *s, size_t len);
void tok__mergemap_put(tok_mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id);
/* The merge of the pair (a, b), NULL when there is none. */
const tok_mergeslot *tok__merge_get(const tok_mergemap *m, int32_t a, int32_t b);
/* A NUL-terminated copy of s[0..len) in the tokenizer's arena (freed with
 * the tokenizer); NULL on OOM. */
char *tok__arena_dup(tdm_tokenizer *tok, const char *s, size_t len);
/* Room for `more` bytes and the NUL; false on OOM. */
bool tok__buf_reserve(tok_buf *b, size_t more);
/* Appends s[0..n) (s may be NULL when n is 0); false on OOM. */
bool tok__buf_append(tok_buf *b, const char *s, size_t n);

/* utf8.c */

/* > 0: a complete character of that many bytes; -k: an invalid sequence
 * whose maximal invalid subpart has k bytes; 0: an unfinished prefix. */
int tok__utf8_class(const unsigned char *p, size_t n);
/* TDM_ERR_INVALID_ARGUMENT naming the byte offset unless text is UTF-8. */
/* GPT-2's bytes_to_unicode: the code point that stands for each byte. */
void tok__byte_level_table(uint32_t cp_of_byte[256]);
/* Writes cp as UTF-8, returns its length (1 to 4). */
int tok__utf8_put(uint32_t cp, char out[4]);
/* The code point of the valid n-byte character at p. */
uint32_t tok__utf8_get(const unsigned char *p, int n);
/* The bytes HF's ByteLevel decoder makes of one token (out has room for
 * len bytes); false when the token is not valid UTF-8. */
bool tok__token_decoded_bytes(const char *s, uint32_t len, const int byte_of_cp[512], char *out,
                              uint32_t *out_len);

/* encode.c */

/* NFC of s[0..n) into a malloc'd *out (the caller frees). */
tdm_status tok__nfc(const char *s, size_t n, char **out, size_t *out_len);
/* Fills tok->nfc_inert; TDM_ERR_RESOURCE_EXHAUSTED on OOM. */
tdm_status tok__nfc_inert_init(tdm_tokenizer *tok);
/* Grows c->ids (256 ids, then doubling); false on OOM. */
bool tok__emit_grow(enc_ctx *c);

/* bpe.c */

/* The tables encoding reads besides the model: the NFC-inertness bits (when
 * the tokenizer normalizes) and the word cache. tok__cache_free frees both. */
tdm_status tok__cache_init(tdm_tokenizer *tok);
void tok__cache_free(tdm_tokenizer *tok);
/* Appends the ids of one pre-tokenized word (raw bytes) to c->ids; false on
 * OOM. */
bool tok__encode_word(enc_ctx *c, const unsigned char *w, size_t n);

/* Appends one id to the output of an encode call; false on OOM. */
static inline bool tok__emit(enc_ctx *c, int32_t id)
{
    if (c->n == c->cap && !tok__emit_grow(c))
        return false;
    c->ids[c->n++] = id;
    return true;
}

#endif
