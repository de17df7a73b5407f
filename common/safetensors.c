/*
 * safetensors.c - see safetensors.h. Format: 8-byte little-endian header
 * length N, N bytes of JSON {name: {dtype, shape, data_offsets:[b,e]}}, then
 * the data; offsets are relative to the first byte after the header.
 */
#include "safetensors.h"
#include "alloc.h"

#include "file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A header larger than this is not a model header; refuse it rather than
 * parse hundreds of MB of JSON. */
#define ST_MAX_HEADER (256u << 20)

typedef struct st_map {
    char *path;
    void *base; /* whole file, PROT_READ, or the caller's buffer */
    size_t size;
    bool mapped; /* base is our mapping (else borrowed) */
} st_map;

struct tdm_st_file {
    st_map *files;
    int nfiles;
    tdm_st_tensor *tensors;
    size_t ntensors, cap;
    const tdm_st_tensor **by_name; /* into tensors (complete once built), sorted by name */
};

static const struct {
    const char *name;
    tdm_st_dtype dt;
    size_t size;
} st_dtypes[] = {
    {"F32", TDM_ST_DTYPE_F32, 4},         {"F16", TDM_ST_DTYPE_F16, 2},
    {"BF16", TDM_ST_DTYPE_BF16, 2},       {"F64", TDM_ST_DTYPE_F64, 8},
    {"I64", TDM_ST_DTYPE_I64, 8},         {"I32", TDM_ST_DTYPE_I32, 4},
    {"I16", TDM_ST_DTYPE_I16, 2},         {"I8", TDM_ST_DTYPE_I8, 1},
    {"U8", TDM_ST_DTYPE_U8, 1},           {"BOOL", TDM_ST_DTYPE_BOOL, 1},
    {"F8_E4M3", TDM_ST_DTYPE_F8_E4M3, 1}, {"F8_E5M2", TDM_ST_DTYPE_F8_E5M2, 1},
};

const char *tdm_st_dtype_name(tdm_st_dtype dt)
{
    for (size_t i = 0; i < TDM_ARRAY_LEN(st_dtypes); i++)
        if (st_dtypes[i].dt == dt)
            return st_dtypes[i].name;
    return "?";
}

size_t tdm_st_dtype_size(tdm_st_dtype dt)
{
    for (size_t i = 0; i < TDM_ARRAY_LEN(st_dtypes); i++)
        if (st_dtypes[i].dt == dt)
            return st_dtypes[i].size;
    return 0;
}

const char *tdm_st_shape_str(const tdm_st_tensor *t, char *buf, size_t len)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, len - n, "[");
    for (int i = 0; i < t->ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
    return buf;
}

static tdm_status st_map_file(const char *path, st_map *m, tdm_error *err)
{
    memset(m, 0, sizeof(*m));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tdm_error_set(err, errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_PERMISSION_DENIED,
                             "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: not a regular file", path);
    }
    m->size = (size_t)st.st_size;
    if (m->size > 0) {
        m->base = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m->base == MAP_FAILED) {
            m->base = NULL;
            close(fd);
            return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "%s: mmap failed: %s", path,
                                 strerror(errno));
        }
        m->mapped = true;
    }
    close(fd);
    m->path = strdup(path);
    return TDM_OK;
}

static int json_to_u64(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return -1;
    double d = j->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || floor(d) != d)
        return -1;
    *out = (uint64_t)d;
    return 0;
}

static tdm_status st_add_tensor(tdm_st_file *f, tdm_st_tensor *t, tdm_error *err)
{
    (void)err;
    if (f->ntensors == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 64;
        tdm_st_tensor *nt = realloc(f->tensors, nc * sizeof(*nt));
        if (!nt)
            return tdm_error_oom(err, nc * sizeof(*nt), "the tensor list of a safetensors "
                                                        "header");
        f->tensors = nt;
        f->cap = nc;
    }
    f->tensors[f->ntensors++] = *t;
    return TDM_OK;
}

/* Parses and validates the header of mapped file `fi`, appending its tensors. */
static tdm_status st_parse_header(tdm_st_file *f, int fi, tdm_error *err)
{
    const st_map *m = &f->files[fi];
    if (m->size < 8)
        return tdm_error_set(err, TDM_ERR_DATA_LOSS,
                             "%s: truncated: %zu bytes, shorter than the 8-byte header length",
                             m->path, m->size);
    const unsigned char *p = m->base;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | p[i];
    if (hlen > m->size - 8)
        return tdm_error_set(err, TDM_ERR_DATA_LOSS,
                             "%s: truncated or corrupt: header length %llu exceeds the %zu bytes "
                             "after it",
                             m->path, (unsigned long long)hlen, m->size - 8);
    if (hlen > ST_MAX_HEADER)
        return tdm_error_set(err, TDM_ERR_DATA_LOSS,
                             "%s: corrupt: header length %llu is implausible", m->path,
                             (unsigned long long)hlen);
    size_t data_size = m->size - 8 - (size_t)hlen;
    const unsigned char *data = p + 8 + hlen;
    cJSON *root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return tdm_error_set(err, TDM_ERR_DATA_LOSS, "%s: corrupt: header is not a JSON object",
                             m->path);
    }
    tdm_status rc = TDM_OK;
    for (cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0)
            continue;
        const char *name = e->string;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) ||
            !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2) {
            rc = tdm_error_set(err, TDM_ERR_DATA_LOSS,
                               "%s: tensor '%s': header entry lacks dtype, shape or data_offsets",
                               m->path, name);
            break;
        }
        tdm_st_tensor t;
        memset(&t, 0, sizeof(t));
        t.file_index = fi;
        int found = 0;
        size_t esize = 0;
        for (size_t i = 0; i < TDM_ARRAY_LEN(st_dtypes); i++)
            if (strcmp(st_dtypes[i].name, dt->valuestring) == 0) {
                t.dtype = st_dtypes[i].dt;
                esize = st_dtypes[i].size;
                found = 1;
            }
        if (!found) {
            rc = tdm_error_set(err, TDM_ERR_DATA_LOSS, "%s: tensor '%s': unknown dtype '%s'",
                               m->path, name, dt->valuestring);
            break;
        }
        t.ndim = cJSON_GetArraySize(shape);
        if (t.ndim > TDM_ST_MAX_DIMS) {
            rc = tdm_error_set(err, TDM_ERR_DATA_LOSS, "%s: tensor '%s': %d dimensions (max %d)",
                               m->path, name, t.ndim, TDM_ST_MAX_DIMS);
            break;
        }
        uint64_t numel = 1;
        int bad = 0, i = 0;
        for (const cJSON *d = shape->child; d; d = d->next, i++) {
            uint64_t v;
            if (json_to_u64(d, &v) != 0 || v > (uint64_t)INT64_MAX ||
                (v && numel > UINT64_MAX / v)) {
                bad = 1;
                break;
            }
            t.shape[i] = (int64_t)v;
            numel *= v;
        }
        uint64_t b = 0, en = 0;
        if (bad || json_to_u64(offs->child, &b) != 0 || json_to_u64(offs->child->next, &en) != 0) {
            rc = tdm_error_set(
                err, TDM_ERR_DATA_LOSS,
                "%s: tensor '%s': shape or data_offsets are not non-negative integers", m->path,
                name);
            break;
        }
        if (en < b || en > data_size) {
            rc = tdm_error_set(
                err, TDM_ERR_DATA_LOSS,
                "%s: tensor '%s': data_offsets [%llu, %llu] lie outside the %zu data "
                "bytes (file truncated or header corrupt)",
                m->path, name, (unsigned long long)b, (unsigned long long)en, data_size);
            break;
        }
        if (numel > UINT64_MAX / esize || en - b != numel * esize) {
            rc = tdm_error_set(err, TDM_ERR_DATA_LOSS,
                               "%s: tensor '%s': data_offsets span %llu bytes but shape and dtype "
                               "%s need %llu",
                               m->path, name, (unsigned long long)(en - b), dt->valuestring,
                               (unsigned long long)(numel * esize));
            break;
        }
        t.numel = (int64_t)numel;
        t.nbytes = (size_t)(en - b);
        t.data = data + b;
        t.name = tdm_xstrdup(name);
        if ((rc = st_add_tensor(f, &t, err)) != TDM_OK) {
            free((char *)t.name);
            break;
        }
    }
    cJSON_Delete(root);
    return rc;
}

static int st_cmp_name(const void *a, const void *b)
{
    const tdm_st_tensor *ta = *(const tdm_st_tensor *const *)a;
    const tdm_st_tensor *tb = *(const tdm_st_tensor *const *)b;
    return strcmp(ta->name, tb->name);
}

static tdm_status st_build_index(tdm_st_file *f, tdm_error *err)
{
    f->by_name = malloc((f->ntensors ? f->ntensors : 1) * sizeof(*f->by_name));
    if (!f->by_name)
        return tdm_error_oom(err, f->ntensors * sizeof(*f->by_name), "an index of %zu tensors",
                             f->ntensors);
    for (size_t i = 0; i < f->ntensors; i++)
        f->by_name[i] = &f->tensors[i];
    qsort(f->by_name, f->ntensors, sizeof(*f->by_name), st_cmp_name);
    for (size_t i = 1; i < f->ntensors; i++) {
        const tdm_st_tensor *a = f->by_name[i - 1];
        const tdm_st_tensor *b = f->by_name[i];
        if (strcmp(a->name, b->name) == 0)
            return tdm_error_set(err, TDM_ERR_DATA_LOSS, "tensor '%s' appears twice (in %s and %s)",
                                 a->name, f->files[a->file_index].path,
                                 f->files[b->file_index].path);
    }
    return TDM_OK;
}

static tdm_status st_open_files(tdm_st_file *f, char **paths, int n, tdm_error *err)
{
    f->files = tdm_xcalloc((size_t)n, sizeof(st_map));
    for (int i = 0; i < n; i++) {
        tdm_status rc = st_map_file(paths[i], &f->files[i], err);
        if (rc != TDM_OK)
            return rc;
        f->nfiles = i + 1;
        if ((rc = st_parse_header(f, i, err)) != TDM_OK)
            return rc;
    }
    return TDM_OK;
}

static char *st_read_text(const char *path, tdm_error *err)
{
    char *text = NULL;
    tdm_file_read(path, (size_t)64 << 20, &text, NULL, err);
    return text;
}

/* Opens the shards named by an index.json and checks the index against them. */
static tdm_status st_open_index(tdm_st_file *f, const char *index_path, tdm_error *err)
{
    char *text = st_read_text(index_path, err);
    if (!text)
        return err ? err->code : TDM_ERR_NOT_FOUND;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return tdm_error_set(err, TDM_ERR_DATA_LOSS, "%s: not JSON with a \"weight_map\" object",
                             index_path);
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", index_path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[1] = 0;
    else
        dir[0] = 0;
    int cap = cJSON_GetArraySize(wm), n = 0;
    char **paths = calloc((size_t)(cap ? cap : 1), sizeof(char *));
    tdm_status rc = TDM_OK;
    for (const cJSON *e = wm->child; e && rc == TDM_OK; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || e->valuestring[0] == 0) {
            rc = tdm_error_set(err, TDM_ERR_DATA_LOSS,
                               "%s: weight_map entry '%s' is not a plain file name", index_path,
                               e->string);
            break;
        }
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "%s%s", dir, e->valuestring);
        int seen = 0;
        for (int i = 0; i < n; i++)
            if (strcmp(paths[i], p) == 0)
                seen = 1;
        if (!seen)
            paths[n++] = strdup(p);
    }
    if (rc == TDM_OK)
        rc = st_open_files(f, paths, n, err);
    if (rc == TDM_OK)
        rc = st_build_index(f, err);
    /* Every tensor the index names must be in the file it names. */
    for (const cJSON *e = wm->child; e && rc == TDM_OK; e = e->next) {
        const tdm_st_tensor *t = tdm_st_find(f, e->string);
        const char *fp = t ? f->files[t->file_index].path : NULL;
        const char *base = fp ? strrchr(fp, '/') : NULL;
        base = base ? base + 1 : fp;
        if (!t || strcmp(base, e->valuestring) != 0)
            rc = tdm_error_set(err, TDM_ERR_DATA_LOSS,
                               "%s: index puts tensor '%s' in %s, but that file has no such tensor",
                               index_path, e->string, e->valuestring);
    }
    for (int i = 0; i < n; i++)
        free(paths[i]);
    free(paths);
    cJSON_Delete(root);
    return rc;
}

static int st_is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int st_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static int st_ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

tdm_status tdm_st_open(const char *path, tdm_st_file **out, tdm_error *err)
{
    *out = NULL;
    tdm_st_file *f = tdm_xcalloc(1, sizeof(*f));
    tdm_status rc;
    char p[PATH_MAX];
    if (st_is_dir(path)) {
        snprintf(p, sizeof(p), "%s/model.safetensors", path);
        if (!st_exists(p)) {
            snprintf(p, sizeof(p), "%s/model.safetensors.index.json", path);
            if (!st_exists(p)) {
                tdm_st_close(f);
                return tdm_error_set(err, TDM_ERR_NOT_FOUND,
                                     "%s: neither model.safetensors nor "
                                     "model.safetensors.index.json found",
                                     path);
            }
        }
    } else {
        snprintf(p, sizeof(p), "%s", path);
    }
    if (st_ends_with(p, ".json")) {
        rc = st_open_index(f, p, err);
    } else {
        char *one = p;
        rc = st_open_files(f, &one, 1, err);
        if (rc == TDM_OK)
            rc = st_build_index(f, err);
    }
    if (rc != TDM_OK) {
        tdm_st_close(f);
        return rc;
    }
    *out = f;
    return TDM_OK;
}

tdm_status tdm_st_open_memory(const void *data, size_t size, const char *origin, tdm_st_file **out,
                              tdm_error *err)
{
    *out = NULL;
    tdm_st_file *f = tdm_xcalloc(1, sizeof(*f));
    f->files = tdm_xcalloc(1, sizeof(st_map));
    f->files[0].base = (void *)data;
    f->files[0].size = size;
    f->files[0].path = tdm_xstrdup(origin);
    f->nfiles = 1;
    tdm_status rc = st_parse_header(f, 0, err);
    if (rc == TDM_OK)
        rc = st_build_index(f, err);
    if (rc != TDM_OK) {
        tdm_st_close(f);
        return rc;
    }
    *out = f;
    return TDM_OK;
}

void tdm_st_close(tdm_st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->ntensors; i++)
        free((char *)f->tensors[i].name);
    free(f->tensors);
    free(f->by_name);
    for (int i = 0; i < f->nfiles; i++) {
        if (f->files[i].mapped)
            munmap(f->files[i].base, f->files[i].size);
        free(f->files[i].path);
    }
    free(f->files);
    free(f);
}

size_t tdm_st_count(const tdm_st_file *f)
{
    return f->ntensors;
}

const tdm_st_tensor *tdm_st_at(const tdm_st_file *f, size_t i)
{
    return i < f->ntensors ? &f->tensors[i] : NULL;
}

const tdm_st_tensor *tdm_st_find(const tdm_st_file *f, const char *name)
{
    if (!f->by_name)
        return NULL;
    size_t lo = 0, hi = f->ntensors;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0)
            return f->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *tdm_st_file_path(const tdm_st_file *f, int index)
{
    return index >= 0 && index < f->nfiles ? f->files[index].path : "?";
}

size_t tdm_st_file_size(const tdm_st_file *f, int index)
{
    return index >= 0 && index < f->nfiles ? f->files[index].size : 0;
}

size_t tdm_st_file_unused_bytes(const tdm_st_file *f, int index)
{
    if (index < 0 || index >= f->nfiles)
        return 0;
    const st_map *m = &f->files[index];
    const unsigned char *p = m->base;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) /* checked when the file was opened */
        hlen = (hlen << 8) | p[i];
    size_t data_size = m->size - 8 - (size_t)hlen, used = 0;
    for (size_t i = 0; i < f->ntensors; i++)
        if (f->tensors[i].file_index == index)
            used += f->tensors[i].nbytes;
    return used < data_size ? data_size - used : 0;
}

int tdm_st_file_count(const tdm_st_file *f)
{
    return f->nfiles;
}
