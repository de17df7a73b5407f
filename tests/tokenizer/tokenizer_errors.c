/*
 * tokenizer_errors - bad input gets a clear error, never a crash.
 *
 *   tokenizer_errors FIXTURE_DIR
 *
 * Starts from a valid fixture tokenizer.json, breaks one thing at a time and
 * checks the status code and that the message names the JSON path and the
 * feature. Also: missing file, corrupt JSON, invalid UTF-8 to encode (with
 * the byte offset), ids out of range to decode and to a stream, bad ChatML.
 */
#include "tokenizer.h"

#include "tok_test.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Loads `j` and expects failure with `code` and every needle in the message. */
static void expect_load_error(const char *what, cJSON *j, tdm_status code, const char *needle1,
                              const char *needle2)
{
    char *s = cJSON_PrintUnformatted(j);
    tdm_tokenizer *tok = NULL;
    tdm_error err = {0};
    tdm_status st = tdm_tok_load_json(s, strlen(s), "test.json", &tok, &err);
    CHECK(st == code, "%s: status %s, want %s (%s)", what, tdm_status_name(st),
          tdm_status_name(code), err.msg);
    CHECK(tok == NULL, "%s: tokenizer returned on error", what);
    CHECK(strstr(err.msg, "test.json") != NULL, "%s: message lacks the origin: %s", what, err.msg);
    CHECK(needle1 == NULL || strstr(err.msg, needle1) != NULL, "%s: message lacks '%s': %s", what,
          needle1, err.msg);
    CHECK(needle2 == NULL || strstr(err.msg, needle2) != NULL, "%s: message lacks '%s': %s", what,
          needle2, err.msg);
    printf("%-34s -> %s: %s\n", what, tdm_status_name(st), err.msg);
    tdm_tok_destroy(tok);
    free(s);
}

static cJSON *base;

/* One damaged copy of the fixture: the member `key` of the object at `path`
 * (dot-separated keys, numbers index arrays; "" = the top level) is set to
 * the JSON `value`, or appended when the object has no such member. */
typedef struct broken_case {
    const char *what;
    const char *path;
    const char *key;
    const char *value;
    tdm_status code;
    const char *needle1, *needle2; /* must appear in the message (NULL = none) */
} broken_case;

static const broken_case broken_cases[] = {
    {"model type", "model", "type", "\"WordPiece\"", TDM_ERR_UNIMPLEMENTED, "model.type",
     "WordPiece"},
    {"dropout", "model", "dropout", "0.1", TDM_ERR_UNIMPLEMENTED, "model.dropout", "dropout"},
    {"byte_fallback", "model", "byte_fallback", "true", TDM_ERR_UNIMPLEMENTED,
     "model.byte_fallback", NULL},
    {"subword prefix", "model", "continuing_subword_prefix", "\"##\"", TDM_ERR_UNIMPLEMENTED,
     "model.continuing_subword_prefix", NULL},
    {"normalizer", "", "normalizer", "{\"type\": \"Lowercase\"}", TDM_ERR_UNIMPLEMENTED,
     "normalizer", "Lowercase"},
    {"normalizer sequence", "", "normalizer",
     "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"NFKC\"}]}",
     TDM_ERR_UNIMPLEMENTED, "normalizer.normalizers[1]", "NFKC"},
    {"split behavior", "pre_tokenizer.pretokenizers.0", "behavior", "\"MergedWithPrevious\"",
     TDM_ERR_UNIMPLEMENTED, "pre_tokenizer.pretokenizers[0].behavior", "MergedWithPrevious"},
    {"split invert", "pre_tokenizer.pretokenizers.0", "invert", "true", TDM_ERR_UNIMPLEMENTED,
     "pre_tokenizer.pretokenizers[0].invert", NULL},
    {"bad regex", "pre_tokenizer.pretokenizers.0", "pattern", "{\"Regex\": \"(unclosed\"}",
     TDM_ERR_UNIMPLEMENTED, "pre_tokenizer.pretokenizers[0].pattern", "PCRE2"},
    {"add_prefix_space", "pre_tokenizer.pretokenizers.1", "add_prefix_space", "true",
     TDM_ERR_UNIMPLEMENTED, "pre_tokenizer.pretokenizers[1]", "add_prefix_space"},
    {"pre-tokenizer type", "", "pre_tokenizer", "{\"type\": \"Whitespace\"}", TDM_ERR_UNIMPLEMENTED,
     "pre_tokenizer", "Whitespace"},
    {"no pre-tokenizer", "", "pre_tokenizer", "null", TDM_ERR_UNIMPLEMENTED, "pre_tokenizer",
     "ByteLevel"},
    {"decoder", "", "decoder", "{\"type\": \"WordPiece\"}", TDM_ERR_UNIMPLEMENTED, "decoder",
     "WordPiece"},
    {"post-processor", "", "post_processor", "{\"type\": \"TemplateProcessing\"}",
     TDM_ERR_UNIMPLEMENTED, "post_processor", "TemplateProcessing"},
    {"truncation", "", "truncation", "{\"max_length\": 8}", TDM_ERR_UNIMPLEMENTED, "truncation",
     NULL},
    {"single_word", "added_tokens.0", "single_word", "true", TDM_ERR_UNIMPLEMENTED,
     "added_tokens[0].single_word", NULL},
    {"merge string", "model.merges", "0", "\"nospace\"", TDM_ERR_INVALID_ARGUMENT,
     "model.merges[0]", "nospace"},
    {"merge unknown token", "model.merges", "3", "\"zzz\xc3\xa9 q\"", TDM_ERR_INVALID_ARGUMENT,
     "model.merges[3]", "not in model.vocab"},
    {"duplicate vocab id", "model.vocab", "brand-new", "5", TDM_ERR_INVALID_ARGUMENT, "brand-new",
     "id 5"},
    {"negative vocab id", "model.vocab", "neg", "-3", TDM_ERR_INVALID_ARGUMENT, "neg",
     "out of range"},
    {"huge vocab id", "model.vocab", "huge", "2000000000", TDM_ERR_INVALID_ARGUMENT, "huge",
     "out of range"},
    {"id beyond int32", "model.vocab", "beyond-int", "1e19", TDM_ERR_INVALID_ARGUMENT, "beyond-int",
     "integer"},
    {"fractional added id", "added_tokens.1", "id", "7.5", TDM_ERR_INVALID_ARGUMENT,
     "added_tokens[1].id", "integer"},
    {"string vocab id", "model.vocab", "frac", "\"7\"", TDM_ERR_INVALID_ARGUMENT, "frac",
     "integer"},
    {"model not object", "", "model", "\"BPE\"", TDM_ERR_INVALID_ARGUMENT, "model", "object"},
};

static cJSON *walk(cJSON *j, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *k = strtok(buf, "."); k && j; k = strtok(NULL, "."))
        j = (*k >= '0' && *k <= '9') ? cJSON_GetArrayItem(j, atoi(k))
                                     : cJSON_GetObjectItemCaseSensitive(j, k);
    return j;
}

static void feature_errors(void)
{
    for (size_t i = 0; i < TDM_ARRAY_LEN(broken_cases); i++) {
        const broken_case *c = &broken_cases[i];
        cJSON *j = cJSON_Duplicate(base, 1);
        cJSON *obj = walk(j, c->path), *value = cJSON_Parse(c->value);
        if (obj == NULL || value == NULL) {
            fprintf(stderr, "%s: bad case (path %s)\n", c->what, c->path);
            exit(2);
        }
        if (cJSON_IsArray(obj))
            cJSON_ReplaceItemInArray(obj, atoi(c->key), value);
        else if (cJSON_HasObjectItem(obj, c->key))
            cJSON_ReplaceItemInObjectCaseSensitive(obj, c->key, value);
        else
            cJSON_AddItemToObject(obj, c->key, value);
        expect_load_error(c->what, j, c->code, c->needle1, c->needle2);
        cJSON_Delete(j);
    }
}

static void file_errors(const char *good_path)
{
    tdm_tokenizer *tok = NULL;
    tdm_error err = {0};
    tdm_status st = tdm_tok_load("/nonexistent/dir/tokenizer.json", &tok, &err);
    CHECK(st == TDM_ERR_NOT_FOUND && tok == NULL, "missing file: %s", tdm_status_name(st));
    CHECK(strstr(err.msg, "/nonexistent/dir/tokenizer.json") != NULL, "missing file msg: %s",
          err.msg);
    printf("%-34s -> %s: %s\n", "missing file", tdm_status_name(st), err.msg);

    char fp[65];
    st = tdm_tok_fingerprint_file("/nonexistent/tokenizer.json", fp, &err);
    CHECK(st == TDM_ERR_NOT_FOUND, "fingerprint of a missing file: %s", tdm_status_name(st));

    char *good = tok_test_slurp(good_path, NULL);
    size_t n = strlen(good);
    /* Cut in the middle: not valid JSON any more. */
    st = tdm_tok_load_json(good, n / 2, "half.json", &tok, &err);
    CHECK(st == TDM_ERR_INVALID_ARGUMENT && tok == NULL, "truncated JSON: %s", tdm_status_name(st));
    CHECK(strstr(err.msg, "half.json") && strstr(err.msg, "not valid JSON"), "truncated msg: %s",
          err.msg);
    printf("%-34s -> %s: %s\n", "truncated JSON", tdm_status_name(st), err.msg);
    /* A structural character replaced: the first ':' becomes '='. */
    *strchr(good, ':') = '=';
    st = tdm_tok_load_json(good, n, "garbage.json", &tok, &err);
    CHECK(st == TDM_ERR_INVALID_ARGUMENT && tok == NULL, "corrupt JSON: %s", tdm_status_name(st));
    free(good);
    st = tdm_tok_load_json("[1, 2]", 6, "array.json", &tok, &err);
    CHECK(st == TDM_ERR_INVALID_ARGUMENT && strstr(err.msg, "object"), "array top: %s", err.msg);
    st = tdm_tok_load_json("", 0, "empty.json", &tok, &err);
    CHECK(st == TDM_ERR_INVALID_ARGUMENT, "empty: %s", tdm_status_name(st));
}

static void encode_decode_errors(tdm_tokenizer *tok)
{
    static const struct {
        const char *text;
        size_t len;
        const char *offset;
    } bad[] = {
        {"abc\xff", 4, "byte offset 3"},
        {"\x80 leading continuation", 23, "byte offset 0"},
        {"ok \xe2\x82", 5, "byte offset 3"},       /* truncated at the end */
        {"ok \xe2\x82 more", 10, "byte offset 3"}, /* truncated in the middle */
        {"\xc0\x80", 2, "byte offset 0"},          /* overlong NUL */
        {"xy\xed\xa0\x80", 5, "byte offset 2"},    /* UTF-16 surrogate */
        {"\xf4\x90\x80\x80", 4, "byte offset 0"},  /* above U+10FFFF */
        {"<|im_end|>\xfe", 11, "byte offset 10"},
    };
    for (size_t i = 0; i < TDM_ARRAY_LEN(bad); i++) {
        int32_t *ids = (int32_t *)1;
        size_t n = 99;
        tdm_error err = {0};
        tdm_status st = tdm_tok_encode(tok, bad[i].text, bad[i].len, &ids, &n, &err);
        CHECK(st == TDM_ERR_INVALID_ARGUMENT, "invalid UTF-8 #%zu: %s", i, tdm_status_name(st));
        CHECK(ids == NULL && n == 0, "invalid UTF-8 #%zu: output not cleared", i);
        CHECK(strstr(err.msg, "UTF-8") && strstr(err.msg, bad[i].offset),
              "invalid UTF-8 #%zu: message '%s' lacks '%s'", i, err.msg, bad[i].offset);
        if (i == 0)
            printf("%-34s -> %s: %s\n", "invalid UTF-8", tdm_status_name(st), err.msg);
    }

    int32_t vs = (int32_t)tdm_tok_vocab_size(tok);
    int32_t bad_ids[][2] = {{5, -1}, {vs, 5}, {5, INT32_MAX}};
    for (size_t i = 0; i < TDM_ARRAY_LEN(bad_ids); i++) {
        char *text = (char *)1;
        tdm_error err = {0};
        tdm_status st = tdm_tok_decode(tok, bad_ids[i], 2, false, &text, NULL, &err);
        CHECK(st == TDM_ERR_OUT_OF_RANGE && text == NULL, "bad id #%zu: %s", i,
              tdm_status_name(st));
        CHECK(strstr(err.msg, "out of range") != NULL, "bad id #%zu: %s", i, err.msg);
        if (i == 1)
            printf("%-34s -> %s: %s\n", "decode id out of range", tdm_status_name(st), err.msg);
    }

    tdm_tok_stream *s;
    tdm_error err = {0};
    CHECK(tdm_tok_stream_create(tok, false, &s, &err) == TDM_OK, "stream create");
    const char *t;
    size_t tl;
    CHECK(tdm_tok_stream_push(s, -7, &t, &tl, &err) == TDM_ERR_OUT_OF_RANGE && tl == 0,
          "stream bad id");
    int32_t h = tdm_tok_token_to_id(tok, "h", 1);
    CHECK(tdm_tok_stream_push(s, h, &t, &tl, &err) == TDM_OK && tl == 1 && t[0] == 'h',
          "stream keeps working after a bad id");
    tdm_tok_stream_destroy(s);

    tdm_tok_message msgs[] = {{"user", "hi"}, {"", "x"}};
    char *text;
    tdm_status st = tdm_tok_chatml(msgs, 2, true, &text, NULL, &err);
    CHECK(st == TDM_ERR_INVALID_ARGUMENT && strstr(err.msg, "messages[1].role"), "empty role: %s",
          err.msg);
    tdm_tok_message nl[] = {{"user\nsystem", "x"}};
    st = tdm_tok_chatml(nl, 1, true, &text, NULL, &err);
    CHECK(st == TDM_ERR_INVALID_ARGUMENT, "role with newline: %s", tdm_status_name(st));
    tdm_tok_message nc[] = {{"user", NULL}};
    st = tdm_tok_chatml(nc, 1, true, &text, NULL, &err);
    CHECK(st == TDM_ERR_INVALID_ARGUMENT && strstr(err.msg, "messages[0].content"),
          "NULL content: %s", err.msg);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(uint32_t n)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33) % n;
}

/* Damaged files and random input: every call returns a status, nothing
 * crashes (the sanitizer build turns any memory error into a failure). */
static void fuzz(const char *path)
{
    char *good = tok_test_slurp(path, NULL);
    size_t n = strlen(good);
    char *buf = malloc(n + 1);
    int loaded = 0;
    static const char junk[] = "{}[]\":,0123456789-. \\tnufe\x80\xff";
    for (int round = 0; round < 120; round++) {
        memcpy(buf, good, n + 1);
        size_t len = n;
        int edits = 1 + (int)rnd(4);
        for (int e = 0; e < edits; e++)
            buf[rnd((uint32_t)len)] = junk[rnd(sizeof(junk) - 1)];
        if (rnd(4) == 0)
            len = rnd((uint32_t)len);
        tdm_tokenizer *tok = NULL;
        tdm_error err = {0};
        tdm_status st = tdm_tok_load_json(buf, len, "fuzz", &tok, &err);
        CHECK((st == TDM_OK) == (tok != NULL), "round %d: status and result disagree", round);
        CHECK(st == TDM_OK || err.msg[0] != '\0', "round %d: error without a message", round);
        if (tok) {
            loaded++;
            int32_t *ids;
            size_t k;
            const char *t = "Hello <|im_end|> w\xc3\xb6rld 123";
            if (tdm_tok_encode(tok, t, strlen(t), &ids, &k, &err) == TDM_OK)
                free(ids);
            tdm_tok_destroy(tok);
        }
    }
    printf("%-34s -> %d of 120 damaged files still loaded, none crashed\n", "damaged files",
           loaded);

    tdm_tokenizer *tok;
    tdm_error err = {0};
    if (tdm_tok_load(path, &tok, &err) != TDM_OK)
        exit(1);
    unsigned char text[64];
    int32_t ids[16];
    int valid = 0;
    for (int round = 0; round < 2000; round++) {
        size_t len = rnd(sizeof(text));
        for (size_t i = 0; i < len; i++)
            text[i] = (unsigned char)(rnd(3) ? rnd(128) : 128 + rnd(128));
        int32_t *out;
        size_t k;
        if (tdm_tok_encode(tok, (const char *)text, len, &out, &k, &err) == TDM_OK) {
            valid++;
            free(out);
        }
        for (int i = 0; i < 16; i++)
            ids[i] = (int32_t)rnd((uint32_t)tdm_tok_vocab_size(tok) + 8) - 4;
        char *dec;
        if (tdm_tok_decode(tok, ids, 1 + rnd(16), round & 1, &dec, NULL, &err) == TDM_OK)
            free(dec);
    }
    printf("%-34s -> %d of 2000 random byte strings were UTF-8, none crashed\n", "random input",
           valid);
    tdm_tok_destroy(tok);
    free(buf);
    free(good);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURE_DIR\n", argv[0]);
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/qwen2_bpe1000.tokenizer.json", argv[1]);
    char *text = tok_test_slurp(path, NULL);
    base = cJSON_Parse(text);
    free(text);
    if (base == NULL) {
        fprintf(stderr, "fixture %s does not parse\n", path);
        return 2;
    }
    feature_errors();
    file_errors(path);
    fuzz(path);

    tdm_tokenizer *tok;
    tdm_error err = {0};
    if (tdm_tok_load(path, &tok, &err) != TDM_OK) {
        fprintf(stderr, "load %s: %s\n", path, err.msg);
        return 1;
    }
    encode_decode_errors(tok);
    tdm_tok_destroy(tok);

    /* A tokenizer without ChatML tokens refuses to encode a chat. */
    snprintf(path, sizeof(path), "%s/gpt2_bpe2000.tokenizer.json", argv[1]);
    if (tdm_tok_load(path, &tok, &err) != TDM_OK) {
        fprintf(stderr, "load %s: %s\n", path, err.msg);
        return 1;
    }
    tdm_tok_message m[] = {{"user", "hi"}};
    int32_t *ids;
    size_t n;
    tdm_status st = tdm_tok_encode_chat(tok, m, 1, true, &ids, &n, &err);
    CHECK(st == TDM_ERR_FAILED_PRECONDITION && ids == NULL, "chat without im_start: %s",
          tdm_status_name(st));
    printf("%-34s -> %s: %s\n", "ChatML without <|im_start|>", tdm_status_name(st), err.msg);
    tdm_tok_destroy(tok);
    cJSON_Delete(base);
    if (tok_test_failures)
        fprintf(stderr, "%d checks failed\n", tok_test_failures);
    return tok_test_failures ? 1 : 0;
}
