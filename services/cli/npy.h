/*
 * npy.h - NumPy .npy files of float32 values (C order, little-endian).
 *
 * Owns nothing beyond the arrays it returns: tdm_npy_read allocates the data
 * (the caller frees it with free()). Used to hand logits to users and to read
 * reference logits in tests. Other dtypes and Fortran order are refused with
 * an error naming the file.
 */
#ifndef TANDEM_COMMON_NPY_H
#define TANDEM_COMMON_NPY_H

#include "status.h"

#include <stddef.h>
#include <stdint.h>

/* Writes data [shape[0], ..., shape[ndim-1]] as '<f4'. */
tdm_status tdm_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape,
                             tdm_error *err);

/* Reads a '<f4' array of at most 4 dimensions. On success *data (caller
 * frees) holds prod(shape) values and *ndim/shape are filled. */
tdm_status tdm_npy_read_f32(const char *path, float **data, int *ndim, int64_t shape[4],
                            tdm_error *err);

/* The same from an .npy image in memory (len bytes at buf); `origin` names
 * it in errors. */
tdm_status tdm_npy_read_f32_mem(const void *buf, size_t len, const char *origin, float **data,
                                int *ndim, int64_t shape[4], tdm_error *err);

#endif
