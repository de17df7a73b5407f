#include "status.h"

#include <string.h>

tdm_status tdm_error_set(tdm_error *err, tdm_status code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return code;
}

tdm_status tdm_error_prefix(tdm_error *err, const char *fmt, ...)
{
    if (!err)
        return TDM_ERR_UNKNOWN;
    char old[TDM_ERROR_MSG_MAX];
    memcpy(old, err->msg, sizeof(old));
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(err->msg) - 2)
        return err->code;
    size_t used = (size_t)n;
    err->msg[used++] = ':';
    err->msg[used++] = ' ';
    size_t room = sizeof(err->msg) - used - 1;
    size_t len = strnlen(old, room);
    memcpy(err->msg + used, old, len);
    err->msg[used + len] = '\0';
    return err->code;
}

void tdm_error_clear(tdm_error *err)
{
    if (err) {
        err->code = TDM_OK;
        err->msg[0] = '\0';
    }
}

const char *tdm_status_name(tdm_status code)
{
    static const char *const names[] = {
        "OK",        "CANCELLED",          "UNKNOWN",        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED", "NOT_FOUND",  "ALREADY_EXISTS", "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
        "UNIMPLEMENTED", "INTERNAL",       "UNAVAILABLE",    "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if ((unsigned)code < TDM_ARRAY_LEN(names))
        return names[code];
    return "UNKNOWN";
}
