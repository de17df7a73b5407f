/*
 * safetensors.h - read-only, memory-mapped access to safetensors checkpoints.
 *
 * Owns the mappings of one checkpoint: a single `.safetensors` file, or the
 * shards named by a `model.safetensors.index.json`. Every header is validated
 * when opened (header length, JSON, dtype names, shapes, offsets inside the
 * file, byte counts that match the shape), so a tensor handed out always lies
 * inside its mapping. Tensor data stays in the page cache; nothing is copied.
 * Errors name the file and, where one is at fault, the tensor.
 */
#ifndef TANDEM_COMMON_SAFETENSORS_H
#define TANDEM_COMMON_SAFETENSORS_H

#include "status.h"

#include <stddef.h>
#include <stdint.h>

#define TDM_ST_MAX_DIMS 8

typedef enum tdm_st_dtype {
    TDM_ST_DTYPE_F32 = 0,
    TDM_ST_DTYPE_F16,
    TDM_ST_DTYPE_BF16,
    TDM_ST_DTYPE_F64,
    TDM_ST_DTYPE_I64,
    TDM_ST_DTYPE_I32,
    TDM_ST_DTYPE_I16,
    TDM_ST_DTYPE_I8,
    TDM_ST_DTYPE_U8,
    TDM_ST_DTYPE_BOOL,
    TDM_ST_DTYPE_F8_E4M3,
    TDM_ST_DTYPE_F8_E5M2,
} tdm_st_dtype;

typedef struct tdm_st_tensor {
    const char *name; /* full name as stored, e.g. "model.norm.weight" */
    tdm_st_dtype dtype;
    int ndim; /* 0 for a scalar */
    int64_t shape[TDM_ST_MAX_DIMS];
    int64_t numel;
    const void *data; /* inside the file's read-only mapping */
    size_t nbytes;
    int file_index; /* which file of the checkpoint holds it */
} tdm_st_tensor;

typedef struct tdm_st_file tdm_st_file;

/* Opens a checkpoint. `path` is a `.safetensors` file, a
 * `model.safetensors.index.json`, or a folder holding either
 * `model.safetensors` or `model.safetensors.index.json`. On success *out is
 * owned by the caller (tdm_st_close). */
tdm_status tdm_st_open(const char *path, tdm_st_file **out, tdm_error *err);
void tdm_st_close(tdm_st_file *f);

/* Opens one `.safetensors` image held in memory (size bytes at data), with
 * the same checks as a file; `origin` names it in errors and stands as its
 * path. The buffer is borrowed: it must outlive *out, whose tensors point
 * into it. */
tdm_status tdm_st_open_memory(const void *data, size_t size, const char *origin, tdm_st_file **out,
                              tdm_error *err);

size_t tdm_st_count(const tdm_st_file *f);
/* Tensors in a stable order (file by file, then by data offset). */
const tdm_st_tensor *tdm_st_at(const tdm_st_file *f, size_t i);
/* NULL when absent. */
const tdm_st_tensor *tdm_st_find(const tdm_st_file *f, const char *name);
/* Path of file `index` (tensor->file_index), for error messages. */
const char *tdm_st_file_path(const tdm_st_file *f, int index);
int tdm_st_file_count(const tdm_st_file *f);
/* Bytes of file `index`, and of its data section the bytes no tensor's
 * data_offsets cover (before, between or after tensors): 0 in a file that
 * was written whole; a file longer than its header says, a copy appended to,
 * leaves some. */
size_t tdm_st_file_size(const tdm_st_file *f, int index);
size_t tdm_st_file_unused_bytes(const tdm_st_file *f, int index);

/* "F32", "BF16", ... (the safetensors spelling). */
const char *tdm_st_dtype_name(tdm_st_dtype dt);
size_t tdm_st_dtype_size(tdm_st_dtype dt);

/* Writes "[a, b, c]" into buf. */
const char *tdm_st_shape_str(const tdm_st_tensor *t, char *buf, size_t len);

#endif
