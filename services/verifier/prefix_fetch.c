/*
 * prefix_fetch.c - prompt prefixes between verifiers: FetchPrefix (a peer
 * asks for this verifier's cached states of a prefix) and the fetch a Run
 * makes before its request is queued, when the gateway named a verifier
 * that holds more of the prompt (RunRequest.prefix_source) and the cost
 * rule says fetching beats prefilling.
 *
 * The cost rule, per request: the prompt's first `want` tokens (whole
 * blocks, at most all of the prompt but its last token, and no more than
 * the source claims) of which this cache holds `have`;
 *   prefill_ms = (want - have) / prefill rate
 *   fetch_ms   = prefix_fetch_latency + want / block x block bytes / bandwidth
 * and the fetch runs only when fetch_ms < prefill_ms. The prefill rate is
 * the scheduler's measured one (tokens per ms over its prefill calls;
 * PREFILL_PRIOR_TOK_PER_MS until one ran). The bandwidth is measured over
 * past fetches (bytes over each fetch's whole time, a moving average), and
 * prefix_fetch_bandwidth until one completed. A fetch carries the whole
 * chain of blocks (a cache entry needs its parents), so its bytes count
 * every block of `want`, the ones held here too.
 *
 * Failures never fail the request: a source that is dead, slow (past
 * prefix_fetch_timeout), refuses, or sends anything the assembler refuses
 * (wrong model or layout, a chunk out of order, a CRC32C or SHA-256 that
 * does not match) or a prefix of other tokens costs only the time spent;
 * the request prefills what its cache lacks, as without a source.
 *
 * Threading: both sides run on RPC handler threads. FetchPrefix copies the
 * blocks out of the cache under the cache's lock (vsched_prefix_export),
 * then digests and streams them without it. A Run's fetch does the network
 * on its own handler thread before vsched_submit and inserts under the
 * cache's lock (vsched_prefix_import); the scheduler thread never waits on
 * a peer, only, at most, for one host copy into or out of the cache.
 */
#include "verifier.h"

#include "alloc.h"
#include "capacity.h"
#include "log.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOG "verifier"

/* Prefill throughput assumed until this verifier measured its own: 4000
 * tokens a second, low for a GPU (so a fetch is tried when it may pay; the
 * measurement then decides) and high enough for a CPU run not to fetch
 * what it prefills faster. */
#define PREFILL_PRIOR_TOK_PER_MS 4.0

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void atomic_add_double(_Atomic double *d, double v)
{
    double prev = atomic_load(d);
    while (!atomic_compare_exchange_weak(d, &prev, prev + v))
        ;
}

/* ---- the holder: FetchPrefix ------------------------------------------------------------ */

static tdm_status fetch_handler(tdm_rpc_call *call, const ProtobufCMessage *msg, tdm_error *err,
                                void *user)
{
    verifier *v = user;
    const Tandem__V1__FetchPrefixRequest *req = (const Tandem__V1__FetchPrefixRequest *)msg;
    /* Peers only: a verifier that fetches, or a gateway (tools). */
    tdm_status rc = tdm_trust_check_internal(v->trust, call, "verifier", NULL);
    if (rc != TDM_OK && (rc = tdm_trust_check_internal(v->trust, call, "gateway", err)) != TDM_OK)
        return rc;
    const int block = vsched_prefix_block(v->sched);
    if (block == 0)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "this verifier runs with prefix_cache off");
    if (req->block != (uint32_t)block)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "block: the caller keeps blocks of %u tokens, this verifier's "
                             "prefix_cache_block is %d",
                             req->block, block);
    if (req->n_tokens > (size_t)v->max_context)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "tokens: %zu, this verifier holds at most %d positions", req->n_tokens,
                             v->max_context);
    uint64_t chunk;
    if ((rc = verifier_chunk_bytes(v, req->chunk_bytes, &chunk, err)) != TDM_OK)
        return rc;
    int32_t *tokens = tdm_xmalloc((req->n_tokens + 1) * sizeof(int32_t));
    for (size_t i = 0; i < req->n_tokens; i++)
        tokens[i] = req->tokens[i] > INT32_MAX ? -1 : (int32_t)req->tokens[i];
    tdm_snap_layout x;
    uint8_t *payload = NULL;
    rc = vsched_prefix_export(v->sched, tokens, (int)req->n_tokens, &x, &payload, err);
    free(tokens);
    if (rc == TDM_OK && x.committed == 0)
        rc = tdm_error_set(err, TDM_ERR_NOT_FOUND,
                           "no block of the %zu tokens asked for is cached here", req->n_tokens);
    if (rc != TDM_OK) {
        tdm_snap_layout_free(&x);
        free(payload);
        return rc;
    }
    tdm_snap_seal(&x, payload); /* off the scheduler thread: here */
    char id[128];
    static _Atomic unsigned serial;
    snprintf(id, sizeof(id), "%.60s/prefix/%u", v->replica_id, atomic_fetch_add(&serial, 1) + 1);
    uint32_t n = 0;
    rc = verifier_send_chunks(call, id, &x, payload, chunk, NULL, &n, err);
    if (rc == TDM_OK)
        tdm_log_info(LOG, "sent prefix %s (%u tokens, %llu bytes, %u chunks)", id, x.committed,
                     (unsigned long long)x.total_bytes, n);
    tdm_snap_layout_free(&x);
    free(payload);
    return rc;
}

tdm_status verifier_prefix_register(tdm_rpc_server *server, verifier *v, tdm_error *err)
{
    return tdm_rpc_server_add_server_stream(server, "/tandem.v1.Verifier/FetchPrefix",
                                            &tandem__v1__fetch_prefix_request__descriptor,
                                            fetch_handler, v, err);
}

/* ---- the fetcher ------------------------------------------------------------------------ */

double verifier_fetch_bandwidth(const verifier *v)
{
    const double m = atomic_load(&v->fetch.bytes_per_ms);
    return m > 0 ? m : (double)v->fetch.bandwidth_prior / 1e3;
}

double verifier_fetch_prefill_rate(verifier *v)
{
    const double r = vsched_prefill_rate(v->sched);
    return r > 0 ? r : PREFILL_PRIOR_TOK_PER_MS;
}

/* Streams the prefix from the source into an assembler; *bytes gets the
 * payload bytes received. */
static tdm_status fetch_stream(verifier *v, const Tandem__V1__PrefixSource *src,
                               const int32_t *tokens, int want, tdm_snap_layout *l,
                               uint8_t **payload, uint64_t *bytes, tdm_error *err)
{
    const int block = vsched_prefix_block(v->sched);
    tdm_rpc_channel_options co = {
        .target = src->address, .tls = v->fetch.tls, .max_message_bytes = v->max_message_bytes};
    tdm_rpc_channel *ch = NULL;
    tdm_status rc = tdm_rpc_channel_create(&co, &ch, err);
    if (rc != TDM_OK)
        return rc;
    Tandem__V1__FetchPrefixRequest req = TANDEM__V1__FETCH_PREFIX_REQUEST__INIT;
    req.n_tokens = (size_t)want;
    req.tokens = (uint32_t *)tokens; /* ids are non-negative: same bits */
    req.block = (uint32_t)block;
    tdm_rpc_metadata md;
    tdm_rpc_call_options so = {.timeout_ms = v->fetch.timeout_ms, .metadata = &md};
    so.n_metadata = tdm_trust_metadata(v->trust, &md);
    tdm_rpc_stream *st = NULL;
    rc = tdm_rpc_stream_open(ch, "/tandem.v1.Verifier/FetchPrefix", &req.base,
                             &tandem__v1__snapshot_chunk__descriptor, &so, &st, err);
    tdm_snap_asm *a =
        tdm_snap_asm_create_prefix(tdm_model_checkpoint_config(v->rt->model), v->fingerprint,
                                   (uint32_t)v->max_context, (uint32_t)block);
    while (rc == TDM_OK) {
        ProtobufCMessage *m = NULL;
        tdm_error rerr = {0};
        const tdm_status r = tdm_rpc_stream_read(st, &m, &rerr);
        if (!m) {
            if (r != TDM_OK)
                rc = tdm_error_set(err, r, "%s", rerr.msg);
            break;
        }
        const Tandem__V1__SnapshotChunk *c = (const Tandem__V1__SnapshotChunk *)m;
        *bytes += c->data.len;
        rc = tdm_snap_asm_add(a, c, err);
        protobuf_c_message_free_unpacked(m, NULL);
    }
    if (rc == TDM_OK)
        rc = tdm_snap_asm_finish(a, l, payload, err);
    /* The prefix of other tokens than the prompt's is no prefix of it. */
    if (rc == TDM_OK && (l->committed > (uint32_t)want ||
                         memcmp(l->tokens, tokens, (size_t)l->committed * sizeof(int32_t)) != 0))
        rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                           "the source sent a prefix of %u tokens that is not the prompt's",
                           l->committed);
    if (st) {
        if (rc != TDM_OK)
            tdm_rpc_stream_cancel(st);
        tdm_rpc_stream_destroy(st);
    }
    tdm_snap_asm_destroy(a);
    tdm_rpc_channel_destroy(ch);
    return rc;
}

void verifier_prefix_fetch(verifier *v, const Tandem__V1__RunRequest *req)
{
    const Tandem__V1__PrefixSource *src = req->prefix_source;
    const int block = vsched_prefix_block(v->sched);
    if (!src || !src->address || !src->address[0] || block == 0 || req->snapshot_id[0])
        return;
    if (src->replica_id && strcmp(src->replica_id, v->replica_id) == 0)
        return;
    /* Whole blocks, at most all of the prompt but its last token (what
     * admission restores), no more than the source claims. */
    const int n_prompt = (int)req->n_prompt_ids;
    int want = n_prompt - 1;
    if ((int64_t)src->tokens < want)
        want = (int)src->tokens;
    want = want / block * block;
    if (want <= 0 || n_prompt > v->max_context)
        return;
    int32_t *tokens = tdm_xmalloc((size_t)want * sizeof(int32_t));
    for (int i = 0; i < want; i++) {
        if (req->prompt_ids[i] > INT32_MAX) {
            free(tokens);
            return; /* the Run refuses it */
        }
        tokens[i] = (int32_t)req->prompt_ids[i];
    }
    const int have = vsched_prefix_cached(v->sched, tokens, want);
    if (have >= want) {
        free(tokens);
        return;
    }
    const size_t block_bytes =
        tdm_capacity_prefix_block_bytes(tdm_model_checkpoint_config(v->rt->model), block);
    const double rate = verifier_fetch_prefill_rate(v), bw = verifier_fetch_bandwidth(v);
    const double prefill_ms = (want - have) / rate;
    const double fetch_ms =
        (double)v->fetch.latency_ms + (double)(want / block) * (double)block_bytes / bw;
    if (!(fetch_ms < prefill_ms)) {
        atomic_fetch_add(&v->fetch.recomputed, 1);
        tdm_log_info(LOG,
                     "request %s: prefill %d tokens (%.1f ms at %.2f tokens/ms) rather than "
                     "fetch them from %s (%.1f ms at %.0f bytes/ms)",
                     req->request_id, want - have, prefill_ms, rate, src->replica_id, fetch_ms, bw);
        free(tokens);
        return;
    }
    tdm_snap_layout l;
    memset(&l, 0, sizeof(l));
    uint8_t *payload = NULL;
    uint64_t bytes = 0;
    tdm_error err = {0};
    const double t0 = now_ms();
    tdm_status rc = fetch_stream(v, src, tokens, want, &l, &payload, &bytes, &err);
    int covered = 0;
    if (rc == TDM_OK)
        rc = vsched_prefix_import(v->sched, &l, payload, &covered, &err);
    const double ms = now_ms() - t0;
    atomic_fetch_add(&v->fetch.fetches, 1);
    atomic_add_double(&v->fetch.ms_total, ms);
    if (rc == TDM_OK) {
        atomic_fetch_add(&v->fetch.blocks, l.committed / (uint32_t)block);
        atomic_fetch_add(&v->fetch.bytes, l.total_bytes);
        const double m = (double)l.total_bytes / (ms > 0.001 ? ms : 0.001),
                     prev = atomic_load(&v->fetch.bytes_per_ms);
        atomic_store(&v->fetch.bytes_per_ms, prev > 0 ? 0.8 * prev + 0.2 * m : m);
        tdm_log_info(LOG,
                     "request %s: fetched %u prompt tokens from %s (%llu bytes in %.1f ms; "
                     "prefilling %d would take %.1f ms); %d cached now",
                     req->request_id, l.committed, src->replica_id,
                     (unsigned long long)l.total_bytes, ms, want - have, prefill_ms, covered);
    } else {
        atomic_fetch_add(&v->fetch.failures, 1);
        tdm_log_warn(LOG,
                     "request %s: fetching the prompt's prefix from %s failed (%s); it is "
                     "prefilled here",
                     req->request_id, src->replica_id, err.msg);
    }
    tdm_snap_layout_free(&l);
    free(payload);
    free(tokens);
}
