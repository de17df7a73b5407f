/*
 * feature_stream.c - the feature stream's requests, encoding and message split
 * (see feature_stream.h).
 */
#include "feature_stream.h"

#include "alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *tdm_feat_spec_name(const tdm_feat_spec *s, char *buf, size_t len)
{
    if (s->final_layer)
        snprintf(buf, len, "final layer %s the norm", s->normed ? "after" : "before");
    else
        snprintf(buf, len, "layer %u%s", s->layer, s->normed ? " after the final norm" : "");
    return buf;
}

const char *tdm_feat_request_str(const tdm_feat_request *r, char *buf, size_t len)
{
    if (r->n == 0) {
        snprintf(buf, len, "none");
        return buf;
    }
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < r->n && used < len; i++) {
        char one[64];
        int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "",
                         tdm_feat_spec_name(&r->specs[i], one, sizeof(one)));
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return buf;
}

const char *tdm_feat_dtype_name(Tandem__V1__FeatureDtype d)
{
    return d == TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32 ? "f32" : "bf16";
}

size_t tdm_feat_dtype_bytes(Tandem__V1__FeatureDtype d)
{
    return d == TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32 ? 4 : 2;
}

bool tdm_feat_spec_available(const tdm_feat_spec *s)
{
    return s->final_layer && s->normed;
}

int tdm_feat_available(tdm_feat_spec *out, int max)
{
    if (max < 1)
        return 0;
    out[0] = (tdm_feat_spec){.final_layer = true, .normed = true};
    return 1;
}

tdm_status tdm_feat_request_from_proto(const Tandem__V1__FeatureRequest *m, const char *what,
                                       tdm_feat_request *out, tdm_error *err)
{
    memset(out, 0, sizeof(*out));
    out->dtype = TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_BF16;
    if (!m)
        return TDM_OK;
    if (m->n_specs > TDM_FEAT_MAX_SPECS)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s.specs has %zu entries; at most %d hidden states may be asked for",
                             what, m->n_specs, TDM_FEAT_MAX_SPECS);
    if (m->dtype != TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_UNSPECIFIED &&
        m->dtype != TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_BF16 &&
        m->dtype != TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s.dtype %d is not a FeatureDtype (bf16 or f32)", what,
                             (int)m->dtype);
    if (m->dtype == TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32)
        out->dtype = m->dtype;
    for (size_t i = 0; i < m->n_specs; i++) {
        const Tandem__V1__FeatureSpec *s = m->specs[i];
        out->specs[i] = (tdm_feat_spec){.final_layer = s->final_layer,
                                        .layer = s->final_layer ? 0 : s->layer,
                                        .normed = s->normed};
    }
    out->n = (int)m->n_specs;
    return TDM_OK;
}

void tdm_feat_request_to_proto(const tdm_feat_request *r, Tandem__V1__FeatureRequest *m,
                               Tandem__V1__FeatureSpec *specs, Tandem__V1__FeatureSpec **ptrs)
{
    tandem__v1__feature_request__init(m);
    for (int i = 0; i < r->n; i++) {
        tandem__v1__feature_spec__init(&specs[i]);
        specs[i].final_layer = r->specs[i].final_layer;
        specs[i].layer = r->specs[i].layer;
        specs[i].normed = r->specs[i].normed;
        ptrs[i] = &specs[i];
    }
    m->n_specs = (size_t)r->n;
    m->specs = ptrs;
    m->dtype = r->dtype;
}

int tdm_feat_request_missing(const tdm_feat_request *r)
{
    for (int i = 0; i < r->n; i++)
        if (!tdm_feat_spec_available(&r->specs[i]))
            return i;
    return -1;
}

uint16_t tdm_feat_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
        return (uint16_t)((u >> 16) | 0x0040u); /* a NaN stays a (quiet) NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float tdm_feat_from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* ---- verifier: rows waiting to be sent ------------------------------------ */

void tdm_feat_out_init(tdm_feat_out *b, int width, Tandem__V1__FeatureDtype dtype, int position)
{
    memset(b, 0, sizeof(*b));
    b->width = width;
    b->dtype = dtype == TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32
                   ? dtype
                   : TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_BF16;
    b->position = position;
}

void tdm_feat_out_free(tdm_feat_out *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

void tdm_feat_out_append(tdm_feat_out *b, const float *rows, int n)
{
    if (n <= 0)
        return;
    const size_t row = (size_t)b->width * tdm_feat_dtype_bytes(b->dtype);
    if (b->rows + n > b->cap) {
        int cap = b->cap ? b->cap : 16;
        while (cap < b->rows + n)
            cap *= 2;
        b->data = tdm_xrealloc(b->data, (size_t)cap * row);
        b->cap = cap;
    }
    uint8_t *dst = b->data + (size_t)b->rows * row;
    const size_t nv = (size_t)n * (size_t)b->width;
    if (b->dtype == TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32) {
        memcpy(dst, rows, nv * sizeof(float)); /* little-endian hosts only (as the engine) */
    } else {
        for (size_t i = 0; i < nv; i++) {
            const uint16_t h = tdm_feat_bf16(rows[i]);
            dst[2 * i] = (uint8_t)(h & 0xff);
            dst[2 * i + 1] = (uint8_t)(h >> 8);
        }
    }
    b->rows += n;
}

size_t tdm_feat_out_messages(const tdm_feat_out *b, size_t max_bytes, Tandem__V1__Features *out,
                             size_t max_out)
{
    if (b->rows == 0)
        return 0;
    const size_t row = (size_t)b->width * tdm_feat_dtype_bytes(b->dtype);
    size_t per = row > 0 ? max_bytes / row : (size_t)b->rows;
    if (per < 1)
        per = 1;
    const size_t need = ((size_t)b->rows + per - 1) / per;
    for (size_t i = 0; i < need && i < max_out; i++) {
        const size_t r0 = i * per;
        const size_t nr = (size_t)b->rows - r0 < per ? (size_t)b->rows - r0 : per;
        tandem__v1__features__init(&out[i]);
        out[i].position = (uint32_t)(b->position + (int)r0);
        out[i].rows = (uint32_t)nr;
        out[i].width = (uint32_t)b->width;
        out[i].dtype = b->dtype;
        out[i].data.len = nr * row;
        out[i].data.data = b->data + r0 * row;
    }
    return need;
}

void tdm_feat_out_sent(tdm_feat_out *b)
{
    b->position += b->rows;
    b->rows = 0;
}

void tdm_feat_out_take(tdm_feat_out *dst, tdm_feat_out *src)
{
    TDM_ASSERT(dst->width == src->width && dst->dtype == src->dtype);
    if (src->rows == 0)
        return;
    if (dst->rows == 0)
        dst->position = src->position;
    TDM_ASSERT(dst->position + dst->rows == src->position);
    const size_t row = (size_t)src->width * tdm_feat_dtype_bytes(src->dtype);
    if (dst->rows + src->rows > dst->cap) {
        int cap = dst->cap ? dst->cap : 16;
        while (cap < dst->rows + src->rows)
            cap *= 2;
        dst->data = tdm_xrealloc(dst->data, (size_t)cap * row);
        dst->cap = cap;
    }
    memcpy(dst->data + (size_t)dst->rows * row, src->data, (size_t)src->rows * row);
    dst->rows += src->rows;
    tdm_feat_out_sent(src);
}

/* ---- drafter: rows received, not yet used --------------------------------- */

void tdm_feat_in_init(tdm_feat_in *b, int width)
{
    memset(b, 0, sizeof(*b));
    b->width = width;
    b->position = -1;
}

void tdm_feat_in_free(tdm_feat_in *b)
{
    free(b->data);
    b->data = NULL;
    b->cap = b->rows = 0;
    b->position = -1;
}

void tdm_feat_in_clear(tdm_feat_in *b)
{
    b->rows = 0;
    b->position = -1;
}

tdm_status tdm_feat_in_append(tdm_feat_in *b, const Tandem__V1__Features *f, const char *what,
                              tdm_error *err)
{
    if (f->width != (uint32_t)b->width)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s.width %u: this drafter takes rows of %d values", what, f->width,
                             b->width);
    if (f->dtype != TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_BF16 &&
        f->dtype != TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s.dtype %d is not bf16 or f32", what,
                             (int)f->dtype);
    const size_t vb = tdm_feat_dtype_bytes(f->dtype);
    const size_t nv = (size_t)f->rows * (size_t)b->width;
    if (f->rows > (1u << 24) || f->data.len != nv * vb)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s.data holds %zu bytes, but %u rows of %d %s values take %zu", what,
                             f->data.len, f->rows, b->width, tdm_feat_dtype_name(f->dtype),
                             nv * vb);
    if (b->rows > 0 && f->position != (uint32_t)(b->position + b->rows))
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "%s.position %u: the rows held end at position %d (a gap or an "
                             "overlap in the feature stream)",
                             what, f->position, b->position + b->rows);
    if (f->rows == 0)
        return TDM_OK;
    if (b->rows + (int)f->rows > b->cap) {
        int cap = b->cap ? b->cap : 16;
        while (cap < b->rows + (int)f->rows)
            cap *= 2;
        b->data = tdm_xrealloc(b->data, (size_t)cap * (size_t)b->width * sizeof(float));
        b->cap = cap;
    }
    if (b->rows == 0)
        b->position = (int)f->position;
    float *dst = b->data + (size_t)b->rows * (size_t)b->width;
    const uint8_t *src = f->data.data;
    if (f->dtype == TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32) {
        memcpy(dst, src, nv * sizeof(float));
    } else {
        for (size_t i = 0; i < nv; i++)
            dst[i] = tdm_feat_from_bf16((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
    }
    b->rows += (int)f->rows;
    return TDM_OK;
}
