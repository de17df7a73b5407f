/*
 * status.h - the one error convention of tandem.
 *
 * Functions that can fail on input from outside (a client, a file, a peer)
 * return a tdm_status and, when given one, fill a tdm_error whose message
 * names what was wrong. Broken invariants abort() instead (TDM_ASSERT).
 * The codes mirror gRPC's so that the RPC layer maps them one to one.
 */
#ifndef TANDEM_COMMON_STATUS_H
#define TANDEM_COMMON_STATUS_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

typedef enum tdm_status {
    TDM_OK = 0,
    TDM_ERR_CANCELLED = 1,
    TDM_ERR_UNKNOWN = 2,
    TDM_ERR_INVALID_ARGUMENT = 3,
    TDM_ERR_DEADLINE_EXCEEDED = 4,
    TDM_ERR_NOT_FOUND = 5,
    TDM_ERR_ALREADY_EXISTS = 6,
    TDM_ERR_PERMISSION_DENIED = 7,
    TDM_ERR_RESOURCE_EXHAUSTED = 8,
    TDM_ERR_FAILED_PRECONDITION = 9,
    TDM_ERR_ABORTED = 10,
    TDM_ERR_OUT_OF_RANGE = 11,
    TDM_ERR_UNIMPLEMENTED = 12,
    TDM_ERR_INTERNAL = 13,
    TDM_ERR_UNAVAILABLE = 14,
    TDM_ERR_DATA_LOSS = 15,
    TDM_ERR_UNAUTHENTICATED = 16,
} tdm_status;

#define TDM_ERROR_MSG_MAX 1024

typedef struct tdm_error {
    tdm_status code;
    char msg[TDM_ERROR_MSG_MAX];
} tdm_error;

/* Sets *err (when err is not NULL) and returns code, so callers can write
 * `return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "...", ...);`. */
tdm_status tdm_error_set(tdm_error *err, tdm_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "context: " to an error's message, keeping its code. */
tdm_status tdm_error_prefix(tdm_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void tdm_error_clear(tdm_error *err);

/* "INVALID_ARGUMENT", ... (the gRPC spelling). */
const char *tdm_status_name(tdm_status code);

#define TDM_ASSERT(cond)                                                                          \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "tandem: assertion failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);  \
            abort();                                                                              \
        }                                                                                         \
    } while (0)

#define TDM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
