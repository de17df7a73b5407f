/*
 * log.h - process-wide logging to stderr.
 *
 * One line per event: "2026-11-30T08:00:00.123Z LEVEL component: message".
 * The level is set once at start (configuration key log_level) and read
 * without locks; lines are written with one write() so they do not interleave.
 */
#ifndef TANDEM_COMMON_LOG_H
#define TANDEM_COMMON_LOG_H

typedef enum tdm_log_level {
    TDM_LOG_DEBUG = 0,
    TDM_LOG_INFO = 1,
    TDM_LOG_WARN = 2,
    TDM_LOG_ERROR = 3,
} tdm_log_level;

void tdm_log_set_level(tdm_log_level level);
tdm_log_level tdm_log_get_level(void);
/* Parses "debug", "info", "warn", "error"; returns -1 for anything else. */
int tdm_log_parse_level(const char *s);

void tdm_log(tdm_log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define tdm_log_debug(comp, ...) tdm_log(TDM_LOG_DEBUG, comp, __VA_ARGS__)
#define tdm_log_info(comp, ...) tdm_log(TDM_LOG_INFO, comp, __VA_ARGS__)
#define tdm_log_warn(comp, ...) tdm_log(TDM_LOG_WARN, comp, __VA_ARGS__)
#define tdm_log_error(comp, ...) tdm_log(TDM_LOG_ERROR, comp, __VA_ARGS__)

#endif
