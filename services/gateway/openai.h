/*
 * openai.h - the gateway's OpenAI-compatible HTTP API: POST /v1/completions,
 * POST /v1/chat/completions (streamed as server-sent events or whole),
 * GET /v1/models and GET /health, on http_listen.
 *
 * Owns one HTTP server (service/http.h, a thread per connection so that a
 * long generation or a slow client holds only its own connection) and
 * translates JSON requests into Generate requests served by gw_api_generate,
 * the same path as the gRPC API. Borrows the gw_api.
 */
#ifndef TANDEM_GATEWAY_OPENAI_H
#define TANDEM_GATEWAY_OPENAI_H

#include "api.h"
#include "config.h"
#include "trust.h"

typedef struct gw_openai gw_openai;

/* Starts the API on http_listen; *out is NULL when it is empty (no API).
 * Requests other than /health need a bearer token when `trust` asks for one
 * (api_tokens_file), as on gRPC. Borrows api and trust; destroy before them. */
tdm_status gw_openai_create(const tdm_cfg *cfg, gw_api *api, const tdm_trust *trust,
                            gw_openai **out, tdm_error *err);
/* Stops serving (requests in progress end first) and frees. NULL: no-op. */
void gw_openai_destroy(gw_openai *o);

#endif
