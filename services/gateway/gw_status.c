/*
 * gw_status.c - GetStatus and DrainReplica (see gw_status.h).
 */
#include "gw_status.h"

#include "log.h"
#include "request_check.h"

#include <string.h>

typedef struct gw_status_ctx {
    tdm_service *svc;
    gw_registry *reg;
} gw_status_ctx;

static void clear_status(void *arg)
{
    gw_registry_status_clear(arg);
}

static tdm_status handle_get_status(tdm_rpc_call *call, const ProtobufCMessage *req,
                                    ProtobufCMessage **resp, tdm_error *err, void *user)
{
    (void)req;
    gw_status_ctx *c = user;
    const tdm_trust *trust = tdm_service_trust(c->svc);
    tdm_status st = tdm_trust_check_client(trust, call, err);
    if (st != TDM_OK)
        return st;
    Tandem__V1__StatusResponse *out = tdm_rpc_call_alloc(call, sizeof(*out));
    tandem__v1__status_response__init(out);
    /* The descriptor lives as long as the service, which outlives its calls. */
    out->gateway = (Tandem__V1__Descriptor *)tdm_service_descriptor(c->svc);
    /* Paths, addresses and configuration are for operators only. */
    bool details = tdm_trust_is_operator(trust, call);
    gw_registry_status(c->reg, out, details);
    tdm_rpc_call_defer(call, clear_status, out);
    tdm_service_counters_to_proto(c->svc, call, &out->counters, &out->n_counters);
    if (details)
        out->config = tdm_service_config_to_proto(c->svc, call);
    *resp = &out->base;
    return TDM_OK;
}

/* DrainReplica: an operator tells a replica, through the gateway it
 * registered with, to drain (Replica.Drain, as SIGTERM would). */
static tdm_status handle_drain_replica(tdm_rpc_call *call, const ProtobufCMessage *req,
                                       ProtobufCMessage **resp, tdm_error *err, void *user)
{
    gw_status_ctx *c = user;
    const Tandem__V1__DrainReplicaRequest *dr = (const Tandem__V1__DrainReplicaRequest *)req;
    const tdm_trust *trust = tdm_service_trust(c->svc);
    tdm_status rc = tdm_trust_check_client(trust, call, err);
    if (rc != TDM_OK)
        return rc;
    if (!tdm_trust_is_operator(trust, call))
        return tdm_error_set(err, TDM_ERR_PERMISSION_DENIED,
                             "DrainReplica is for operators: call from the gateway's host or "
                             "with the cluster credential");
    if ((rc = tdm_req_check_label("replica_id", dr->replica_id, 128, err)) != TDM_OK)
        return rc;
    char address[256];
    Tandem__V1__Role role;
    if (!gw_registry_address(c->reg, dr->replica_id, address, sizeof(address), &role))
        return tdm_error_set(err, TDM_ERR_NOT_FOUND,
                             "replica_id %s: no drafter or verifier of that id is registered",
                             dr->replica_id);
    if (role == TANDEM__V1__ROLE__ROLE_GATEWAY)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "replica_id %s is a gateway",
                             dr->replica_id);
    const tdm_cfg *cfg = tdm_service_config(c->svc);
    tdm_rpc_channel_options o = {.target = address,
                                 .tls = tdm_service_tls(c->svc),
                                 .max_message_bytes = tdm_cfg_int(cfg, "max_message_size")};
    tdm_rpc_channel *ch = NULL;
    if ((rc = tdm_rpc_channel_create(&o, &ch, err)) != TDM_OK)
        return rc;
    Tandem__V1__DrainRequest fwd = TANDEM__V1__DRAIN_REQUEST__INIT;
    fwd.reason = dr->reason[0] && tdm_req_check_label("reason", dr->reason, 160, NULL) == TDM_OK
                     ? dr->reason
                     : "tandem drain";
    tdm_rpc_metadata md;
    tdm_rpc_call_options co = {.timeout_ms = 10000, .metadata = &md};
    co.n_metadata = tdm_trust_metadata(trust, &md);
    ProtobufCMessage *got = NULL;
    rc = tdm_rpc_unary(ch, "/tandem.v1.Replica/Drain", &fwd.base,
                       &tandem__v1__drain_response__descriptor, &got, &co, err);
    tdm_rpc_channel_destroy(ch);
    if (rc != TDM_OK)
        return tdm_error_prefix(err, "replica %s at %s", dr->replica_id, address);
    Tandem__V1__DrainReplicaResponse *out = tdm_rpc_call_alloc(call, sizeof(*out));
    tandem__v1__drain_replica_response__init(out);
    out->active_sequences = ((Tandem__V1__DrainResponse *)got)->active_sequences;
    protobuf_c_message_free_unpacked(got, NULL);
    out->replica_id = tdm_rpc_call_alloc(call, strlen(dr->replica_id) + 1);
    memcpy(out->replica_id, dr->replica_id, strlen(dr->replica_id) + 1);
    out->address = tdm_rpc_call_alloc(call, strlen(address) + 1);
    memcpy(out->address, address, strlen(address) + 1);
    tdm_log_info("gateway", "replica %s at %s told to drain (%u sequences in flight)",
                 dr->replica_id, address, out->active_sequences);
    *resp = &out->base;
    return TDM_OK;
}

tdm_status gw_status_add_method(tdm_service *svc, gw_registry *reg, tdm_error *err)
{
    static gw_status_ctx ctx; /* one gateway per process */
    ctx.svc = svc;
    ctx.reg = reg;
    tdm_status rc = tdm_rpc_server_add_unary(
        tdm_service_server(svc), "/tandem.v1.Gateway/GetStatus",
        &tandem__v1__get_status_request__descriptor, handle_get_status, &ctx, err);
    if (rc == TDM_OK)
        rc = tdm_rpc_server_add_unary(tdm_service_server(svc), "/tandem.v1.Gateway/DrainReplica",
                                      &tandem__v1__drain_replica_request__descriptor,
                                      handle_drain_replica, &ctx, err);
    return rc;
}
