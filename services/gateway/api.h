/*
 * api.h - the gateway's public methods (tandem.v1.Gateway, less GetStatus):
 * Generate, Tokenize, Detokenize, GetModelInfo.
 *
 * Owns the gateway's tokenizer and one channel per verifier address. Borrows
 * the registry, which picks the replicas of every request.
 */
#ifndef TANDEM_GATEWAY_API_H
#define TANDEM_GATEWAY_API_H

#include "registry.h"
#include "service.h"
#include "tokenizer.h"

typedef struct gw_api gw_api;

/* Loads the tokenizer named by the configuration and adds the methods to the
 * service's server (before it starts). *out is destroyed after the server
 * shut down. */
tdm_status gw_api_create(tdm_service *svc, gw_registry *reg, gw_api **out, tdm_error *err);
void gw_api_destroy(gw_api *g);

size_t gw_api_counters(gw_api *g, tdm_service_counter *out, size_t max);

#endif
