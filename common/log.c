#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int g_level = TDM_LOG_INFO;

void tdm_log_set_level(tdm_log_level level)
{
    atomic_store(&g_level, (int)level);
}

tdm_log_level tdm_log_get_level(void)
{
    return (tdm_log_level)atomic_load(&g_level);
}

int tdm_log_parse_level(const char *s)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++)
        if (s && strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

void tdm_log(tdm_log_level level, const char *component, const char *fmt, ...)
{
    if ((int)level < atomic_load(&g_level))
        return;
    static const char *const tags[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    char line[4096];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, tags[level & 3], component);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(line))
        n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(line) - 1)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
