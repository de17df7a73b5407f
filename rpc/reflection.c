/*
 * reflection.c - gRPC server reflection over the descriptor set embedded at
 * build time (see reflection.h).
 *
 * The descriptor set is walked with a minimal protobuf wire reader rather
 * than by compiling descriptor.proto: a FileDescriptorSet is `repeated
 * FileDescriptorProto file = 1`, and only names, packages, dependencies and
 * the names of messages, enums, services and methods are needed.
 */
#include "reflection.h"
#include "alloc.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/reflection/v1/reflection.pb-c.h"
#include "log.h"
#include "rpc_internal.h"

#ifndef TANDEM_PROTO_DESC_FILE
#error "TANDEM_PROTO_DESC_FILE must name the descriptor set (rpc/CMakeLists.txt)"
#endif

/* The descriptor set, linked in verbatim. */
__asm__(".pushsection .rodata.tandem_proto_desc, \"a\"\n"
        ".balign 16\n"
        "tdm_reflection__desc_begin:\n"
        ".incbin \"" TANDEM_PROTO_DESC_FILE "\"\n"
        "tdm_reflection__desc_end:\n"
        ".byte 0\n"
        ".popsection\n");
extern const unsigned char tdm_reflection__desc_begin[];
extern const unsigned char tdm_reflection__desc_end[];

const unsigned char *tdm_reflection_descriptor_set(size_t *len)
{
    *len = (size_t)(tdm_reflection__desc_end - tdm_reflection__desc_begin);
    return tdm_reflection__desc_begin;
}

/* ---- a minimal protobuf wire reader ------------------------------------------------ */

typedef struct wire {
    const uint8_t *p, *end;
} wire;

typedef struct wire_field {
    uint32_t number;
    int type;            /* 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
    const uint8_t *data; /* type 2 */
    size_t len;
} wire_field;

static bool read_varint(wire *w, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64 && w->p < w->end; shift += 7) {
        uint8_t b = *w->p++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

/* Next field; false at the end or on malformed input (*bad set). */
static bool next_field(wire *w, wire_field *f, bool *bad)
{
    if (w->p >= w->end)
        return false;
    uint64_t key, v;
    if (!read_varint(w, &key) || (key >> 3) == 0 || (key >> 3) > UINT32_MAX) {
        *bad = true;
        return false;
    }
    f->number = (uint32_t)(key >> 3);
    f->type = (int)(key & 7);
    f->data = NULL;
    f->len = 0;
    switch (f->type) {
    case 0:
        if (!read_varint(w, &v))
            break;
        return true;
    case 1:
        if (w->end - w->p < 8)
            break;
        w->p += 8;
        return true;
    case 5:
        if (w->end - w->p < 4)
            break;
        w->p += 4;
        return true;
    case 2:
        if (!read_varint(w, &v) || v > (uint64_t)(w->end - w->p))
            break;
        f->data = w->p;
        f->len = (size_t)v;
        w->p += v;
        return true;
    default:
        break;
    }
    *bad = true;
    return false;
}

/* ---- the index ---------------------------------------------------------------------------- */

typedef struct refl_file {
    char *name;
    const uint8_t *data; /* FileDescriptorProto bytes (len) */
    size_t len;
    char **deps; /* (n_deps) */
    size_t n_deps;
} refl_file;

typedef struct refl_symbol {
    char *name; /* fully qualified, no leading dot */
    size_t file;
} refl_symbol;

/* Built once, kept for the life of the process. */
static struct {
    refl_file *files;
    size_t n_files;
    refl_symbol *syms;
    size_t n_syms, cap_syms;
    bool bad;
} idx;
static pthread_once_t idx_once = PTHREAD_ONCE_INIT;

static char *strndup_checked(const uint8_t *p, size_t n)
{
    char *s = tdm_xmalloc(n + 1);
    memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

static char *join(const char *prefix, const uint8_t *name, size_t n)
{
    size_t pl = strlen(prefix);
    char *s = tdm_xmalloc(pl + 1 + n + 1);
    size_t at = 0;
    if (pl) {
        memcpy(s, prefix, pl);
        s[pl] = '.';
        at = pl + 1;
    }
    memcpy(s + at, name, n);
    s[at + n] = '\0';
    return s;
}

static void add_symbol(char *name, size_t file)
{
    if (idx.n_syms == idx.cap_syms) {
        idx.cap_syms = idx.cap_syms ? idx.cap_syms * 2 : 256;
        idx.syms = tdm_xrealloc(idx.syms, idx.cap_syms * sizeof(*idx.syms));
    }
    idx.syms[idx.n_syms++] = (refl_symbol){name, file};
}

/* The name (field 1) of a DescriptorProto / EnumDescriptorProto / ... */
static bool message_name(const uint8_t *p, size_t n, const uint8_t **name, size_t *len)
{
    wire w = {p, p + n};
    wire_field f;
    bool bad = false;
    while (next_field(&w, &f, &bad))
        if (f.number == 1 && f.type == 2) {
            *name = f.data;
            *len = f.len;
            return true;
        }
    return false;
}

/* DescriptorProto: nested_type = 3, enum_type = 4. */
static void index_message(const char *prefix, const uint8_t *p, size_t n, size_t file)
{
    const uint8_t *nm;
    size_t nl;
    if (!message_name(p, n, &nm, &nl))
        return;
    char *full = join(prefix, nm, nl);
    add_symbol(full, file);
    wire w = {p, p + n};
    wire_field f;
    bool bad = false;
    while (next_field(&w, &f, &bad)) {
        if (f.type != 2)
            continue;
        if (f.number == 3) {
            index_message(full, f.data, f.len, file);
        } else if (f.number == 4 && message_name(f.data, f.len, &nm, &nl)) {
            add_symbol(join(full, nm, nl), file);
        }
    }
}

/* ServiceDescriptorProto: method = 2 (MethodDescriptorProto, name = 1). */
static void index_service(const char *prefix, const uint8_t *p, size_t n, size_t file)
{
    const uint8_t *nm;
    size_t nl;
    if (!message_name(p, n, &nm, &nl))
        return;
    char *full = join(prefix, nm, nl);
    add_symbol(full, file);
    wire w = {p, p + n};
    wire_field f;
    bool bad = false;
    while (next_field(&w, &f, &bad))
        if (f.number == 2 && f.type == 2 && message_name(f.data, f.len, &nm, &nl))
            add_symbol(join(full, nm, nl), file);
}

/* FileDescriptorProto: name = 1, package = 2, dependency = 3,
 * message_type = 4, enum_type = 5, service = 6. */
static void index_file(const uint8_t *p, size_t n)
{
    size_t fi = idx.n_files;
    idx.files = tdm_xrealloc(idx.files, (fi + 1) * sizeof(*idx.files));
    refl_file *rf = &idx.files[fi];
    memset(rf, 0, sizeof(*rf));
    rf->data = p;
    rf->len = n;
    char *package = NULL;
    wire w = {p, p + n};
    wire_field f;
    bool bad = false;
    while (next_field(&w, &f, &bad)) {
        if (f.type != 2)
            continue;
        if (f.number == 1) {
            free(rf->name);
            rf->name = strndup_checked(f.data, f.len);
        } else if (f.number == 2) {
            free(package);
            package = strndup_checked(f.data, f.len);
        } else if (f.number == 3) {
            rf->deps = tdm_xrealloc(rf->deps, (rf->n_deps + 1) * sizeof(*rf->deps));
            rf->deps[rf->n_deps++] = strndup_checked(f.data, f.len);
        }
    }
    if (bad || !rf->name) {
        idx.bad = true;
        free(package);
        return;
    }
    idx.n_files++;
    const char *pkg = package ? package : "";
    w = (wire){p, p + n};
    while (next_field(&w, &f, &bad)) {
        const uint8_t *nm;
        size_t nl;
        if (f.type != 2)
            continue;
        if (f.number == 4)
            index_message(pkg, f.data, f.len, fi);
        else if (f.number == 5 && message_name(f.data, f.len, &nm, &nl))
            add_symbol(join(pkg, nm, nl), fi);
        else if (f.number == 6)
            index_service(pkg, f.data, f.len, fi);
    }
    free(package);
}

static void index_build(void)
{
    size_t len;
    const unsigned char *set = tdm_reflection_descriptor_set(&len);
    wire w = {set, set + len};
    wire_field f;
    bool bad = false;
    while (next_field(&w, &f, &bad))
        if (f.number == 1 && f.type == 2)
            index_file(f.data, f.len);
    if (bad || idx.bad)
        tdm_log_error("reflection", "embedded descriptor set is malformed; reflection is partial");
}

static long find_file(const char *name)
{
    for (size_t i = 0; i < idx.n_files; i++)
        if (strcmp(idx.files[i].name, name) == 0)
            return (long)i;
    return -1;
}

static long find_symbol(const char *name)
{
    if (name[0] == '.')
        name++;
    for (size_t i = 0; i < idx.n_syms; i++)
        if (strcmp(idx.syms[i].name, name) == 0)
            return (long)idx.syms[i].file;
    return -1;
}

/* ---- the service ---------------------------------------------------------------------------- */

typedef Grpc__Reflection__V1__ServerReflectionRequest refl_req;
typedef Grpc__Reflection__V1__ServerReflectionResponse refl_resp;

/* Fills a FileDescriptorResponse with file `first` and its transitive
 * dependencies (each once, the requested file first). */
static void answer_files(refl_resp *resp, Grpc__Reflection__V1__FileDescriptorResponse *fdr,
                         size_t first, size_t *order /* (n_files) scratch */)
{
    bool *seen = tdm_xcalloc(idx.n_files, sizeof(*seen));
    size_t n = 0;
    order[n++] = first;
    seen[first] = true;
    for (size_t k = 0; k < n; k++) {
        const refl_file *rf = &idx.files[order[k]];
        for (size_t d = 0; d < rf->n_deps; d++) {
            long j = find_file(rf->deps[d]);
            if (j >= 0 && !seen[j]) {
                seen[j] = true;
                order[n++] = (size_t)j;
            }
        }
    }
    free(seen);
    fdr->n_file_descriptor_proto = n;
    fdr->file_descriptor_proto = tdm_xcalloc(n, sizeof(*fdr->file_descriptor_proto));
    for (size_t k = 0; k < n; k++) {
        fdr->file_descriptor_proto[k].data = (uint8_t *)idx.files[order[k]].data;
        fdr->file_descriptor_proto[k].len = idx.files[order[k]].len;
    }
    resp->message_response_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
    resp->file_descriptor_response = fdr;
}

static tdm_status answer(tdm_rpc_call *call, const tdm_rpc_server *server, refl_req *r,
                         tdm_error *err)
{
    refl_resp resp = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
    resp.valid_host = r->host;
    resp.original_request = r;
    Grpc__Reflection__V1__FileDescriptorResponse fdr =
        GRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
    Grpc__Reflection__V1__ListServiceResponse lsr = GRPC__REFLECTION__V1__LIST_SERVICE_RESPONSE__INIT;
    Grpc__Reflection__V1__ExtensionNumberResponse enr =
        GRPC__REFLECTION__V1__EXTENSION_NUMBER_RESPONSE__INIT;
    Grpc__Reflection__V1__ErrorResponse er = GRPC__REFLECTION__V1__ERROR_RESPONSE__INIT;
    Grpc__Reflection__V1__ServiceResponse *svcs = NULL;
    Grpc__Reflection__V1__ServiceResponse **svc_ptrs = NULL;
    char **svc_names = NULL;
    size_t n_svcs = 0;
    size_t *order = tdm_xcalloc(idx.n_files + 1, sizeof(*order));
    char msg[512];
    long fi;

    switch (r->message_request_case) {
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES: {
        /* Service names of the registered methods, each once. */
        size_t cap = 0;
        for (size_t i = 0; tdm_rpc__server_method(server, i); i++)
            cap++;
        svc_names = tdm_xcalloc(cap + 1, sizeof(*svc_names));
        for (size_t i = 0; i < cap; i++) {
            const char *path = tdm_rpc__server_method(server, i);
            const char *slash = strchr(path + 1, '/');
            size_t len = (size_t)(slash - (path + 1));
            bool dup = false;
            for (size_t k = 0; k < n_svcs && !dup; k++)
                dup = strlen(svc_names[k]) == len && strncmp(svc_names[k], path + 1, len) == 0;
            if (!dup)
                svc_names[n_svcs++] = strndup_checked((const uint8_t *)path + 1, len);
        }
        svcs = tdm_xcalloc(n_svcs + 1, sizeof(*svcs));
        svc_ptrs = tdm_xcalloc(n_svcs + 1, sizeof(*svc_ptrs));
        for (size_t k = 0; k < n_svcs; k++) {
            grpc__reflection__v1__service_response__init(&svcs[k]);
            svcs[k].name = svc_names[k];
            svc_ptrs[k] = &svcs[k];
        }
        lsr.n_service = n_svcs;
        lsr.service = svc_ptrs;
        resp.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
        resp.list_services_response = &lsr;
        break;
    }
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
        fi = find_file(r->file_by_filename);
        if (fi >= 0) {
            answer_files(&resp, &fdr, (size_t)fi, order);
            break;
        }
        snprintf(msg, sizeof(msg), "file not found: %s", r->file_by_filename);
        goto not_found;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
        fi = find_symbol(r->file_containing_symbol);
        if (fi >= 0) {
            answer_files(&resp, &fdr, (size_t)fi, order);
            break;
        }
        snprintf(msg, sizeof(msg), "symbol not found: %s", r->file_containing_symbol);
        goto not_found;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
        if (find_symbol(r->all_extension_numbers_of_type) >= 0) {
            enr.base_type_name = r->all_extension_numbers_of_type;
            resp.message_response_case =
                GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ALL_EXTENSION_NUMBERS_RESPONSE;
            resp.all_extension_numbers_response = &enr;
            break;
        }
        snprintf(msg, sizeof(msg), "type not found: %s", r->all_extension_numbers_of_type);
        goto not_found;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
        snprintf(msg, sizeof(msg), "extension not found: %s(%d) (tandem defines no extensions)",
                 r->file_containing_extension && r->file_containing_extension->containing_type
                     ? r->file_containing_extension->containing_type
                     : "",
                 r->file_containing_extension ? r->file_containing_extension->extension_number
                                              : 0);
        goto not_found;
    default:
        er.error_code = TDM_ERR_INVALID_ARGUMENT;
        er.error_message = "reflection request names no query";
        resp.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
        resp.error_response = &er;
        break;
    not_found:
        er.error_code = TDM_ERR_NOT_FOUND;
        er.error_message = msg;
        resp.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
        resp.error_response = &er;
        break;
    }
    tdm_status st = tdm_rpc_call_write(call, &resp.base, err);
    free(fdr.file_descriptor_proto);
    for (size_t k = 0; k < n_svcs; k++)
        free(svc_names[k]);
    free(svc_names);
    free(svcs);
    free(svc_ptrs);
    free(order);
    return st;
}

static tdm_status reflection_info(tdm_rpc_call *call, tdm_error *err, void *user)
{
    const tdm_rpc_server *server = user;
    pthread_once(&idx_once, index_build);
    for (;;) {
        ProtobufCMessage *m = NULL;
        tdm_status st = tdm_rpc_call_read(call, &m, err);
        if (st != TDM_OK)
            return st;
        if (!m)
            return TDM_OK; /* the client is done */
        st = answer(call, server, (refl_req *)m, err);
        protobuf_c_message_free_unpacked(m, NULL);
        if (st != TDM_OK)
            return st;
    }
}

tdm_status tdm_reflection_register(tdm_rpc_server *server, tdm_error *err)
{
    /* v1alpha has the same messages, field for field: one decoder serves
     * both paths. */
    static const char *const paths[] = {
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    };
    for (size_t i = 0; i < TDM_ARRAY_LEN(paths); i++) {
        tdm_status st = tdm_rpc_server_add_bidi(
            server, paths[i], &grpc__reflection__v1__server_reflection_request__descriptor,
            reflection_info, server, err);
        if (st != TDM_OK)
            return st;
    }
    return TDM_OK;
}
