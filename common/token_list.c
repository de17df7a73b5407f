/*
 * token_list.c - reading a file of token ids (token_list.h).
 */
#include "token_list.h"
#include "alloc.h"
#include "file.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define TOKEN_LIST_MAX_BYTES ((size_t)64 << 20)

typedef struct {
    int32_t id;
    int line;
} listed;

static int by_id(const void *a, const void *b)
{
    const listed *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

tdm_status tdm_token_list_read(const char *path, int vocab_size, int32_t **ids, int *n,
                               tdm_error *err)
{
    *ids = NULL;
    *n = 0;
    char *text = NULL;
    tdm_status rc = tdm_file_read(path, TOKEN_LIST_MAX_BYTES, &text, NULL, err);
    if (rc != TDM_OK)
        return rc;
    listed *all = NULL;
    size_t count = 0, cap = 0;
    int line = 1;
    for (const char *p = text; *p && rc == TDM_OK;) {
        if (*p == '\n') {
            line++;
            p++;
        } else if (*p == '#') {
            while (*p && *p != '\n')
                p++;
        } else if (isspace((unsigned char)*p) || *p == ',') {
            p++;
        } else {
            const char *start = p;
            while (*p && !isspace((unsigned char)*p) && *p != ',' && *p != '#')
                p++;
            char word[32];
            const size_t len = (size_t)(p - start);
            char *end = NULL;
            long v = -1;
            if (len < sizeof(word)) {
                memcpy(word, start, len);
                word[len] = '\0';
                errno = 0;
                v = isdigit((unsigned char)word[0]) ? strtol(word, &end, 10) : -1;
            }
            if (v < 0 || !end || *end || errno || v > INT32_MAX)
                rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                   "%s:%d: '%.*s' is not a token id (a decimal number)", path, line,
                                   (int)(len < 40 ? len : 40), start);
            else if (vocab_size > 0 && v >= vocab_size)
                rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                   "%s:%d: token %ld is outside the model's vocabulary "
                                   "0..%d",
                                   path, line, v, vocab_size - 1);
            else {
                if (count == cap) {
                    cap = cap ? 2 * cap : 1024;
                    all = tdm_xrealloc(all, cap * sizeof(*all));
                }
                all[count++] = (listed){(int32_t)v, line};
            }
        }
    }
    free(text);
    if (rc == TDM_OK && count == 0)
        rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: no token ids in the file", path);
    if (rc == TDM_OK) {
        qsort(all, count, sizeof(*all), by_id);
        for (size_t i = 1; i < count && rc == TDM_OK; i++)
            if (all[i].id == all[i - 1].id)
                rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                   "%s: token %d is listed twice (lines %d and %d)", path,
                                   (int)all[i].id,
                                   all[i - 1].line < all[i].line ? all[i - 1].line : all[i].line,
                                   all[i - 1].line < all[i].line ? all[i].line : all[i - 1].line);
    }
    if (rc == TDM_OK) {
        *ids = tdm_xmalloc(count * sizeof(int32_t));
        for (size_t i = 0; i < count; i++)
            (*ids)[i] = all[i].id;
        *n = (int)count;
    }
    free(all);
    return rc;
}
