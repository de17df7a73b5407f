/*
 * run.c - the verifier's methods: Run (one request, tokens streamed back as
 * the scheduler produces them) and the counters it reports.
 */
#include "verifier.h"

#include "log.h"
#include "service_config.h"
#include "tandem/v1/verifier.pb-c.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct run_cancel {
    vsched *sched;
    vreq *req;
} run_cancel;

static void on_cancel(void *arg)
{
    run_cancel *c = arg;
    vsched_cancel(c->sched, c->req);
}

static tdm_status run_handler(tdm_rpc_call *call, const ProtobufCMessage *msg, tdm_error *err,
                              void *user)
{
    verifier *v = user;
    /* This thread only forwards tokens: woken by the scheduler thread for
     * each round's tokens, it must not take that thread's core (Linux's
     * wake-up preemption). On a CPU backend of two cores each wake did,
     * before the scheduler had woken the next Run: 22 us a sequence. */
    struct sched_param sp = {0};
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
    const Tandem__V1__RunRequest *req = (const Tandem__V1__RunRequest *)msg;
    vreq *r = NULL;
    tdm_status rc = tdm_trust_check_internal(v->trust, call, "gateway", err);
    if (rc == TDM_OK) {
        verifier_prefix_fetch(v, req); /* on this thread, before the scheduler sees it */
        rc = vsched_submit(v->sched, req, &r, err);
    }
    if (rc != TDM_OK) {
        tdm_metrics_outcome(&v->outcomes, rc, 0);
        return rc;
    }
    run_cancel *c = tdm_rpc_call_alloc(call, sizeof(*c));
    c->sched = v->sched;
    c->req = r;
    tdm_rpc_call_set_cancel_notify(call, on_cancel, c);

    rc = TDM_OK;
    int o_finish = 0;
    for (;;) {
        vsched_output o;
        vsched_next(v->sched, r, &o);
        if (o.n_ids > 0) {
            Tandem__V1__TokenChunk chunk = TANDEM__V1__TOKEN_CHUNK__INIT;
            chunk.n_ids = (size_t)o.n_ids;
            chunk.ids = (uint32_t *)o.ids;
            chunk.index = (uint32_t)o.index;
            Tandem__V1__RunResponse resp = TANDEM__V1__RUN_RESPONSE__INIT;
            resp.chunk_case = TANDEM__V1__RUN_RESPONSE__CHUNK_TOKENS;
            resp.tokens = &chunk;
            o.stats.verifier = (char *)v->replica_id;
            resp.progress = &o.stats;
            tdm_error werr = {0};
            if (tdm_rpc_call_write(call, &resp.base, &werr) != TDM_OK)
                vsched_cancel(v->sched, r); /* the client is gone; drain to the end */
            free(o.ids);
            continue;
        }
        if (o.draining) {
            Tandem__V1__RunResponse resp = TANDEM__V1__RUN_RESPONSE__INIT;
            resp.draining = true;
            tdm_error werr = {0};
            if (tdm_rpc_call_write(call, &resp.base, &werr) != TDM_OK)
                vsched_cancel(v->sched, r);
            continue;
        }
        if (!o.done)
            continue;
        if (o.queue_ms > 0)
            tdm_metric_observe(v->queue_time, NULL, o.queue_ms / 1e3);
        if (o.status != TDM_OK) {
            rc = tdm_error_set(err, o.status, "%s", o.msg);
            break;
        }
        Tandem__V1__RunComplete done = TANDEM__V1__RUN_COMPLETE__INIT;
        done.finish_reason = o.finish_reason;
        o_finish = (int)o.finish_reason;
        o.stats.verifier = (char *)v->replica_id;
        done.stats = &o.stats;
        Tandem__V1__RunResponse resp = TANDEM__V1__RUN_RESPONSE__INIT;
        resp.chunk_case = TANDEM__V1__RUN_RESPONSE__CHUNK_COMPLETE;
        resp.complete = &done;
        rc = tdm_rpc_call_write(call, &resp.base, err);
        break;
    }
    tdm_rpc_call_set_cancel_notify(call, NULL, NULL);
    vsched_release(v->sched, r);
    tdm_metrics_outcome(&v->outcomes, rc, o_finish);
    return rc;
}

static size_t counters(void *arg, tdm_service_counter *out, size_t max)
{
    verifier *v = arg;
    vsched_counters c;
    vsched_get_counters(v->sched, &c);
    tdm_runtime_graph_stats gs;
    tdm_runtime_graph_stats_get(v->rt, &gs);
    tdm_service_counter all[] = {
        {"requests", (double)c.requests},
        {"active_sequences", (double)c.active},
        {"waiting_sequences", (double)c.waiting},
        {"rounds", (double)c.rounds},
        {"speculative_rounds", (double)c.spec_rounds},
        {"drafted_tokens", (double)c.drafted},
        {"accepted_tokens", (double)c.accepted},
        {"generated_tokens", (double)c.tokens},
        {"mean_accepted_per_round", c.spec_rounds ? (double)c.accepted / (double)c.spec_rounds : 0},
        {"drafter_failures", (double)c.drafter_failures},
        {"drafter_reopens", (double)c.drafter_reopens},
        {"cancelled", (double)c.cancelled},
        {"malformed_blocks", (double)c.malformed_blocks},
        TDM_GRAPH_COUNTERS(gs),
        {"draft_streams", (double)c.draft_streams},
        {"ahead_blocks_used", (double)c.ahead_used},
        {"ahead_blocks_dropped", (double)c.ahead_dropped},
        {"draft_exchange_overhead_p50_us", c.overhead_p50_us},
        {"draft_exchange_overhead_p99_us", c.overhead_p99_us},
        {"draft_time_per_token_p50_us", c.draft_token_p50_us},
        {"draft_time_per_token_p99_us", c.draft_token_p99_us},
        {"draft_exchange_us_total", c.exchange_us_total},
        {"draft_exchange_blocks", (double)c.exchange_blocks},
        {"draft_open_wait_us_total", c.open_wait_us_total},
        {"draft_open_waits", (double)c.open_waits},
        {"draft_exchange_send_us_total", c.send_us_total},
        {"draft_exchange_sends", (double)c.sends},
        {"draft_exchange_queue_us_total", c.queue_us_total},
        {"draft_exchange_write_us_total", c.write_us_total},
        {"draft_exchange_writes", (double)c.writes},
        {"draft_exchange_deliver_us_total", c.deliver_us_total},
        {"draft_exchange_delivers", (double)c.delivers},
        {"draft_time_us_total", c.draft_us_total},
        {"draft_tokens_timed", (double)c.draft_tokens_total},
        {"scheduler_uptime_us", c.uptime_us},
        {"max_sequences", (double)v->max_sequences},
        {"speculative_steps", (double)c.speculative_steps},
        {"feature_rows_sent", (double)c.feature_rows},
        {"feature_bytes_sent", (double)c.feature_bytes},
        {"feature_rows_shm", (double)c.feature_rows_shm},
        {"feature_bytes_shm", (double)c.feature_bytes_shm},
        {"feature_rows_grpc", (double)c.feature_rows_grpc},
        {"feature_bytes_grpc", (double)c.feature_bytes_grpc},
        {"feature_ring_full", (double)c.feature_ring_full},
        {"feature_puts_shm", (double)c.feature_puts_shm},
        {"feature_puts_grpc", (double)c.feature_puts_grpc},
        {"feature_put_us_shm", c.feature_put_us_shm},
        {"feature_put_us_grpc", c.feature_put_us_grpc},
        {"feature_streams_shm", (double)c.feature_streams_shm},
        {"feature_streams_grpc", (double)c.feature_streams_grpc},
        {"exchange_streams_shm", (double)c.exchange_streams_shm},
        {"exchange_streams_grpc", (double)c.exchange_streams_grpc},
        {"adaptive_off_rounds", (double)c.adaptive_off_rounds},
        {"adaptive_switch_offs", (double)c.adaptive_switch_offs},
        {"plain_measure_rounds", (double)c.plain_measure_rounds},
        {"adaptive_scores", (double)c.scores},
        {"adaptive_scored_positions", (double)c.scored_positions},
        {"adaptive_score_restarts", (double)c.score_restarts},
        {"adaptive_cost_relaxes", (double)c.cost_relaxes},
        {"kv_cache_bytes", (double)c.kv_bytes},
        {"recurrent_state_bytes", (double)c.recurrent_bytes},
        {"conv_state_bytes", (double)c.conv_bytes},
        {"strategy_state_bytes", (double)c.strategy_bytes},
        {"weight_bytes", (double)tdm_model_weight_bytes(v->rt->model)},
        {"capacity_sequences", (double)v->cap.max_sequences},
        {"capacity_budget_bytes", (double)v->cap.budget},
        {"capacity_weight_bytes", (double)v->cap.weights},
        {"capacity_workspace_bytes", (double)v->cap.workspace},
        {"capacity_sequence_bytes", (double)v->cap.seq_total},
        {"capacity_sequence_kv_bytes", (double)v->cap.seq.kv},
        {"capacity_sequence_recurrent_bytes", (double)v->cap.seq.recurrent},
        {"capacity_sequence_conv_bytes", (double)v->cap.seq.conv},
        {"capacity_sequence_strategy_bytes", (double)v->cap.seq.strategy},
        {"reserved_bytes", (double)c.reserved_bytes},
        {"refused_queue_full", (double)c.refused},
        {"snapshots_exported", (double)c.snapshots_exported},
        {"snapshots_imported", (double)c.snapshots_imported},
        {"snapshots_expired", (double)c.snapshots_expired},
        {"snapshots_waiting", (double)c.snapshots_waiting},
        {"prefix_cache_hits", (double)c.prefix_hits},
        {"prefix_cache_misses", (double)c.prefix_misses},
        {"prefix_cache_tokens_saved", (double)c.prefix_tokens_saved},
        {"prefix_cache_blocks_stored", (double)c.prefix_stored},
        {"prefix_cache_evictions", (double)c.prefix_evictions},
        {"prefix_cache_blocks", (double)c.prefix_blocks},
        {"prefix_cache_bytes", (double)c.prefix_bytes},
        {"prefix_cache_memory_bytes", (double)v->prefix_cache_memory},
        {"prefix_fetches", (double)atomic_load(&v->fetch.fetches)},
        {"prefix_fetch_failures", (double)atomic_load(&v->fetch.failures)},
        {"prefix_fetch_blocks", (double)atomic_load(&v->fetch.blocks)},
        {"prefix_fetch_bytes", (double)atomic_load(&v->fetch.bytes)},
        {"prefix_fetch_ms", atomic_load(&v->fetch.ms_total)},
        {"prefix_fetch_recomputed", (double)atomic_load(&v->fetch.recomputed)},
        {"prefix_fetch_bandwidth_bytes_per_ms", verifier_fetch_bandwidth(v)},
        {"prefill_tokens_per_ms", verifier_fetch_prefill_rate(v)},
    };
    size_t n = tdm_service_counters_copy(all, TDM_ARRAY_LEN(all), out, max);
    /* The round's timeline, a phase at a time (vsched_phase's order). */
    static const char *const names[VSCHED_PHASES][3] = {
        {"round_idle_us_total", "round_idle_p50_us", "round_idle_p99_us"},
        {"round_admit_us_total", "round_admit_p50_us", "round_admit_p99_us"},
        {"round_prefill_us_total", "round_prefill_p50_us", "round_prefill_p99_us"},
        {"round_wait_us_total", "round_wait_p50_us", "round_wait_p99_us"},
        {"round_step_us_total", "round_step_p50_us", "round_step_p99_us"},
        {"round_commit_us_total", "round_commit_p50_us", "round_commit_p99_us"},
        {"round_send_us_total", "round_send_p50_us", "round_send_p99_us"},
    };
    for (int p = 0; p < VSCHED_PHASES && n + 3 <= max; p++) {
        out[n++] = (tdm_service_counter){names[p][0], c.phase_total_us[p]};
        out[n++] = (tdm_service_counter){names[p][1], c.phase_p50_us[p]};
        out[n++] = (tdm_service_counter){names[p][2], c.phase_p99_us[p]};
    }
    /* The commit phase by part (vsched_commit_part's order). */
    static const char *const parts[VSCHED_COMMIT_PARTS] = {
        "round_commit_verdicts_us_total", "round_commit_emit_us_total",
        "round_commit_retire_us_total", "round_commit_states_us_total"};
    for (int p = 0; p < VSCHED_COMMIT_PARTS && n < max; p++)
        out[n++] = (tdm_service_counter){parts[p], c.commit_part_us[p]};
    return n;
}

/* Accepted drafts by position in their block: a label per position, which
 * the Describe counters cannot carry. */
static void collect_positions(void *arg, tdm_metrics_writer *w)
{
    verifier *v = arg;
    vsched_counters c;
    vsched_get_counters(v->sched, &c);
    tdm_metrics_write_family(w, "tandem_spec_decode_num_accepted_tokens_per_pos_total",
                             TDM_METRIC_COUNTER,
                             "Draft tokens accepted at each position of their block (0: the "
                             "first draft).");
    for (int j = 0; j < v->max_draft && j < TDM_MAX_DRAFT_BLOCK; j++) {
        char pos[16];
        snprintf(pos, sizeof(pos), "%d", j);
        tdm_metric_label l = {"position", pos};
        tdm_metrics_write_sample(w, "", &l, 1, (double)c.accepted_at[j]);
    }
}

static void load(void *arg, uint32_t *active, uint32_t *free_slots)
{
    verifier *v = arg;
    vsched_counters c;
    vsched_get_counters(v->sched, &c);
    uint64_t busy = c.active + c.waiting;
    *active = (uint32_t)busy;
    *free_slots = busy < (uint64_t)v->max_sequences ? (uint32_t)(v->max_sequences - busy) : 0;
}

/* Resolves what gpu_memory and max_sequences left to the start (auto on a
 * cuda backend: the device's free memory), checks max_sequences against the
 * capacity, logs the arithmetic and reserves the workspace of the largest
 * step, so that serving allocates only sequence state (reserved by
 * admission). */
static tdm_status account_memory(verifier *v, tdm_service *svc, tdm_error *err)
{
    const tdm_cfg *cfg = tdm_service_config(svc);
    tdm_backend *be = v->rt->backend;
    tdm_status rc;
    if (tdm_cfg_int(cfg, "gpu_memory") == 0) {
        size_t free_b = 0, total_b = 0;
        if (!be->mem_info || be->mem_info(be->ctx, &free_b, &total_b) != 0)
            return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                                 "gpu_memory auto: the %s backend cannot tell its free memory; "
                                 "set gpu_memory",
                                 be->name);
        if ((rc = tdm_svc_verifier_capacity(cfg, &v->cap_params, &v->cap, err)) != TDM_OK)
            return rc;
        const size_t budget = v->cap.weights + free_b / 10 * 9;
        char value[32], reason[512], f[32], w[32], t[32];
        snprintf(value, sizeof(value), "%zu", budget);
        snprintf(reason, sizeof(reason),
                 "rule gpu-memory-from-device, at start: the weights (%s) plus 90%% of the %s "
                 "free on the %s device of %s once they were loaded",
                 tdm_capacity_bytes_str(v->cap.weights, w, sizeof(w)),
                 tdm_capacity_bytes_str(free_b, f, sizeof(f)), be->name,
                 tdm_capacity_bytes_str(total_b, t, sizeof(t)));
        if ((rc = tdm_service_set_resolved(svc, "gpu_memory", value, reason, err)) != TDM_OK)
            return rc;
    }
    if ((rc = tdm_svc_verifier_capacity(cfg, &v->cap_params, &v->cap, err)) != TDM_OK)
        return rc;
    char g[512];
    tdm_cfg_describe(cfg, "gpu_memory", g, sizeof(g));
    if (v->cap.max_sequences < 1) {
        char u[32];
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "%s holds no sequence: weights, workspace and one sequence need %s", g,
                             tdm_capacity_bytes_str(v->cap.used, u, sizeof(u)));
    }
    if (tdm_cfg_int(cfg, "max_sequences") == 0) {
        char value[32], reason[700], s[32];
        snprintf(value, sizeof(value), "%d", v->cap.max_sequences);
        snprintf(reason, sizeof(reason),
                 "rule max-sequences-from-capacity, at start: the capacity of %s: %d sequences "
                 "of %s each besides weights and workspace",
                 g, v->cap.max_sequences, tdm_capacity_bytes_str(v->cap.seq_total, s, sizeof(s)));
        if ((rc = tdm_service_set_resolved(svc, "max_sequences", value, reason, err)) != TDM_OK)
            return rc;
    }
    if ((rc = tdm_svc_check_capacity(cfg, &v->cap, err)) != TDM_OK)
        return rc;
    char text[2048];
    tdm_capacity_format(&v->cap_params, &v->cap, "", text, sizeof(text));
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        tdm_log_info("verifier", "capacity: %s", line);
    const int rows =
        tdm_capacity_step_rows((int)tdm_cfg_int(cfg, "max_sequences"), v->cap_params.max_draft);
    if ((rc = tdm_model_reserve_workspace(v->rt->model, rows, err)) != TDM_OK)
        return tdm_error_prefix(err, "the workspace of %d rows (%s)", rows, g);
    return TDM_OK;
}

/* SIGTERM, or Replica.Drain: refuse new requests, tell every running Run
 * (the gateway then moves it to a peer through a snapshot), and wait until
 * nothing is left here (moved or finished) or the grace is spent; what is
 * left then is cancelled by the server's shutdown, and the gateway resumes
 * it elsewhere from its tokens. */
static void drain(void *arg, int grace_ms)
{
    verifier *v = arg;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int before = vsched_in_flight(v->sched);
    vsched_drain(v->sched);
    tdm_log_info("verifier",
                 "draining: %d requests in flight; waiting up to %d ms for them to "
                 "move or finish",
                 before, grace_ms);
    int left = before;
    double ms = 0;
    while (left > 0 && ms < grace_ms) {
        struct timespec nap = {0, 5 * 1000 * 1000};
        nanosleep(&nap, NULL);
        left = vsched_in_flight(v->sched);
        clock_gettime(CLOCK_MONOTONIC, &now);
        ms = (double)(now.tv_sec - t0.tv_sec) * 1e3 + (double)(now.tv_nsec - t0.tv_nsec) / 1e6;
    }
    vsched_counters c;
    vsched_get_counters(v->sched, &c);
    tdm_log_info("verifier",
                 "drained in %.0f ms: %d of %d requests left here (%llu snapshots "
                 "exported since the start)",
                 ms, left, before, (unsigned long long)c.snapshots_exported);
}

tdm_status verifier_setup(tdm_service *svc, void *arg, tdm_error *err)
{
    verifier *v = arg;
    const tdm_cfg *cfg = tdm_service_config(svc);
    const Tandem__V1__Descriptor *d = tdm_service_descriptor(svc);
    snprintf(v->replica_id, sizeof(v->replica_id), "%s", d->replica_id);
    v->trust = tdm_service_trust(svc);
    const char *model = tdm_cfg_str(cfg, "model");
    if (!model[0])
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "model is not set: the verifier needs a model directory (--model)");
    tdm_status rc = tdm_runtime_open_cfg(cfg, "verifier", &v->rt, err);
    if (rc != TDM_OK)
        return rc;
    tdm_service_set_device(svc, v->rt->device_uuid, v->rt->device_mps);
    if ((rc = account_memory(v, svc, err)) != TDM_OK)
        return rc;
    const int max_sequences = (int)tdm_cfg_int(cfg, "max_sequences");
    const size_t ws = tdm_capacity_workspace_bytes(
        &v->cap_params.cfg, tdm_capacity_step_rows(max_sequences, v->cap_params.max_draft), NULL);
    const size_t fixed = v->cap.weights + ws;
    char limits[1200], a[512], b[512], c[512], ft[256], et[256];
    snprintf(limits, sizeof(limits), "%s, %s, %s",
             tdm_cfg_describe(cfg, "max_sequences", a, sizeof(a)),
             tdm_cfg_describe(cfg, "max_waiting", b, sizeof(b)),
             tdm_cfg_describe(cfg, "gpu_memory", c, sizeof(c)));
    snprintf(v->fingerprint, sizeof(v->fingerprint), "%s", d->model_fingerprint);
    vsched_params p = {
        .model = v->rt->model,
        .runtime = v->rt,
        .strategy = v->rt->strategy,
        .max_draft = (int)tdm_cfg_int(cfg, "max_draft_tokens"),
        .max_sequences = (int)tdm_cfg_int(cfg, "max_sequences"),
        .draft_timeout_ms = (int)tdm_cfg_int(cfg, "draft_timeout"),
        .drafter_reopen_tries = (int)tdm_cfg_int(cfg, "drafter_reopen_tries"),
        .max_context = (int)tdm_cfg_int(cfg, "max_context"),
        .prefill_chunk = (int)tdm_cfg_int(cfg, "prefill_chunk"),
        .tls = tdm_service_tls(svc),
        .trust = tdm_service_trust(svc),
        .max_message_bytes = tdm_cfg_int(cfg, "max_message_size"),
        .device_uuid = v->rt->device_uuid,
        .device_mps = v->rt->device_mps,
        .host_id = tdm_service_descriptor(svc)->host_id,
        .cpus = tdm_service_descriptor(svc)->cpus,
        .seq_fixed_bytes = v->cap.seq_total - v->cap.seq.kv,
        .kv_bytes_per_position = v->cap.seq.kv / (size_t)v->cap_params.max_context,
        .seq_budget_bytes = v->cap.budget > fixed ? v->cap.budget - fixed : 0,
        .max_waiting = (int)tdm_cfg_int(cfg, "max_waiting"),
        .limits = limits,
        .fingerprint = v->fingerprint,
        .snapshot_ttl_ms = tdm_cfg_int(cfg, "snapshot_ttl"),
        .max_snapshots = (int)tdm_cfg_int(cfg, "max_snapshots"),
        .max_snapshot_bytes = tdm_cfg_int(cfg, "max_snapshot_bytes"),
        .prefix_cache = tdm_cfg_bool(cfg, "prefix_cache"),
        .prefix_cache_block = (int)tdm_cfg_int(cfg, "prefix_cache_block"),
        .prefix_cache_memory = (size_t)tdm_cfg_int(cfg, "prefix_cache_memory"),
        .feature_transport = tdm_feat_transport_parse(tdm_cfg_str(cfg, "feature_transport")),
        .feature_shm_bytes = (uint64_t)tdm_cfg_int(cfg, "feature_shm_size"),
        .feature_setting = tdm_cfg_describe(cfg, "feature_transport", ft, sizeof(ft)),
        .exchange_transport = tdm_lane_transport_parse(tdm_cfg_str(cfg, "exchange_transport")),
        .exchange_setting = tdm_cfg_describe(cfg, "exchange_transport", et, sizeof(et)),
    };
    if ((rc = vsched_create(&p, &v->sched, err)) != TDM_OK)
        return rc;
    v->max_sequences = p.max_sequences;
    v->prefix_cache_memory = p.prefix_cache ? p.prefix_cache_memory : 0;
    v->max_draft = p.max_draft;
    v->max_message_bytes = p.max_message_bytes;
    v->fetch.bandwidth_prior = tdm_cfg_int(cfg, "prefix_fetch_bandwidth");
    v->fetch.latency_ms = tdm_cfg_int(cfg, "prefix_fetch_latency");
    v->fetch.timeout_ms = tdm_cfg_int(cfg, "prefix_fetch_timeout");
    v->fetch.tls = p.tls;
    v->max_context = p.max_context > 1
                         ? p.max_context
                         : tdm_model_get_config(v->rt->model)->max_position_embeddings;
    tdm_metrics *m = tdm_service_metrics(svc);
    tdm_metrics_outcomes_init(&v->outcomes, m, "tandem_verifier_request_success_total",
                              "Run requests that completed, by finish reason.",
                              "tandem_verifier_request_errors_total",
                              "Run requests that failed, by status code.");
    v->queue_time = tdm_metrics_histogram(
        m, "tandem_request_queue_time_seconds", "Time a request waited for a place in the batch.",
        NULL, tdm_metrics_latency_buckets, tdm_metrics_n_latency_buckets);
    tdm_metrics_add_collector(m, collect_positions, v);
    tdm_service_set_counters(svc, counters, v);
    tdm_service_set_load(svc, load, v);
    tdm_service_set_drain(svc, drain, v);
    rc =
        tdm_rpc_server_add_server_stream(tdm_service_server(svc), "/tandem.v1.Verifier/Run",
                                         &tandem__v1__run_request__descriptor, run_handler, v, err);
    if (rc == TDM_OK)
        rc = verifier_snapshot_register(tdm_service_server(svc), v, err);
    if (rc == TDM_OK)
        rc = verifier_prefix_register(tdm_service_server(svc), v, err);
    return rc;
}
