/* alloc.c - see alloc.h. */
#include "alloc.h"

#include <sys/sysinfo.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Noreturn void die(size_t n, const char *file, int line)
{
    fprintf(stderr, "tandem: out of host memory allocating %zu bytes at %s:%d\n", n, file, line);
    abort();
}

void *tdm__xmalloc(size_t n, const char *file, int line)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die(n, file, line);
    return p;
}

void *tdm__xcalloc(size_t n, size_t size, const char *file, int line)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        die(n * size, file, line);
    return p;
}

void *tdm__xrealloc(void *p, size_t n, const char *file, int line)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        die(n, file, line);
    return q;
}

char *tdm__xstrdup(const char *s, const char *file, int line)
{
    size_t n = strlen(s ? s : "") + 1;
    char *d = tdm__xmalloc(n, file, line);
    memcpy(d, s ? s : "", n);
    return d;
}

char *tdm__xstrndup(const char *s, size_t n, const char *file, int line)
{
    size_t len = s ? strnlen(s, n) : 0;
    char *d = tdm__xmalloc(len + 1, file, line);
    if (len)
        memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

tdm_status tdm_error_oom(tdm_error *err, size_t bytes, const char *what_fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, what_fmt);
    vsnprintf(what, sizeof(what), what_fmt, ap);
    va_end(ap);
    return tdm_error_set(err, TDM_ERR_RESOURCE_EXHAUSTED, "out of memory for %s (%zu bytes)", what,
                         bytes);
}

int tdm_host_memory(size_t *available, size_t *total, const char **source)
{
    *available = 0;
    *total = 0;
    if (source)
        *source = "MemAvailable in /proc/meminfo";
    FILE *f = fopen("/proc/meminfo", "r");
    int found = 0;
    if (f) {
        char line[256];
        while (fgets(line, sizeof(line), f)) {
            unsigned long long kib = 0;
            if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
                *available = (size_t)kib * 1024;
                found |= 1;
            } else if (sscanf(line, "MemTotal: %llu kB", &kib) == 1) {
                *total = (size_t)kib * 1024;
                found |= 2;
            }
        }
        fclose(f);
    }
    if (found == 3)
        return 0;
    /* No /proc (a bare chroot, some sandboxes): the kernel's own count of
     * free and buffer memory, which leaves out the page cache it could give
     * back, so it errs low. */
    struct sysinfo si;
    if (sysinfo(&si) != 0 || si.totalram == 0) {
        *available = *total = 0;
        return -1;
    }
    *available = ((size_t)si.freeram + (size_t)si.bufferram) * (size_t)si.mem_unit;
    *total = (size_t)si.totalram * (size_t)si.mem_unit;
    if (source)
        *source = "free + buffer memory from sysinfo(2), /proc/meminfo being unreadable";
    return 0;
}
