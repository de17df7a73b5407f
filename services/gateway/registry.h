/*
 * registry.h - the gateway's registry of drafters and verifiers.
 *
 * Owns the set of registered replicas (their Descriptors, last heartbeat and
 * load), drops a replica that stops heartbeating for longer than the TTL (a
 * reaper thread), and applies the compatibility rules (common/compat.h) to
 * every verifier/drafter pair and to replicas of one role: compatible pairs
 * are formed, refused pairs are kept with their reasons and logged once per
 * registration at WARN. Serves tandem.v1.Registry (RegisterReplica,
 * Heartbeat, DeregisterReplica).
 *
 * Thread-safe: RPC handlers and the reaper share one mutex.
 */
#ifndef TANDEM_GATEWAY_REGISTRY_H
#define TANDEM_GATEWAY_REGISTRY_H

#include "rpc.h"
#include "service.h"
#include "status.h"
#include "tandem/v1/gateway.pb-c.h"

#include <stdint.h>

typedef struct gw_registry gw_registry;

/* Starts the reaper. heartbeat_ms is what replicas are told to use; a replica
 * silent for more than ttl_ms is dropped. */
gw_registry *gw_registry_create(int64_t heartbeat_ms, int64_t ttl_ms);
void gw_registry_destroy(gw_registry *r);

/* Adds the tandem.v1.Registry methods to a server (before it starts). */
tdm_status gw_registry_add_methods(gw_registry *r, tdm_rpc_server *server, tdm_error *err);

/* Fills the replicas, pairs and replica_refusals of a StatusResponse (other
 * fields untouched) with heap memory freed by gw_registry_status_clear. */
void gw_registry_status(gw_registry *r, Tandem__V1__StatusResponse *out);
void gw_registry_status_clear(Tandem__V1__StatusResponse *out);

/* Registry counters for Describe / GetStatus. */
size_t gw_registry_counters(gw_registry *r, tdm_service_counter *out, size_t max);

#endif
