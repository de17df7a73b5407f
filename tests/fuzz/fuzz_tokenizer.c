/*
 * fuzz_tokenizer.c - the tokenizer: tokenizer.json loading, and encode,
 * one-shot and streaming decode and ChatML on the bundled demo tokenizer.
 *
 * Input: one byte picks the mode, the rest is its data.
 *   0  a tokenizer.json (tdm_tok_load_json); a loaded one encodes and
 *      decodes a fixed text and is fingerprinted
 *   1  text for the demo tokenizer: encode; for valid UTF-8 in NFC,
 *      decode(encode(text)) == text; streaming decode == one-shot decode
 *   2  token ids (little-endian u32, some out of range) to decode, one-shot
 *      (with and without specials) and streaming: both agree, both refuse
 *      the same ids
 *   3  chat messages (NUL-separated role, content, role, ...) to encode
 */
#include "fuzz.h"

#include "tokenizer.h"

#include <string.h>
#include <utf8proc.h>

static tdm_tokenizer *demo;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char path[4096];
    snprintf(path, sizeof(path), "%s/demo-target/tokenizer.json", fuzz_models_dir());
    tdm_error err;
    if (tdm_tok_load(path, &demo, &err) != TDM_OK) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg);
        exit(1);
    }
    return 0;
}

/* Decodes ids through a stream, one push each, then flushes: the text
 * (malloc'd, caller frees) or NULL when a push refused an id. */
static char *stream_decode(const tdm_tokenizer *tok, const int32_t *ids, size_t n, bool skip,
                           size_t *len)
{
    tdm_tok_stream *s = NULL;
    tdm_error err;
    FUZZ_CHECK(tdm_tok_stream_create(tok, skip, &s, &err) == TDM_OK, "%s", err.msg);
    size_t cap = 64, used = 0;
    char *out = malloc(cap);
    bool refused = false;
    for (size_t i = 0; i <= n && out; i++) {
        const char *piece = NULL;
        size_t plen = 0;
        if (i < n) {
            if (tdm_tok_stream_push(s, ids[i], &piece, &plen, &err) != TDM_OK) {
                refused = true;
                break;
            }
        } else {
            tdm_tok_stream_flush(s, &piece, &plen);
        }
        /* A token may decode to U+0000: the length, not strlen, is the text's. */
        FUZZ_CHECK(piece && piece[plen] == '\0', "a piece not NUL-terminated at its length");
        if (used + plen + 1 > cap) {
            while (used + plen + 1 > cap)
                cap *= 2;
            char *nb = realloc(out, cap);
            if (!nb) {
                free(out);
                out = NULL;
                break;
            }
            out = nb;
        }
        memcpy(out + used, piece, plen);
        used += plen;
    }
    tdm_tok_stream_destroy(s);
    if (refused || !out) {
        free(out);
        return NULL;
    }
    out[used] = '\0';
    *len = used;
    return out;
}

/* One-shot and streaming decode of ids agree: the same text, or both refuse. */
static void check_decode(const tdm_tokenizer *tok, const int32_t *ids, size_t n, bool skip)
{
    char *text = NULL;
    size_t len = 0;
    tdm_error err;
    tdm_status rc = tdm_tok_decode(tok, ids, n, skip, &text, &len, &err);
    size_t slen = 0;
    char *st = stream_decode(tok, ids, n, skip, &slen);
    FUZZ_CHECK((rc == TDM_OK) == (st != NULL), "decode %s but the stream %s",
               rc == TDM_OK ? "accepted" : "refused", st ? "accepted" : "refused");
    if (rc == TDM_OK) {
        FUZZ_CHECK(text[len] == '\0', "decoded text not NUL-terminated at its length");
        FUZZ_CHECK(tdm_tok_check_utf8(text, len, NULL) == TDM_OK, "decoded text is not UTF-8");
        FUZZ_CHECK(slen == len && memcmp(st, text, len) == 0,
                   "streaming decode (%zu bytes) differs from decode (%zu bytes)", slen, len);
    }
    free(text);
    free(st);
}

static void fuzz_load(const uint8_t *data, size_t size)
{
    tdm_tokenizer *tok = NULL;
    tdm_error err;
    if (tdm_tok_load_json((const char *)data, size, "<fuzz>", &tok, &err) != TDM_OK) {
        FUZZ_CHECK(err.msg[0] != '\0', "a refusal without a message");
        return;
    }
    static const char sample[] = "Hello, world! def f(x):\n    return x  # \xc3\xa9t\xc3\xa9 42";
    int32_t *ids = NULL;
    size_t n = 0;
    if (tdm_tok_encode(tok, sample, sizeof(sample) - 1, &ids, &n, &err) == TDM_OK) {
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(ids[i] >= 0 && (size_t)ids[i] < tdm_tok_vocab_size(tok), "id %d", ids[i]);
        check_decode(tok, ids, n, false);
        check_decode(tok, ids, n, true);
    }
    free(ids);
    char hex[65];
    FUZZ_CHECK(tdm_tok_fingerprint(tok, hex) == TDM_OK && strlen(hex) == 64, "fingerprint");
    tdm_tok_destroy(tok);
}

/* Whether text (valid UTF-8) is already in NFC. */
static bool is_nfc(const char *text, size_t len)
{
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &nfc,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    bool same = n >= 0 && (size_t)n == len && memcmp(nfc, text, len) == 0;
    free(nfc);
    return same;
}

static void fuzz_encode(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    int32_t *ids = NULL;
    size_t n = 0;
    tdm_error err;
    tdm_status rc = tdm_tok_encode(demo, text, size, &ids, &n, &err);
    bool utf8 = tdm_tok_check_utf8(text, size, NULL) == TDM_OK;
    FUZZ_CHECK((rc == TDM_OK) == utf8, "encode %s valid UTF-8: %s",
               rc == TDM_OK ? "accepted" : "refused", err.msg);
    if (rc != TDM_OK)
        return;
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(ids[i] >= 0 && (size_t)ids[i] < tdm_tok_vocab_size(demo), "id %d", ids[i]);
    /* utf8proc counts U+0000 as the end of text (in NFC it is unchanged). */
    if (memchr(text, 0, size) == NULL && is_nfc(text, size)) {
        char *back = NULL;
        size_t blen = 0;
        FUZZ_CHECK(tdm_tok_decode(demo, ids, n, false, &back, &blen, &err) == TDM_OK, "%s",
                   err.msg);
        FUZZ_CHECK(blen == size && memcmp(back, text, size) == 0,
                   "decode(encode(text)) != text (%zu -> %zu tokens -> %zu bytes)", size, n, blen);
        free(back);
    }
    check_decode(demo, ids, n, false);
    check_decode(demo, ids, n, true);
    free(ids);
}

static void fuzz_decode(const uint8_t *data, size_t size)
{
    size_t n = size / 4;
    int32_t *ids = malloc((n ? n : 1) * sizeof(int32_t));
    if (!ids)
        return;
    /* Mostly ids of the vocabulary, with the high bits able to leave it. */
    uint32_t vocab = (uint32_t)tdm_tok_vocab_size(demo);
    for (size_t i = 0; i < n; i++) {
        uint32_t v;
        memcpy(&v, data + 4 * i, 4);
        ids[i] = (v & 0x80000000u) ? (int32_t)v : (int32_t)(v % (vocab + 4));
    }
    check_decode(demo, ids, n, false);
    check_decode(demo, ids, n, true);
    free(ids);
}

static void fuzz_chat(const uint8_t *data, size_t size)
{
    /* NUL-separated fields; a copy so that every field ends in NUL. */
    char *buf = malloc(size + 1);
    if (!buf)
        return;
    memcpy(buf, data, size);
    buf[size] = '\0';
    tdm_tok_message msgs[16];
    size_t n = 0;
    const char *fields[32];
    size_t nf = 0;
    for (size_t at = 0; at <= size && nf < 32;) {
        fields[nf++] = buf + at;
        at += strlen(buf + at) + 1;
    }
    for (size_t i = 0; i + 1 < nf && n < 16; i += 2)
        msgs[n++] = (tdm_tok_message){fields[i], fields[i + 1]};
    bool gen = size > 0 && (data[0] & 1);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    tdm_error err;
    if (tdm_tok_encode_chat(demo, msgs, n, gen, &ids, &n_ids, &err) == TDM_OK) {
        FUZZ_CHECK(n == 0 || n_ids > 0, "a chat of %zu messages encodes to no token", n);
        check_decode(demo, ids, n_ids, true);
    }
    free(ids);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    switch (data[0] % 4) {
    case 0:
        fuzz_load(p, n);
        break;
    case 1:
        fuzz_encode(p, n);
        break;
    case 2:
        fuzz_decode(p, n);
        break;
    default:
        fuzz_chat(p, n);
        break;
    }
    return 0;
}
