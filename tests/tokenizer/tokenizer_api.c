/*
 * tokenizer_api - streaming, ChatML, lookups, special ids, fingerprint
 * stability and concurrent use.
 *
 *   tokenizer_api FIXTURE_DIR
 *
 * Expectations come from outside our code: the GPT-2 byte alphabet is
 * rebuilt here from its definition, U+FFFD counts follow the Unicode
 * standard's "maximal subpart" examples, the ChatML text is Qwen's template,
 * and lookups are checked against the tokenizer.json read with cJSON.
 */
#include "tokenizer.h"

#include "tok_test.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static tdm_tokenizer *load(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.tokenizer.json", dir, name);
    tdm_tokenizer *tok;
    tdm_error err = {0};
    if (tdm_tok_load(path, &tok, &err) != TDM_OK) {
        fprintf(stderr, "load %s: %s\n", path, err.msg);
        exit(1);
    }
    return tok;
}

/* GPT-2 bytes_to_unicode, written from its definition. */
static int byte_token(const tdm_tokenizer *tok, unsigned char b)
{
    int cps[256], n = 0;
    for (int c = 0; c < 256; c++)
        cps[c] = -1;
    for (int c = '!'; c <= '~'; c++)
        cps[c] = c;
    for (int c = 0xA1; c <= 0xAC; c++)
        cps[c] = c;
    for (int c = 0xAE; c <= 0xFF; c++)
        cps[c] = c;
    for (int c = 0; c < 256; c++)
        if (cps[c] < 0)
            cps[c] = 256 + n++;
    int cp = cps[b];
    char u[3];
    size_t len;
    if (cp < 0x80) {
        u[0] = (char)cp;
        len = 1;
    } else {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        len = 2;
    }
    return tdm_tok_token_to_id(tok, u, len);
}

static void test_stream(const tdm_tokenizer *tok)
{
    /* "a", U+1F600 as 4 byte tokens, "é" as 2: nothing comes out until a
     * character is complete. */
    const unsigned char bytes[] = {'a', 0xF0, 0x9F, 0x98, 0x80, 0xC3, 0xA9};
    const char *want[] = {"a", "", "", "", "\xF0\x9F\x98\x80", "", "\xC3\xA9"};
    tdm_tok_stream *s;
    tdm_error err = {0};
    CHECK(tdm_tok_stream_create(tok, false, &s, &err) == TDM_OK, "create");
    for (size_t i = 0; i < sizeof(bytes); i++) {
        int id = byte_token(tok, bytes[i]);
        CHECK(id >= 0, "byte 0x%02x has no token", bytes[i]);
        const char *t;
        size_t n;
        CHECK(tdm_tok_stream_push(s, id, &t, &n, &err) == TDM_OK, "push");
        CHECK(n == strlen(want[i]) && memcmp(t, want[i], n) == 0 && t[n] == '\0',
              "stream step %zu: got %zu bytes, want %zu", i, n, strlen(want[i]));
    }
    /* An unfinished character at the end becomes one U+FFFD at flush. */
    const char *t;
    size_t n;
    tdm_tok_stream_push(s, byte_token(tok, 0xE2), &t, &n, &err);
    CHECK(n == 0, "E2 alone emits nothing");
    tdm_tok_stream_push(s, byte_token(tok, 0x82), &t, &n, &err);
    CHECK(n == 0, "E2 82 emits nothing");
    tdm_tok_stream_flush(s, &t, &n);
    CHECK(n == 3 && memcmp(t, "\xEF\xBF\xBD", 3) == 0, "flush of E2 82 is one U+FFFD");
    /* An invalid continuation ends the pending sequence: U+FFFD then 'a'. */
    tdm_tok_stream_push(s, byte_token(tok, 0xF0), &t, &n, &err);
    tdm_tok_stream_push(s, byte_token(tok, 'a'), &t, &n, &err);
    CHECK(n == 4 && memcmp(t,
                           "\xEF\xBF\xBD"
                           "a",
                           4) == 0,
          "F0 then 'a'");
    tdm_tok_stream_flush(s, &t, &n);
    CHECK(n == 0, "nothing pending");
    tdm_tok_stream_destroy(s);

    /* One-shot decode of invalid sequences, per the Unicode standard's
     * maximal-subpart practice (Rust from_utf8_lossy, hence HF). */
    static const struct {
        unsigned char b[6];
        size_t n;
        const char *want;
    } cases[] = {
        {{0xED, 0xA0, 0x80}, 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* surrogate: 3 */
        {{0xF0, 0x9F, 0x98}, 3, "\xEF\xBF\xBD"},                         /* truncated: 1 */
        {{0xC0, 0xAF}, 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},                   /* overlong: 2 */
        {{0xE1, 0x80, 0x41},
         3,
         "\xEF\xBF\xBD"
         "A"}, /* E1 80 then A */
        {{0xFF, 0x41},
         2,
         "\xEF\xBF\xBD"
         "A"},
    };
    for (size_t i = 0; i < TDM_ARRAY_LEN(cases); i++) {
        int32_t ids[6];
        for (size_t k = 0; k < cases[i].n; k++)
            ids[k] = byte_token(tok, cases[i].b[k]);
        char *text;
        size_t len;
        CHECK(tdm_tok_decode(tok, ids, cases[i].n, false, &text, &len, &err) == TDM_OK, "decode");
        CHECK(len == strlen(cases[i].want) && memcmp(text, cases[i].want, len) == 0,
              "lossy case %zu: got %zu bytes", i, len);
        free(text);
    }
}

static void test_chat(const tdm_tokenizer *tok)
{
    tdm_tok_message msgs[] = {{"system", "You are a helpful assistant."}, {"user", "Hello, 世界!"}};
    char *text;
    size_t len;
    tdm_error err = {0};
    CHECK(tdm_tok_chatml(msgs, 2, true, &text, &len, &err) == TDM_OK, "chatml");
    const char *want = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                       "<|im_start|>user\nHello, 世界!<|im_end|>\n<|im_start|>assistant\n";
    CHECK(strcmp(text, want) == 0 && len == strlen(want), "chatml text: %s", text);
    int32_t *ids, *ids2;
    size_t n, n2;
    CHECK(tdm_tok_encode(tok, text, len, &ids, &n, &err) == TDM_OK, "encode");
    CHECK(tdm_tok_encode_chat(tok, msgs, 2, true, &ids2, &n2, &err) == TDM_OK, "encode_chat");
    CHECK(n == n2 && memcmp(ids, ids2, n * sizeof(int32_t)) == 0, "encode_chat == encode(chatml)");
    const tdm_tok_specials *sp = tdm_tok_specials_get(tok);
    CHECK(n > 3 && ids[0] == sp->im_start, "chat starts with <|im_start|>");
    /* The special tokens appear as single ids: 3 im_start, 2 im_end. */
    int starts = 0, ends = 0;
    for (size_t i = 0; i < n; i++) {
        starts += ids[i] == sp->im_start;
        ends += ids[i] == sp->im_end;
    }
    CHECK(starts == 3 && ends == 2, "im_start x%d, im_end x%d", starts, ends);
    char *back;
    CHECK(tdm_tok_decode(tok, ids, n, false, &back, NULL, &err) == TDM_OK &&
              strcmp(back, want) == 0,
          "chat round trip");
    free(back);
    CHECK(tdm_tok_decode(tok, ids, n, true, &back, NULL, &err) == TDM_OK &&
              strcmp(back,
                     "system\nYou are a helpful assistant.\nuser\nHello, 世界!\nassistant\n") == 0,
          "chat decode without specials: %s", back);
    free(back);
    free(ids);
    free(ids2);
    free(text);
    CHECK(tdm_tok_chatml(msgs, 1, false, &text, &len, &err) == TDM_OK &&
              strcmp(text, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n") == 0,
          "no generation prompt");
    free(text);
}

/* Lookups and special ids against the JSON itself. */
static void test_lookups(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.tokenizer.json", dir, name);
    char *s = tok_test_slurp(path, NULL);
    cJSON *j = cJSON_Parse(s);
    free(s);
    tdm_tokenizer *tok = load(dir, name);
    int max_id = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(cJSON_GetObjectItem(j, "model"), "vocab"))
    {
        int id = it->valueint;
        max_id = id > max_id ? id : max_id;
        size_t len;
        const char *t = tdm_tok_id_to_token(tok, id, &len);
        CHECK(t && len == strlen(it->string) && memcmp(t, it->string, len) == 0,
              "%s: id_to_token(%d)", name, id);
        CHECK(tdm_tok_token_to_id(tok, it->string, strlen(it->string)) == id, "%s: token_to_id(%s)",
              name, it->string);
    }
    int32_t endoftext = -1, im_start = -1, im_end = -1;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(j, "added_tokens"))
    {
        int id = cJSON_GetObjectItem(it, "id")->valueint;
        const char *c = cJSON_GetObjectItem(it, "content")->valuestring;
        bool special = cJSON_IsTrue(cJSON_GetObjectItem(it, "special"));
        max_id = id > max_id ? id : max_id;
        CHECK(tdm_tok_token_to_id(tok, c, strlen(c)) == id, "%s: added %s", name, c);
        CHECK(tdm_tok_is_special(tok, id) == special, "%s: is_special(%s)", name, c);
        if (strcmp(c, "<|endoftext|>") == 0)
            endoftext = id;
        if (strcmp(c, "<|im_start|>") == 0)
            im_start = id;
        if (strcmp(c, "<|im_end|>") == 0)
            im_end = id;
    }
    CHECK(tdm_tok_vocab_size(tok) == (size_t)max_id + 1, "%s: vocab size %zu, want %d", name,
          tdm_tok_vocab_size(tok), max_id + 1);
    const tdm_tok_specials *sp = tdm_tok_specials_get(tok);
    CHECK(sp->endoftext == endoftext && sp->im_start == im_start && sp->im_end == im_end,
          "%s: special ids", name);
    CHECK(sp->eos == (im_end >= 0 ? im_end : endoftext) && sp->pad == endoftext, "%s: eos/pad",
          name);
    CHECK(tdm_tok_token_to_id(tok, "no-such-token-\x01", 15) == -1, "absent token");
    CHECK(tdm_tok_id_to_token(tok, -1, NULL) == NULL &&
              tdm_tok_id_to_token(tok, (int32_t)tdm_tok_vocab_size(tok), NULL) == NULL,
          "out-of-range id_to_token");
    tdm_tok_destroy(tok);
    cJSON_Delete(j);
}

/* Reverses the key order of an object and of its object members. */
static void reverse_keys(cJSON *obj, int depth)
{
    if (!cJSON_IsObject(obj) || depth > 2)
        return;
    cJSON *items[64];
    int n = 0;
    while (obj->child && n < 64)
        items[n++] = cJSON_DetachItemViaPointer(obj, obj->child);
    for (int i = n - 1; i >= 0; i--) {
        if (strcmp(items[i]->string, "vocab") != 0)
            reverse_keys(items[i], depth + 1);
        cJSON_AddItemToObject(obj, items[i]->string, items[i]);
    }
}

static tdm_status fp_of(cJSON *j, bool formatted, char out[65])
{
    char *s = formatted ? cJSON_Print(j) : cJSON_PrintUnformatted(j);
    tdm_tokenizer *tok;
    tdm_error err = {0};
    tdm_status st = tdm_tok_load_json(s, strlen(s), "variant", &tok, &err);
    free(s);
    if (st != TDM_OK) {
        fprintf(stderr, "variant: %s\n", err.msg);
        return st;
    }
    tdm_tok_fingerprint(tok, out);
    tdm_tok_destroy(tok);
    return TDM_OK;
}

static void test_fingerprint(const char *dir)
{
    char path[4096], fp[65], fp2[65];
    snprintf(path, sizeof(path), "%s/qwen2_bpe1000.tokenizer.json", dir);
    tdm_error err = {0};
    CHECK(tdm_tok_fingerprint_file(path, fp, &err) == TDM_OK, "fingerprint_file: %s", err.msg);
    CHECK(strlen(fp) == 64 && strspn(fp, "0123456789abcdef") == 64, "fingerprint hex: %s", fp);
    char *s = tok_test_slurp(path, NULL);
    cJSON *j = cJSON_Parse(s);
    free(s);

    /* Formatting, key order and the merge spelling do not matter. */
    CHECK(fp_of(j, false, fp2) == TDM_OK && strcmp(fp, fp2) == 0, "compact JSON changes it");
    cJSON *r = cJSON_Duplicate(j, 1);
    reverse_keys(r, 0);
    CHECK(fp_of(r, true, fp2) == TDM_OK && strcmp(fp, fp2) == 0, "key order changes it");
    cJSON_Delete(r);
    r = cJSON_Duplicate(j, 1);
    cJSON *merges = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "model"), "merges");
    for (int i = 0; i < cJSON_GetArraySize(merges); i++) {
        char *m = strdup(cJSON_GetArrayItem(merges, i)->valuestring);
        char *sp = strchr(m, ' ');
        *sp = '\0';
        const char *pair[2] = {m, sp + 1};
        cJSON_ReplaceItemInArray(merges, i, cJSON_CreateStringArray(pair, 2));
        free(m);
    }
    CHECK(fp_of(r, false, fp2) == TDM_OK && strcmp(fp, fp2) == 0, "[a, b] merges change it");
    cJSON_Delete(r);
    /* Decoder options do not change ids or text, so they do not count. */
    r = cJSON_Duplicate(j, 1);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(r, "decoder"), "trim_offsets",
                              cJSON_CreateFalse());
    CHECK(fp_of(r, false, fp2) == TDM_OK && strcmp(fp, fp2) == 0, "decoder flags change it");
    cJSON_Delete(r);

    /* Anything that changes ids does. */
    r = cJSON_Duplicate(j, 1);
    merges = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "model"), "merges");
    char *m0 = strdup(cJSON_GetArrayItem(merges, 0)->valuestring);
    char *m1 = strdup(cJSON_GetArrayItem(merges, 1)->valuestring);
    cJSON_ReplaceItemInArray(merges, 0, cJSON_CreateString(m1));
    cJSON_ReplaceItemInArray(merges, 1, cJSON_CreateString(m0));
    free(m0);
    free(m1);
    CHECK(fp_of(r, false, fp2) == TDM_OK && strcmp(fp, fp2) != 0, "swapped merges keep it");
    cJSON_Delete(r);
    r = cJSON_Duplicate(j, 1);
    cJSON *split = cJSON_GetArrayItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(r, "pre_tokenizer"), "pretokenizers"), 0);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(split, "pattern"), "Regex",
                              cJSON_CreateString("\\s+|\\S+"));
    CHECK(fp_of(r, false, fp2) == TDM_OK && strcmp(fp, fp2) != 0, "regex change keeps it");
    cJSON_Delete(r);
    r = cJSON_Duplicate(j, 1);
    cJSON_ReplaceItemInObject(r, "normalizer", cJSON_CreateNull());
    CHECK(fp_of(r, false, fp2) == TDM_OK && strcmp(fp, fp2) != 0, "dropping NFC keeps it");
    cJSON_Delete(r);
    r = cJSON_Duplicate(j, 1);
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "added_tokens"), 0),
                              "special", cJSON_CreateFalse());
    CHECK(fp_of(r, false, fp2) == TDM_OK && strcmp(fp, fp2) != 0, "special flag keeps it");
    cJSON_Delete(r);
    r = cJSON_Duplicate(j, 1);
    cJSON *vocab = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "model"), "vocab");
    cJSON_AddItemToObject(vocab, "\xe2\x82\xac\xe2\x82\xac", cJSON_CreateNumber(1005));
    CHECK(fp_of(r, false, fp2) == TDM_OK && strcmp(fp, fp2) != 0, "extra vocab entry keeps it");
    cJSON_Delete(r);
    cJSON_Delete(j);

    snprintf(path, sizeof(path), "%s/qwen35_bpe8000.tokenizer.json", dir);
    CHECK(tdm_tok_fingerprint_file(path, fp2, &err) == TDM_OK && strcmp(fp, fp2) != 0,
          "two tokenizers share a fingerprint");
}

/* The whole corpus as one text: encode normalizes only the stretches NFC
 * can change, so decode(encode(text)) must equal utf8proc's NFC of all of it. */
static void test_big_text(const tdm_tokenizer *tok, char **texts, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += strlen(texts[i]) + 1;
    char *big = malloc(total + 1), *o = big;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(texts[i]);
        memcpy(o, texts[i], l);
        o += l;
        *o++ = '\n';
    }
    *o = '\0';
    char *nfc = (char *)utf8proc_NFC((const utf8proc_uint8_t *)big);
    int32_t *ids;
    size_t n_ids, len;
    char *back = NULL;
    tdm_error err = {0};
    CHECK(tdm_tok_encode(tok, big, total, &ids, &n_ids, &err) == TDM_OK, "encode big: %s", err.msg);
    CHECK(tdm_tok_decode(tok, ids, n_ids, false, &back, &len, &err) == TDM_OK, "decode big");
    CHECK(nfc && back && len == strlen(nfc) && memcmp(back, nfc, len) == 0,
          "decode(encode(corpus)) != NFC(corpus)");
    free(back);
    free(ids);
    free(nfc);
    free(big);
}

typedef struct job {
    const tdm_tokenizer *tok;
    char **texts;
    size_t n;
    int32_t **ids;
    size_t *n_ids;
    int bad;
} job;

static void *encode_all(void *arg)
{
    job *jb = arg;
    for (size_t i = 0; i < jb->n; i++) {
        int32_t *ids;
        size_t n;
        tdm_error err = {0};
        if (tdm_tok_encode(jb->tok, jb->texts[i], strlen(jb->texts[i]), &ids, &n, &err) != TDM_OK) {
            jb->bad++;
            continue;
        }
        if (n != jb->n_ids[i] || (n && memcmp(ids, jb->ids[i], n * sizeof(int32_t)) != 0))
            jb->bad++;
        free(ids);
    }
    return NULL;
}

/* Several threads encode the corpus at once (the word cache is shared) and
 * must agree with a single-threaded pass. */
static void test_threads(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/corpus.jsonl", dir);
    size_t n;
    cJSON **lines = tok_test_jsonl(path, &n);
    char **texts = malloc(n * sizeof(*texts));
    for (size_t i = 0; i < n; i++) {
        texts[i] = strdup(cJSON_GetObjectItem(lines[i], "text")->valuestring);
        cJSON_Delete(lines[i]);
    }
    free(lines);
    /* qwen2_bpe1000 has no lstrip/rstrip tokens, which drop whitespace. */
    tdm_tokenizer *tok = load(dir, "qwen2_bpe1000");
    test_big_text(tok, texts, n);
    tdm_tok_destroy(tok);
    tok = load(dir, "qwen35_bpe8000");
    int32_t **ids = malloc(n * sizeof(*ids));
    size_t *n_ids = malloc(n * sizeof(*n_ids));
    tdm_error err = {0};
    for (size_t i = 0; i < n; i++)
        if (tdm_tok_encode(tok, texts[i], strlen(texts[i]), &ids[i], &n_ids[i], &err) != TDM_OK)
            exit(1);
    /* A fresh tokenizer, so that threads fill the cache concurrently. */
    tdm_tok_destroy(tok);
    tok = load(dir, "qwen35_bpe8000");
    enum { T = 4 };
    pthread_t th[T];
    job jobs[T];
    for (int t = 0; t < T; t++) {
        jobs[t] = (job){tok, texts, n, ids, n_ids, 0};
        pthread_create(&th[t], NULL, encode_all, &jobs[t]);
    }
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        CHECK(jobs[t].bad == 0, "thread %d: %d strings differ", t, jobs[t].bad);
    }
    for (size_t i = 0; i < n; i++) {
        free(ids[i]);
        free(texts[i]);
    }
    free(ids);
    free(n_ids);
    free(texts);
    tdm_tok_destroy(tok);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURE_DIR\n", argv[0]);
        return 2;
    }
    tdm_tokenizer *tok = load(argv[1], "qwen2_bpe1000");
    test_stream(tok);
    test_chat(tok);
    tdm_tok_destroy(tok);
    test_lookups(argv[1], "qwen2_bpe1000");
    test_lookups(argv[1], "qwen35_bpe8000");
    test_lookups(argv[1], "gpt2_bpe2000");
    test_fingerprint(argv[1]);
    test_threads(argv[1]);
    if (tok_test_failures)
        fprintf(stderr, "%d checks failed\n", tok_test_failures);
    else
        printf("all checks passed\n");
    return tok_test_failures ? 1 : 0;
}
