/*
 * reflection.h - gRPC server reflection (grpc.reflection.v1 and v1alpha
 * ServerReflectionInfo), so that generic tools (grpcurl, Postman) can list a
 * server's services and fetch their descriptors.
 *
 * What it owns: an index, built once per process, of the FileDescriptorSet of
 * every proto under proto/ (embedded in the binary at build time): file
 * names, their dependencies and the fully qualified symbols each defines.
 * Answers list_services (from the server's registered methods),
 * file_by_filename and file_containing_symbol (the file and its transitive
 * dependencies); unknown names get an ErrorResponse with NOT_FOUND. Tandem
 * defines no extensions: all_extension_numbers_of_type answers an empty list
 * for a known message, file_containing_extension NOT_FOUND.
 */
#ifndef TANDEM_COMMON_REFLECTION_H
#define TANDEM_COMMON_REFLECTION_H

#include "rpc.h"
#include "status.h"

/* Adds both reflection method paths to a server (before start). */
tdm_status tdm_reflection_register(tdm_rpc_server *server, tdm_error *err);

/* The embedded descriptor set (a serialized FileDescriptorSet). */
const unsigned char *tdm_reflection_descriptor_set(size_t *len);

#endif
