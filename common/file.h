/*
 * file.h - reading a whole (small) file: configuration, tokenizer.json,
 * safetensors indexes, PEM files. One place for the checks every reader
 * needs: a regular file, a size bound, complete reads, errors that name the
 * path.
 */
#ifndef TANDEM_COMMON_FILE_H
#define TANDEM_COMMON_FILE_H

#include "status.h"

#include <stddef.h>

/* Reads `path` (a regular file of at most max bytes) into a NUL-terminated
 * malloc'd buffer the caller frees; *len (optional) excludes the NUL.
 * NOT_FOUND / PERMISSION_DENIED when it cannot be opened, INVALID_ARGUMENT
 * when it is not a regular file or is too large, DATA_LOSS on a short read. */
tdm_status tdm_file_read(const char *path, size_t max, char **out, size_t *len, tdm_error *err);

#endif
