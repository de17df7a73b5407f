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
#include "tandem/v1/gateway.pb-c.h"

#include <pthread.h>
#include <stdbool.h>

typedef struct gw_api gw_api;

/* Loads the tokenizer named by the configuration and adds the methods to the
 * service's server (before it starts). *out is destroyed after the server
 * shut down. */
tdm_status gw_api_create(tdm_service *svc, gw_registry *reg, gw_api **out, tdm_error *err);
void gw_api_destroy(gw_api *g);

size_t gw_api_counters(gw_api *g, tdm_service_counter *out, size_t max);

/* The gateway's tokenizer (borrowed; NULL when it has none). */
const tdm_tokenizer *gw_api_tokenizer(const gw_api *g);

/* TDM_OK when a verifier could take a request now; else why not. */
tdm_status gw_api_ready(gw_api *g, tdm_error *err);

/* Cancellation of a request from another thread (a client that went away
 * from a transport without gRPC's cancellation, such as HTTP). */
typedef struct gw_cancel {
    pthread_mutex_t mu;
    bool cancelled;
    tdm_rpc_stream *stream; /* the verifier stream now running (under mu) */
} gw_cancel;

void gw_cancel_init(gw_cancel *c);
/* Marks the request cancelled and cancels its verifier stream, if one runs
 * (which cancels the sequence on verifier and drafter). Any thread. */
void gw_cancel_fire(gw_cancel *c);
void gw_cancel_destroy(gw_cancel *c);

/* Where the responses of a request go: every token chunk, then the
 * GenerateComplete, as the gRPC Generate stream carries them. */
typedef struct gw_sink {
    /* Takes one response (borrowed for the call); an error ends the request. */
    tdm_status (*write)(void *arg, const Tandem__V1__GenerateResponse *r, tdm_error *err);
    void *arg;
    tdm_rpc_call *parent; /* optional: a gRPC call whose deadline and cancel propagate */
    gw_cancel *cancel;    /* optional: cancellation from another thread */
} gw_sink;

/* Serves one Generate request (the client's trust checked by the caller):
 * tokenizes the prompt, picks the replicas, relays the verifier's tokens to
 * the sink with stop strings applied, retries another verifier that cannot be
 * reached before anything streamed. Returns the request's status; on an
 * error, err says why (CANCELLED when the client went away). */
tdm_status gw_api_generate(gw_api *g, const Tandem__V1__GenerateRequest *req, const gw_sink *sink,
                           tdm_error *err);

#endif
