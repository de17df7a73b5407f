/*
 * move.c - see move.h.
 */
#include "move.h"

#include "tandem/v1/verifier.pb-c.h"

#include <stdio.h>
#include <string.h>

tdm_status gw_move_snapshot(tdm_rpc_channel *from, tdm_rpc_channel *to,
                            const tdm_rpc_call_options *co, const char *request_id,
                            gw_move_result *out, tdm_error *err)
{
    memset(out, 0, sizeof(*out));
    Tandem__V1__ExportSnapshotRequest xr = TANDEM__V1__EXPORT_SNAPSHOT_REQUEST__INIT;
    xr.request_id = (char *)request_id;
    xr.detach = true;
    tdm_rpc_stream *ex = NULL, *im = NULL;
    tdm_status rc = tdm_rpc_stream_open(from, "/tandem.v1.Verifier/ExportSnapshot", &xr.base,
                                        &tandem__v1__snapshot_chunk__descriptor, co, &ex, err);
    if (rc != TDM_OK)
        return tdm_error_prefix(err, "export");
    for (;;) {
        ProtobufCMessage *m = NULL;
        tdm_error rerr = {0};
        rc = tdm_rpc_stream_read(ex, &m, &rerr);
        if (!m) {
            if (rc != TDM_OK)
                tdm_error_set(err, rc, "export: %s", rerr.msg);
            else if (!im)
                rc = tdm_error_set(err, TDM_ERR_UNAVAILABLE, "export: the stream ended empty");
            break;
        }
        const Tandem__V1__SnapshotChunk *c = (const Tandem__V1__SnapshotChunk *)m;
        if (!im) {
            /* The first chunk: the request has left `from`. */
            out->detached = true;
            if (c->continuation)
                out->generated = c->continuation->generated;
            rc = tdm_rpc_stream_open(to, "/tandem.v1.Verifier/ImportSnapshot", NULL,
                                     &tandem__v1__import_snapshot_response__descriptor, co, &im,
                                     err);
            if (rc != TDM_OK) {
                tdm_error_prefix(err, "import");
                protobuf_c_message_free_unpacked(m, NULL);
                break;
            }
        }
        out->bytes += c->data.len;
        out->chunks++;
        rc = tdm_rpc_stream_write(im, m, err);
        protobuf_c_message_free_unpacked(m, NULL);
        if (rc != TDM_OK) {
            tdm_error_prefix(err, "import");
            break;
        }
    }
    if (rc == TDM_OK && (rc = tdm_rpc_stream_close_send(im, err)) != TDM_OK)
        tdm_error_prefix(err, "import");
    if (rc == TDM_OK) {
        ProtobufCMessage *m = NULL;
        tdm_error rerr = {0};
        rc = tdm_rpc_stream_read(im, &m, &rerr);
        if (m) {
            const Tandem__V1__ImportSnapshotResponse *r =
                (const Tandem__V1__ImportSnapshotResponse *)m;
            snprintf(out->snapshot_id, sizeof(out->snapshot_id), "%s", r->snapshot_id);
            protobuf_c_message_free_unpacked(m, NULL);
            /* Read on to the call's end: its status, so that nothing is
             * left to cancel. */
            tdm_error eerr = {0};
            ProtobufCMessage *extra = NULL;
            if ((rc = tdm_rpc_stream_read(im, &extra, &eerr)) != TDM_OK || extra) {
                if (extra)
                    protobuf_c_message_free_unpacked(extra, NULL);
                rc = tdm_error_set(err, rc != TDM_OK ? rc : TDM_ERR_INTERNAL,
                                   "import: %s", extra ? "a second answer" : eerr.msg);
            }
        } else {
            if (rc == TDM_OK)
                rc = TDM_ERR_UNAVAILABLE;
            tdm_error_set(err, rc, "import: %s", rerr.msg[0] ? rerr.msg : "no answer");
        }
    }
    if (im)
        tdm_rpc_stream_destroy(im);
    tdm_rpc_stream_destroy(ex);
    return rc;
}
