/*
 * tokenizer_reference - our tokenizer against HF `tokenizers` on a corpus.
 *
 *   tokenizer_reference CORPUS.jsonl TOKENIZER.json EXPECTED.jsonl
 *
 * CORPUS has {"text"} per line; EXPECTED the HF results for the same line:
 * {"ids", "decoded" (absent = the text), "decoded_skip" (absent = decoded)}.
 * For every line: encode == ids; decode(ids) == decoded; decode with
 * skip_special == decoded_skip; a one-token-at-a-time stream concatenates to
 * the one-shot decode; encode(decoded) == ids (round trip). Any difference
 * fails the test and prints the first differing string.
 */
#include "tokenizer.h"

#include "tok_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_escaped(const char *label, const char *s, size_t n)
{
    fprintf(stderr, "  %s (%zu bytes): \"", label, n);
    for (size_t i = 0; i < n && i < 400; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stderr);
        else if (c == '\r')
            fputs("\\r", stderr);
        else if (c == '\t')
            fputs("\\t", stderr);
        else if (c < 0x20)
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
    fputs(n > 400 ? "\"...\n" : "\"\n", stderr);
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s (%zu):", label, n);
    for (size_t i = 0; i < n && i < 120; i++)
        fprintf(stderr, " %d", ids[i]);
    fputs(n > 120 ? " ...\n" : "\n", stderr);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s CORPUS.jsonl TOKENIZER.json EXPECTED.jsonl\n", argv[0]);
        return 2;
    }
    tdm_error err = {0};
    tdm_tokenizer *tok;
    if (tdm_tok_load(argv[2], &tok, &err) != TDM_OK) {
        fprintf(stderr, "load failed: %s\n", err.msg);
        return 1;
    }
    size_t nc, ne;
    cJSON **corpus = tok_test_jsonl(argv[1], &nc);
    cJSON **exp = tok_test_jsonl(argv[3], &ne);
    if (nc != ne || nc < 2000) {
        fprintf(stderr, "corpus has %zu lines, expected file %zu (need equal, >= 2000)\n", nc, ne);
        return 1;
    }
    size_t failures = 0, total_ids = 0;
    tdm_tok_stream *stream;
    if (tdm_tok_stream_create(tok, false, &stream, &err) != TDM_OK)
        return 1;
    for (size_t i = 0; i < nc; i++) {
        const char *text = cJSON_GetObjectItem(corpus[i], "text")->valuestring;
        size_t tlen = strlen(text);
        cJSON *jids = cJSON_GetObjectItem(exp[i], "ids");
        size_t n_exp = (size_t)cJSON_GetArraySize(jids);
        int32_t *want = malloc((n_exp + 1) * sizeof(int32_t));
        for (size_t k = 0; k < n_exp; k++)
            want[k] = (int32_t)cJSON_GetArrayItem(jids, (int)k)->valuedouble;
        const cJSON *jd = cJSON_GetObjectItem(exp[i], "decoded");
        const cJSON *js = cJSON_GetObjectItem(exp[i], "decoded_skip");
        const char *dec_want = jd ? jd->valuestring : text;
        const char *skip_want = js ? js->valuestring : dec_want;
        total_ids += n_exp;

        int32_t *got;
        size_t n_got;
        bool ok = true;
        if (tdm_tok_encode(tok, text, tlen, &got, &n_got, &err) != TDM_OK) {
            fprintf(stderr, "line %zu: encode failed: %s\n", i + 1, err.msg);
            ok = false;
            got = NULL;
            n_got = 0;
        } else if (n_got != n_exp || (n_got && memcmp(got, want, n_got * sizeof(int32_t)) != 0)) {
            size_t k = 0;
            while (k < n_got && k < n_exp && got[k] == want[k])
                k++;
            fprintf(stderr, "line %zu: encode differs from HF at id index %zu\n", i + 1, k);
            print_escaped("text", text, tlen);
            print_ids("HF  ", want, n_exp);
            print_ids("ours", got, n_got);
            ok = false;
        }
        char *dec = NULL, *skip = NULL;
        size_t dlen = 0, slen = 0;
        if (tdm_tok_decode(tok, want, n_exp, false, &dec, &dlen, &err) != TDM_OK ||
            tdm_tok_decode(tok, want, n_exp, true, &skip, &slen, &err) != TDM_OK) {
            fprintf(stderr, "line %zu: decode failed: %s\n", i + 1, err.msg);
            ok = false;
        } else {
            if (dlen != strlen(dec_want) || memcmp(dec, dec_want, dlen) != 0) {
                fprintf(stderr, "line %zu: decode differs from HF\n", i + 1);
                print_escaped("HF  ", dec_want, strlen(dec_want));
                print_escaped("ours", dec, dlen);
                ok = false;
            }
            if (slen != strlen(skip_want) || memcmp(skip, skip_want, slen) != 0) {
                fprintf(stderr, "line %zu: decode(skip_special_tokens) differs from HF\n", i + 1);
                print_escaped("HF  ", skip_want, strlen(skip_want));
                print_escaped("ours", skip, slen);
                ok = false;
            }
            /* Streaming, one token at a time. */
            char *cat = malloc(dlen + 64);
            size_t cl = 0;
            for (size_t k = 0; k < n_exp && ok; k++) {
                const char *t;
                size_t tl;
                if (tdm_tok_stream_push(stream, want[k], &t, &tl, &err) != TDM_OK) {
                    fprintf(stderr, "line %zu: stream push failed: %s\n", i + 1, err.msg);
                    ok = false;
                    break;
                }
                if (cl + tl > dlen) {
                    fprintf(stderr, "line %zu: stream produced more than the one-shot decode\n",
                            i + 1);
                    ok = false;
                    break;
                }
                memcpy(cat + cl, t, tl);
                cl += tl;
            }
            const char *t;
            size_t tl;
            tdm_tok_stream_flush(stream, &t, &tl);
            if (ok &&
                (cl + tl != dlen || memcmp(cat, dec, cl) != 0 || memcmp(t, dec + cl, tl) != 0)) {
                fprintf(stderr, "line %zu: streamed text differs from one-shot decode\n", i + 1);
                print_escaped("one-shot", dec, dlen);
                ok = false;
            }
            free(cat);
            /* Round trip: the decoded text encodes to the same ids. */
            int32_t *rt;
            size_t n_rt;
            if (ok && tdm_tok_encode(tok, dec, dlen, &rt, &n_rt, &err) == TDM_OK) {
                if (n_rt != n_exp || (n_rt && memcmp(rt, want, n_rt * sizeof(int32_t)) != 0)) {
                    fprintf(stderr, "line %zu: encode(decode(ids)) != ids\n", i + 1);
                    print_escaped("decoded", dec, dlen);
                    print_ids("ids ", want, n_exp);
                    print_ids("back", rt, n_rt);
                    ok = false;
                }
                free(rt);
            }
        }
        free(dec);
        free(skip);
        free(got);
        free(want);
        if (!ok && ++failures >= 5) {
            fprintf(stderr, "stopping after 5 failing lines\n");
            break;
        }
    }
    char fp[65];
    tdm_tok_fingerprint(tok, fp);
    printf("%s: %zu strings, %zu ids, %zu failing; vocab %zu; fingerprint %s\n", argv[2], nc,
           total_ids, failures, tdm_tok_vocab_size(tok), fp);
    tdm_tok_stream_destroy(stream);
    for (size_t i = 0; i < nc; i++) {
        cJSON_Delete(corpus[i]);
        cJSON_Delete(exp[i]);
    }
    free(corpus);
    free(exp);
    tdm_tok_destroy(tok);
    return failures ? 1 : 0;
}
