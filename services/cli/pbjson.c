/*
 * pbjson.c - protobuf-c message to cJSON by reflection (see pbjson.h).
 */
#include "pbjson.h"

#include "tokenizer.h"

#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cJSON *bytes_json(const ProtobufCBinaryData *b)
{
    size_t out_len = 4 * ((b->len + 2) / 3) + 1;
    char *buf = malloc(out_len);
    if (!buf)
        return NULL;
    EVP_EncodeBlock((unsigned char *)buf, b->data, (int)b->len);
    cJSON *j = cJSON_CreateString(buf);
    free(buf);
    return j;
}

/* One value of a field at `p` (a pointer to the storage of one element). */
static cJSON *value_json(const ProtobufCFieldDescriptor *f, const void *p, int depth)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        return cJSON_CreateNumber(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return cJSON_CreateNumber(*(const uint32_t *)p);
    /* As protobuf's JSON mapping writes them: decimal strings, since a JSON
     * number (a double) cannot hold every 64-bit value. */
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64: {
        char buf[24];
        snprintf(buf, sizeof(buf), "%lld", (long long)*(const int64_t *)p);
        return cJSON_CreateString(buf);
    }
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: {
        char buf[24];
        snprintf(buf, sizeof(buf), "%llu", (unsigned long long)*(const uint64_t *)p);
        return cJSON_CreateString(buf);
    }
    case PROTOBUF_C_TYPE_FLOAT:
        return cJSON_CreateNumber(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE:
        return cJSON_CreateNumber(*(const double *)p);
    case PROTOBUF_C_TYPE_BOOL:
        return cJSON_CreateBool(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *)p;
        const ProtobufCEnumValue *ev =
            protobuf_c_enum_descriptor_get_value((const ProtobufCEnumDescriptor *)f->descriptor, v);
        return ev ? cJSON_CreateString(ev->name) : cJSON_CreateNumber(v);
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        s = s ? s : "";
        /* A peer may send any bytes; JSON text is UTF-8. */
        if (tdm_tok_check_utf8(s, strlen(s), NULL) == TDM_OK)
            return cJSON_CreateString(s);
        char *fixed = NULL;
        if (tdm_tok_utf8_lossy(s, strlen(s), &fixed, NULL) != TDM_OK)
            return NULL;
        cJSON *j = cJSON_CreateString(fixed);
        free(fixed);
        return j;
    }
    case PROTOBUF_C_TYPE_BYTES:
        return bytes_json((const ProtobufCBinaryData *)p);
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(ProtobufCMessage *const *)p;
        if (!m)
            return cJSON_CreateNull();
        /* Protos here are not recursive (DESIGN.md section 9); the bound is
         * a guard, not a limit anyone reaches. */
        if (depth > 32)
            return cJSON_CreateNull();
        cJSON *o = cJSON_CreateObject();
        const ProtobufCMessageDescriptor *d = m->descriptor;
        for (unsigned i = 0; o && i < d->n_fields; i++) {
            const ProtobufCFieldDescriptor *fi = &d->fields[i];
            const char *base = (const char *)m;
            if (fi->label == PROTOBUF_C_LABEL_REPEATED) {
                size_t n = *(const size_t *)(base + fi->quantifier_offset);
                const char *arr = *(char *const *)(base + fi->offset);
                size_t elem = 0;
                switch (fi->type) {
                case PROTOBUF_C_TYPE_INT64:
                case PROTOBUF_C_TYPE_SINT64:
                case PROTOBUF_C_TYPE_SFIXED64:
                case PROTOBUF_C_TYPE_UINT64:
                case PROTOBUF_C_TYPE_FIXED64:
                    elem = 8;
                    break;
                case PROTOBUF_C_TYPE_DOUBLE:
                    elem = sizeof(double);
                    break;
                case PROTOBUF_C_TYPE_BOOL:
                    elem = sizeof(protobuf_c_boolean);
                    break;
                case PROTOBUF_C_TYPE_STRING:
                case PROTOBUF_C_TYPE_MESSAGE:
                    elem = sizeof(void *);
                    break;
                case PROTOBUF_C_TYPE_BYTES:
                    elem = sizeof(ProtobufCBinaryData);
                    break;
                default:
                    elem = 4;
                    break;
                }
                cJSON *a = cJSON_AddArrayToObject(o, fi->name);
                for (size_t k = 0; a && k < n; k++)
                    cJSON_AddItemToArray(a, value_json(fi, arr + k * elem, depth + 1));
                continue;
            }
            if (fi->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
                uint32_t which = *(const uint32_t *)(base + fi->quantifier_offset);
                if (which != fi->id)
                    continue;
            }
            cJSON_AddItemToObject(o, fi->name, value_json(fi, base + fi->offset, depth + 1));
        }
        return o;
    }
    }
    return cJSON_CreateNull();
}

cJSON *tdm_pbjson_from_message(const ProtobufCMessage *msg)
{
    ProtobufCFieldDescriptor f;
    memset(&f, 0, sizeof(f));
    f.type = PROTOBUF_C_TYPE_MESSAGE;
    return value_json(&f, &msg, 0);
}
