/*
 * registry.h - the gateway's registry of drafters and verifiers.
 *
 * Owns the set of registered replicas (their Descriptors, last heartbeat and
 * load), drops a replica that stops heartbeating for longer than the TTL (a
 * reaper thread), and applies the compatibility rules (service/compat.h) to
 * every verifier/drafter pair and to replicas of one role: compatible pairs
 * are formed, refused pairs are kept with their reasons and logged once per
 * registration at WARN. Serves tandem.v1.Registry (RegisterReplica,
 * Heartbeat, DeregisterReplica). Remembers which verifier last served each
 * prompt prefix (prefix affinity), so that requests sharing a prefix go
 * where its prefix cache likely holds it.
 *
 * Thread-safe: RPC handlers and the reaper share one mutex.
 */
#ifndef TANDEM_GATEWAY_REGISTRY_H
#define TANDEM_GATEWAY_REGISTRY_H

#include "compat.h"
#include "feature_stream.h"
#include "request_check.h"
#include "rpc.h"
#include "service.h"
#include "status.h"
#include "tandem/v1/gateway.pb-c.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct gw_registry gw_registry;

/* Starts the reaper. heartbeat_ms is what replicas are told to use; a replica
 * silent for more than ttl_ms is dropped. trust (borrowed, outlives the
 * registry) decides who may register, heartbeat and deregister.
 * affinity_slack: how many more requests than the least loaded verifier the
 * verifier that last served a prompt's prefix may carry and still be picked
 * for it (prefix_affinity_slack); negative: no prefix affinity. */
gw_registry *gw_registry_create(const tdm_trust *trust, int64_t heartbeat_ms, int64_t ttl_ms,
                                int affinity_slack);
void gw_registry_destroy(gw_registry *r);

/* Adds the tandem.v1.Registry methods to a server (before it starts). */
tdm_status gw_registry_add_methods(gw_registry *r, tdm_rpc_server *server, tdm_error *err);

/* Fills the replicas, pairs and replica_refusals of a StatusResponse (other
 * fields untouched) with heap memory freed by gw_registry_status_clear.
 * Without details (a caller who is not an operator) replicas' addresses and
 * instances are left out, and refusals carry their rule but no message. */
void gw_registry_status(gw_registry *r, Tandem__V1__StatusResponse *out, bool details);
void gw_registry_status_clear(Tandem__V1__StatusResponse *out);

/* The replicas chosen for one request. */
typedef struct gw_pick {
    char verifier_id[128], verifier_addr[256];
    char verifier_instance[72];              /* its instance: a restart gets a new channel */
    uint32_t max_draft;                      /* the verifier's max_draft_tokens */
    uint32_t max_context;                    /* the verifier's max_context */
    char verifier_fingerprint[72];           /* its model_fingerprint */
    uint32_t snapshot_layout;                /* its snapshot_layout_version */
    char drafter_id[128], drafter_addr[256]; /* empty: no drafter */
    char drafter_device[72];                 /* its device_uuid ("" on the CPU) */
    bool drafter_mps;                        /* its device_mps */
    bool drafter_scores; /* a model drafter of protocol >= 1.3: it answers scoring opens */
    char drafter_host[72];                   /* its host_id */
    char drafter_cpus[TDM_CPULIST_TEXT_MAX + 1]; /* its cpus */
    /* its draft_pass_costs */
    Tandem__V1__DraftPassCost drafter_costs[TDM_REQ_MAX_DRAFT_COSTS];
    size_t n_drafter_costs;
    uint32_t block_size;                     /* the drafter's draft_block_size */
    tdm_feat_request features;               /* the hidden states it needs (n 0: none) */
    char no_drafter[1024];                   /* why there is none, when one was wanted */
    uint32_t affinity_tokens; /* picked for the prompt's first tokens, which it served last */
    /* The verifier that served the prompt's first source_tokens tokens last
     * when it was too busy to take the request (prefix affinity passed it
     * over), the same-role rules pass it with the one picked, and both keep
     * blocks of one size: the picked one may fetch them from it. Empty:
     * none. */
    char source_id[128], source_addr[256];
    uint32_t source_tokens;
} gw_pick;

/* Picks the least loaded verifier that the gateway rules pass with `gateway`
 * (this gateway's own descriptor) and, when want_drafter, the least
 * loaded drafter the compatibility rules pair with it (none, with the
 * reasons in no_drafter, when no drafter is compatible). UNAVAILABLE when no
 * verifier is registered, FAILED_PRECONDITION naming the rule when none is
 * usable. Each pick counts as load until gw_registry_unpick.
 *
 * Prefix affinity (prompt given, n_prompt > 0): among the verifiers with a
 * prefix cache, the one that last served the longest run of the prompt's
 * cache blocks (its prefix_cache_block; at most all of the prompt but its
 * last token, as the verifier's cache covers) is picked instead when it has
 * a free place (load below its max_sequences) and carries at most
 * affinity_slack more requests than the least loaded; the pick is then
 * remembered for the prompt's blocks. When the holder is passed over, it
 * is named as the pick's source (see gw_pick). */
tdm_status gw_registry_pick(gw_registry *r, bool want_drafter,
                            const Tandem__V1__Descriptor *gateway, const int32_t *prompt,
                            size_t n_prompt, gw_pick *out, tdm_error *err);
/* The same for a request leaving the verifier of `from` (a drain or a
 * crash; NULL: a new request): never that verifier nor a suspect one
 * (gw_registry_suspect), and only one the
 * same-role rules (snapshot-layout, snapshot-model) pass with it, so that
 * the request continues on the same model. UNAVAILABLE naming the rule
 * when none is left. */
tdm_status gw_registry_pick_peer(gw_registry *r, bool want_drafter,
                                 const Tandem__V1__Descriptor *gateway, const gw_pick *from,
                                 gw_pick *out, tdm_error *err);
void gw_registry_unpick(gw_registry *r, const gw_pick *p);
/* The address and role of a registered replica; false when none has that id. */
bool gw_registry_address(gw_registry *r, const char *replica_id, char *address, size_t len,
                         Tandem__V1__Role *role);
/* A request could not reach this replica instance: until it heartbeats
 * again it counts as having missed its heartbeats, and it is picked only
 * when every other candidate is suspect too (behind replicas that merely
 * missed heartbeats, which may still serve). */
void gw_registry_suspect(gw_registry *r, const char *replica_id, const char *instance_id);

/* Fills model_name, model_fingerprint and the drafters that pair with it in a
 * ModelInfo from a verifier's descriptor (memory from the call). */
void gw_model_info_fill(gw_registry *r, const char *verifier_id, tdm_rpc_call *call,
                        Tandem__V1__ModelInfo *out);

/* Registry counters for Describe / GetStatus. */
size_t gw_registry_counters(gw_registry *r, tdm_service_counter *out, size_t max);

#endif
