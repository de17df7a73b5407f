/*
 * tokenizer.c - the tokenizer module (tokenizer.h): loading tokenizer.json,
 * lookups, fingerprint, encoding (added tokens, NFC, regex pre-tokenizer,
 * BPE), decoding, streaming and ChatML.
 */
#include "tokenizer.h"

#include "file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------------ */
/* Private state                                                            */
/* ------------------------------------------------------------------------ */

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
    uint8_t *nfc_inert;    /* (TOK_NFC_INERT_LIMIT / 8) bit per code point, see nfc_inert_init */
    tok_cache_slot *cache; /* (TOK_CACHE_SLOTS) */
    pthread_mutex_t cache_lock;
    tok_arena_block *arena; /* all strings; freed as a whole */
    size_t arena_used, arena_cap;
};

/* Code points below this have an NFC-inertness bit (planes 0 and 1). */
#define TOK_NFC_INERT_LIMIT 0x20000

static uint64_t tok__hash_bytes(const char *s, size_t n);
static int32_t tok__strmap_get(const tok_strmap *m, const char *s, size_t len);
static const tok_mergeslot *tok__merge_get(const tok_mergemap *m, int32_t a, int32_t b);
static int tok__utf8_class(const unsigned char *p, size_t n);
static tdm_status tok__utf8_check(const char *text, size_t len, tdm_error *err);
static tdm_status tok__nfc(const char *s, size_t n, char **out, size_t *out_len);
static tdm_status tok__cache_init(tdm_tokenizer *tok);
static void tok__cache_free(tdm_tokenizer *tok);

/* ids beyond this are refused: the id table is dense (about 40 bytes per id
 * up to the largest), and real vocabularies stay far below (Qwen: 151,669). */
#define TOK_MAX_ID (1 << 22)

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

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

static bool strmap_init(tok_strmap *m, size_t expected)
{
    m->cap = pow2_at_least(expected * 2 + 1);
    m->n = 0;
    m->slots = calloc(m->cap, sizeof(*m->slots));
    return m->slots != NULL;
}

/* Keys point into storage the tokenizer owns for its whole life. Inserting
 * an existing key replaces its value (HF: the later entry wins). */
static void strmap_put(tok_strmap *m, const char *s, uint32_t len, int32_t value)
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
static void mergemap_put(tok_mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id)
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
/* UTF-8                                                                    */
/* ------------------------------------------------------------------------ */

/* Classifies the sequence at p[0..n): > 0 = a complete valid character of
 * that many bytes; < 0 = invalid, -k = its maximal invalid subpart has k bytes
 * (Unicode's "substitution of maximal subparts", which Rust's
 * from_utf8_lossy and hence HF's decode follow); 0 = a valid but unfinished
 * prefix (needs more bytes than n). */
int tok__utf8_class(const unsigned char *p, size_t n)
{
    unsigned char c = p[0];
    if (c < 0x80)
        return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return -1;
    }
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= n)
            return 0;
        unsigned char b = p[k];
        unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h)
            return -k;
    }
    return need;
}

tdm_status tok__utf8_check(const char *text, size_t len, tdm_error *err)
{
    const unsigned char *p = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int c = tok__utf8_class(p + i, len - i);
        if (c <= 0)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "text is not valid UTF-8: %s 0x%02x at byte offset %zu",
                                 c == 0 ? "the text ends inside a character starting with byte"
                                        : "invalid sequence starting with byte",
                                 p[i], i);
        i += (size_t)c;
    }
    return TDM_OK;
}

/* ------------------------------------------------------------------------ */
/* Byte-level alphabet                                                      */
/* ------------------------------------------------------------------------ */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * other 68 to U+0100.. in byte order, so every byte is a visible char. */
static void byte_level_table(uint32_t cp_of_byte[256])
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool keep =
            (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp_of_byte[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

static int utf8_put(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static uint32_t utf8_get(const unsigned char *p, int n)
{
    if (n == 1)
        return p[0];
    if (n == 2)
        return ((uint32_t)(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    if (n == 3)
        return ((uint32_t)(p[0] & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    return ((uint32_t)(p[0] & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) |
           ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

/* The bytes HF's ByteLevel decoder makes of one token: every char mapped
 * back to its byte, or the token's own UTF-8 when any char is outside the
 * alphabet (added tokens such as "<|im_end|>" come out verbatim either way). */
static bool token_decoded_bytes(const char *s, uint32_t len, const int byte_of_cp[512], char *out,
                                uint32_t *out_len)
{
    const unsigned char *p = (const unsigned char *)s;
    uint32_t i = 0, o = 0;
    while (i < len) {
        int c = tok__utf8_class(p + i, len - i);
        if (c <= 0)
            return false;
        uint32_t cp = utf8_get(p + i, c);
        if (cp >= 512 || byte_of_cp[cp] < 0) {
            memcpy(out, s, len);
            *out_len = len;
            return true;
        }
        out[o++] = (char)byte_of_cp[cp];
        i += (uint32_t)c;
    }
    *out_len = o;
    return true;
}

/* ------------------------------------------------------------------------ */
/* Loading                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct load_ctx {
    const char *origin;
    tdm_error *err;
} load_ctx;

#define LOAD_FAIL(ctx, code, ...)                                                                  \
    (tdm_error_set((ctx)->err, code, __VA_ARGS__),                                                 \
     tdm_error_prefix((ctx)->err, "%s", (ctx)->origin))

static tdm_status unsupported(load_ctx *ctx, const char *path, const char *what)
{
    return LOAD_FAIL(ctx, TDM_ERR_UNIMPLEMENTED, "%s: unsupported tokenizer feature: %s", path,
                     what);
}

static const char *json_type_name(const cJSON *j)
{
    if (j == NULL)
        return "missing";
    if (cJSON_IsNull(j))
        return "null";
    if (cJSON_IsBool(j))
        return "a boolean";
    if (cJSON_IsNumber(j))
        return "a number";
    if (cJSON_IsString(j))
        return "a string";
    if (cJSON_IsArray(j))
        return "an array";
    return "an object";
}

/* Flag fields may be absent (then false) but not of another type. */
static tdm_status get_bool(load_ctx *ctx, const cJSON *obj, const char *key, const char *path,
                           bool *out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (j == NULL || cJSON_IsNull(j)) {
        *out = false;
        return TDM_OK;
    }
    if (!cJSON_IsBool(j))
        return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT, "%s.%s: expected a boolean, found %s", path,
                         key, json_type_name(j));
    *out = cJSON_IsTrue(j);
    return TDM_OK;
}

/* A JSON number that is an integer in int32 range (checked before any
 * cast: converting an out-of-range double is undefined behaviour). */
static bool json_is_int32(const cJSON *j)
{
    if (!cJSON_IsNumber(j))
        return false;
    double v = j->valuedouble;
    return v >= -2147483648.0 && v <= 2147483647.0 && v == (double)(int32_t)v;
}

static bool is_null_or_absent(const cJSON *j)
{
    return j == NULL || cJSON_IsNull(j);
}

static const char *type_of(const cJSON *obj)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* Copies a string into the tokenizer's arena; returns NULL on OOM. */
static char *arena_dup(tdm_tokenizer *tok, const char *s, size_t len)
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

static tdm_status load_normalizer(tdm_tokenizer *tok, load_ctx *ctx, const cJSON *n,
                                  const char *path)
{
    if (is_null_or_absent(n))
        return TDM_OK;
    const char *t = type_of(n);
    if (t == NULL)
        return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT, "%s.type: missing", path);
    if (strcmp(t, "NFC") == 0) {
        tok->nfc = true;
        return TDM_OK;
    }
    if (strcmp(t, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list))
            return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT, "%s.normalizers: expected an array",
                             path);
        int i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, list)
        {
            char sub[128];
            snprintf(sub, sizeof(sub), "%s.normalizers[%d]", path, i++);
            const char *st = type_of(it);
            if (st == NULL || strcmp(st, "NFC") != 0) {
                char what[160];
                snprintf(what, sizeof(what), "normalizer '%s' (only NFC is supported)",
                         st ? st : "?");
                return unsupported(ctx, sub, what);
            }
            tok->nfc = true;
        }
        return TDM_OK;
    }
    char what[160];
    snprintf(what, sizeof(what), "normalizer '%s' (only NFC is supported)", t);
    return unsupported(ctx, path, what);
}

/* The regex HF's ByteLevel pre-tokenizer uses when use_regex is true. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* HF runs these patterns with Oniguruma, whose \s is exactly the Unicode
 * White_Space property. PCRE2 (10.42) with UCP also matches U+180E
 * (Mongolian vowel separator, \h for Perl compatibility), so \s and \S are
 * spelled out as that property before compiling. The list is White_Space. */
#define ONIG_SPACE_ITEMS                                                                           \
    "\\t\\n\\x0b\\f\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}"  \
    "\\x{205f}\\x{3000}"

static char *onig_to_pcre2(const char *pat)
{
    static const char items[] = ONIG_SPACE_ITEMS;
    size_t n = strlen(pat), cap = n * (sizeof(items) + 4) + 1;
    char *out = malloc(cap), *o = out;
    if (out == NULL)
        return NULL;
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char ch = pat[i];
        if (ch == '\\' && i + 1 < n) {
            char e = pat[i + 1];
            if (e == 's' || (e == 'S' && !in_class)) {
                if (!in_class)
                    *o++ = '[';
                if (e == 'S')
                    *o++ = '^';
                memcpy(o, items, sizeof(items) - 1);
                o += sizeof(items) - 1;
                if (!in_class)
                    *o++ = ']';
            } else {
                *o++ = ch;
                *o++ = e;
            }
            i++;
            continue;
        }
        if (!in_class && ch == '[') {
            in_class = true;
            *o++ = ch;
            /* A ']' (after an optional '^') right at the start is literal. */
            if (i + 1 < n && pat[i + 1] == '^')
                *o++ = pat[++i];
            if (i + 1 < n && pat[i + 1] == ']')
                *o++ = pat[++i];
            continue;
        }
        if (in_class && ch == '[' && i + 1 < n && pat[i + 1] == ':') {
            /* POSIX class [:name:] inside a class: copy through its ']' */
            const char *end = strstr(pat + i + 2, ":]");
            if (end != NULL) {
                size_t k = (size_t)(end + 2 - (pat + i));
                memcpy(o, pat + i, k);
                o += k;
                i += k - 1;
                continue;
            }
        }
        if (in_class && ch == ']')
            in_class = false;
        *o++ = ch;
    }
    *o = '\0';
    return out;
}

static tdm_status add_split_step(tdm_tokenizer *tok, load_ctx *ctx, const char *pattern,
                                 bool literal, const char *path)
{
    if (tok->n_steps >= TOK_MAX_STEPS)
        return unsupported(ctx, path, "more than 8 pre-tokenizer steps");
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    char *translated = literal ? NULL : onig_to_pcre2(pattern);
    if (!literal && translated == NULL)
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(literal ? pattern : translated),
                                   PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    free(translated);
    if (re == NULL) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof(msg));
        return LOAD_FAIL(ctx, TDM_ERR_UNIMPLEMENTED,
                         "%s: regex cannot be compiled by PCRE2 (near offset %zu of the translated "
                         "pattern): %s",
                         path, (size_t)eo, (const char *)msg);
    }
    /* JIT is an optimisation only: without it pcre2_match interprets. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    tok_step *s = &tok->steps[tok->n_steps++];
    s->re = re;
    s->literal = literal;
    s->pattern = arena_dup(tok, pattern, strlen(pattern));
    if (s->pattern == NULL)
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    return TDM_OK;
}

static tdm_status load_byte_level(tdm_tokenizer *tok, load_ctx *ctx, const cJSON *p,
                                  const char *path)
{
    bool aps, use_regex;
    tdm_status st;
    if ((st = get_bool(ctx, p, "add_prefix_space", path, &aps)) != TDM_OK)
        return st;
    if (aps)
        return unsupported(ctx, path, "ByteLevel with add_prefix_space true");
    const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
    /* HF's default for a missing use_regex is true. */
    use_regex = ur == NULL ? true : cJSON_IsTrue(ur);
    tok->byte_level_regex = use_regex;
    if (use_regex) {
        char sub[160];
        snprintf(sub, sizeof(sub), "%s (ByteLevel regex)", path);
        if ((st = add_split_step(tok, ctx, GPT2_PATTERN, false, sub)) != TDM_OK)
            return st;
        tok->steps[tok->n_steps - 1].from_byte_level = true;
    }
    tok->has_byte_level = true;
    return TDM_OK;
}

static tdm_status load_split(tdm_tokenizer *tok, load_ctx *ctx, const cJSON *p, const char *path)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
    char sub[160];
    snprintf(sub, sizeof(sub), "%s.pattern", path);
    if (!cJSON_IsString(rx) && !cJSON_IsString(lit))
        return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT,
                         "%s: expected {\"Regex\": ...} or {\"String\": ...}", sub);
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    if (!cJSON_IsString(beh))
        return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT, "%s.behavior: expected a string", path);
    if (strcmp(beh->valuestring, "Isolated") != 0) {
        char what[160];
        snprintf(what, sizeof(what), "Split behavior '%s' (only Isolated is supported)",
                 beh->valuestring);
        snprintf(sub, sizeof(sub), "%s.behavior", path);
        return unsupported(ctx, sub, what);
    }
    bool invert;
    tdm_status st = get_bool(ctx, p, "invert", path, &invert);
    if (st != TDM_OK)
        return st;
    if (invert) {
        snprintf(sub, sizeof(sub), "%s.invert", path);
        return unsupported(ctx, sub, "Split with invert true");
    }
    return add_split_step(tok, ctx, cJSON_IsString(rx) ? rx->valuestring : lit->valuestring,
                          !cJSON_IsString(rx), sub);
}

static tdm_status load_pre_tokenizer(tdm_tokenizer *tok, load_ctx *ctx, const cJSON *p)
{
    if (is_null_or_absent(p))
        return unsupported(ctx, "pre_tokenizer", "no pre-tokenizer (a ByteLevel step is required)");
    const char *t = type_of(p);
    if (t != NULL && strcmp(t, "ByteLevel") == 0)
        return load_byte_level(tok, ctx, p, "pre_tokenizer");
    if (t == NULL || strcmp(t, "Sequence") != 0) {
        char what[160];
        snprintf(what, sizeof(what), "pre-tokenizer '%s'", t ? t : "?");
        return unsupported(ctx, "pre_tokenizer", what);
    }
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    if (!cJSON_IsArray(list))
        return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT,
                         "pre_tokenizer.pretokenizers: expected an array");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, list)
    {
        char path[96];
        snprintf(path, sizeof(path), "pre_tokenizer.pretokenizers[%d]", i++);
        if (tok->has_byte_level)
            return unsupported(ctx, path, "a pre-tokenizer step after ByteLevel");
        const char *st = type_of(it);
        tdm_status s;
        if (st != NULL && strcmp(st, "Split") == 0)
            s = load_split(tok, ctx, it, path);
        else if (st != NULL && strcmp(st, "ByteLevel") == 0)
            s = load_byte_level(tok, ctx, it, path);
        else {
            char what[160];
            snprintf(what, sizeof(what), "pre-tokenizer '%s'", st ? st : "?");
            s = unsupported(ctx, path, what);
        }
        if (s != TDM_OK)
            return s;
    }
    if (!tok->has_byte_level)
        return unsupported(ctx, "pre_tokenizer",
                           "a pre-tokenizer without a ByteLevel step (byte-level BPE only)");
    return TDM_OK;
}

static tdm_status check_decoder(load_ctx *ctx, const cJSON *d)
{
    if (is_null_or_absent(d))
        return unsupported(ctx, "decoder", "no decoder (ByteLevel is required)");
    const char *t = type_of(d);
    if (t != NULL && strcmp(t, "ByteLevel") == 0)
        return TDM_OK;
    if (t != NULL && strcmp(t, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        if (cJSON_GetArraySize(list) == 1 && type_of(cJSON_GetArrayItem(list, 0)) != NULL &&
            strcmp(type_of(cJSON_GetArrayItem(list, 0)), "ByteLevel") == 0)
            return TDM_OK;
        return unsupported(ctx, "decoder.decoders", "a decoder Sequence other than [ByteLevel]");
    }
    char what[160];
    snprintf(what, sizeof(what), "decoder '%s' (only ByteLevel is supported)", t ? t : "?");
    return unsupported(ctx, "decoder", what);
}

static tdm_status check_top_level(load_ctx *ctx, const cJSON *root)
{
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    if (!is_null_or_absent(pp)) {
        const char *t = type_of(pp);
        if (t == NULL || strcmp(t, "ByteLevel") != 0) {
            char what[160];
            snprintf(what, sizeof(what), "post-processor '%s' (only ByteLevel is supported)",
                     t ? t : "?");
            return unsupported(ctx, "post_processor", what);
        }
    }
    if (!is_null_or_absent(cJSON_GetObjectItemCaseSensitive(root, "truncation")))
        return unsupported(ctx, "truncation", "truncation settings");
    if (!is_null_or_absent(cJSON_GetObjectItemCaseSensitive(root, "padding")))
        return unsupported(ctx, "padding", "padding settings");
    return TDM_OK;
}

/* Sets id_str[id]; ids grow the table on demand. */
static tdm_status set_id(tdm_tokenizer *tok, load_ctx *ctx, int32_t id, const char *s, uint32_t len,
                         const char *path)
{
    if (id < 0 || id >= TOK_MAX_ID)
        return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT, "%s: id %d out of range [0, %d)", path, id,
                         TOK_MAX_ID);
    if ((size_t)id >= tok->ids_cap) {
        size_t cap = tok->ids_cap ? tok->ids_cap : 1024;
        while (cap <= (size_t)id)
            cap *= 2;
        tok_idinfo *n = realloc(tok->ids, cap * sizeof(*n));
        if (n == NULL)
            return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
        memset(n + tok->ids_cap, 0, (cap - tok->ids_cap) * sizeof(*n));
        tok->ids = n;
        tok->ids_cap = cap;
    }
    if ((size_t)id >= tok->n_ids)
        tok->n_ids = (size_t)id + 1;
    tok->ids[id].str = s;
    tok->ids[id].len = len;
    return TDM_OK;
}

static tdm_status load_model(tdm_tokenizer *tok, load_ctx *ctx, const cJSON *m)
{
    if (!cJSON_IsObject(m))
        return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT, "model: expected an object, found %s",
                         json_type_name(m));
    const char *t = type_of(m);
    if (t != NULL && strcmp(t, "BPE") != 0) {
        char what[160];
        snprintf(what, sizeof(what), "model type '%s' (only BPE is supported)", t);
        return unsupported(ctx, "model.type", what);
    }
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (!is_null_or_absent(drop) && !(cJSON_IsNumber(drop) && drop->valuedouble == 0.0))
        return unsupported(ctx, "model.dropout", "BPE dropout");
    bool bf;
    tdm_status st = get_bool(ctx, m, "byte_fallback", "model", &bf);
    if (st != TDM_OK)
        return st;
    if (bf)
        return unsupported(ctx, "model.byte_fallback", "byte_fallback true");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < TDM_ARRAY_LEN(affixes); i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(m, affixes[i]);
        if (!is_null_or_absent(a) && !(cJSON_IsString(a) && a->valuestring[0] == '\0')) {
            char path[96];
            snprintf(path, sizeof(path), "model.%s", affixes[i]);
            return unsupported(ctx, path, "BPE subword prefix/suffix");
        }
    }
    if ((st = get_bool(ctx, m, "ignore_merges", "model", &tok->ignore_merges)) != TDM_OK)
        return st;

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    if (!cJSON_IsObject(vocab))
        return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT, "model.vocab: expected an object, found %s",
                         json_type_name(vocab));
    int nv = cJSON_GetArraySize(vocab);
    if (!strmap_init(&tok->vocab, (size_t)nv))
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab)
    {
        if (!json_is_int32(it))
            return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT,
                             "model.vocab[\"%.64s\"]: expected an integer id", it->string);
        int32_t id = (int32_t)it->valuedouble;
        uint32_t len = (uint32_t)strlen(it->string);
        char *s = arena_dup(tok, it->string, len);
        if (s == NULL)
            return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
        char path[128];
        snprintf(path, sizeof(path), "model.vocab[\"%.64s\"]", it->string);
        if (id >= 0 && (size_t)id < tok->n_ids && tok->ids[id].str != NULL)
            return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT, "%s: id %d is also used by \"%.64s\"",
                             path, id, tok->ids[id].str);
        if ((st = set_id(tok, ctx, id, s, len, path)) != TDM_OK)
            return st;
        tok->ids[id].in_vocab = true;
        strmap_put(&tok->vocab, s, len, id);
    }
    tok->n_vocab_entries = (size_t)nv;

    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
    uint32_t cp[256];
    byte_level_table(cp);
    for (int b = 0; b < 256; b++) {
        char u[4];
        int n = utf8_put(cp[b], u);
        memcpy(tok->bl_utf8[b], u, 2); /* every byte-level char is 1 or 2 bytes */
        tok->bl_len[b] = (uint8_t)n;
        tok->byte_id[b] = tok__strmap_get(&tok->vocab, u, (size_t)n);
        if (tok->byte_id[b] < 0 && !is_null_or_absent(unk))
            return unsupported(ctx, "model.unk_token",
                               "unk_token with a vocabulary that lacks some byte tokens");
    }

    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (!cJSON_IsArray(merges))
        return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT, "model.merges: expected an array, found %s",
                         json_type_name(merges));
    int nm = cJSON_GetArraySize(merges);
    tok->merges.cap = pow2_at_least((size_t)nm * 2 + 1);
    tok->merges.slots = malloc(tok->merges.cap * sizeof(*tok->merges.slots));
    tok->merge_list = malloc(((size_t)nm + 1) * 2 * sizeof(int32_t));
    if (tok->merges.slots == NULL || tok->merge_list == NULL)
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; i < tok->merges.cap; i++)
        tok->merges.slots[i].new_id = -1;
    int rank = 0;
    char *joined = NULL;
    size_t joined_cap = 0;
    cJSON_ArrayForEach(it, merges)
    {
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        if (cJSON_IsString(it)) {
            /* "left right": exactly one space, as HF requires. */
            const char *s = it->valuestring;
            const char *sp = strchr(s, ' ');
            if (sp == NULL || strchr(sp + 1, ' ') != NULL) {
                free(joined);
                return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT,
                                 "model.merges[%d]: \"%.64s\" is not two tokens separated by one "
                                 "space",
                                 rank, s);
            }
            a = s;
            la = (size_t)(sp - s);
            b = sp + 1;
            lb = strlen(b);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring;
            b = cJSON_GetArrayItem(it, 1)->valuestring;
            la = strlen(a);
            lb = strlen(b);
        } else {
            free(joined);
            return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT,
                             "model.merges[%d]: expected \"a b\" or [\"a\", \"b\"]", rank);
        }
        int32_t ia = tok__strmap_get(&tok->vocab, a, la);
        int32_t ib = tok__strmap_get(&tok->vocab, b, lb);
        if (la + lb + 1 > joined_cap) {
            joined_cap = (la + lb + 1) * 2;
            char *n = realloc(joined, joined_cap);
            if (n == NULL) {
                free(joined);
                return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
            }
            joined = n;
        }
        memcpy(joined, a, la);
        memcpy(joined + la, b, lb);
        int32_t inew = tok__strmap_get(&tok->vocab, joined, la + lb);
        if (ia < 0 || ib < 0 || inew < 0) {
            tdm_status r = LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT,
                                     "model.merges[%d]: token \"%.*s\" is not in model.vocab", rank,
                                     (int)(ia < 0   ? la
                                           : ib < 0 ? lb
                                                    : la + lb),
                                     ia < 0   ? a
                                     : ib < 0 ? b
                                              : joined);
            free(joined);
            return r;
        }
        mergemap_put(&tok->merges, ia, ib, rank, inew);
        tok->merge_list[2 * rank] = ia;
        tok->merge_list[2 * rank + 1] = ib;
        rank++;
    }
    free(joined);
    tok->n_merges = (size_t)rank;
    return TDM_OK;
}

static int cmp_added_len_desc(const void *a, const void *b)
{
    const tok_added *x = *(const tok_added *const *)a, *y = *(const tok_added *const *)b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int cmp_added_id(const void *a, const void *b)
{
    const tok_added *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Builds one matcher: per first byte, the tokens longest first, so the
 * first hit at a position is HF's leftmost-longest match. */
static tdm_status build_matcher(tdm_tokenizer *tok, tok_matcher *mt, bool normalized)
{
    size_t n = 0;
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].normalized == normalized && tok->added[i].mlen > 0)
            n++;
    mt->n = n;
    if (n == 0)
        return TDM_OK;
    mt->list = malloc(n * sizeof(*mt->list));
    if (mt->list == NULL)
        return TDM_ERR_RESOURCE_EXHAUSTED;
    size_t k = 0;
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].normalized == normalized && tok->added[i].mlen > 0)
            mt->list[k++] = &tok->added[i];
    /* Stable grouping by first byte, longest first within a byte. */
    qsort(mt->list, n, sizeof(*mt->list), cmp_added_len_desc);
    tok_added **sorted = malloc(n * sizeof(*sorted));
    if (sorted == NULL)
        return TDM_ERR_RESOURCE_EXHAUSTED;
    size_t pos = 0;
    for (int b = 0; b < 256; b++) {
        mt->first[b] = (uint32_t)pos;
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)mt->list[i]->match[0] == b)
                sorted[pos++] = mt->list[i];
    }
    mt->first[256] = (uint32_t)pos;
    free(mt->list);
    mt->list = sorted;
    return TDM_OK;
}

static tdm_status load_added(tdm_tokenizer *tok, load_ctx *ctx, const cJSON *arr)
{
    if (is_null_or_absent(arr))
        return TDM_OK;
    if (!cJSON_IsArray(arr))
        return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT, "added_tokens: expected an array, found %s",
                         json_type_name(arr));
    int n = cJSON_GetArraySize(arr);
    tok->added = calloc((size_t)n + 1, sizeof(*tok->added));
    if (tok->added == NULL)
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    const cJSON *it;
    int i = 0;
    cJSON_ArrayForEach(it, arr)
    {
        char path[64];
        snprintf(path, sizeof(path), "added_tokens[%d]", i++);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!json_is_int32(id))
            return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT, "%s.id: expected an integer", path);
        if (!cJSON_IsString(content) || content->valuestring[0] == '\0')
            return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT,
                             "%s.content: expected a non-empty string", path);
        tok_added *a = &tok->added[tok->n_added];
        tdm_status st;
        bool single_word;
        if ((st = get_bool(ctx, it, "special", path, &a->special)) != TDM_OK ||
            (st = get_bool(ctx, it, "normalized", path, &a->normalized)) != TDM_OK ||
            (st = get_bool(ctx, it, "lstrip", path, &a->lstrip)) != TDM_OK ||
            (st = get_bool(ctx, it, "rstrip", path, &a->rstrip)) != TDM_OK ||
            (st = get_bool(ctx, it, "single_word", path, &single_word)) != TDM_OK)
            return st;
        if (single_word) {
            char sub[96];
            snprintf(sub, sizeof(sub), "%s.single_word", path);
            return unsupported(ctx, sub, "added token with single_word true");
        }
        a->id = (int32_t)id->valuedouble;
        a->len = (uint32_t)strlen(content->valuestring);
        a->content = arena_dup(tok, content->valuestring, a->len);
        if (a->content == NULL)
            return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
        a->match = a->content;
        a->mlen = a->len;
        if (a->normalized && tok->nfc) {
            /* HF matches normalized tokens by their normalized form. */
            char *norm;
            size_t nlen;
            if (tok__nfc(a->content, a->len, &norm, &nlen) != TDM_OK)
                return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "%s: NFC failed", path);
            a->match = arena_dup(tok, norm, nlen);
            a->mlen = (uint32_t)nlen;
            free(norm);
            if (a->match == NULL)
                return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
        }
        if ((st = set_id(tok, ctx, a->id, a->content, a->len, path)) != TDM_OK)
            return st;
        tok->ids[a->id].special = a->special;
        tok->n_added++;
    }
    qsort(tok->added, tok->n_added, sizeof(*tok->added), cmp_added_id);
    for (size_t k = 1; k < tok->n_added; k++)
        if (tok->added[k].id == tok->added[k - 1].id)
            return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT, "added_tokens: id %d appears twice",
                             tok->added[k].id);
    if (!strmap_init(&tok->added_map, tok->n_added))
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t k = 0; k < tok->n_added; k++)
        strmap_put(&tok->added_map, tok->added[k].content, tok->added[k].len, tok->added[k].id);
    if (build_matcher(tok, &tok->match_raw, false) != TDM_OK ||
        build_matcher(tok, &tok->match_norm, true) != TDM_OK)
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    return TDM_OK;
}

static tdm_status build_decode_table(tdm_tokenizer *tok, load_ctx *ctx)
{
    uint32_t cp[256];
    int byte_of_cp[512];
    byte_level_table(cp);
    for (int i = 0; i < 512; i++)
        byte_of_cp[i] = -1;
    for (int b = 0; b < 256; b++)
        byte_of_cp[cp[b]] = b;
    size_t total = 0;
    for (size_t i = 0; i < tok->n_ids; i++)
        total += tok->ids[i].len;
    tok->dec_bytes = malloc(total + 1);
    if (tok->dec_bytes == NULL)
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    size_t off = 0;
    for (size_t i = 0; i < tok->n_ids; i++) {
        tok_idinfo *e = &tok->ids[i];
        if (e->str == NULL)
            continue;
        uint32_t n;
        if (!token_decoded_bytes(e->str, e->len, byte_of_cp, tok->dec_bytes + off, &n))
            return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT, "token %zu is not valid UTF-8", i);
        e->dec_off = (uint32_t)off;
        e->dec_len = n;
        off += n;
    }
    return TDM_OK;
}

/* ------------------------------------------------------------------------ */
/* Fingerprint                                                              */
/* ------------------------------------------------------------------------ */

static void fp_field(EVP_MD_CTX *md, const void *p, size_t n)
{
    unsigned char len[4] = {(unsigned char)n, (unsigned char)(n >> 8), (unsigned char)(n >> 16),
                            (unsigned char)(n >> 24)};
    EVP_DigestUpdate(md, len, 4);
    EVP_DigestUpdate(md, p, n);
}

static void fp_str(EVP_MD_CTX *md, const char *s)
{
    fp_field(md, s, strlen(s));
}

static void fp_int(EVP_MD_CTX *md, long long v)
{
    char b[32];
    fp_field(md, b, (size_t)snprintf(b, sizeof(b), "%lld", v));
}

static tdm_status compute_fingerprint(tdm_tokenizer *tok, load_ctx *ctx)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (md == NULL || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(md);
        return LOAD_FAIL(ctx, TDM_ERR_INTERNAL, "SHA-256 unavailable from OpenSSL");
    }
    fp_str(md, "tandem.tokenizer.v1");
    fp_str(md, "normalizer");
    fp_str(md, tok->nfc ? "NFC" : "none");
    fp_str(md, "pre_tokenizer");
    /* The ByteLevel regex is part of the ByteLevel step, not a Split. */
    size_t n_split = 0;
    for (size_t i = 0; i < tok->n_steps; i++)
        n_split += !tok->steps[i].from_byte_level;
    fp_int(md, (long long)n_split + 1);
    for (size_t i = 0; i < tok->n_steps; i++) {
        if (tok->steps[i].from_byte_level)
            continue;
        fp_str(md, "Split");
        fp_str(md, tok->steps[i].literal ? "String" : "Regex");
        fp_str(md, tok->steps[i].pattern);
        fp_str(md, "Isolated");
        fp_str(md, "invert=0");
    }
    fp_str(md, "ByteLevel");
    fp_str(md, "add_prefix_space=0");
    fp_str(md, tok->byte_level_regex ? "use_regex=1" : "use_regex=0");
    fp_str(md, "model");
    fp_str(md, "BPE");
    fp_str(md, tok->ignore_merges ? "ignore_merges=1" : "ignore_merges=0");
    fp_str(md, "vocab");
    fp_int(md, (long long)tok->n_vocab_entries);
    for (size_t i = 0; i < tok->n_ids; i++) {
        if (!tok->ids[i].in_vocab)
            continue;
        fp_int(md, (long long)i);
        /* An added token may share the id; the vocab string is the one
         * in the vocab map. */
        const char *s = tok->ids[i].vocab_str ? tok->ids[i].vocab_str : tok->ids[i].str;
        uint32_t n = tok->ids[i].vocab_str ? tok->ids[i].vocab_len : tok->ids[i].len;
        fp_field(md, s, n);
    }
    fp_str(md, "merges");
    fp_int(md, (long long)tok->n_merges);
    for (size_t r = 0; r < tok->n_merges; r++) {
        for (int k = 0; k < 2; k++) {
            const tok_idinfo *e = &tok->ids[tok->merge_list[2 * r + (size_t)k]];
            fp_field(md, e->vocab_str ? e->vocab_str : e->str,
                     e->vocab_str ? e->vocab_len : e->len);
        }
    }
    fp_str(md, "added");
    fp_int(md, (long long)tok->n_added);
    for (size_t i = 0; i < tok->n_added; i++) {
        const tok_added *a = &tok->added[i];
        char flags[96];
        snprintf(flags, sizeof(flags), "special=%d normalized=%d lstrip=%d rstrip=%d", a->special,
                 a->normalized, a->lstrip, a->rstrip);
        fp_int(md, a->id);
        fp_field(md, a->content, a->len);
        fp_str(md, flags);
    }
    fp_str(md, "decoder");
    fp_str(md, "ByteLevel");
    unsigned char digest[32];
    unsigned int dlen = 0;
    int ok = EVP_DigestFinal_ex(md, digest, &dlen);
    EVP_MD_CTX_free(md);
    if (ok != 1 || dlen != 32)
        return LOAD_FAIL(ctx, TDM_ERR_INTERNAL, "SHA-256 failed");
    for (int i = 0; i < 32; i++)
        snprintf(tok->fingerprint + 2 * i, 3, "%02x", digest[i]);
    return TDM_OK;
}

/* ------------------------------------------------------------------------ */
/* Public: load / destroy                                                   */
/* ------------------------------------------------------------------------ */

tdm_status tdm_tok_load_json(const char *json, size_t len, const char *origin, tdm_tokenizer **out,
                             tdm_error *err)
{
    *out = NULL;
    load_ctx ctx = {origin ? origin : "<buffer>", err};
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (root == NULL) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = (at != NULL && at >= json && at <= json + len) ? (size_t)(at - json) : 0;
        return LOAD_FAIL(&ctx, TDM_ERR_INVALID_ARGUMENT, "not valid JSON (near byte offset %zu)",
                         off);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return LOAD_FAIL(&ctx, TDM_ERR_INVALID_ARGUMENT, "top level: expected a JSON object");
    }
    tdm_tokenizer *tok = calloc(1, sizeof(*tok));
    if (tok == NULL) {
        cJSON_Delete(root);
        return LOAD_FAIL(&ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_init(&tok->cache_lock, NULL);
    tdm_status st;
    if ((st = check_top_level(&ctx, root)) != TDM_OK ||
        (st = load_normalizer(tok, &ctx, cJSON_GetObjectItemCaseSensitive(root, "normalizer"),
                              "normalizer")) != TDM_OK ||
        (st = load_pre_tokenizer(
             tok, &ctx, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"))) != TDM_OK ||
        (st = check_decoder(&ctx, cJSON_GetObjectItemCaseSensitive(root, "decoder"))) != TDM_OK ||
        (st = load_model(tok, &ctx, cJSON_GetObjectItemCaseSensitive(root, "model"))) != TDM_OK) {
        cJSON_Delete(root);
        tdm_tok_destroy(tok);
        return st;
    }
    /* Remember the vocab strings before added tokens may take over ids. */
    for (size_t i = 0; i < tok->n_ids; i++) {
        tok->ids[i].vocab_str = tok->ids[i].str;
        tok->ids[i].vocab_len = tok->ids[i].len;
    }
    if ((st = load_added(tok, &ctx, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"))) !=
            TDM_OK ||
        (st = build_decode_table(tok, &ctx)) != TDM_OK ||
        (st = compute_fingerprint(tok, &ctx)) != TDM_OK || (st = tok__cache_init(tok)) != TDM_OK) {
        if (st == TDM_ERR_RESOURCE_EXHAUSTED && err && err->msg[0] == '\0')
            LOAD_FAIL(&ctx, st, "out of memory");
        cJSON_Delete(root);
        tdm_tok_destroy(tok);
        return st;
    }
    cJSON_Delete(root);
    static const char *const names[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    int32_t found[3];
    for (int i = 0; i < 3; i++)
        found[i] = tdm_tok_token_to_id(tok, names[i], strlen(names[i]));
    tok->specials.endoftext = found[0];
    tok->specials.im_start = found[1];
    tok->specials.im_end = found[2];
    tok->specials.eos = found[2] >= 0 ? found[2] : found[0];
    tok->specials.pad = found[0];
    *out = tok;
    return TDM_OK;
}

tdm_status tdm_tok_load(const char *path, tdm_tokenizer **out, tdm_error *err)
{
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    tdm_status st = tdm_file_read(path, (size_t)1 << 30, &buf, &len, err);
    if (st != TDM_OK)
        return tdm_error_prefix(err, "tokenizer file");
    st = tdm_tok_load_json(buf, len, path, out, err);
    free(buf);
    return st;
}

void tdm_tok_destroy(tdm_tokenizer *tok)
{
    if (tok == NULL)
        return;
    tok__cache_free(tok);
    pthread_mutex_destroy(&tok->cache_lock);
    for (size_t i = 0; i < tok->n_steps; i++)
        pcre2_code_free(tok->steps[i].re);
    free(tok->vocab.slots);
    free(tok->added_map.slots);
    free(tok->merges.slots);
    free(tok->merge_list);
    free(tok->match_raw.list);
    free(tok->match_norm.list);
    free(tok->added);
    free(tok->ids);
    free(tok->dec_bytes);
    while (tok->arena) {
        tok_arena_block *n = tok->arena->next;
        free(tok->arena);
        tok->arena = n;
    }
    free(tok);
}

/* ------------------------------------------------------------------------ */
/* Lookups                                                                  */
/* ------------------------------------------------------------------------ */

size_t tdm_tok_vocab_size(const tdm_tokenizer *tok)
{
    return tok->n_ids;
}

int32_t tdm_tok_token_to_id(const tdm_tokenizer *tok, const char *token, size_t len)
{
    int32_t id = tok__strmap_get(&tok->added_map, token, len);
    return id >= 0 ? id : tok__strmap_get(&tok->vocab, token, len);
}

const char *tdm_tok_id_to_token(const tdm_tokenizer *tok, int32_t id, size_t *len)
{
    if (id < 0 || (size_t)id >= tok->n_ids || tok->ids[id].str == NULL)
        return NULL;
    if (len)
        *len = tok->ids[id].len;
    return tok->ids[id].str;
}

bool tdm_tok_is_special(const tdm_tokenizer *tok, int32_t id)
{
    return id >= 0 && (size_t)id < tok->n_ids && tok->ids[id].special;
}

const tdm_tok_specials *tdm_tok_specials_get(const tdm_tokenizer *tok)
{
    return &tok->specials;
}

tdm_status tdm_tok_fingerprint(const tdm_tokenizer *tok, char out_hex[65])
{
    memcpy(out_hex, tok->fingerprint, 65);
    return TDM_OK;
}

tdm_status tdm_tok_fingerprint_file(const char *path, char out_hex[65], tdm_error *err)
{
    tdm_tokenizer *tok;
    tdm_status st = tdm_tok_load(path, &tok, err);
    if (st != TDM_OK)
        return st;
    st = tdm_tok_fingerprint(tok, out_hex);
    tdm_tok_destroy(tok);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct tok_buf {
    char *p;
    size_t len, cap;
} tok_buf;

static bool buf_reserve(tok_buf *b, size_t more)
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

static bool buf_append(tok_buf *b, const char *s, size_t n)
{
    if (!buf_reserve(b, n))
        return false;
    if (n > 0) /* s may be NULL when n is 0 */
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

static const char REPLACEMENT[] = "\xEF\xBF\xBD"; /* U+FFFD */

/* Appends bytes[0..n) to out as lossy UTF-8 and returns how many trailing
 * bytes were held back because they may still become a character (only
 * when `final` is false; when final they become U+FFFD). */
static bool lossy_append(tok_buf *out, const unsigned char *p, size_t n, bool final, size_t *held)
{
    size_t i = 0, start = 0;
    *held = 0;
    if (!buf_reserve(out, n + 3 * n))
        return false;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int c = tok__utf8_class(p + i, n - i);
        if (c > 0) {
            i += (size_t)c;
            continue;
        }
        buf_append(out, (const char *)p + start, i - start);
        if (c == 0 && !final) {
            *held = n - i;
            return true;
        }
        buf_append(out, REPLACEMENT, 3);
        i += c == 0 ? n - i : (size_t)-c;
        start = i;
    }
    buf_append(out, (const char *)p + start, i - start);
    return true;
}

static tdm_status check_id(const tdm_tokenizer *tok, int32_t id, tdm_error *err)
{
    if (id < 0 || (size_t)id >= tok->n_ids)
        return tdm_error_set(err, TDM_ERR_OUT_OF_RANGE, "token id %d is out of range [0, %zu)", id,
                             tok->n_ids);
    if (tok->ids[id].str == NULL)
        return tdm_error_set(err, TDM_ERR_OUT_OF_RANGE, "token id %d names no token", id);
    return TDM_OK;
}

tdm_status tdm_tok_decode(const tdm_tokenizer *tok, const int32_t *ids, size_t n_ids,
                          bool skip_special, char **text, size_t *len, tdm_error *err)
{
    *text = NULL;
    tok_buf raw = {0}, out = {0};
    for (size_t i = 0; i < n_ids; i++) {
        tdm_status st = check_id(tok, ids[i], err);
        if (st != TDM_OK) {
            free(raw.p);
            return tdm_error_prefix(err, "ids[%zu]", i);
        }
        const tok_idinfo *e = &tok->ids[ids[i]];
        if (skip_special && e->special)
            continue;
        if (!buf_append(&raw, tok->dec_bytes + e->dec_off, e->dec_len)) {
            free(raw.p);
            return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
        }
    }
    size_t held;
    if (!buf_reserve(&out, 0) ||
        !lossy_append(&out, (const unsigned char *)raw.p, raw.len, true, &held)) {
        free(raw.p);
        free(out.p);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    }
    free(raw.p);
    out.p[out.len] = '\0';
    *text = out.p;
    if (len)
        *len = out.len;
    return TDM_OK;
}

struct tdm_tok_stream {
    const tdm_tokenizer *tok;
    bool skip_special;
    unsigned char pending[8]; /* bytes of an unfinished character (at most 3) */
    size_t n_pending;
    tok_buf scratch; /* pending + the new token's bytes */
    tok_buf out;     /* what the last push/flush returned */
};

tdm_status tdm_tok_stream_create(const tdm_tokenizer *tok, bool skip_special, tdm_tok_stream **out,
                                 tdm_error *err)
{
    tdm_tok_stream *s = calloc(1, sizeof(*s));
    if (s == NULL || !buf_reserve(&s->out, 16)) {
        free(s);
        *out = NULL;
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    }
    s->tok = tok;
    s->skip_special = skip_special;
    s->out.p[0] = '\0';
    *out = s;
    return TDM_OK;
}

tdm_status tdm_tok_stream_push(tdm_tok_stream *s, int32_t id, const char **text, size_t *len,
                               tdm_error *err)
{
    s->out.len = 0;
    s->out.p[0] = '\0';
    *text = s->out.p;
    *len = 0;
    tdm_status st = check_id(s->tok, id, err);
    if (st != TDM_OK)
        return st;
    const tok_idinfo *e = &s->tok->ids[id];
    if (s->skip_special && e->special)
        return TDM_OK;
    s->scratch.len = 0;
    size_t held;
    if (!buf_append(&s->scratch, (const char *)s->pending, s->n_pending) ||
        !buf_append(&s->scratch, s->tok->dec_bytes + e->dec_off, e->dec_len) ||
        !lossy_append(&s->out, (const unsigned char *)s->scratch.p, s->scratch.len, false, &held))
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    /* A held-back prefix is a valid start of a character: at most 3 bytes. */
    TDM_ASSERT(held <= 3);
    memcpy(s->pending, s->scratch.p + s->scratch.len - held, held);
    s->n_pending = held;
    s->out.p[s->out.len] = '\0';
    *text = s->out.p;
    *len = s->out.len;
    return TDM_OK;
}

void tdm_tok_stream_flush(tdm_tok_stream *s, const char **text, size_t *len)
{
    s->out.len = 0;
    if (s->n_pending > 0)
        buf_append(&s->out, REPLACEMENT, 3);
    s->n_pending = 0;
    s->out.p[s->out.len] = '\0';
    *text = s->out.p;
    *len = s->out.len;
}

void tdm_tok_stream_destroy(tdm_tok_stream *s)
{
    if (s == NULL)
        return;
    free(s->scratch.p);
    free(s->out.p);
    free(s);
}

/* ------------------------------------------------------------------------ */
/* ChatML                                                                   */
/* ------------------------------------------------------------------------ */

tdm_status tdm_tok_chatml(const tdm_tok_message *msgs, size_t n_msgs, bool add_generation_prompt,
                          char **text, size_t *len, tdm_error *err)
{
    *text = NULL;
    tok_buf b = {0};
    bool ok = buf_reserve(&b, 0);
    for (size_t i = 0; ok && i < n_msgs; i++) {
        const char *role = msgs[i].role, *content = msgs[i].content;
        if (role == NULL || role[0] == '\0' || strpbrk(role, "\r\n") != NULL) {
            free(b.p);
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "messages[%zu].role: must be a non-empty single line", i);
        }
        if (content == NULL) {
            free(b.p);
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "messages[%zu].content: missing",
                                 i);
        }
        ok = buf_append(&b, "<|im_start|>", 12) && buf_append(&b, role, strlen(role)) &&
             buf_append(&b, "\n", 1) && buf_append(&b, content, strlen(content)) &&
             buf_append(&b, "<|im_end|>\n", 11);
    }
    if (ok && add_generation_prompt)
        ok = buf_append(&b, "<|im_start|>assistant\n", 22);
    if (!ok) {
        free(b.p);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory");
    }
    b.p[b.len] = '\0';
    *text = b.p;
    if (len)
        *len = b.len;
    return TDM_OK;
}

tdm_status tdm_tok_encode_chat(const tdm_tokenizer *tok, const tdm_tok_message *msgs, size_t n_msgs,
                               bool add_generation_prompt, int32_t **ids, size_t *n_ids,
                               tdm_error *err)
{
    *ids = NULL;
    *n_ids = 0;
    if (tok->specials.im_start < 0 || tok->specials.im_end < 0)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "the tokenizer has no <|im_start|>/<|im_end|> tokens: it cannot "
                             "encode ChatML");
    char *text;
    size_t len;
    tdm_status st = tdm_tok_chatml(msgs, n_msgs, add_generation_prompt, &text, &len, err);
    if (st != TDM_OK)
        return st;
    st = tdm_tok_encode(tok, text, len, ids, n_ids, err);
    free(text);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */
/* ------------------------------------------------------------------------ */

static tdm_status tok__nfc(const char *s, size_t n, char **out, size_t *out_len)
{
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) {
        free(dst);
        return TDM_ERR_INVALID_ARGUMENT;
    }
    *out = (char *)dst;
    *out_len = (size_t)r;
    return TDM_OK;
}

/* A code point is NFC-inert when NFC can neither decompose it, reorder it
 * nor compose it with what precedes it: combining class 0, no canonical
 * decomposition, and not the second half of any composition (utf8proc marks
 * those with comb_index >= 0x8000; Hangul V and T jamo compose
 * algorithmically). A text of inert code points is its own NFC, so the
 * common case skips utf8proc_map. */
static tdm_status nfc_inert_init(tdm_tokenizer *tok)
{
    tok->nfc_inert = calloc(TOK_NFC_INERT_LIMIT / 8, 1);
    if (tok->nfc_inert == NULL)
        return TDM_ERR_RESOURCE_EXHAUSTED;
    for (uint32_t cp = 0; cp < TOK_NFC_INERT_LIMIT; cp++) {
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        bool second = p->comb_index != UINT16_MAX && p->comb_index >= 0x8000;
        bool jamo_vt = (cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2);
        if (p->combining_class != 0 || second || jamo_vt)
            continue;
        bool inert = !(p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0);
        if (cp >= 0xAC00 && cp <= 0xD7A3) {
            inert = true; /* Hangul syllables recompose algorithmically */
        } else if (!inert) {
            /* A precomposed character stays as it is when NFC recomposes it
             * and its decomposition starts with a starter that cannot
             * compose with what precedes it. */
            utf8proc_int32_t d[8];
            int last = 0;
            utf8proc_ssize_t nd =
                utf8proc_decompose_char((utf8proc_int32_t)cp, d, 8, UTF8PROC_DECOMPOSE, &last);
            char u[4];
            int ul = utf8_put(cp, u);
            char *norm = NULL;
            size_t nl = 0;
            if (nd > 0 && nd <= 8 && tok__nfc(u, (size_t)ul, &norm, &nl) == TDM_OK) {
                const utf8proc_property_t *f = utf8proc_get_property(d[0]);
                inert = nl == (size_t)ul && memcmp(norm, u, nl) == 0 && f->combining_class == 0 &&
                        !(f->comb_index != UINT16_MAX && f->comb_index >= 0x8000);
            }
            free(norm);
        }
        if (inert)
            tok->nfc_inert[cp >> 3] |= (uint8_t)(1u << (cp & 7));
    }
    return TDM_OK;
}

static bool text_is_nfc_inert(const tdm_tokenizer *tok, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0xCC) { /* ASCII, continuation bytes and leads below U+0300 */
            i++;
            continue;
        }
        int k = tok__utf8_class(p + i, n - i);
        if (k <= 0)
            return false;
        uint32_t cp = utf8_get(p + i, k);
        if (cp >= TOK_NFC_INERT_LIMIT || !(tok->nfc_inert[cp >> 3] & (1u << (cp & 7))))
            return false;
        i += (size_t)k;
    }
    return true;
}

/* Length of the character at p[0..n) (> 0; the text is valid UTF-8) and
 * whether it is NFC-inert. */
static int char_inert(const tdm_tokenizer *tok, const unsigned char *p, size_t n, bool *inert)
{
    if (p[0] < 0x80) {
        *inert = true;
        return 1;
    }
    int k = tok__utf8_class(p, n);
    if (k <= 0) {
        *inert = false;
        return 1;
    }
    uint32_t cp = utf8_get(p, k);
    *inert = cp < 0x300 ||
             (cp < TOK_NFC_INERT_LIMIT && (tok->nfc_inert[cp >> 3] & (1u << (cp & 7))) != 0);
    return k;
}

/* NFC of s[0..n), normalizing only the stretches that can change: each run
 * of non-inert characters together with the inert character before it (a
 * base that marks may compose with). Text that starts with an inert
 * character normalizes independently of what precedes it, so the pieces
 * concatenate to the NFC of the whole. *out is malloc'd. */
static tdm_status nfc_by_segments(const tdm_tokenizer *tok, const char *s, size_t n, char **out,
                                  size_t *out_len)
{
    const unsigned char *p = (const unsigned char *)s;
    tok_buf b = {0};
    size_t i = 0, copied = 0, last_inert = 0;
    bool ok = buf_reserve(&b, n);
    while (ok && i < n) {
        bool inert;
        int k = char_inert(tok, p + i, n - i, &inert);
        if (inert) {
            last_inert = i;
            i += (size_t)k;
            continue;
        }
        size_t start = last_inert > copied ? last_inert : copied, j = i + (size_t)k;
        while (j < n) {
            k = char_inert(tok, p + j, n - j, &inert);
            if (inert)
                break;
            j += (size_t)k;
        }
        char *norm;
        size_t nl;
        ok = buf_append(&b, s + copied, start - copied) &&
             tok__nfc(s + start, j - start, &norm, &nl) == TDM_OK;
        if (ok) {
            ok = buf_append(&b, norm, nl);
            free(norm);
        }
        copied = i = j;
    }
    if (!ok || !buf_append(&b, s + copied, n - copied)) {
        free(b.p);
        return TDM_ERR_RESOURCE_EXHAUSTED;
    }
    *out = b.p;
    *out_len = b.len;
    return TDM_OK;
}

static tdm_status tok__cache_init(tdm_tokenizer *tok)
{
    if (tok->nfc && nfc_inert_init(tok) != TDM_OK)
        return TDM_ERR_RESOURCE_EXHAUSTED;
    tok->cache = calloc(TOK_CACHE_SLOTS, sizeof(*tok->cache));
    return tok->cache ? TDM_OK : TDM_ERR_RESOURCE_EXHAUSTED;
}

static void tok__cache_free(tdm_tokenizer *tok)
{
    free(tok->cache);
    tok->cache = NULL;
    free(tok->nfc_inert);
    tok->nfc_inert = NULL;
}

/* A pending merge of the symbol at `pos` with its right neighbour. */
typedef struct bpe_merge {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
} bpe_merge;

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
    bpe_merge *heap; /* (heap_cap) */
    size_t heap_cap;
    char *word; /* (word_cap) a word in the byte-level alphabet */
    size_t word_cap;
    tdm_error *err;
} enc_ctx;

static bool emit_grow(enc_ctx *c)
{
    size_t cap = c->cap ? c->cap * 2 : 256;
    int32_t *n = realloc(c->ids, cap * sizeof(*n));
    if (n == NULL)
        return false;
    c->ids = n;
    c->cap = cap;
    return true;
}

static inline bool emit(enc_ctx *c, int32_t id)
{
    if (c->n == c->cap && !emit_grow(c))
        return false;
    c->ids[c->n++] = id;
    return true;
}

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
        if (!emit(c, c->sym_id[i]))
            return false;
    return true;
}

/* One pre-tokenized word -> ids, through the word cache when it fits; with
 * ignore_merges a word that is a vocabulary entry is that entry. */
static bool encode_word(enc_ctx *c, const unsigned char *w, size_t n)
{
    const tdm_tokenizer *tok = c->tok;
    if (n == 1) {
        int32_t id = tok->byte_id[w[0]];
        return id < 0 || emit(c, id);
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
                    if (!emit(c, ids[i]))
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
            if (!emit(c, id))
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

static tdm_status oom(enc_ctx *c)
{
    return tdm_error_set(c->err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory while encoding");
}

/* Pre-tokenizer step `step` over s[0..n): regex matches and the gaps between
 * them become pieces (behaviour Isolated), each handed to the next step. */
static tdm_status pre_tokenize(enc_ctx *c, const char *s, size_t n, size_t step)
{
    const tdm_tokenizer *tok = c->tok;
    if (n == 0)
        return TDM_OK;
    if (step == tok->n_steps)
        return encode_word(c, (const unsigned char *)s, n) ? TDM_OK : oom(c);
    const tok_step *st = &tok->steps[step];
    size_t pos = 0, prev = 0;
    while (pos < n) {
        int rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, c->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                             c->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            return tdm_error_set(c->err, TDM_ERR_RESOURCE_EXHAUSTED,
                                 "pre-tokenizer regex failed on a %zu-byte piece: %s", n,
                                 (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t a = ov[0], b = ov[1];
        if (a == b) {
            /* An empty match yields no piece; step over one character. */
            pos = b + 1;
            while (pos < n && ((unsigned char)s[pos] & 0xC0) == 0x80)
                pos++;
            continue;
        }
        tdm_status r;
        if (a > prev && (r = pre_tokenize(c, s + prev, a - prev, step + 1)) != TDM_OK)
            return r;
        if ((r = pre_tokenize(c, s + a, b - a, step + 1)) != TDM_OK)
            return r;
        prev = pos = b;
    }
    return prev < n ? pre_tokenize(c, s + prev, n - prev, step + 1) : TDM_OK;
}

/* Rust's char::is_whitespace (the Unicode White_Space property). */
static bool is_unicode_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

/* Bytes of whitespace at the end of s[0..n). */
static size_t space_before(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = n;
    while (i > 0) {
        size_t j = i - 1;
        while (j > 0 && (p[j] & 0xC0) == 0x80)
            j--;
        int k = tok__utf8_class(p + j, i - j);
        if (k <= 0 || !is_unicode_space(utf8_get(p + j, k)))
            break;
        i = j;
    }
    return n - i;
}

/* Bytes of whitespace at the start of s[0..n). */
static size_t space_after(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        int k = tok__utf8_class(p + i, n - i);
        if (k <= 0 || !is_unicode_space(utf8_get(p + i, k)))
            break;
        i += (size_t)k;
    }
    return i;
}

typedef tdm_status (*gap_fn)(enc_ctx *c, const char *s, size_t n);

/* Splits s[0..n) on the added tokens of `mt` (leftmost, then longest, as
 * HF's aho-corasick LeftmostLongest), emitting their ids and handing the
 * text between them to `gap`. */
static tdm_status split_added(enc_ctx *c, const tok_matcher *mt, const char *s, size_t n,
                              gap_fn gap)
{
    size_t pos = 0, done = 0;
    if (mt->n > 0) {
        while (pos < n) {
            const tok_added *hit = NULL;
            size_t p;
            for (p = pos; p < n && hit == NULL; p++) {
                unsigned char b = (unsigned char)s[p];
                for (uint32_t k = mt->first[b]; k < mt->first[b + 1]; k++) {
                    const tok_added *a = mt->list[k];
                    if (a->mlen <= n - p && memcmp(s + p, a->match, a->mlen) == 0) {
                        hit = a;
                        break;
                    }
                }
            }
            if (hit == NULL)
                break;
            p--; /* the loop stepped past the hit */
            size_t start = p, stop = p + hit->mlen;
            if (hit->lstrip) {
                size_t ns = start - space_before(s, start);
                start = ns > done ? ns : done;
            }
            if (hit->rstrip)
                stop += space_after(s + stop, n - stop);
            if (start > done) {
                tdm_status r = gap(c, s + done, start - done);
                if (r != TDM_OK)
                    return r;
            }
            if (!emit(c, hit->id))
                return oom(c);
            done = stop;
            pos = p + hit->mlen;
        }
    }
    return done < n ? gap(c, s + done, n - done) : TDM_OK;
}

static tdm_status after_normalized_tokens(enc_ctx *c, const char *s, size_t n)
{
    return pre_tokenize(c, s, n, 0);
}

/* A piece between raw added tokens: normalize, then look for normalized
 * added tokens, then pre-tokenize. */
static tdm_status after_raw_tokens(enc_ctx *c, const char *s, size_t n)
{
    const tdm_tokenizer *tok = c->tok;
    if (!tok->nfc || text_is_nfc_inert(tok, s, n))
        return split_added(c, &tok->match_norm, s, n, after_normalized_tokens);
    char *norm;
    size_t nlen;
    if (nfc_by_segments(tok, s, n, &norm, &nlen) != TDM_OK)
        return oom(c);
    tdm_status r = split_added(c, &tok->match_norm, norm, nlen, after_normalized_tokens);
    free(norm);
    return r;
}

tdm_status tdm_tok_encode(const tdm_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                          size_t *n_ids, tdm_error *err)
{
    *ids = NULL;
    *n_ids = 0;
    if (text == NULL && len > 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "text is NULL");
    tdm_status st = tok__utf8_check(text, len, err);
    if (st != TDM_OK)
        return st;
    enc_ctx c = {.tok = tok, .tok_mut = (tdm_tokenizer *)tok, .err = err};
    c.md = pcre2_match_data_create(1, NULL);
    if (c.md == NULL)
        return oom(&c);
    st = split_added(&c, &tok->match_raw, text, len, after_raw_tokens);
    pcre2_match_data_free(c.md);
    free(c.sym_id);
    free(c.sym_prev);
    free(c.sym_next);
    free(c.sym_dead);
    free(c.heap);
    free(c.word);
    if (st != TDM_OK) {
        free(c.ids);
        return st;
    }
    *ids = c.ids;
    *n_ids = c.n;
    return TDM_OK;
}
