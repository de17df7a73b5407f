/*
 * decode.c - ids -> text: tdm_tok_decode, the streaming decoder (which holds
 * back an unfinished UTF-8 character from one push to the next) and ChatML
 * with tdm_tok_encode_chat. Token bytes come from the decode table load.c
 * builds; invalid UTF-8 becomes U+FFFD as in HF's decode.
 */
#include "tokenizer_internal.h"
#include "alloc.h"

#include <string.h>

/* ------------------------------------------------------------------------ */
/* Decoding                                                                 */
/* ------------------------------------------------------------------------ */

static const char REPLACEMENT[] = "\xEF\xBF\xBD"; /* U+FFFD */

/* Appends bytes[0..n) to out as lossy UTF-8 and returns how many trailing
 * bytes were held back because they may still become a character (only
 * when `final` is false; when final they become U+FFFD). */
static bool lossy_append(tok_buf *out, const unsigned char *p, size_t n, bool final, size_t *held)
{
    size_t i = 0, start = 0;
    *held = 0;
    if (!tok__buf_reserve(out, n + 3 * n))
        return false;
    if (n == 0)
        return true; /* p may be NULL: no text at all (e.g. only skipped specials) */
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
        tok__buf_append(out, (const char *)p + start, i - start);
        if (c == 0 && !final) {
            *held = n - i;
            return true;
        }
        tok__buf_append(out, REPLACEMENT, 3);
        i += c == 0 ? n - i : (size_t)-c;
        start = i;
    }
    tok__buf_append(out, (const char *)p + start, i - start);
    return true;
}

tdm_status tdm_tok_utf8_lossy(const char *text, size_t len, char **out, size_t *out_len)
{
    tok_buf b = {0};
    size_t held = 0;
    if (!lossy_append(&b, (const unsigned char *)text, len, true, &held) ||
        !tok__buf_reserve(&b, 1)) {
        free(b.p);
        *out = NULL;
        return TDM_ERR_RESOURCE_EXHAUSTED;
    }
    b.p[b.len] = '\0';
    *out = b.p;
    if (out_len)
        *out_len = b.len;
    return TDM_OK;
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
        if (!tok__buf_append(&raw, tok->dec_bytes + e->dec_off, e->dec_len)) {
            free(raw.p);
            return tdm_error_oom(err, raw.len, "the text of %zu token ids", n_ids);
        }
    }
    size_t held;
    if (!tok__buf_reserve(&out, 0) ||
        !lossy_append(&out, (const unsigned char *)raw.p, raw.len, true, &held)) {
        free(raw.p);
        free(out.p);
        return tdm_error_oom(err, raw.len, "the text of %zu token ids", n_ids);
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
    if (s == NULL || !tok__buf_reserve(&s->out, 16)) {
        free(s);
        *out = NULL;
        return tdm_error_oom(err, sizeof(*s), "a streaming decoder");
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
    if (!tok__buf_append(&s->scratch, (const char *)s->pending, s->n_pending) ||
        !tok__buf_append(&s->scratch, s->tok->dec_bytes + e->dec_off, e->dec_len) ||
        !lossy_append(&s->out, (const unsigned char *)s->scratch.p, s->scratch.len, false, &held))
        return tdm_error_oom(err, s->scratch.len, "a token's text in a stream");
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
        tok__buf_append(&s->out, REPLACEMENT, 3);
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
    bool ok = tok__buf_reserve(&b, 0);
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
        ok = tok__buf_append(&b, "<|im_start|>", 12) && tok__buf_append(&b, role, strlen(role)) &&
             tok__buf_append(&b, "\n", 1) && tok__buf_append(&b, content, strlen(content)) &&
             tok__buf_append(&b, "<|im_end|>\n", 11);
    }
    if (ok && add_generation_prompt)
        ok = tok__buf_append(&b, "<|im_start|>assistant\n", 22);
    if (!ok) {
        free(b.p);
        return tdm_error_oom(err, b.len, "a ChatML prompt of %zu messages", n_msgs);
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
