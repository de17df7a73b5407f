/*
 * trust.h - who may call what.
 *
 * Owns the credentials a process checks its callers against and the one it
 * presents to its peers, loaded once at start from its configuration:
 *
 *  - Calls between tandem's own services (Registry on the gateway, Run on a
 *    verifier, Draft on a drafter) are internal. A caller proves it is one
 *    of the cluster's services by either
 *      - the cluster token (cluster_token_file, the same secret on every
 *        service), sent as metadata `x-tandem-cluster-token`; or
 *      - under mutual TLS (tls_client_auth require), a certificate that
 *        names the caller's role: a URI SAN `tandem:role:ROLE` or an
 *        OU=tandem-ROLE in its subject (ROLE is gateway, verifier or
 *        drafter). A certificate from the same CA without the role (a
 *        user's) is refused.
 *    When both are configured, both must hold. With neither, internal calls
 *    are accepted only from this host (loopback or a unix socket).
 *  - The public API (the gateway's Generate, Tokenize, Detokenize,
 *    GetModelInfo, GetStatus) may require a bearer token from
 *    api_tokens_file (`authorization: Bearer TOKEN`).
 *  - GetStatus details (model paths, addresses, configuration) are for
 *    operators: a token from operator_tokens_file, or, when none is
 *    configured, a caller on this host.
 *
 * Token files hold one token per line (blank lines and lines starting with
 * '#' skipped); comparisons take the same time whatever the bytes compared
 * (CRYPTO_memcmp over equal-length digests).
 *
 * Ownership: tdm_trust_create copies what it needs from the configuration;
 * free with tdm_trust_destroy. Thread-safe once created (read-only).
 */
#ifndef TANDEM_SERVICE_TRUST_H
#define TANDEM_SERVICE_TRUST_H

#include "config.h"
#include "rpc.h"
#include "status.h"

#include <stdbool.h>

typedef struct tdm_trust tdm_trust;

/* Metadata key of the cluster token. */
#define TDM_TRUST_CLUSTER_TOKEN_KEY "x-tandem-cluster-token"

/* Loads the token files the configuration names (keys a schema lacks are
 * simply off). Errors name the file. mtls: whether this process's main
 * server requires client certificates. */
tdm_status tdm_trust_create(const tdm_cfg *cfg, bool mtls, tdm_trust **out, tdm_error *err);
void tdm_trust_destroy(tdm_trust *t);

/* Whether an internal call comes from a service of role `role_name`
 * ("gateway", "verifier", "drafter"); PERMISSION_DENIED (or
 * UNAUTHENTICATED for a missing or wrong token) naming the method, the peer
 * and what to set, else TDM_OK. */
tdm_status tdm_trust_check_internal(const tdm_trust *t, const tdm_rpc_call *call,
                                    const char *role_name, tdm_error *err);
/* Whether a public call may proceed (bearer token when required). */
tdm_status tdm_trust_check_client(const tdm_trust *t, const tdm_rpc_call *call, tdm_error *err);
/* The same for a transport other than gRPC: `authorization` is the value
 * of its authorization header (NULL: none), `what` names the request in the
 * error. */
tdm_status tdm_trust_check_bearer(const tdm_trust *t, const char *authorization, const char *what,
                                  tdm_error *err);
/* Whether the caller may see operator details. */
bool tdm_trust_is_operator(const tdm_trust *t, const tdm_rpc_call *call);

/* The metadata this process sends on its internal calls (the cluster token,
 * when it has one): fills *md and returns 0 or 1 entries. Valid while t is. */
size_t tdm_trust_metadata(const tdm_trust *t, tdm_rpc_metadata *md);

#endif
