/*
 * pbjson.h - any protobuf-c message as JSON, by reflection over its
 * descriptor (for `--json` output of the CLI).
 *
 * Field names are the .proto names; enums are written by name; 64-bit
 * integers as decimal strings (protobuf's JSON mapping); bytes as base64;
 * unset proto3 scalars are written with their zero value so the output
 * always has the same shape. A string field that is not valid UTF-8 (protobuf-c
 * does not check what a peer sends) is written with U+FFFD for each invalid
 * sequence, as decoded text is, so the output is always valid JSON.
 *
 * Ownership: the returned cJSON tree belongs to the caller (cJSON_Delete).
 */
#ifndef TANDEM_COMMON_PBJSON_H
#define TANDEM_COMMON_PBJSON_H

#include <cjson/cJSON.h>
#include <protobuf-c/protobuf-c.h>

/* NULL only when out of memory. */
cJSON *tdm_pbjson_from_message(const ProtobufCMessage *msg);

#endif
