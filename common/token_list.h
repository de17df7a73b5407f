/*
 * token_list.h - a file of token ids (a drafter's draft vocabulary,
 * draft_vocab): decimal ids separated by white space or commas, '#' to the
 * end of a line a comment. Any order (a frequency-ranked list is the usual
 * source); each id once.
 */
#ifndef TANDEM_COMMON_TOKEN_LIST_H
#define TANDEM_COMMON_TOKEN_LIST_H

#include "status.h"

#include <stdint.h>

/* The ids of `path`, ascending, into a malloc'd *ids the caller frees, *n of
 * them. vocab_size > 0: every id must be below it. INVALID_ARGUMENT naming
 * the path, the line and the text for anything not an id, an id out of
 * range, an id listed twice, or an empty list; the file errors of
 * tdm_file_read. */
tdm_status tdm_token_list_read(const char *path, int vocab_size, int32_t **ids, int *n,
                               tdm_error *err);

#endif
