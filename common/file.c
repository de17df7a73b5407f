#include "file.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

tdm_status tdm_file_read(const char *path, size_t max, char **out, size_t *len, tdm_error *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return tdm_error_set(err, errno == EACCES ? TDM_ERR_PERMISSION_DENIED : TDM_ERR_NOT_FOUND,
                             "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max) {
        fclose(f);
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: %lld bytes is larger than %zu",
                             path, (long long)st.st_size, max);
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        fclose(f);
        return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    }
    size_t got = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    if (got != (size_t)st.st_size) {
        free(buf);
        return tdm_error_set(err, TDM_ERR_DATA_LOSS, "%s: short read", path);
    }
    buf[got] = '\0';
    *out = buf;
    if (len)
        *len = got;
    return TDM_OK;
}
