/*
 * gw_status.c - GetStatus (see gw_status.h).
 */
#include "gw_status.h"

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

tdm_status gw_status_add_method(tdm_service *svc, gw_registry *reg, tdm_error *err)
{
    static gw_status_ctx ctx; /* one gateway per process */
    ctx.svc = svc;
    ctx.reg = reg;
    return tdm_rpc_server_add_unary(tdm_service_server(svc), "/tandem.v1.Gateway/GetStatus",
                                    &tandem__v1__get_status_request__descriptor, handle_get_status,
                                    &ctx, err);
}
