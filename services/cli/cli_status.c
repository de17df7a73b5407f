/*
 * cli_status.c - `tandem status`: asks the gateway (GetStatus) which replicas
 * are registered, which verifier/drafter pairs are formed and which are
 * refused and why, and prints it readably or as JSON.
 */
#include "defs.h"
#include "cli.h"
#include "feature_stream.h"

#include "cli_net.h"
#include "compat.h"
#include "config.h"
#include "pbjson.h"
#include "rpc.h"
#include "service_config.h"
#include "tandem/v1/gateway.pb-c.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tandem status [options]\n\n"
            "Shows the gateway's registered replicas with their self-descriptions and\n"
            "heartbeat age, the verifier/drafter pairs formed, the pairs refused with the\n"
            "rule and both values, counters and the gateway's effective configuration\n"
            "(addresses, paths and configuration only for operators).\n\n"
            "  --json               the GetStatus response as JSON\n"
            "  --timeout DURATION   deadline of the call (default 5s)\n"
            "%s",
            cli_net_usage);
}

static const char *fp12(const char *fp, char *buf, size_t len)
{
    snprintf(buf, len, "%.12s", (fp && fp[0]) ? fp : "-");
    return buf;
}

/* A counter of the replica's last heartbeat; -1 when it has none such. */
static double counter(const Tandem__V1__ReplicaStatus *r, const char *name)
{
    for (size_t i = 0; r->load && i < r->load->n_counters; i++)
        if (strcmp(r->load->counters[i]->name, name) == 0)
            return r->load->counters[i]->value;
    return -1;
}

/* A verifier's memory arithmetic (engine/capacity.h), from its counters. */
static void print_capacity(const Tandem__V1__ReplicaStatus *r)
{
    const double n = counter(r, "capacity_sequences");
    if (n < 0)
        return;
    char b[32], w[32], ws[32], sq[32], kv[32], rec[32], cv[32], st[32], res[32];
    printf(
        "           capacity %.0f sequences in %s (%.0f bytes): weights %s + workspace %s + "
        "%.0f x %s (%.0f bytes: kv %s, recurrent %s, conv %s, strategy %s); %s reserved now\n",
        n, tdm_capacity_bytes_str((size_t)counter(r, "capacity_budget_bytes"), b, sizeof(b)),
        counter(r, "capacity_budget_bytes"),
        tdm_capacity_bytes_str((size_t)counter(r, "capacity_weight_bytes"), w, sizeof(w)),
        tdm_capacity_bytes_str((size_t)counter(r, "capacity_workspace_bytes"), ws, sizeof(ws)), n,
        tdm_capacity_bytes_str((size_t)counter(r, "capacity_sequence_bytes"), sq, sizeof(sq)),
        counter(r, "capacity_sequence_bytes"),
        tdm_capacity_bytes_str((size_t)counter(r, "capacity_sequence_kv_bytes"), kv, sizeof(kv)),
        tdm_capacity_bytes_str((size_t)counter(r, "capacity_sequence_recurrent_bytes"), rec,
                               sizeof(rec)),
        tdm_capacity_bytes_str((size_t)counter(r, "capacity_sequence_conv_bytes"), cv, sizeof(cv)),
        tdm_capacity_bytes_str((size_t)counter(r, "capacity_sequence_strategy_bytes"), st,
                               sizeof(st)),
        tdm_capacity_bytes_str((size_t)counter(r, "reserved_bytes"), res, sizeof(res)));
}

/* A verifier's prefix cache, from its counters. */
static void print_prefix_cache(const Tandem__V1__ReplicaStatus *r)
{
    const double hits = counter(r, "prefix_cache_hits");
    if (!r->descriptor->prefix_cache || hits < 0)
        return;
    const double misses = counter(r, "prefix_cache_misses");
    char held[32], budget[32];
    printf("           prefix cache (block %u): %.0f hits, %.0f misses (%.0f%% hit), %.0f prompt "
           "tokens saved; %.0f blocks in %s of %s, %.0f evicted\n",
           r->descriptor->prefix_cache_block, hits, misses,
           hits + misses > 0 ? 100.0 * hits / (hits + misses) : 0.0,
           counter(r, "prefix_cache_tokens_saved"), counter(r, "prefix_cache_blocks"),
           tdm_capacity_bytes_str((size_t)counter(r, "prefix_cache_bytes"), held, sizeof(held)),
           tdm_capacity_bytes_str((size_t)counter(r, "prefix_cache_memory_bytes"), budget,
                                  sizeof(budget)),
           counter(r, "prefix_cache_evictions"));
    const double fetches = counter(r, "prefix_fetches");
    if (fetches < 0)
        return;
    char bytes[32];
    printf("           prefix fetches: %.0f (%.0f failed; %.0f blocks, %s in %.0f ms), %.0f "
           "prefilled instead; rates %.0f bytes/ms fetching, %.1f tokens/ms prefilling\n",
           fetches, counter(r, "prefix_fetch_failures"), counter(r, "prefix_fetch_blocks"),
           tdm_capacity_bytes_str((size_t)counter(r, "prefix_fetch_bytes"), bytes, sizeof(bytes)),
           counter(r, "prefix_fetch_ms"), counter(r, "prefix_fetch_recomputed"),
           counter(r, "prefix_fetch_bandwidth_bytes_per_ms"), counter(r, "prefill_tokens_per_ms"));
}

/* The feature stream: what a verifier streams, what a hidden-state drafter
 * needs and the target model it belongs to, the transports it allows
 * (feature_transport) and, from its counters, what its streams settled on. */
static void print_features(const Tandem__V1__ReplicaStatus *r)
{
    const Tandem__V1__Descriptor *d = r->descriptor;
    char buf[512], fp[16];
    if (d->role == TANDEM__V1__ROLE__ROLE_VERIFIER && d->n_features_available > 0) {
        tdm_feat_request av = {0};
        for (size_t i = 0; i < d->n_features_available && i < TDM_FEAT_MAX_SPECS; i++, av.n++)
            av.specs[i] = (tdm_feat_spec){.final_layer = d->features_available[i]->final_layer,
                                          .layer = d->features_available[i]->layer,
                                          .normed = d->features_available[i]->normed};
        printf("           streams hidden states: %s\n",
               tdm_feat_request_str(&av, buf, sizeof(buf)));
    }
    tdm_feat_request need;
    if (d->role == TANDEM__V1__ROLE__ROLE_DRAFTER && d->features_needed &&
        tdm_feat_request_from_proto(d->features_needed, "features_needed", &need, NULL) == TDM_OK &&
        need.n > 0)
        printf("           needs hidden states: %s (%s), of target model %s\n",
               tdm_feat_request_str(&need, buf, sizeof(buf)), tdm_feat_dtype_name(need.dtype),
               fp12(d->target_model_fingerprint, fp, sizeof(fp)));
    if (d->n_feature_transports > 0) {
        printf("           feature transports: ");
        for (size_t i = 0; i < d->n_feature_transports; i++)
            printf("%s%s", i ? ", " : "", d->feature_transports[i]);
        if (d->n_feature_transports > 1)
            printf(" (auto: shm where the handshake proves colocation)");
        printf("\n");
    }
    const double shm = counter(r, "feature_streams_shm"), grpc = counter(r, "feature_streams_grpc");
    const double rows_shm = counter(r, "feature_rows_shm"),
                 rows_grpc = counter(r, "feature_rows_grpc");
    if (d->role == TANDEM__V1__ROLE__ROLE_VERIFIER && shm >= 0 && (shm > 0 || grpc > 0)) {
        const double us_s = counter(r, "feature_put_us_shm"), n_s = counter(r, "feature_puts_shm");
        const double us_g = counter(r, "feature_put_us_grpc"),
                     n_g = counter(r, "feature_puts_grpc");
        printf("           feature stream: %.0f Draft stream(s) on shm, %.0f on grpc; rows %.0f by "
               "shm, %.0f by grpc (%.0f inline for a full ring); put out in %.1f us a message "
               "by shm, %.1f by grpc\n",
               shm, grpc > 0 ? grpc : 0, rows_shm, rows_grpc, counter(r, "feature_ring_full"),
               n_s > 0 ? us_s / n_s : 0, n_g > 0 ? us_g / n_g : 0);
    }
    if (d->role == TANDEM__V1__ROLE__ROLE_DRAFTER && shm >= 0 && (rows_shm > 0 || rows_grpc > 0))
        printf("           feature stream: %.0f ring(s) taken, %.0f refused; rows %.0f by shm, "
               "%.0f by grpc\n",
               shm, counter(r, "feature_shm_refused"), rows_shm, rows_grpc);
}

/* The exchange transport: what a side allows (exchange_transport) and, from
 * its counters, what its Draft streams settled on. */
static void print_exchange(const Tandem__V1__ReplicaStatus *r)
{
    const Tandem__V1__Descriptor *d = r->descriptor;
    if (d->n_exchange_transports > 0) {
        printf("           exchange transports: ");
        for (size_t i = 0; i < d->n_exchange_transports; i++)
            printf("%s%s", i ? ", " : "", d->exchange_transports[i]);
        if (d->n_exchange_transports > 1)
            printf(" (auto: shm where the handshake proves colocation)");
        printf("\n");
    }
    const double shm = counter(r, "exchange_streams_shm");
    if (d->role == TANDEM__V1__ROLE__ROLE_VERIFIER && shm >= 0) {
        const double grpc = counter(r, "exchange_streams_grpc");
        if (shm > 0 || grpc > 0)
            printf("           exchange: %.0f Draft stream(s) on the shared-memory lane, %.0f on "
                   "grpc\n",
                   shm, grpc > 0 ? grpc : 0);
    }
    if (d->role == TANDEM__V1__ROLE__ROLE_DRAFTER && shm >= 0) {
        const double refused = counter(r, "exchange_lane_refused");
        if (shm > 0 || refused > 0)
            printf("           exchange: %.0f shared-memory lane(s) taken, %.0f refused\n", shm,
                   refused > 0 ? refused : 0);
    }
}

static void print_replica(const Tandem__V1__ReplicaStatus *r)
{
    const Tandem__V1__Descriptor *d = r->descriptor;
    if (!d)
        return;
    char m[16], t[16];
    printf("  %-8s %s  %s\n", tdm_role_name(d->role), d->replica_id, d->address);
    printf("           model %s (%s), tokenizer %s\n", d->model_name[0] ? d->model_name : "-",
           fp12(d->model_fingerprint, m, sizeof(m)), fp12(d->tokenizer_fingerprint, t, sizeof(t)));
    printf("           ");
    if (d->role == TANDEM__V1__ROLE__ROLE_VERIFIER)
        printf("max_draft_tokens %u, ", d->max_draft_tokens);
    if (d->role == TANDEM__V1__ROLE__ROLE_VERIFIER && d->tensor_parallel > 1)
        printf("tensor_parallel %u, ", d->tensor_parallel);
    if (d->role == TANDEM__V1__ROLE__ROLE_DRAFTER) {
        printf("%s drafter, draft_block_size %u, ", tdm_drafter_kind_name(d->drafter_kind),
               d->draft_block_size);
        if (d->draft_vocab_size)
            printf("draft_vocab %u of %u tokens, ", d->draft_vocab_size, d->vocab_size);
        if (d->weights[0])
            printf("weights %s, ", d->weights);
    }
    printf("state %s, prefix_cache %s, max_sequences %u\n",
           tdm_state_strategy_name(tdm_state_strategy_from_proto(d->state_strategy)),
           d->prefix_cache ? "on" : "off", d->max_sequences);
    printf("           protocol %u.%u, snapshot layout %u, build %s (%s, %s)\n",
           d->protocol ? d->protocol->major : 0, d->protocol ? d->protocol->minor : 0,
           d->snapshot_layout_version, d->build ? d->build->version : "?",
           d->build ? d->build->git_revision : "?",
           d->build && d->build->backend[0] ? d->build->backend : "no backend");
    print_features(r);
    print_exchange(r);
    if (d->device_uuid[0])
        printf("           GPU %s%s\n", d->device_uuid,
               d->device_mps ? ", through an MPS server" : "");
    else if (d->cpus[0])
        printf("           CPUs %s of host %s\n", d->cpus, d->host_id[0] ? d->host_id : "?");
    /* one line a block length, as reported (the drafter's block first) */
    for (size_t i = 0; i < d->n_draft_pass_costs; i++) {
        const Tandem__V1__DraftPassCost *c = d->draft_pass_costs[i];
        if (i == 0 || c->block != d->draft_pass_costs[i - 1]->block)
            printf("%s           a draft pass of %u token%s (timed before serving):", i ? "\n" : "",
                   c->block, c->block == 1 ? "" : "s");
        else
            printf(",");
        printf(" %u sequence%s %.3f ms", c->sequences, c->sequences == 1 ? "" : "s",
               (double)c->millis);
        if (i + 1 == d->n_draft_pass_costs)
            printf("\n");
    }
    printf("           heartbeat %.1fs ago", r->heartbeat_age_ms / 1000.0);
    if (r->load)
        printf(", %u active sequences, %u free slots", r->load->active_sequences,
               r->load->free_slots);
    if (r->requests_in_flight)
        printf("; %u requests in flight from this gateway", r->requests_in_flight);
    printf("\n");
    print_capacity(r);
    print_prefix_cache(r);
    /* The replica's own counters, as of its last heartbeat. */
    if (r->load && r->load->n_counters > 0) {
        int col = 11;
        printf("           ");
        for (size_t i = 0; i < r->load->n_counters; i++) {
            char item[160];
            int n = snprintf(item, sizeof(item), "%s %.6g%s", r->load->counters[i]->name,
                             r->load->counters[i]->value, i + 1 < r->load->n_counters ? ", " : "");
            if (col + n > 100) {
                printf("\n           ");
                col = 11;
            }
            fputs(item, stdout);
            col += n;
        }
        printf("\n");
    }
}

const Tandem__V1__Descriptor *cli_status_replica(const Tandem__V1__StatusResponse *s,
                                                 const char *id)
{
    for (size_t i = 0; i < s->n_replicas; i++)
        if (s->replicas[i]->descriptor && strcmp(s->replicas[i]->descriptor->replica_id, id) == 0)
            return s->replicas[i]->descriptor;
    return NULL;
}

/* A formed pair's line: the two, and the GPU they share, if they do. */
static void print_pair(const Tandem__V1__StatusResponse *s, const Tandem__V1__PairStatus *p)
{
    printf("  verifier %s + drafter %s\n", p->verifier, p->drafter);
    const Tandem__V1__Descriptor *v = cli_status_replica(s, p->verifier),
                                 *d = cli_status_replica(s, p->drafter);
    if (!v || !d)
        return;
    switch (tdm_gpu_sharing(v->device_uuid, v->device_mps, d->device_uuid, d->device_mps)) {
    case TDM_GPU_APART:
        if (!v->device_uuid[0] && !d->device_uuid[0] &&
            tdm_cores_shared(v->host_id, v->cpus, d->host_id, d->cpus))
            printf("    on CPU cores they may share (CPUs %s and %s): no drafting ahead of "
                   "verdicts; %s\n",
                   v->cpus[0] ? v->cpus : "?", d->cpus[0] ? d->cpus : "?", TDM_CORES_FIX);
        break;
    case TDM_GPU_SHARED_MPS:
        printf("    on one GPU (%s), both through an MPS server: their kernels run at once\n",
               v->device_uuid);
        break;
    case TDM_GPU_SHARED_TURNS:
        printf("    on one GPU (%s) as two contexts, which take turns on it (%s through an MPS "
               "server); %s\n",
               v->device_uuid, tdm_gpu_turns_without(v->device_mps, d->device_mps),
               TDM_GPU_TURNS_FIX);
        break;
    }
}

static void print_status(const Tandem__V1__StatusResponse *s)
{
    if (s->gateway) {
        const Tandem__V1__Descriptor *g = s->gateway;
        printf("gateway %s at %s: tandem %s (revision %s), protocol %u.%u\n", g->replica_id,
               g->address, g->build ? g->build->version : "?",
               g->build ? g->build->git_revision : "?", g->protocol ? g->protocol->major : 0,
               g->protocol ? g->protocol->minor : 0);
    }
    printf("\nreplicas (%zu):\n", s->n_replicas);
    if (s->n_replicas == 0)
        printf("  (none registered)\n");
    for (size_t i = 0; i < s->n_replicas; i++)
        print_replica(s->replicas[i]);

    size_t formed = 0, refused = 0;
    for (size_t i = 0; i < s->n_pairs; i++)
        s->pairs[i]->compatible ? formed++ : refused++;
    printf("\npairs formed (%zu):\n", formed);
    if (formed == 0)
        printf("  (none)\n");
    for (size_t i = 0; i < s->n_pairs; i++)
        if (s->pairs[i]->compatible)
            print_pair(s, s->pairs[i]);
    printf("\npairs refused (%zu):\n", refused);
    if (refused == 0)
        printf("  (none)\n");
    for (size_t i = 0; i < s->n_pairs; i++) {
        const Tandem__V1__PairStatus *p = s->pairs[i];
        if (p->compatible)
            continue;
        printf("  verifier %s + drafter %s\n", p->verifier, p->drafter);
        for (size_t k = 0; k < p->n_refusals; k++)
            printf("    %s\n", p->refusals[k]->message);
    }
    if (s->n_replica_refusals) {
        printf("\nreplicas of one role that cannot exchange state (%zu):\n", s->n_replica_refusals);
        for (size_t k = 0; k < s->n_replica_refusals; k++)
            printf("  %s\n", s->replica_refusals[k]->message);
    }
    if (s->n_counters) {
        printf("\ncounters:\n");
        for (size_t i = 0; i < s->n_counters; i++)
            printf("  %-28s %.0f\n", s->counters[i]->name, s->counters[i]->value);
    }
    if (s->config && s->config->n_entries) {
        printf("\ngateway configuration:\n");
        for (size_t i = 0; i < s->config->n_entries; i++) {
            const Tandem__V1__ConfigEntry *e = s->config->entries[i];
            printf("  %-20s %-24s # %s%s%s\n", e->key, e->value[0] ? e->value : "''", e->source,
                   e->reason[0] ? "; " : "", e->reason);
        }
    }
}

int cli_status(int argc, char **argv)
{
    cli_net net;
    cli_net_init(&net);
    bool json = false;
    int64_t timeout_ms = 5000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            if (i + 1 < argc) {
                fprintf(stderr, "tandem status: takes no arguments, got '%s'\n", argv[i + 1]);
                return 2;
            }
            break;
        }
        int taken = cli_net_option(&net, "status", argc, argv, &i);
        if (taken < 0)
            return 2;
        if (taken)
            continue;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--timeout") == 0 && i + 1 < argc) {
            if (cli_net_timeout("status", argv[++i], &timeout_ms) != 0)
                return 2;
        } else {
            fprintf(stderr, "tandem status: unknown or incomplete argument '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    const char *gateway = net.gateway;
    tdm_rpc_channel *ch = NULL;
    tdm_error err;
    if (cli_net_channel(&net, &ch, &err) != TDM_OK) {
        fprintf(stderr, "tandem status: %s\n", err.msg);
        return 1;
    }
    Tandem__V1__GetStatusRequest req = TANDEM__V1__GET_STATUS_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    tdm_rpc_call_options opt = {.timeout_ms = timeout_ms};
    cli_net_call_options(&net, &opt);
    tdm_status st = tdm_rpc_unary(ch, "/tandem.v1.Gateway/GetStatus", &req.base,
                                  &tandem__v1__status_response__descriptor, &resp, &opt, &err);
    if (st != TDM_OK) {
        fprintf(stderr, "tandem status: gateway %s: %s: %s\n", gateway, tdm_status_name(st),
                err.msg);
        tdm_rpc_channel_destroy(ch);
        return 1;
    }
    if (json) {
        cJSON *j = tdm_pbjson_from_message(resp);
        char *text = j ? cJSON_Print(j) : NULL;
        if (text)
            printf("%s\n", text);
        free(text);
        cJSON_Delete(j);
    } else {
        print_status((const Tandem__V1__StatusResponse *)resp);
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    tdm_rpc_channel_destroy(ch);
    return 0;
}
