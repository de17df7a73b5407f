/*
 * encode.c - tdm_tok_encode up to the word (the pipeline in tokenizer.h):
 * added tokens are split off the raw text, the pieces between them are
 * normalized (NFC, only the stretches that can change), split again on the
 * normalized added tokens and cut into words by the pre-tokenizer regexes;
 * bpe.c turns each word into ids.
 */
#include "tokenizer_internal.h"
#include "alloc.h"

#include <string.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------------ */
/* Normalization (NFC)                                                      */
/* ------------------------------------------------------------------------ */

tdm_status tok__nfc(const char *s, size_t n, char **out, size_t *out_len)
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
tdm_status tok__nfc_inert_init(tdm_tokenizer *tok)
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
            int ul = tok__utf8_put(cp, u);
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
        uint32_t cp = tok__utf8_get(p + i, k);
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
    uint32_t cp = tok__utf8_get(p, k);
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
    bool ok = tok__buf_reserve(&b, n);
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
        ok = tok__buf_append(&b, s + copied, start - copied) &&
             tok__nfc(s + start, j - start, &norm, &nl) == TDM_OK;
        if (ok) {
            ok = tok__buf_append(&b, norm, nl);
            free(norm);
        }
        copied = i = j;
    }
    if (!ok || !tok__buf_append(&b, s + copied, n - copied)) {
        free(b.p);
        return TDM_ERR_RESOURCE_EXHAUSTED;
    }
    *out = b.p;
    *out_len = b.len;
    return TDM_OK;
}

/* ------------------------------------------------------------------------ */
/* Added tokens and pre-tokenizer                                           */
/* ------------------------------------------------------------------------ */

bool tok__emit_grow(enc_ctx *c)
{
    size_t cap = c->cap ? c->cap * 2 : 256;
    int32_t *n = realloc(c->ids, cap * sizeof(*n));
    if (n == NULL)
        return false;
    c->ids = n;
    c->cap = cap;
    return true;
}

static tdm_status oom(enc_ctx *c)
{
    return tdm_error_oom(c->err, c->cap * sizeof(*c->ids), "the token ids of a text being encoded");
}

/* Pre-tokenizer step `step` over s[0..n): regex matches and the gaps between
 * them become pieces (behaviour Isolated), each handed to the next step. */
static tdm_status pre_tokenize(enc_ctx *c, const char *s, size_t n, size_t step)
{
    const tdm_tokenizer *tok = c->tok;
    if (n == 0)
        return TDM_OK;
    if (step == tok->n_steps)
        return tok__encode_word(c, (const unsigned char *)s, n) ? TDM_OK : oom(c);
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
        if (k <= 0 || !is_unicode_space(tok__utf8_get(p + j, k)))
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
        if (k <= 0 || !is_unicode_space(tok__utf8_get(p + i, k)))
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
            if (!tok__emit(c, hit->id))
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
    tdm_status st = tdm_tok_check_utf8(text, len, err);
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
