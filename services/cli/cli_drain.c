/*
 * cli_drain.c - `tandem drain REPLICA`: tells a drafter or verifier, through
 * the gateway it registered with (Gateway.DrainReplica, operators only), to
 * drain as SIGTERM would: it deregisters, its in-flight requests move to
 * compatible peers (a verifier's through state snapshots), and it exits 0.
 */
#include "cli.h"
#include "cli_net.h"

#include "tandem/v1/gateway.pb-c.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tandem drain [options] REPLICA_ID\n\n"
            "Tells the replica REPLICA_ID (as `tandem status` lists it) to drain: it stops\n"
            "taking requests, its in-flight requests move to compatible peers without the\n"
            "clients seeing a gap (a verifier's through state snapshots; a drafter's go on\n"
            "without speculation), and it exits 0 within its shutdown_grace. The gateway\n"
            "accepts this from operators only.\n\n"
            "options:\n"
            "  --reason TEXT        logged by the gateway and the replica\n"
            "  --timeout DURATION   deadline of the call (default 10s)\n"
            "%s",
            cli_net_usage);
}

int cli_drain(int argc, char **argv)
{
    cli_net net;
    cli_net_init(&net);
    int64_t timeout_ms = 10000;
    const char *replica = NULL, *reason = "tandem drain";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int taken = cli_net_option(&net, "drain", argc, argv, &i);
        if (taken < 0)
            return 2;
        if (taken)
            continue;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--reason") == 0 && i + 1 < argc) {
            reason = argv[++i];
        } else if (strcmp(a, "--timeout") == 0 && i + 1 < argc) {
            if (cli_net_timeout("drain", argv[++i], &timeout_ms) != 0)
                return 2;
        } else if (a[0] != '-' && !replica) {
            replica = a;
        } else {
            fprintf(stderr, "tandem drain: unknown or incomplete argument '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!replica) {
        fprintf(stderr, "tandem drain: which replica? Give its id (tandem status lists them)\n\n");
        usage(stderr);
        return 2;
    }
    tdm_rpc_channel *ch = NULL;
    tdm_error err;
    if (cli_net_channel(&net, &ch, &err) != TDM_OK) {
        fprintf(stderr, "tandem drain: %s\n", err.msg);
        return 1;
    }
    Tandem__V1__DrainReplicaRequest req = TANDEM__V1__DRAIN_REPLICA_REQUEST__INIT;
    req.replica_id = (char *)replica;
    req.reason = (char *)reason;
    ProtobufCMessage *resp = NULL;
    tdm_rpc_call_options opt = {.timeout_ms = timeout_ms};
    cli_net_call_options(&net, &opt);
    tdm_status st = tdm_rpc_unary(ch, "/tandem.v1.Gateway/DrainReplica", &req.base,
                                  &tandem__v1__drain_replica_response__descriptor, &resp, &opt,
                                  &err);
    tdm_rpc_channel_destroy(ch);
    if (st != TDM_OK) {
        fprintf(stderr, "tandem drain: gateway %s: %s: %s\n", net.gateway, tdm_status_name(st),
                err.msg);
        return 1;
    }
    const Tandem__V1__DrainReplicaResponse *r = (const Tandem__V1__DrainReplicaResponse *)resp;
    printf("replica %s at %s is draining (%u sequences in flight when told)\n", r->replica_id,
           r->address, r->active_sequences);
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}
