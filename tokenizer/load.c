/*
 * load.c - tokenizer.json -> struct tdm_tokenizer. Every part of the file
 * (top-level settings, normalizer, pre_tokenizer, decoder, model,
 * added_tokens) is checked against what tokenizer.h lists as supported and
 * refused with its JSON path otherwise; then the decode table and the
 * fingerprint are built. Also tdm_tok_load*, tdm_tok_destroy and the lookups.
 */
#include "tokenizer_internal.h"
#include "alloc.h"

#include "file.h"

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

/* ids beyond this are refused: the id table is dense (about 40 bytes per id
 * up to the largest), and real vocabularies stay far below (Qwen: 151,669). */
#define TOK_MAX_ID (1 << 22)

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
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory holding the tokenizer");
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
    s->pattern = tok__arena_dup(tok, pattern, strlen(pattern));
    if (s->pattern == NULL)
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory holding the tokenizer");
    return TDM_OK;
}

static tdm_status load_byte_level(tdm_tokenizer *tok, load_ctx *ctx, const cJSON *p,
                                  const char *path)
{
    bool aps = false, use_regex;
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
            return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory holding the tokenizer");
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
    if (!tok__strmap_init(&tok->vocab, (size_t)nv))
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory holding the tokenizer");
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab)
    {
        if (!json_is_int32(it))
            return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT,
                             "model.vocab[\"%.64s\"]: expected an integer id", it->string);
        int32_t id = (int32_t)it->valuedouble;
        uint32_t len = (uint32_t)strlen(it->string);
        char *s = tok__arena_dup(tok, it->string, len);
        if (s == NULL)
            return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory holding the tokenizer");
        char path[128];
        snprintf(path, sizeof(path), "model.vocab[\"%.64s\"]", it->string);
        if (id >= 0 && (size_t)id < tok->n_ids && tok->ids[id].str != NULL)
            return LOAD_FAIL(ctx, TDM_ERR_INVALID_ARGUMENT, "%s: id %d is also used by \"%.64s\"",
                             path, id, tok->ids[id].str);
        if ((st = set_id(tok, ctx, id, s, len, path)) != TDM_OK)
            return st;
        tok->ids[id].in_vocab = true;
        tok__strmap_put(&tok->vocab, s, len, id);
    }
    tok->n_vocab_entries = (size_t)nv;

    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
    uint32_t cp[256];
    tok__byte_level_table(cp);
    for (int b = 0; b < 256; b++) {
        char u[4];
        int n = tok__utf8_put(cp[b], u);
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
    tok->merges.cap = tok__pow2_at_least((size_t)nm * 2 + 1);
    tok->merges.slots = malloc(tok->merges.cap * sizeof(*tok->merges.slots));
    tok->merge_list = malloc(((size_t)nm + 1) * 2 * sizeof(int32_t));
    if (tok->merges.slots == NULL || tok->merge_list == NULL)
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory holding the tokenizer");
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
                return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory holding the tokenizer");
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
        tok__mergemap_put(&tok->merges, ia, ib, rank, inew);
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
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory holding the tokenizer");
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
        a->content = tok__arena_dup(tok, content->valuestring, a->len);
        if (a->content == NULL)
            return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory holding the tokenizer");
        a->match = a->content;
        a->mlen = a->len;
        if (a->normalized && tok->nfc) {
            /* HF matches normalized tokens by their normalized form. */
            char *norm;
            size_t nlen;
            if (tok__nfc(a->content, a->len, &norm, &nlen) != TDM_OK)
                return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "%s: NFC failed", path);
            a->match = tok__arena_dup(tok, norm, nlen);
            a->mlen = (uint32_t)nlen;
            free(norm);
            if (a->match == NULL)
                return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory holding the tokenizer");
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
    if (!tok__strmap_init(&tok->added_map, tok->n_added))
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory holding the tokenizer");
    for (size_t k = 0; k < tok->n_added; k++)
        tok__strmap_put(&tok->added_map, tok->added[k].content, tok->added[k].len,
                        tok->added[k].id);
    if (build_matcher(tok, &tok->match_raw, false) != TDM_OK ||
        build_matcher(tok, &tok->match_norm, true) != TDM_OK)
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory holding the tokenizer");
    return TDM_OK;
}

static tdm_status build_decode_table(tdm_tokenizer *tok, load_ctx *ctx)
{
    uint32_t cp[256];
    int byte_of_cp[512];
    tok__byte_level_table(cp);
    for (int i = 0; i < 512; i++)
        byte_of_cp[i] = -1;
    for (int b = 0; b < 256; b++)
        byte_of_cp[cp[b]] = b;
    size_t total = 0;
    for (size_t i = 0; i < tok->n_ids; i++)
        total += tok->ids[i].len;
    tok->dec_bytes = malloc(total + 1);
    if (tok->dec_bytes == NULL)
        return LOAD_FAIL(ctx, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory holding the tokenizer");
    size_t off = 0;
    for (size_t i = 0; i < tok->n_ids; i++) {
        tok_idinfo *e = &tok->ids[i];
        if (e->str == NULL)
            continue;
        uint32_t n;
        if (!tok__token_decoded_bytes(e->str, e->len, byte_of_cp, tok->dec_bytes + off, &n))
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
    tdm_tokenizer *tok = tdm_xcalloc(1, sizeof(*tok));
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
            LOAD_FAIL(&ctx, st, "out of memory holding the tokenizer");
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
