/*
 * rpc.c - helpers shared by the server and client halves of the gRPC layer:
 * file loading for TLS, protobuf-c <-> byte buffer conversion, channel
 * arguments, deadlines and the process-wide signal wait.
 */
#include <errno.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "rpc_internal.h"

#include "file.h"

tdm_status tdm_rpc__read_file(const char *what, const char *path, char **out, tdm_error *err)
{
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    tdm_error ferr = {0};
    if (tdm_file_read(path, (size_t)64 << 20, &buf, &len, &ferr) != TDM_OK)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "cannot read %s file '%s': %s", what,
                             path, ferr.msg);
    if (len == 0) {
        free(buf);
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s file '%s' is empty", what, path);
    }
    *out = buf;
    return TDM_OK;
}

grpc_byte_buffer *tdm_rpc__pack(const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

grpc_byte_buffer *tdm_rpc__pack_raw(const void *data, size_t len)
{
    grpc_slice s = grpc_slice_from_copied_buffer(data, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* Whether m and every message inside it hold no unknown field numbered 0
 * (see tdm_rpc_unpack). tandem's protos are not recursive; depth is a guard. */
static bool rpc__fields_valid(const ProtobufCMessage *m, int depth)
{
    if (depth > 64)
        return false;
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return false;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *arr = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t k = 0; k < n; k++)
                if (!rpc__fields_valid(arr[k], depth + 1))
                    return false;
            continue;
        }
        /* A oneof's storage holds whichever member is set. */
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(base + f->quantifier_offset) != f->id)
            continue;
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + f->offset);
        if (sub && !rpc__fields_valid(sub, depth + 1))
            return false;
    }
    return true;
}

/* A varint at p[0..n): the bytes it takes, 0 when there is none. */
static size_t rpc__varint(const uint8_t *p, size_t n, uint64_t *v)
{
    uint64_t r = 0;
    for (size_t i = 0; i < n && i < 10; i++) {
        r |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80)) {
            *v = r;
            return i + 1;
        }
    }
    return 0;
}

/* The first string field of the encoded `d` at p[0..n) (its submessages
 * included) whose bytes hold a NUL, or NULL; *owner gets its message type.
 * Runs on bytes protobuf-c accepted, so it only needs to find its way. */
static const ProtobufCFieldDescriptor *rpc__nul_string(const ProtobufCMessageDescriptor *d,
                                                       const uint8_t *p, size_t n, int depth,
                                                       const ProtobufCMessageDescriptor **owner)
{
    size_t i = 0;
    while (i < n) {
        uint64_t key = 0, v = 0;
        size_t k = rpc__varint(p + i, n - i, &key);
        if (k == 0)
            return NULL;
        i += k;
        switch (key & 7) {
        case 0:
            if ((k = rpc__varint(p + i, n - i, &v)) == 0)
                return NULL;
            i += k;
            break;
        case 1:
            if (n - i < 8)
                return NULL;
            i += 8;
            break;
        case 5:
            if (n - i < 4)
                return NULL;
            i += 4;
            break;
        case 2: {
            if ((k = rpc__varint(p + i, n - i, &v)) == 0 || v > n - i - k)
                return NULL;
            i += k;
            uint64_t num = key >> 3;
            const ProtobufCFieldDescriptor *f =
                num > 0 && num <= UINT32_MAX
                    ? protobuf_c_message_descriptor_get_field(d, (unsigned)num)
                    : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p + i, 0, (size_t)v)) {
                *owner = d;
                return f;
            }
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 64) {
                const ProtobufCFieldDescriptor *r =
                    rpc__nul_string(f->descriptor, p + i, (size_t)v, depth + 1, owner);
                if (r)
                    return r;
            }
            i += (size_t)v;
            break;
        }
        default:
            return NULL;
        }
    }
    return NULL;
}

ProtobufCMessage *tdm_rpc_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                                 size_t len, tdm_error *err)
{
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, data);
    if (!m) {
        tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "does not decode as %s", desc->name);
        return NULL;
    }
    if (!rpc__fields_valid(m, 0)) {
        protobuf_c_message_free_unpacked(m, NULL);
        tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                      "a %s holding field number 0 (spelt as a multi-byte varint) is malformed",
                      desc->name);
        return NULL;
    }
    const ProtobufCMessageDescriptor *owner = NULL;
    const ProtobufCFieldDescriptor *f = rpc__nul_string(desc, data, len, 0, &owner);
    if (f) {
        protobuf_c_message_free_unpacked(m, NULL);
        tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                      "field %s.%s holds a NUL character (U+0000), which tandem's strings cannot "
                      "carry",
                      owner->name, f->name);
        return NULL;
    }
    return m;
}

ProtobufCMessage *tdm_rpc__unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *buf,
                                  tdm_error *err)
{
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, buf)) {
        tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "cannot be read");
        return NULL;
    }
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    ProtobufCMessage *m = tdm_rpc_unpack(desc, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), err);
    grpc_slice_unref(s);
    return m;
}

void *tdm_rpc__buffer_bytes(grpc_byte_buffer *buf, size_t *len)
{
    grpc_byte_buffer_reader r;
    *len = 0;
    if (!grpc_byte_buffer_reader_init(&r, buf))
        return NULL;
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    size_t n = GRPC_SLICE_LENGTH(s);
    void *out = malloc(n ? n : 1);
    if (out)
        memcpy(out, GRPC_SLICE_START_PTR(s), n);
    grpc_slice_unref(s);
    *len = out ? n : 0;
    return out;
}

void tdm_rpc__size_args(grpc_arg *args, grpc_channel_args *out, int64_t max_bytes,
                        const char *name_override)
{
    if (max_bytes <= 0)
        max_bytes = TDM_RPC_DEFAULT_MAX_MESSAGE_BYTES;
    if (max_bytes > INT_MAX)
        max_bytes = INT_MAX;
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)max_bytes;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = (int)max_bytes;
    out->num_args = 2;
    if (name_override && name_override[0]) {
        args[2].type = GRPC_ARG_STRING;
        args[2].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[2].value.string = (char *)name_override;
        out->num_args = 3;
    }
    out->args = args;
}

gpr_timespec tdm_rpc__deadline(int64_t timeout_ms)
{
    if (timeout_ms <= 0)
        return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

gpr_timespec tdm_rpc__poll_once(void)
{
    return gpr_inf_past(GPR_CLOCK_MONOTONIC);
}

void tdm_rpc__init(void)
{
    /* Name resolution through getaddrinfo rather than c-ares: service
     * addresses are host:port pairs that the system resolver handles, and
     * Debian's c-ares path leaves allocations behind that LeakSanitizer
     * reports in every test. An operator's explicit setting wins. Read by
     * the core when it initialises, so set before grpc_init. */
    setenv("GRPC_DNS_RESOLVER", "native", 0);
    grpc_init();
}

/* ---- signals ----------------------------------------------------------------
 * The handler only posts a semaphore (async-signal-safe); the waiting thread
 * does the rest, so no gRPC function ever runs in signal context. */

static sem_t sig_sem;
static volatile sig_atomic_t sig_last;
static pthread_once_t sig_once = PTHREAD_ONCE_INIT;

static void sig_handler(int signo)
{
    sig_last = signo;
    sem_post(&sig_sem);
}

static void sig_install_once(void)
{
    sem_init(&sig_sem, 0, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = sig_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

void tdm_rpc_signals_install(void)
{
    pthread_once(&sig_once, sig_install_once);
}

int tdm_rpc_wait_for_signal(void)
{
    tdm_rpc_signals_install();
    while (sem_wait(&sig_sem) != 0 && errno == EINTR) {
    }
    return (int)sig_last;
}
