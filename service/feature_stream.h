/*
 * feature_stream.h - the feature stream between a verifier and a hidden-state
 * drafter (drafter.proto): what a drafter asks for, what a verifier can
 * give, and the rows themselves, encoded, split into messages that fit the
 * message size, and put back together.
 *
 * Owns: tdm_feat_request (the plain form of tandem.v1.FeatureRequest), the
 * verifier's buffer of encoded rows not yet sent (tdm_feat_out) and the
 * drafter's buffer of decoded rows not yet primed (tdm_feat_in). A row is
 * the hidden states of one position, each spec's hidden_size values
 * concatenated; bf16 rows are rounded to nearest even from fp32.
 *
 * Ownership: the buffers own their memory (tdm_feat_out_free,
 * tdm_feat_in_free); the Features messages tdm_feat_out_messages fills point
 * into the buffer and live until it changes. Not thread-safe: one owner each.
 */
#ifndef TANDEM_SERVICE_FEATURE_STREAM_H
#define TANDEM_SERVICE_FEATURE_STREAM_H

#include "status.h"
#include "tandem/v1/drafter.pb-c.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most specs a request may hold (an EAGLE-3 head takes three layers). */
#define TDM_FEAT_MAX_SPECS 8

typedef struct tdm_feat_spec {
    bool final_layer; /* the last layer's output; else layer */
    uint32_t layer;
    bool normed; /* after the final norm */
} tdm_feat_spec;

typedef struct tdm_feat_request {
    int n; /* 0: no features */
    tdm_feat_spec specs[TDM_FEAT_MAX_SPECS];
    Tandem__V1__FeatureDtype dtype; /* BF16 or F32 (UNSPECIFIED reads as BF16) */
} tdm_feat_request;

/* "final layer after the norm", "layer 7", ... into buf. */
const char *tdm_feat_spec_name(const tdm_feat_spec *s, char *buf, size_t len);
/* The specs of r as "final layer after the norm, layer 3", or "none". */
const char *tdm_feat_request_str(const tdm_feat_request *r, char *buf, size_t len);
/* "bf16" or "f32"; bytes a value takes on the wire. */
const char *tdm_feat_dtype_name(Tandem__V1__FeatureDtype d);
size_t tdm_feat_dtype_bytes(Tandem__V1__FeatureDtype d);

/* Whether this build's engine can stream a spec: the last layer's output
 * after the final norm (tdm_step_out.hidden), nothing else yet. */
bool tdm_feat_spec_available(const tdm_feat_spec *s);
/* The specs a verifier of this build advertises (Descriptor.features_available). */
int tdm_feat_available(tdm_feat_spec *out, int max);

/* From a FeatureRequest message (NULL: none): INVALID_ARGUMENT naming the
 * field when it has more than TDM_FEAT_MAX_SPECS specs or an unknown dtype.
 * `what` names the message for errors. */
tdm_status tdm_feat_request_from_proto(const Tandem__V1__FeatureRequest *m, const char *what,
                                       tdm_feat_request *out, tdm_error *err);
/* A FeatureRequest message viewing r: specs and ptrs are caller storage of
 * TDM_FEAT_MAX_SPECS entries that must outlive m. */
void tdm_feat_request_to_proto(const tdm_feat_request *r, Tandem__V1__FeatureRequest *m,
                               Tandem__V1__FeatureSpec *specs, Tandem__V1__FeatureSpec **ptrs);
/* The first spec of r this build cannot stream, or -1 when it streams all. */
int tdm_feat_request_missing(const tdm_feat_request *r);

/* fp32 <-> bf16 (round to nearest even; NaN stays NaN). */
uint16_t tdm_feat_bf16(float x);
float tdm_feat_from_bf16(uint16_t b);

/* ---- verifier: rows waiting to be sent ------------------------------------ */

typedef struct tdm_feat_out {
    Tandem__V1__FeatureDtype dtype;
    int width;     /* values per row */
    int position;  /* position of the first row held */
    int rows;      /* rows held */
    uint8_t *data; /* [cap rows, width] encoded */
    int cap;
} tdm_feat_out;

/* An empty buffer for rows of `width` values in dtype, starting at `position`. */
void tdm_feat_out_init(tdm_feat_out *b, int width, Tandem__V1__FeatureDtype dtype, int position);
void tdm_feat_out_free(tdm_feat_out *b);
/* Appends n rows (host fp32 [n, width]), encoded. */
void tdm_feat_out_append(tdm_feat_out *b, const float *rows, int n);
/* Splits the held rows into messages of at most max_bytes of data each
 * (at least one row a message), viewing b's data: writes up to max_out
 * messages into out and returns how many are needed (0 when b is empty).
 * The caller sends all but the last as FeatureChunk messages, then the last
 * with its open or verdict, then calls tdm_feat_out_sent. */
size_t tdm_feat_out_messages(const tdm_feat_out *b, size_t max_bytes, Tandem__V1__Features *out,
                             size_t max_out);
/* The held rows went out: the next row is at position + rows. */
void tdm_feat_out_sent(tdm_feat_out *b);
/* Moves src's rows to the end of dst (same width and dtype; an empty dst
 * takes src's position): src is left empty at the position after them, as
 * after tdm_feat_out_sent. */
void tdm_feat_out_take(tdm_feat_out *dst, tdm_feat_out *src);

/* ---- drafter: rows received, not yet used --------------------------------- */

typedef struct tdm_feat_in {
    int width;    /* values per row the drafter expects */
    int position; /* position of the first row held (-1: none received yet) */
    int rows;
    float *data; /* [cap rows, width] fp32 */
    int cap;
} tdm_feat_in;

void tdm_feat_in_init(tdm_feat_in *b, int width);
void tdm_feat_in_free(tdm_feat_in *b);
/* Appends a message's rows, decoded. INVALID_ARGUMENT naming the field at
 * fault when its width is not b's, its dtype unknown, its data not rows x
 * width values of that dtype, or its rows do not follow the held ones (the
 * first rows received may start anywhere). `what` names the message. On
 * error b is left as it was. */
tdm_status tdm_feat_in_append(tdm_feat_in *b, const Tandem__V1__Features *f, const char *what,
                              tdm_error *err);
/* Drops the held rows; the next ones may start anywhere. */
void tdm_feat_in_clear(tdm_feat_in *b);

#endif
