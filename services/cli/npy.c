/*
 * npy.c - see npy.h. Format 1.0: magic "\x93NUMPY", version 1.0, uint16
 * header length, a Python dict literal padded with spaces to a multiple of
 * 64 bytes (ending in '\n'), then the raw data.
 */
#include "npy.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tdm_status tdm_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape,
                             tdm_error *err)
{
    char dict[256];
    int n = snprintf(dict, sizeof(dict), "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        n += snprintf(dict + n, sizeof(dict) - (size_t)n, "%lld,%s", (long long)shape[i],
                      i + 1 < ndim ? " " : "");
        count *= (size_t)shape[i];
    }
    n += snprintf(dict + n, sizeof(dict) - (size_t)n, "), }");
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)n + pad + 1;
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return tdm_error_set(err, TDM_ERR_PERMISSION_DENIED, "%s: cannot create: %s", path,
                             strerror(errno));
    unsigned char pre[10] = {0x93,
                             'N',
                             'U',
                             'M',
                             'P',
                             'Y',
                             1,
                             0,
                             (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    int ok = fwrite(pre, 1, 10, fp) == 10 && fwrite(dict, 1, (size_t)n, fp) == (size_t)n;
    for (size_t i = 0; ok && i < pad; i++)
        ok = fputc(' ', fp) != EOF;
    ok = ok && fputc('\n', fp) != EOF;
    ok = ok && fwrite(data, sizeof(float), count, fp) == count;
    if (fclose(fp) != 0)
        ok = 0;
    if (!ok)
        return tdm_error_set(err, TDM_ERR_DATA_LOSS, "%s: write failed", path);
    return TDM_OK;
}

/* Reads the array from fp (positioned at the magic); `path` names it. */
static tdm_status npy_read(FILE *fp, const char *path, float **data, int *ndim, int64_t shape[4],
                           tdm_error *err)
{
    unsigned char pre[10];
    tdm_status rc = TDM_OK;
    char hdr[4096];
    if (fread(pre, 1, 10, fp) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0 || pre[6] != 1) {
        rc = tdm_error_set(err, TDM_ERR_DATA_LOSS, "%s: not a version-1 .npy file", path);
        goto out;
    }
    size_t hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    if (hlen >= sizeof(hdr) || fread(hdr, 1, hlen, fp) != hlen) {
        rc = tdm_error_set(err, TDM_ERR_DATA_LOSS, "%s: truncated header", path);
        goto out;
    }
    hdr[hlen] = 0;
    if (!strstr(hdr, "'descr': '<f4'") || !strstr(hdr, "'fortran_order': False")) {
        rc =
            tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                          "%s: only little-endian float32 in C order is supported (%s)", path, hdr);
        goto out;
    }
    char *s = strstr(hdr, "'shape': (");
    if (!s) {
        rc = tdm_error_set(err, TDM_ERR_DATA_LOSS, "%s: header has no shape", path);
        goto out;
    }
    s += strlen("'shape': (");
    *ndim = 0;
    size_t count = 1;
    while (*s && *s != ')') {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s)
            break;
        if (*ndim >= 4 || v < 0 || errno == ERANGE) {
            rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                               "%s: unsupported shape (at most 4 dimensions, each 0..2^63-1)",
                               path);
            goto out;
        }
        shape[(*ndim)++] = v;
        if (v > 0 && count > SIZE_MAX / sizeof(float) / (unsigned long long)v) {
            rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                               "%s: the shape holds more values than memory can", path);
            goto out;
        }
        count *= (size_t)v;
        s = end;
        while (*s == ',' || *s == ' ')
            s++;
    }
    if (*s != ')') {
        rc = tdm_error_set(err, TDM_ERR_DATA_LOSS, "%s: malformed shape in the header", path);
        goto out;
    }
    /* The data must be what the shape says, no more and no less: checked
     * before anything is allocated for it. */
    long here = ftell(fp);
    if (here < 0 || fseek(fp, 0, SEEK_END) != 0) {
        rc = tdm_error_set(err, TDM_ERR_DATA_LOSS, "%s: cannot find the size of the data", path);
        goto out;
    }
    long size = ftell(fp);
    if (size < here || fseek(fp, here, SEEK_SET) != 0) {
        rc = tdm_error_set(err, TDM_ERR_DATA_LOSS, "%s: cannot find the size of the data", path);
        goto out;
    }
    size_t have = (size_t)(size - here), need = count * sizeof(float);
    if (have != need) {
        rc = tdm_error_set(err, TDM_ERR_DATA_LOSS,
                           "%s: %s data: the shape needs %zu bytes, the file has %zu", path,
                           have < need ? "truncated" : "trailing bytes after the", need, have);
        goto out;
    }
    *data = malloc(count ? need : 1);
    if (!*data || fread(*data, sizeof(float), count, fp) != count) {
        free(*data);
        *data = NULL;
        rc = tdm_error_set(err, TDM_ERR_DATA_LOSS, "%s: truncated data", path);
    }
out:
    return rc;
}

tdm_status tdm_npy_read_f32(const char *path, float **data, int *ndim, int64_t shape[4],
                            tdm_error *err)
{
    *data = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return tdm_error_set(err, TDM_ERR_NOT_FOUND, "%s: cannot open: %s", path, strerror(errno));
    tdm_status rc = npy_read(fp, path, data, ndim, shape, err);
    fclose(fp);
    return rc;
}

tdm_status tdm_npy_read_f32_mem(const void *buf, size_t len, const char *origin, float **data,
                                int *ndim, int64_t shape[4], tdm_error *err)
{
    *data = NULL;
    /* fmemopen needs a buffer of at least one byte; an empty image is
     * read from a one-byte buffer that holds nothing of it. */
    static const char none[1];
    FILE *fp = fmemopen((void *)(len ? buf : none), len ? len : 1, "rb");
    if (!fp)
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "%s: cannot read from memory: %s",
                             origin, strerror(errno));
    if (!len)
        fseek(fp, 1, SEEK_SET);
    tdm_status rc = npy_read(fp, origin, data, ndim, shape, err);
    fclose(fp);
    return rc;
}
