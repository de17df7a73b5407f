/*
 * cli_tokenize.c - `tandem tokenize` and `tandem detokenize`: the tokenizer
 * (tokenizer/tokenizer.h) from the command line.
 */
#include "cli.h"

#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads all of stdin; the caller frees. NULL on failure. */
static char *read_stdin(size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b != NULL) {
        size_t got = fread(b + n, 1, cap - n - 1, stdin);
        n += got;
        if (got == 0)
            break;
        if (n + 1 == cap) {
            char *nb = realloc(b, cap *= 2);
            if (nb == NULL)
                free(b);
            b = nb;
        }
    }
    if (b == NULL || ferror(stdin)) {
        free(b);
        return NULL;
    }
    b[n] = '\0';
    *len = n;
    return b;
}

static void tokenize_usage(FILE *out)
{
    fprintf(out,
            "usage: tandem tokenize --tokenizer FILE [options] [TEXT | -]\n"
            "\n"
            "Prints the token ids of TEXT (or of stdin when TEXT is '-' or absent).\n"
            "  --tokenizer FILE        a Hugging Face tokenizer.json (byte-level BPE)\n"
            "  --tokens                one line per token: id, then the token string\n"
            "  --chat ROLE=CONTENT     add a ChatML message (repeatable); TEXT is not read\n"
            "  --no-generation-prompt  with --chat: omit the trailing assistant prefix\n"
            "  --fingerprint           print the tokenizer's fingerprint and exit\n"
            "  --info                  print vocabulary size and special token ids and exit\n"
            "  --                      end of options: what follows is TEXT\n");
}

static void detokenize_usage(FILE *out)
{
    fprintf(out, "usage: tandem detokenize --tokenizer FILE [--skip-special] [ID ...]\n"
                 "\n"
                 "Prints the text of the token ids given as arguments, or read from stdin\n"
                 "(separated by spaces, commas, brackets or newlines) when none are given.\n"
                 "  --tokenizer FILE   a Hugging Face tokenizer.json (byte-level BPE)\n"
                 "  --skip-special     leave special tokens out\n"
                 "  --                 end of options: what follows are ids\n");
}

static tdm_tokenizer *open_tokenizer(const char *path)
{
    tdm_tokenizer *tok;
    tdm_error err = {0};
    if (tdm_tok_load(path, &tok, &err) != TDM_OK) {
        fprintf(stderr, "tandem: %s\n", err.msg);
        return NULL;
    }
    return tok;
}

int cli_tokenize(int argc, char **argv)
{
    const char *path = NULL, *text_arg = NULL;
    bool tokens = false, fingerprint = false, info = false, gen_prompt = true;
    tdm_tok_message *msgs = calloc((size_t)argc, sizeof(*msgs));
    size_t n_msgs = 0;
    int rc = 2;
    tdm_tokenizer *tok = NULL;
    char *input = NULL;
    int32_t *ids = NULL;
    if (msgs == NULL)
        return 1;
    bool options = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!options || strcmp(a, "--") == 0) {
            if (options) {
                options = false;
                continue;
            }
            if (text_arg != NULL) {
                fprintf(stderr, "tandem tokenize: give the text as one argument (quote it)\n");
                goto done;
            }
            text_arg = a;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            tokenize_usage(stdout);
            rc = 0;
            goto done;
        } else if (strcmp(a, "--tokenizer") == 0 && i + 1 < argc) {
            path = argv[++i];
        } else if (strcmp(a, "--tokens") == 0) {
            tokens = true;
        } else if (strcmp(a, "--fingerprint") == 0) {
            fingerprint = true;
        } else if (strcmp(a, "--info") == 0) {
            info = true;
        } else if (strcmp(a, "--no-generation-prompt") == 0) {
            gen_prompt = false;
        } else if (strcmp(a, "--chat") == 0 && i + 1 < argc) {
            char *m = argv[++i], *eq = strchr(m, '=');
            if (eq == NULL) {
                fprintf(stderr, "tandem tokenize: --chat wants ROLE=CONTENT, got '%s'\n", m);
                goto done;
            }
            *eq = '\0';
            msgs[n_msgs++] = (tdm_tok_message){m, eq + 1};
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "tandem tokenize: unknown or incomplete option '%s'\n\n", a);
            tokenize_usage(stderr);
            goto done;
        } else if (text_arg == NULL) {
            text_arg = a;
        } else {
            fprintf(stderr, "tandem tokenize: give the text as one argument (quote it)\n");
            goto done;
        }
    }
    if (path == NULL) {
        fprintf(stderr, "tandem tokenize: --tokenizer FILE is required\n\n");
        tokenize_usage(stderr);
        goto done;
    }
    rc = 1;
    if ((tok = open_tokenizer(path)) == NULL)
        goto done;
    if (fingerprint || info) {
        char fp[65];
        tdm_tok_fingerprint(tok, fp);
        if (fingerprint)
            printf("%s\n", fp);
        if (info) {
            const tdm_tok_specials *sp = tdm_tok_specials_get(tok);
            printf("vocab_size:   %zu\nfingerprint:  %s\nendoftext:    %d\nim_start:     %d\n"
                   "im_end:       %d\neos:          %d\npad:          %d\n",
                   tdm_tok_vocab_size(tok), fp, sp->endoftext, sp->im_start, sp->im_end, sp->eos,
                   sp->pad);
        }
        rc = 0;
        goto done;
    }
    size_t n_ids = 0;
    tdm_error err = {0};
    tdm_status st;
    if (n_msgs > 0) {
        st = tdm_tok_encode_chat(tok, msgs, n_msgs, gen_prompt, &ids, &n_ids, &err);
    } else {
        size_t len;
        if (text_arg == NULL || strcmp(text_arg, "-") == 0) {
            if ((input = read_stdin(&len)) == NULL) {
                fprintf(stderr, "tandem tokenize: cannot read stdin\n");
                goto done;
            }
        } else {
            len = strlen(text_arg);
        }
        st = tdm_tok_encode(tok, input ? input : text_arg, len, &ids, &n_ids, &err);
    }
    if (st != TDM_OK) {
        fprintf(stderr, "tandem tokenize: %s\n", err.msg);
        goto done;
    }
    for (size_t i = 0; i < n_ids; i++) {
        if (tokens) {
            size_t tl;
            const char *t = tdm_tok_id_to_token(tok, ids[i], &tl);
            printf("%d\t%.*s\n", ids[i], (int)tl, t);
        } else {
            printf(i ? " %d" : "%d", ids[i]);
        }
    }
    if (!tokens)
        printf("\n");
    rc = 0;
done:
    free(ids);
    free(input);
    free(msgs);
    tdm_tok_destroy(tok);
    return rc;
}

/* Parses ids separated by spaces, commas, brackets or newlines. */
static int parse_ids(char *s, int32_t **ids, size_t *n, size_t *cap)
{
    const char *sep = " \t\r\n,[]";
    for (char *tk = strtok(s, sep); tk; tk = strtok(NULL, sep)) {
        char *end;
        errno = 0;
        long v = strtol(tk, &end, 10);
        if (*end != '\0' || errno != 0 || v < INT32_MIN || v > INT32_MAX) {
            fprintf(stderr, "tandem detokenize: not a token id: '%s'\n", tk);
            return -1;
        }
        if (*n == *cap) {
            *cap = *cap ? *cap * 2 : 256;
            int32_t *nb = realloc(*ids, *cap * sizeof(int32_t));
            if (nb == NULL)
                return -1;
            *ids = nb;
        }
        (*ids)[(*n)++] = (int32_t)v;
    }
    return 0;
}

int cli_detokenize(int argc, char **argv)
{
    const char *path = NULL;
    bool skip = false;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int rc = 2;
    char *input = NULL, *text = NULL;
    tdm_tokenizer *tok = NULL;
    int first_id = argc;
    for (int i = 1; i < argc && first_id == argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            first_id = i + 1; /* what follows are ids, even when it starts with '-' */
            break;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            detokenize_usage(stdout);
            return 0;
        } else if (strcmp(a, "--tokenizer") == 0 && i + 1 < argc) {
            path = argv[++i];
        } else if (strcmp(a, "--skip-special") == 0) {
            skip = true;
        } else if (a[0] == '-' && (a[1] < '0' || a[1] > '9')) {
            fprintf(stderr, "tandem detokenize: unknown or incomplete option '%s'\n\n", a);
            detokenize_usage(stderr);
            return 2;
        } else {
            first_id = i;
        }
    }
    if (path == NULL) {
        fprintf(stderr, "tandem detokenize: --tokenizer FILE is required\n\n");
        detokenize_usage(stderr);
        return 2;
    }
    if (first_id < argc) {
        for (int i = first_id; i < argc; i++)
            if (parse_ids(argv[i], &ids, &n, &cap) != 0)
                goto done;
    } else {
        size_t len;
        if ((input = read_stdin(&len)) == NULL || parse_ids(input, &ids, &n, &cap) != 0)
            goto done;
    }
    rc = 1;
    if ((tok = open_tokenizer(path)) == NULL)
        goto done;
    size_t len;
    tdm_error err = {0};
    if (tdm_tok_decode(tok, ids, n, skip, &text, &len, &err) != TDM_OK) {
        fprintf(stderr, "tandem detokenize: %s\n", err.msg);
        goto done;
    }
    fwrite(text, 1, len, stdout);
    rc = 0;
done:
    free(text);
    free(input);
    free(ids);
    tdm_tok_destroy(tok);
    return rc;
}
