/*
 * api.c - the gateway's public methods: Generate (tokenize, pick a verifier
 * and a compatible drafter, relay the verifier's tokens as text deltas, stop
 * strings), Tokenize, Detokenize and GetModelInfo.
 */
#include "api.h"
#include "alloc.h"

#include "compat.h"
#include "log.h"
#include "request_check.h"
#include "tandem/v1/verifier.pb-c.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOG "gateway"

struct gw_api {
    gw_registry *reg;
    const Tandem__V1__Descriptor *self; /* this gateway's (tokenizer fingerprint) */
    tdm_tokenizer *tok; /* NULL: text in and out are unavailable */
    char tok_fp[65];
    int32_t stop_ids[2];
    int n_stop_ids;
    uint32_t default_max_tokens;
    const tdm_rpc_tls *tls;
    int64_t max_message_bytes;
    pthread_mutex_t mu;
    struct channel {
        char address[256];
        tdm_rpc_channel *ch;
    } *channels;
    size_t n_channels;
    uint64_t requests, completed, failed, cancelled, tokens;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* One channel per verifier address, shared by every request to it. */
static tdm_rpc_channel *channel_for(gw_api *g, const char *address, tdm_error *err)
{
    pthread_mutex_lock(&g->mu);
    for (size_t i = 0; i < g->n_channels; i++)
        if (strcmp(g->channels[i].address, address) == 0) {
            tdm_rpc_channel *ch = g->channels[i].ch;
            pthread_mutex_unlock(&g->mu);
            return ch;
        }
    struct channel *grown = tdm_xrealloc(g->channels, (g->n_channels + 1) * sizeof(*grown));
    g->channels = grown;
    tdm_rpc_channel_options o = {
        .target = address, .tls = g->tls, .max_message_bytes = g->max_message_bytes};
    tdm_rpc_channel *ch = NULL;
    if (tdm_rpc_channel_create(&o, &ch, err) != TDM_OK) {
        pthread_mutex_unlock(&g->mu);
        return NULL;
    }
    snprintf(g->channels[g->n_channels].address, sizeof(g->channels[0].address), "%s", address);
    g->channels[g->n_channels++].ch = ch;
    pthread_mutex_unlock(&g->mu);
    return ch;
}

/* ---- prompts ---------------------------------------------------------------- */

static tdm_status need_tokenizer(const gw_api *g, const char *what, tdm_error *err)
{
    if (g->tok)
        return TDM_OK;
    return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                         "%s needs a tokenizer, and this gateway has none (set tokenizer)", what);
}

static tdm_status encode_chat(const gw_api *g, const Tandem__V1__ChatPrompt *chat, int32_t **ids,
                              size_t *n, tdm_error *err)
{
    if (!chat || chat->n_messages == 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "chat.messages is empty");
    tdm_tok_message *m = calloc(chat->n_messages, sizeof(*m));
    if (!m)
        return tdm_error_oom(err, chat->n_messages * sizeof(*m), "%zu chat messages",
                             chat->n_messages);
    for (size_t i = 0; i < chat->n_messages; i++) {
        m[i].role = chat->messages[i]->role;
        m[i].content = chat->messages[i]->content;
    }
    tdm_status rc = tdm_tok_encode_chat(g->tok, m, chat->n_messages, chat->add_generation_prompt,
                                        ids, n, err);
    free(m);
    return rc;
}

/* The prompt of a Generate request as token ids (caller frees *ids). */
static tdm_status prompt_ids(const gw_api *g, const Tandem__V1__GenerateRequest *req,
                             int32_t **ids, size_t *n, tdm_error *err)
{
    *ids = NULL;
    *n = 0;
    tdm_status rc;
    switch (req->prompt_case) {
    case TANDEM__V1__GENERATE_REQUEST__PROMPT_TEXT:
        if ((rc = need_tokenizer(g, "a text prompt", err)) != TDM_OK)
            return rc;
        rc = tdm_tok_encode(g->tok, req->text, strlen(req->text), ids, n, err);
        return rc == TDM_OK ? rc : tdm_error_prefix(err, "prompt text");
    case TANDEM__V1__GENERATE_REQUEST__PROMPT_CHAT:
        if ((rc = need_tokenizer(g, "a chat prompt", err)) != TDM_OK)
            return rc;
        rc = encode_chat(g, req->chat, ids, n, err);
        return rc == TDM_OK ? rc : tdm_error_prefix(err, "chat prompt");
    case TANDEM__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS: {
        const Tandem__V1__TokenIds *t = req->token_ids;
        size_t cnt = t ? t->n_ids : 0;
        *ids = malloc((cnt ? cnt : 1) * sizeof(int32_t));
        if (!*ids)
            return tdm_error_oom(err, cnt * sizeof(int32_t), "%zu prompt token ids", cnt);
        size_t vocab = g->tok ? tdm_tok_vocab_size(g->tok) : (size_t)INT32_MAX;
        for (size_t i = 0; i < cnt; i++) {
            if (t->ids[i] >= vocab) {
                free(*ids);
                *ids = NULL;
                return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                     "token_ids[%zu] = %u is outside the vocabulary (0..%zu)", i,
                                     t->ids[i], vocab - 1);
            }
            (*ids)[i] = (int32_t)t->ids[i];
        }
        *n = cnt;
        return TDM_OK;
    }
    default:
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "prompt is not set: give text, token_ids or chat");
    }
}

/* ---- stop strings ------------------------------------------------------------ */

/* Generated text so far and how much of it the client has. */
typedef struct textbuf {
    char *s;
    size_t len, cap, sent;
} textbuf;

static bool textbuf_add(textbuf *b, const char *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s)
            return false;
        b->s = s;
        b->cap = cap;
    }
    memcpy(b->s + b->len, p, n);
    b->len += n;
    b->s[b->len] = 0;
    return true;
}

/* Where the first stop string starts in the unsent text (searching a little
 * back for strings split across deltas), or -1. */
static ssize_t find_stop(const textbuf *b, char *const *stop, size_t n_stop, size_t max_stop)
{
    size_t from = b->sent > max_stop ? b->sent - max_stop : 0;
    ssize_t best = -1;
    for (size_t i = 0; i < n_stop; i++) {
        const char *hit = memmem(b->s + from, b->len - from, stop[i], strlen(stop[i]));
        if (hit && (best < 0 || hit - b->s < best))
            best = hit - b->s;
    }
    return best;
}

/* How much text can go out now: all of it but a tail that could still grow
 * into a stop string. */
static size_t safe_end(const textbuf *b, char *const *stop, size_t n_stop)
{
    size_t hold = 0;
    for (size_t i = 0; i < n_stop; i++) {
        size_t L = strlen(stop[i]);
        for (size_t k = L - 1; k > hold; k--)
            if (k <= b->len && memcmp(b->s + b->len - k, stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    size_t end = b->len - hold;
    return end > b->sent ? end : b->sent;
}

/* ---- Generate ------------------------------------------------------------------ */

static tdm_status send_chunk(tdm_rpc_call *call, const uint32_t *ids, size_t n, const char *text,
                             size_t text_len, uint32_t index, tdm_error *err)
{
    Tandem__V1__TokenChunk chunk = TANDEM__V1__TOKEN_CHUNK__INIT;
    chunk.n_ids = n;
    chunk.ids = (uint32_t *)ids;
    char *t = strndup(text ? text : "", text_len);
    if (!t)
        return tdm_error_oom(err, text_len, "a text delta");
    chunk.text = t;
    chunk.index = index;
    Tandem__V1__GenerateResponse r = TANDEM__V1__GENERATE_RESPONSE__INIT;
    r.chunk_case = TANDEM__V1__GENERATE_RESPONSE__CHUNK_TOKENS;
    r.tokens = &chunk;
    tdm_status rc = tdm_rpc_call_write(call, &r.base, err);
    free(t);
    return rc;
}

static tdm_status validate(const Tandem__V1__GenerateRequest *req, tdm_error *err)
{
    tdm_status rc = tdm_req_check_sampling(req->sampling, err);
    if (rc == TDM_OK)
        rc = tdm_req_check_max_tokens(req->max_tokens, err);
    if (rc != TDM_OK)
        return rc;
    for (size_t i = 0; i < req->n_stop; i++)
        if (!req->stop[i][0] || strlen(req->stop[i]) > 256)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "stop[%zu] must be 1..256 bytes long", i);
    if (req->n_stop > 16)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "at most 16 stop strings, got %zu",
                             req->n_stop);
    return TDM_OK;
}

static tdm_status generate(tdm_rpc_call *call, const ProtobufCMessage *msg, tdm_error *err,
                           void *user)
{
    gw_api *g = user;
    const Tandem__V1__GenerateRequest *req = (const Tandem__V1__GenerateRequest *)msg;
    double t0 = now_ms();
    __atomic_fetch_add(&g->requests, 1, __ATOMIC_RELAXED);
    tdm_status rc = validate(req, err);
    if (rc != TDM_OK)
        return rc;
    if (req->n_stop > 0 && (rc = need_tokenizer(g, "stop strings", err)) != TDM_OK)
        return rc;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if ((rc = prompt_ids(g, req, &ids, &n_ids, err)) != TDM_OK)
        return rc;
    if (n_ids == 0) {
        free(ids);
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "the prompt is empty");
    }

    /* Pick the replicas. */
    Tandem__V1__SpeculationMode mode =
        req->speculation ? req->speculation->mode : TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_AUTO;
    bool want = mode != TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_OFF;
    gw_pick pick;
    if ((rc = gw_registry_pick(g->reg, want, g->self, &pick, err)) != TDM_OK) {
        free(ids);
        return rc;
    }
    char note[1100] = "";
    uint32_t block = 0;
    if (want && !pick.drafter_id[0]) {
        if (mode == TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_ON) {
            rc = tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                               "speculation was asked for, but no drafter can pair with verifier "
                               "%s: %s",
                               pick.verifier_id, pick.no_drafter);
            goto out;
        }
        snprintf(note, sizeof(note), "off: %s", pick.no_drafter);
    } else if (!want) {
        snprintf(note, sizeof(note), "off: not requested");
    }
    if (pick.drafter_id[0]) {
        block = req->speculation && req->speculation->block_size ? req->speculation->block_size
                                                                  : pick.block_size;
        if (block > pick.max_draft) {
            rc = tdm_compat_check_request_block(block, "speculation.block_size", pick.verifier_id,
                                            pick.max_draft, err);
            goto out;
        }
    }

    /* Hand the request to the verifier. */
    Tandem__V1__RunRequest run = TANDEM__V1__RUN_REQUEST__INIT;
    char rid[64];
    if (req->request_id[0])
        run.request_id = req->request_id;
    else {
        snprintf(rid, sizeof(rid), "req-%llx-%llu", (unsigned long long)(t0 * 1000.0),
                 (unsigned long long)__atomic_load_n(&g->requests, __ATOMIC_RELAXED));
        run.request_id = rid;
    }
    run.n_prompt_ids = n_ids;
    run.prompt_ids = (uint32_t *)ids;
    run.max_tokens = req->max_tokens ? req->max_tokens : g->default_max_tokens;
    run.sampling = req->sampling;
    uint32_t stop_ids[2];
    if (!req->ignore_eos) {
        for (int i = 0; i < g->n_stop_ids; i++)
            stop_ids[i] = (uint32_t)g->stop_ids[i];
        run.n_stop_token_ids = (size_t)g->n_stop_ids;
        run.stop_token_ids = stop_ids;
    }
    Tandem__V1__DrafterAssignment da = TANDEM__V1__DRAFTER_ASSIGNMENT__INIT;
    if (pick.drafter_id[0]) {
        da.replica_id = pick.drafter_id;
        da.address = pick.drafter_addr;
        da.block_size = block;
        da.fixed_block_size = req->speculation && req->speculation->fixed_block_size;
        run.drafter = &da;
    }
    tdm_rpc_channel *ch = channel_for(g, pick.verifier_addr, err);
    if (!ch) {
        rc = err->code;
        goto out;
    }
    tdm_rpc_call_options co = {.parent = call};
    tdm_rpc_stream *stream = NULL;
    rc = tdm_rpc_stream_open(ch, "/tandem.v1.Verifier/Run", &run.base,
                             &tandem__v1__run_response__descriptor, &co, &stream, err);
    if (rc != TDM_OK) {
        tdm_error_prefix(err, "verifier %s", pick.verifier_id);
        goto out;
    }

    /* Relay: ids as they come, text as far as no stop string can start. */
    tdm_tok_stream *ts = NULL;
    if (g->tok)
        tdm_tok_stream_create(g->tok, true, &ts, NULL);
    textbuf tb = {0};
    size_t max_stop = 0;
    for (size_t i = 0; i < req->n_stop; i++)
        if (strlen(req->stop[i]) > max_stop)
            max_stop = strlen(req->stop[i]);
    double t_first = 0;
    uint32_t n_sent_ids = 0;
    bool stopped = false;
    Tandem__V1__RunComplete *complete = NULL;
    ProtobufCMessage *m = NULL;
    for (;;) {
        tdm_error rerr = {0};
        rc = tdm_rpc_stream_read(stream, &m, &rerr);
        if (!m) {
            if (rc == TDM_OK)
                rc = tdm_error_set(err, TDM_ERR_UNAVAILABLE,
                                   "verifier %s ended the stream without completing",
                                   pick.verifier_id);
            else
                tdm_error_set(err, rc, "verifier %s: %s", pick.verifier_id, rerr.msg);
            break;
        }
        Tandem__V1__RunResponse *resp = (Tandem__V1__RunResponse *)m;
        if (resp->chunk_case == TANDEM__V1__RUN_RESPONSE__CHUNK_COMPLETE) {
            complete = resp->complete;
            rc = TDM_OK;
            break; /* m is freed after the final message is written */
        }
        if (resp->chunk_case != TANDEM__V1__RUN_RESPONSE__CHUNK_TOKENS || !resp->tokens) {
            protobuf_c_message_free_unpacked(m, NULL);
            m = NULL;
            continue;
        }
        const Tandem__V1__TokenChunk *tc = resp->tokens;
        size_t send_n = tc->n_ids;
        for (size_t i = 0; ts && i < tc->n_ids; i++) {
            const char *piece;
            size_t plen;
            if (tdm_tok_stream_push(ts, (int32_t)tc->ids[i], &piece, &plen, NULL) == TDM_OK)
                textbuf_add(&tb, piece, plen);
            if (req->n_stop > 0) {
                ssize_t at = find_stop(&tb, req->stop, req->n_stop, max_stop);
                if (at >= 0) {
                    /* Cut the text at the stop string; ids up to the token
                     * that completed it. */
                    tb.len = (size_t)at;
                    send_n = i + 1;
                    stopped = true;
                    break;
                }
            }
        }
        size_t end = stopped ? tb.len : (req->n_stop ? safe_end(&tb, req->stop, req->n_stop) : tb.len);
        if (t_first == 0)
            t_first = now_ms();
        rc = send_chunk(call, tc->ids, send_n, tb.s ? tb.s + tb.sent : "", end - tb.sent,
                        n_sent_ids, err);
        tb.sent = end;
        n_sent_ids += (uint32_t)send_n;
        protobuf_c_message_free_unpacked(m, NULL);
        m = NULL;
        if (rc != TDM_OK || stopped)
            break;
    }
    tdm_rpc_stream_cancel(stream); /* a no-op once the verifier finished */
    if (rc == TDM_OK && (complete || stopped)) {
        /* Whatever text was held back for stop strings that never came. */
        const char *rest;
        size_t rlen = 0;
        if (ts && !stopped) {
            tdm_tok_stream_flush(ts, &rest, &rlen);
            textbuf_add(&tb, rest, rlen);
        }
        if (tb.len > tb.sent)
            rc = send_chunk(call, NULL, 0, tb.s + tb.sent, tb.len - tb.sent, n_sent_ids, err);
        Tandem__V1__RequestStats st = TANDEM__V1__REQUEST_STATS__INIT;
        if (complete && complete->stats)
            st = *complete->stats;
        st.generated_tokens = n_sent_ids;
        st.time_to_first_token_ms = t_first > 0 ? t_first - t0 : 0;
        st.total_ms = now_ms() - t0;
        st.verifier = pick.verifier_id;
        if (note[0])
            st.speculation = note;
        Tandem__V1__GenerateComplete gc = TANDEM__V1__GENERATE_COMPLETE__INIT;
        gc.finish_reason = stopped ? TANDEM__V1__FINISH_REASON__FINISH_REASON_STOP
                                   : complete->finish_reason;
        gc.stats = &st;
        gc.request_id = run.request_id;
        Tandem__V1__GenerateResponse r = TANDEM__V1__GENERATE_RESPONSE__INIT;
        r.chunk_case = TANDEM__V1__GENERATE_RESPONSE__CHUNK_COMPLETE;
        r.complete = &gc;
        if (rc == TDM_OK)
            rc = tdm_rpc_call_write(call, &r.base, err);
        __atomic_fetch_add(&g->tokens, n_sent_ids, __ATOMIC_RELAXED);
    }
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    tdm_rpc_stream_destroy(stream);
    tdm_tok_stream_destroy(ts);
    free(tb.s);
out:
    gw_registry_unpick(g->reg, &pick);
    free(ids);
    if (rc == TDM_OK)
        __atomic_fetch_add(&g->completed, 1, __ATOMIC_RELAXED);
    else if (tdm_rpc_call_cancelled(call))
        __atomic_fetch_add(&g->cancelled, 1, __ATOMIC_RELAXED);
    else
        __atomic_fetch_add(&g->failed, 1, __ATOMIC_RELAXED);
    return rc;
}

/* ---- Tokenize, Detokenize, GetModelInfo ------------------------------------------ */

static void free_ids(void *arg)
{
    free(arg);
}

static tdm_status tokenize(tdm_rpc_call *call, const ProtobufCMessage *msg,
                           ProtobufCMessage **resp, tdm_error *err, void *user)
{
    gw_api *g = user;
    const Tandem__V1__TokenizeRequest *req = (const Tandem__V1__TokenizeRequest *)msg;
    tdm_status rc = need_tokenizer(g, "Tokenize", err);
    if (rc != TDM_OK)
        return rc;
    int32_t *ids = NULL;
    size_t n = 0;
    if (req->input_case == TANDEM__V1__TOKENIZE_REQUEST__INPUT_TEXT)
        rc = tdm_tok_encode(g->tok, req->text, strlen(req->text), &ids, &n, err);
    else if (req->input_case == TANDEM__V1__TOKENIZE_REQUEST__INPUT_CHAT)
        rc = encode_chat(g, req->chat, &ids, &n, err);
    else
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "input is not set: give text or chat");
    if (rc != TDM_OK)
        return rc;
    tdm_rpc_call_defer(call, free_ids, ids);
    Tandem__V1__TokenizeResponse *out = tdm_rpc_call_alloc(call, sizeof(*out));
    tandem__v1__tokenize_response__init(out);
    out->n_ids = n;
    out->ids = (uint32_t *)ids;
    *resp = &out->base;
    return TDM_OK;
}

static tdm_status detokenize(tdm_rpc_call *call, const ProtobufCMessage *msg,
                             ProtobufCMessage **resp, tdm_error *err, void *user)
{
    gw_api *g = user;
    const Tandem__V1__DetokenizeRequest *req = (const Tandem__V1__DetokenizeRequest *)msg;
    tdm_status rc = need_tokenizer(g, "Detokenize", err);
    if (rc != TDM_OK)
        return rc;
    for (size_t i = 0; i < req->n_ids; i++)
        if (req->ids[i] > INT32_MAX)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "ids[%zu] = %u is out of range",
                                 i, req->ids[i]);
    char *text = NULL;
    rc = tdm_tok_decode(g->tok, (const int32_t *)req->ids, req->n_ids, false, &text, NULL, err);
    if (rc != TDM_OK)
        return rc == TDM_ERR_OUT_OF_RANGE ? tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s", err->msg) : rc;
    tdm_rpc_call_defer(call, free_ids, text);
    Tandem__V1__DetokenizeResponse *out = tdm_rpc_call_alloc(call, sizeof(*out));
    tandem__v1__detokenize_response__init(out);
    out->text = text;
    *resp = &out->base;
    return TDM_OK;
}

static tdm_status model_info(tdm_rpc_call *call, const ProtobufCMessage *msg,
                             ProtobufCMessage **resp, tdm_error *err, void *user)
{
    (void)msg;
    gw_api *g = user;
    gw_pick pick;
    Tandem__V1__ModelInfo *out = tdm_rpc_call_alloc(call, sizeof(*out));
    tandem__v1__model_info__init(out);
    tdm_status rc = gw_registry_pick(g->reg, true, g->self, &pick, err);
    if (rc != TDM_OK)
        return rc;
    gw_registry_unpick(g->reg, &pick);
    gw_model_info_fill(g->reg, pick.verifier_id, call, out);
    out->tokenizer_fingerprint = g->tok_fp;
    if (g->tok)
        out->vocab_size = (uint32_t)tdm_tok_vocab_size(g->tok);
    uint32_t *eos = tdm_rpc_call_alloc(call, 2 * sizeof(uint32_t));
    for (int i = 0; i < g->n_stop_ids; i++)
        eos[i] = (uint32_t)g->stop_ids[i];
    out->n_eos_token_ids = (size_t)g->n_stop_ids;
    out->eos_token_ids = eos;
    *resp = &out->base;
    return TDM_OK;
}

/* ---- life cycle ------------------------------------------------------------------ */

tdm_status gw_api_create(tdm_service *svc, gw_registry *reg, gw_api **out, tdm_error *err)
{
    *out = NULL;
    const tdm_cfg *cfg = tdm_service_config(svc);
    gw_api *g = tdm_xcalloc(1, sizeof(*g));
    pthread_mutex_init(&g->mu, NULL);
    g->reg = reg;
    g->self = tdm_service_descriptor(svc);
    g->tls = tdm_service_tls(svc);
    g->max_message_bytes = tdm_cfg_int(cfg, "max_message_size");
    g->default_max_tokens = (uint32_t)tdm_cfg_int(cfg, "default_max_tokens");
    const char *tok = tdm_cfg_str(cfg, "tokenizer");
    if (tok[0]) {
        tdm_status rc = tdm_tok_load(tok, &g->tok, err);
        if (rc != TDM_OK) {
            gw_api_destroy(g);
            return tdm_error_prefix(err, "tokenizer %s", tok);
        }
        /* The same fingerprint replicas put in their descriptors. */
        if ((rc = tdm_compat_tokenizer_fingerprint_file(tok, g->tok_fp, err)) != TDM_OK) {
            gw_api_destroy(g);
            return tdm_error_prefix(err, "tokenizer %s", tok);
        }
        const tdm_tok_specials *sp = tdm_tok_specials_get(g->tok);
        if (sp->im_end >= 0)
            g->stop_ids[g->n_stop_ids++] = sp->im_end;
        if (sp->endoftext >= 0 && sp->endoftext != sp->im_end)
            g->stop_ids[g->n_stop_ids++] = sp->endoftext;
        tdm_log_info(LOG, "tokenizer %s (fingerprint %.12s, %zu tokens)", tok, g->tok_fp,
                     tdm_tok_vocab_size(g->tok));
    } else {
        tdm_log_warn(LOG, "no tokenizer configured: only token-id prompts can be served");
    }
    tdm_rpc_server *srv = tdm_service_server(svc);
    tdm_status rc;
    if ((rc = tdm_rpc_server_add_server_stream(srv, "/tandem.v1.Gateway/Generate",
                                               &tandem__v1__generate_request__descriptor,
                                               generate, g, err)) != TDM_OK ||
        (rc = tdm_rpc_server_add_unary(srv, "/tandem.v1.Gateway/Tokenize",
                                       &tandem__v1__tokenize_request__descriptor, tokenize, g,
                                       err)) != TDM_OK ||
        (rc = tdm_rpc_server_add_unary(srv, "/tandem.v1.Gateway/Detokenize",
                                       &tandem__v1__detokenize_request__descriptor, detokenize,
                                       g, err)) != TDM_OK ||
        (rc = tdm_rpc_server_add_unary(srv, "/tandem.v1.Gateway/GetModelInfo",
                                       &tandem__v1__get_model_info_request__descriptor,
                                       model_info, g, err)) != TDM_OK) {
        gw_api_destroy(g);
        return rc;
    }
    *out = g;
    return TDM_OK;
}

void gw_api_destroy(gw_api *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->n_channels; i++)
        tdm_rpc_channel_destroy(g->channels[i].ch);
    free(g->channels);
    tdm_tok_destroy(g->tok);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

size_t gw_api_counters(gw_api *g, tdm_service_counter *out, size_t max)
{
    tdm_service_counter all[] = {
        {"generate_requests", (double)__atomic_load_n(&g->requests, __ATOMIC_RELAXED)},
        {"generate_completed", (double)__atomic_load_n(&g->completed, __ATOMIC_RELAXED)},
        {"generate_failed", (double)__atomic_load_n(&g->failed, __ATOMIC_RELAXED)},
        {"generate_cancelled", (double)__atomic_load_n(&g->cancelled, __ATOMIC_RELAXED)},
        {"generated_tokens", (double)__atomic_load_n(&g->tokens, __ATOMIC_RELAXED)},
    };
    return tdm_service_counters_copy(all, TDM_ARRAY_LEN(all), out, max);
}
