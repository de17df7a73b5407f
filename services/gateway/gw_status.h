/*
 * gw_status.h - the gateway's GetStatus: its own Descriptor, the registry's
 * replicas and pairs (formed and refused, with reasons), counters and the
 * effective configuration; and DrainReplica.
 */
#ifndef TANDEM_GATEWAY_GW_STATUS_H
#define TANDEM_GATEWAY_GW_STATUS_H

#include "registry.h"
#include "service.h"

/* Adds /tandem.v1.Gateway/GetStatus and the operators' DrainReplica (which
 * forwards Replica.Drain to the replica) to the service's server (before start).
 * Both objects are borrowed and must outlive the server. */
tdm_status gw_status_add_method(tdm_service *svc, gw_registry *reg, tdm_error *err);

#endif
