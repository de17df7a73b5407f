/*
 * alloc.h - host memory, one policy.
 *
 * Small internal allocations (a struct, a name, scratch sized by the model or
 * the configuration, a message being built) go through tdm_xmalloc and its
 * kin: they never return NULL. When the heap is exhausted they print the size
 * and the call site and abort, since a process that cannot allocate a few
 * bytes cannot go on serving correctly either.
 *
 * Allocations whose size comes from input (a prompt's tokens, a request's
 * output, KV cache growth, a file or a message a peer sent) use plain
 * malloc/realloc and turn failure into TDM_ERR_RESOURCE_EXHAUSTED naming what
 * could not be held (tdm_error_oom), so one huge request fails alone and the
 * others go on. Device memory follows the second rule.
 */
#ifndef TANDEM_COMMON_ALLOC_H
#define TANDEM_COMMON_ALLOC_H

#include "status.h"

#include <stddef.h>

#define tdm_xmalloc(n) tdm__xmalloc((n), __FILE__, __LINE__)
#define tdm_xcalloc(n, size) tdm__xcalloc((n), (size), __FILE__, __LINE__)
#define tdm_xrealloc(p, n) tdm__xrealloc((p), (n), __FILE__, __LINE__)
#define tdm_xstrdup(s) tdm__xstrdup((s), __FILE__, __LINE__)
#define tdm_xstrndup(s, n) tdm__xstrndup((s), (n), __FILE__, __LINE__)

void *tdm__xmalloc(size_t n, const char *file, int line);
void *tdm__xcalloc(size_t n, size_t size, const char *file, int line);
void *tdm__xrealloc(void *p, size_t n, const char *file, int line);
char *tdm__xstrdup(const char *s, const char *file, int line);
char *tdm__xstrndup(const char *s, size_t n, const char *file, int line);

/* RESOURCE_EXHAUSTED: "out of memory for WHAT (N bytes)". */
tdm_status tdm_error_oom(tdm_error *err, size_t bytes, const char *what_fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The host's memory as the kernel reports it (/proc/meminfo): MemAvailable
 * (what can be allocated without swapping) and MemTotal, in bytes; without a
 * readable /proc/meminfo, free + buffer memory and the total from
 * sysinfo(2). *source (when source is not NULL) says which. Returns 0, or -1
 * when neither can be read (both then 0). */
int tdm_host_memory(size_t *available, size_t *total, const char **source);

#endif
