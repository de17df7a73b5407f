/*
 * snapshot_rpc.c - the verifier's ExportSnapshot and ImportSnapshot: a
 * running request's state (taken between rounds by the scheduler) sent as
 * chunks, and received chunks checked and assembled (engine/snapshot.h)
 * into a sequence that a Run with its snapshot_id continues; and the
 * chunking of a snapshot that FetchPrefix (prefix_fetch.c) shares.
 *
 * Both are peer-only, like Run: a gateway or another verifier (a drain moves
 * sequences between verifiers) proves its role (service/trust.h).
 */
#include "verifier.h"

#include "alloc.h"
#include "log.h"
#include "request_check.h"
#include "tandem/v1/verifier.pb-c.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define LOG "verifier"

/* Overhead of a chunk message besides its data (ids, offsets, CRC, tags). */
#define CHUNK_OVERHEAD 1024

/* A gateway or a verifier: the peers that move sequences. */
static tdm_status check_peer(const verifier *v, const tdm_rpc_call *call, tdm_error *err)
{
    if (tdm_trust_check_internal(v->trust, call, "gateway", NULL) == TDM_OK)
        return TDM_OK;
    return tdm_trust_check_internal(v->trust, call, "verifier", err);
}

/* The continuation as a message pointing into c (and `sp`, `stops`). */
static void continuation_to_proto(const vsched_continuation *c,
                                  Tandem__V1__SnapshotContinuation *out,
                                  Tandem__V1__SamplingParams *sp, uint32_t *stops)
{
    tandem__v1__snapshot_continuation__init(out);
    tandem__v1__sampling_params__init(sp);
    out->request_id = (char *)c->request_id;
    out->prompt_tokens = c->prompt_tokens;
    out->max_tokens = c->max_tokens;
    sp->temperature = c->sampling.temperature;
    sp->top_p = c->sampling.top_p;
    sp->top_k = c->sampling.top_k;
    sp->seed_choice_case = TANDEM__V1__SAMPLING_PARAMS__SEED_CHOICE_SEED;
    sp->seed = c->seed;
    out->sampling = sp;
    for (int i = 0; i < c->n_stop; i++)
        stops[i] = (uint32_t)c->stop_ids[i];
    out->n_stop_token_ids = (size_t)c->n_stop;
    out->stop_token_ids = stops;
    out->generated = c->generated;
    out->next_token = (uint32_t)c->next_token;
}

static tdm_status continuation_from_proto(const Tandem__V1__SnapshotContinuation *in,
                                          vsched_continuation *c, tdm_error *err)
{
    memset(c, 0, sizeof(*c));
    if (strlen(in->request_id) >= sizeof(c->request_id))
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "continuation.request_id: %zu bytes, at most %zu",
                             strlen(in->request_id), sizeof(c->request_id) - 1);
    if (in->n_stop_token_ids > TDM_ARRAY_LEN(c->stop_ids))
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "continuation.stop_token_ids: %zu ids, at most %zu",
                             in->n_stop_token_ids, TDM_ARRAY_LEN(c->stop_ids));
    if (in->next_token > INT32_MAX)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "continuation.next_token: %u is not a token id", in->next_token);
    tdm_status rc = tdm_req_check_sampling(in->sampling, err);
    if (rc != TDM_OK)
        return tdm_error_prefix(err, "continuation.sampling");
    snprintf(c->request_id, sizeof(c->request_id), "%s", in->request_id);
    c->prompt_tokens = in->prompt_tokens;
    c->max_tokens = in->max_tokens;
    c->generated = in->generated;
    c->next_token = (int32_t)in->next_token;
    c->sampling = tdm_req_sampling(in->sampling);
    c->seed = in->sampling && in->sampling->seed_choice_case ==
                                  TANDEM__V1__SAMPLING_PARAMS__SEED_CHOICE_SEED
                  ? in->sampling->seed
                  : 0;
    c->n_stop = (int)in->n_stop_token_ids;
    for (size_t i = 0; i < in->n_stop_token_ids; i++) {
        if (in->stop_token_ids[i] > INT32_MAX)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "continuation.stop_token_ids[%zu]: %u is not a token id", i,
                                 in->stop_token_ids[i]);
        c->stop_ids[i] = (int32_t)in->stop_token_ids[i];
    }
    return TDM_OK;
}

tdm_status verifier_chunk_bytes(const verifier *v, uint32_t asked, uint64_t *out, tdm_error *err)
{
    /* Data chunks stay under the message limit with room for their fields. */
    uint64_t cap = TDM_SNAPSHOT_MAX_CHUNK;
    if (v->max_message_bytes > 2 * CHUNK_OVERHEAD &&
        (uint64_t)v->max_message_bytes - CHUNK_OVERHEAD < cap)
        cap = (uint64_t)v->max_message_bytes - CHUNK_OVERHEAD;
    *out = asked ? asked : TDM_SNAPSHOT_DEFAULT_CHUNK;
    if (*out > cap)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "chunk_bytes: %u, this verifier sends at most %llu a chunk "
                             "(under max_message_size %lld)",
                             asked, (unsigned long long)cap, (long long)v->max_message_bytes);
    return TDM_OK;
}

tdm_status verifier_send_chunks(tdm_rpc_call *call, const char *id, const tdm_snap_layout *l,
                                const uint8_t *payload, uint64_t chunk,
                                Tandem__V1__SnapshotContinuation *cont, uint32_t *n, tdm_error *err)
{
    const size_t nt = l->n_tensors;
    Tandem__V1__SnapshotTensor *pt = tdm_xcalloc(nt + 1, sizeof(*pt));
    Tandem__V1__SnapshotTensor **pp = tdm_xcalloc(nt + 1, sizeof(*pp));
    uint64_t(*shapes)[3] = tdm_xcalloc(nt + 1, sizeof(*shapes));
    Tandem__V1__SnapshotLayout layout;
    tdm_snap_layout_to_proto(l, &layout, pt, pp, shapes);
    *n = tdm_snap_chunk_count(l->total_bytes, (uint32_t)chunk);
    tdm_status rc = TDM_OK;
    for (uint32_t i = 0; i < *n && rc == TDM_OK; i++) {
        Tandem__V1__SnapshotChunk c = TANDEM__V1__SNAPSHOT_CHUNK__INIT;
        c.snapshot_id = (char *)id;
        c.index = i;
        c.last = i == *n - 1;
        if (i == 0) {
            c.layout = &layout;
            c.continuation = cont;
        } else {
            const uint64_t off = (uint64_t)(i - 1) * chunk, left = l->total_bytes - off;
            c.offset = off;
            c.data.data = (uint8_t *)payload + off;
            c.data.len = (size_t)(left < chunk ? left : chunk);
            c.crc32c = tdm_crc32c(0, c.data.data, c.data.len);
        }
        rc = tdm_rpc_call_write(call, &c.base, err);
    }
    free(pt);
    free(pp);
    free(shapes);
    return rc;
}

static tdm_status export_handler(tdm_rpc_call *call, const ProtobufCMessage *msg, tdm_error *err,
                                 void *user)
{
    verifier *v = user;
    const Tandem__V1__ExportSnapshotRequest *req = (const Tandem__V1__ExportSnapshotRequest *)msg;
    tdm_status rc = check_peer(v, call, err);
    if (rc != TDM_OK)
        return rc;
    if (!req->request_id[0])
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "request_id is empty");
    uint64_t chunk;
    if ((rc = verifier_chunk_bytes(v, req->chunk_bytes, &chunk, err)) != TDM_OK)
        return rc;
    char id[128];
    static _Atomic unsigned serial;
    snprintf(id, sizeof(id), "%.40s/%.60s/%u", v->replica_id, req->request_id,
             atomic_fetch_add(&serial, 1) + 1);
    vsched_snapshot x;
    if ((rc = vsched_export(v->sched, req->request_id, req->detach, id, &x, err)) != TDM_OK)
        return rc;

    Tandem__V1__SnapshotContinuation cont;
    Tandem__V1__SamplingParams sp;
    uint32_t stops[TDM_ARRAY_LEN(x.cont.stop_ids)];
    continuation_to_proto(&x.cont, &cont, &sp, stops);
    uint32_t n = 0;
    rc = verifier_send_chunks(call, id, &x.layout, x.payload, chunk, &cont, &n, err);
    if (rc == TDM_OK)
        tdm_log_info(
            LOG, "request %s: exported snapshot %s (%u positions, %llu bytes, %u chunks)%s",
            req->request_id, id, x.layout.committed, (unsigned long long)x.layout.total_bytes, n,
            req->detach ? "; the request ends here" : "");
    vsched_snapshot_free(&x);
    return rc;
}

static tdm_status import_handler(tdm_rpc_call *call, tdm_error *err, void *user)
{
    verifier *v = user;
    tdm_status rc = check_peer(v, call, err);
    if (rc != TDM_OK)
        return rc;
    const tdm_model_config *cfg = tdm_model_checkpoint_config(v->rt->model);
    tdm_snap_asm *a = tdm_snap_asm_create(cfg, v->fingerprint, (uint32_t)v->max_context);
    vsched_continuation cont;
    bool have_cont = false;
    for (;;) {
        ProtobufCMessage *m = NULL;
        if ((rc = tdm_rpc_call_read(call, &m, err)) != TDM_OK)
            break;
        if (!m)
            break; /* the client half-closed: the stream is complete */
        const Tandem__V1__SnapshotChunk *c = (const Tandem__V1__SnapshotChunk *)m;
        rc = tdm_snap_asm_add(a, c, err);
        if (rc == TDM_OK && c->index == 0) {
            if (!c->continuation)
                rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                   "chunk 0: the continuation is missing (a verifier's snapshot "
                                   "carries the request with its state)");
            else
                rc = continuation_from_proto(c->continuation, &cont, err);
            have_cont = rc == TDM_OK;
        }
        protobuf_c_message_free_unpacked(m, NULL);
        if (rc != TDM_OK)
            break;
    }
    tdm_snap_layout layout;
    uint8_t *payload = NULL;
    if (rc == TDM_OK)
        rc = tdm_snap_asm_finish(a, &layout, &payload, err);
    char id[128];
    static _Atomic unsigned serial;
    if (rc == TDM_OK) {
        TDM_ASSERT(have_cont); /* chunk 0 came, or finish refuses */
        if (tdm_snap_asm_id(a)[0])
            snprintf(id, sizeof(id), "%s", tdm_snap_asm_id(a));
        else
            snprintf(id, sizeof(id), "%.60s/import/%u", v->replica_id,
                     atomic_fetch_add(&serial, 1) + 1);
        const uint32_t committed = layout.committed;
        rc = vsched_import(v->sched, id, &layout, payload, &cont, err);
        if (rc == TDM_OK) {
            tdm_log_info(LOG, "imported snapshot %s (%u positions)", id, committed);
            Tandem__V1__ImportSnapshotResponse resp = TANDEM__V1__IMPORT_SNAPSHOT_RESPONSE__INIT;
            resp.snapshot_id = id;
            resp.committed_position = committed;
            rc = tdm_rpc_call_write(call, &resp.base, err);
        }
    }
    if (rc != TDM_OK)
        tdm_log_warn(LOG, "snapshot import refused: %s", err->msg);
    tdm_snap_asm_destroy(a);
    return rc;
}

tdm_status verifier_snapshot_register(tdm_rpc_server *server, verifier *v, tdm_error *err)
{
    tdm_status rc = tdm_rpc_server_add_server_stream(
        server, "/tandem.v1.Verifier/ExportSnapshot",
        &tandem__v1__export_snapshot_request__descriptor, export_handler, v, err);
    if (rc == TDM_OK)
        rc = tdm_rpc_server_add_bidi(server, "/tandem.v1.Verifier/ImportSnapshot",
                                     &tandem__v1__snapshot_chunk__descriptor, import_handler, v,
                                     err);
    return rc;
}
