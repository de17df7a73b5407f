/*
 * api.c - the gateway's public methods: Generate (tokenize, pick a verifier
 * and a compatible drafter, relay the verifier's tokens as text deltas, stop
 * strings), Tokenize, Detokenize and GetModelInfo.
 */
#include "api.h"
#include "alloc.h"

#include "compat.h"
#include "log.h"
#include "move.h"
#include "request_check.h"
#include "tandem/v1/verifier.pb-c.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOG "gateway"

/* A channel to one verifier instance, shared by every request to it. */
typedef struct gw_chan {
    char address[256];
    char instance[72]; /* the replica instance it was opened for */
    tdm_rpc_channel *ch;
    int refs; /* the table while live, each request on it (under gw_api.mu) */
} gw_chan;

struct gw_api {
    gw_registry *reg;
    const Tandem__V1__Descriptor *self; /* this gateway's (tokenizer fingerprint) */
    tdm_tokenizer *tok;                 /* NULL: text in and out are unavailable */
    char tok_fp[65];
    int32_t stop_ids[2];
    int n_stop_ids;
    uint32_t default_max_tokens;
    uint32_t max_prompt_tokens; /* 0: the verifier's context decides */
    const tdm_trust *trust;
    const tdm_rpc_tls *tls;
    int64_t max_message_bytes;
    pthread_mutex_t mu;
    gw_chan **channels; /* (n_channels) the live ones */
    size_t n_channels;
    uint64_t requests, completed, failed, cancelled, tokens;
    uint64_t moved; /* requests that changed verifier mid-stream (drains, crashes) */
    /* metrics (families in the service's registry) */
    tdm_metrics_outcomes outcomes; /* Generate requests by finish reason and error code */
    tdm_metric *ttft, *itl, *e2e;  /* time to first token, between tokens, whole request */
    tdm_metric *prompt_tokens, *in_flight;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The channel to a verifier instance (a new reference). A replica that
 * restarted (a new instance at the same address) gets a fresh channel at
 * once, instead of the old one's reconnect back-off; the old one leaves the
 * table and closes when its last request ends. */
static gw_chan *channel_get(gw_api *g, const char *address, const char *instance, tdm_error *err)
{
    pthread_mutex_lock(&g->mu);
    gw_chan *old = NULL;
    for (size_t i = 0; i < g->n_channels; i++)
        if (strcmp(g->channels[i]->address, address) == 0) {
            if (strcmp(g->channels[i]->instance, instance) == 0) {
                gw_chan *c = g->channels[i];
                c->refs++;
                pthread_mutex_unlock(&g->mu);
                return c;
            }
            old = g->channels[i];
            g->channels[i] = g->channels[--g->n_channels];
            break;
        }
    bool close_old = old && --old->refs == 0;
    tdm_rpc_channel_options o = {
        .target = address, .tls = g->tls, .max_message_bytes = g->max_message_bytes};
    tdm_rpc_channel *ch = NULL;
    gw_chan *c = NULL;
    if (tdm_rpc_channel_create(&o, &ch, err) == TDM_OK) {
        c = tdm_xcalloc(1, sizeof(*c));
        snprintf(c->address, sizeof(c->address), "%s", address);
        snprintf(c->instance, sizeof(c->instance), "%s", instance);
        c->ch = ch;
        c->refs = 2; /* the table, the caller */
        g->channels = tdm_xrealloc(g->channels, (g->n_channels + 1) * sizeof(*g->channels));
        g->channels[g->n_channels++] = c;
    }
    pthread_mutex_unlock(&g->mu);
    if (close_old) {
        tdm_rpc_channel_destroy(old->ch);
        free(old);
    }
    return c;
}

static void channel_put(gw_api *g, gw_chan *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&g->mu);
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last) {
        tdm_rpc_channel_destroy(c->ch);
        free(c);
    }
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
    tdm_status rc =
        tdm_tok_encode_chat(g->tok, m, chat->n_messages, chat->add_generation_prompt, ids, n, err);
    free(m);
    return rc;
}

/* The prompt of a Generate request as token ids (caller frees *ids). */
static tdm_status prompt_ids(const gw_api *g, const Tandem__V1__GenerateRequest *req, int32_t **ids,
                             size_t *n, tdm_error *err)
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

static tdm_status send_chunk(const gw_sink *sink, const uint32_t *ids, size_t n, const char *text,
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
    tdm_status rc = sink->write(sink->arg, &r, err);
    free(t);
    return rc;
}

/* The relay of one request's tokens to its client: text as far as no stop
 * string can start, and the ids of the tokens whose text went out whole. */
typedef struct relay {
    tdm_tok_stream *ts; /* NULL without a tokenizer */
    textbuf tb;
    uint32_t *ids;     /* [cap] ids not yet sent */
    size_t *ends;      /* [cap] where each one's text ends in tb */
    size_t n_ids, cap; /* pending */
    uint32_t n_sent;   /* ids the client has */
    size_t max_stop;
    bool stopped;
} relay;

/* Sends the text up to `end` and the ids whose text ends there or before. */
static tdm_status relay_send(relay *rl, const gw_sink *sink, size_t end, tdm_error *err)
{
    size_t k = 0;
    while (k < rl->n_ids && rl->ends[k] <= end)
        k++;
    if (k == 0 && end <= rl->tb.sent)
        return TDM_OK;
    tdm_status rc = send_chunk(sink, rl->ids, k, rl->tb.s ? rl->tb.s + rl->tb.sent : "",
                               end - rl->tb.sent, rl->n_sent, err);
    rl->tb.sent = end;
    rl->n_sent += (uint32_t)k;
    memmove(rl->ids, rl->ids + k, (rl->n_ids - k) * sizeof(*rl->ids));
    memmove(rl->ends, rl->ends + k, (rl->n_ids - k) * sizeof(*rl->ends));
    rl->n_ids -= k;
    return rc;
}

/* Takes one chunk of ids from the verifier; sends what may go out. */
static tdm_status relay_push(relay *rl, const gw_api *g, const Tandem__V1__GenerateRequest *req,
                             const gw_sink *sink, const Tandem__V1__TokenChunk *tc, tdm_error *err)
{
    if (rl->n_ids + tc->n_ids > rl->cap) {
        rl->cap = (rl->n_ids + tc->n_ids) * 2 + 16;
        rl->ids = tdm_xrealloc(rl->ids, rl->cap * sizeof(*rl->ids));
        rl->ends = tdm_xrealloc(rl->ends, rl->cap * sizeof(*rl->ends));
    }
    for (size_t i = 0; i < tc->n_ids; i++) {
        if (rl->ts) {
            const char *piece;
            size_t plen;
            if (tdm_tok_stream_push(rl->ts, (int32_t)tc->ids[i], &piece, &plen, NULL) == TDM_OK &&
                !textbuf_add(&rl->tb, piece, plen))
                return tdm_error_oom(err, rl->tb.len + plen, "the text of a request");
        }
        rl->ids[rl->n_ids] = tc->ids[i];
        rl->ends[rl->n_ids++] = rl->tb.len;
        if (req->n_stop > 0) {
            ssize_t at = find_stop(&rl->tb, req->stop, req->n_stop, rl->max_stop);
            if (at >= 0) {
                /* Cut the text at the stop string; the ids of the tokens
                 * that reach into it are not the client's. */
                rl->tb.len = (size_t)at;
                rl->stopped = true;
                return relay_send(rl, sink, rl->tb.len, err);
            }
        }
    }
    (void)g;
    size_t end = req->n_stop ? safe_end(&rl->tb, req->stop, req->n_stop) : rl->tb.len;
    return relay_send(rl, sink, end, err);
}

/* The end of the stream: whatever text was held back for stop strings that
 * never came, and every id left. */
static tdm_status relay_flush(relay *rl, const gw_sink *sink, tdm_error *err)
{
    if (rl->ts && !rl->stopped) {
        const char *rest;
        size_t rlen = 0;
        tdm_tok_stream_flush(rl->ts, &rest, &rlen);
        if (!textbuf_add(&rl->tb, rest, rlen))
            return tdm_error_oom(err, rl->tb.len + rlen, "the text of a request");
    }
    if (!rl->stopped)
        for (size_t i = 0; i < rl->n_ids; i++)
            rl->ends[i] = rl->tb.len;
    else
        rl->n_ids = 0;
    return relay_send(rl, sink, rl->tb.len, err);
}

static void relay_free(relay *rl)
{
    tdm_tok_stream_destroy(rl->ts);
    free(rl->tb.s);
    free(rl->ids);
    free(rl->ends);
}

/* One line per request at info level: what a log reader needs to find it. */
static void log_request(const char *request_id, const gw_pick *pick, size_t prompt,
                        uint32_t generated, Tandem__V1__FinishReason fr, tdm_status rc,
                        const char *msg, double ms)
{
    const ProtobufCEnumValue *ev =
        protobuf_c_enum_descriptor_get_value(&tandem__v1__finish_reason__descriptor, (int)fr);
    tdm_log_info(LOG,
                 "request %s: verifier %s, drafter %s, prompt %zu tokens, generated %u, finish "
                 "%s, status %s%s%s, %.1f ms",
                 request_id, pick && pick->verifier_id[0] ? pick->verifier_id : "-",
                 pick && pick->drafter_id[0] ? pick->drafter_id : "-", prompt, generated,
                 ev ? ev->name + strlen("FINISH_REASON_") : "?", tdm_status_name(rc),
                 msg && msg[0] ? ": " : "", msg ? msg : "", ms);
}

static bool sink_cancelled(const gw_sink *sink)
{
    if (sink->parent && tdm_rpc_call_cancelled(sink->parent))
        return true;
    return sink->cancel && __atomic_load_n(&sink->cancel->cancelled, __ATOMIC_ACQUIRE);
}

/* Makes the verifier stream (NULL: none any more) the one gw_cancel_fire
 * cancels; false when the request was cancelled already. */
static bool sink_watch(const gw_sink *sink, tdm_rpc_stream *stream)
{
    gw_cancel *c = sink->cancel;
    if (!c)
        return true;
    pthread_mutex_lock(&c->mu);
    c->stream = stream;
    bool live = !c->cancelled;
    pthread_mutex_unlock(&c->mu);
    return live;
}

void gw_cancel_init(gw_cancel *c)
{
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->mu, NULL);
}

void gw_cancel_fire(gw_cancel *c)
{
    pthread_mutex_lock(&c->mu);
    __atomic_store_n(&c->cancelled, true, __ATOMIC_RELEASE);
    if (c->stream)
        tdm_rpc_stream_cancel(c->stream);
    pthread_mutex_unlock(&c->mu);
}

void gw_cancel_destroy(gw_cancel *c)
{
    pthread_mutex_destroy(&c->mu);
}

/* ---- moving a request between verifiers -------------------------------------- */

/* The most times one request changes verifier (drains and crashes). */
#define GW_MAX_MOVES 4

/* One change of verifier, for the stats. */
typedef struct gw_move_note {
    char from[128], to[128];
    size_t at; /* generated tokens streamed when it left */
    char how[240];
} gw_move_note;

static bool want_spec(const Tandem__V1__GenerateRequest *req)
{
    return !req->speculation ||
           req->speculation->mode != TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_OFF;
}

/* Lets go of the verifier a request leaves: its stream, channel and pick. */
static void leave_verifier(gw_api *g, const gw_sink *sink, tdm_rpc_stream **stream,
                           gw_chan **chan, gw_pick *pick, bool *picked)
{
    sink_watch(sink, NULL);
    tdm_rpc_stream_destroy(*stream);
    *stream = NULL;
    channel_put(g, *chan);
    *chan = NULL;
    gw_registry_unpick(g->reg, pick);
    *picked = false;
}

/* Whether the streamed tokens already end the request on a stop token. */
static bool ends_on_stop(const gw_api *g, const Tandem__V1__GenerateRequest *req,
                         const uint32_t *got, size_t n_got)
{
    if (req->ignore_eos || n_got == 0)
        return false;
    for (int i = 0; i < g->n_stop_ids; i++)
        if (got[n_got - 1] == (uint32_t)g->stop_ids[i])
            return true;
    return false;
}

/* The verifier `pick` (on `chan`) is draining: moves request rid's state to
 * a peer the same-role rules allow (picked into *next). True when the
 * request leaves `pick`: with its snapshot imported under snap, or (snap
 * empty) to be recomputed there because the transfer broke after the
 * request let go. False: no peer, or the export did not start; the request
 * goes on where it is. */
static bool try_move(gw_api *g, const tdm_rpc_call_options *co, const char *rid, gw_chan *chan,
                     const gw_pick *pick, bool want, size_t n_got, gw_pick *next,
                     bool *have_next, char *snap, size_t snap_len, uint32_t *generated,
                     gw_move_note *mv)
{
    tdm_error err = {0};
    gw_pick to;
    if (gw_registry_pick_peer(g->reg, want, g->self, pick, &to, &err) != TDM_OK) {
        tdm_log_info(LOG, "request %s stays on draining verifier %s: %s", rid, pick->verifier_id,
                     err.msg);
        return false;
    }
    gw_chan *tc = channel_get(g, to.verifier_addr, to.verifier_instance, &err);
    if (!tc) {
        gw_registry_unpick(g->reg, &to);
        tdm_log_info(LOG, "request %s stays on draining verifier %s: %s", rid, pick->verifier_id,
                     err.msg);
        return false;
    }
    gw_move_result mr;
    const double t0 = now_ms();
    tdm_status rc = gw_move_snapshot(chan->ch, tc->ch, co, rid, &mr, &err);
    const double ms = now_ms() - t0;
    channel_put(g, tc);
    *mv = (gw_move_note){.at = n_got};
    snprintf(mv->from, sizeof(mv->from), "%s", pick->verifier_id);
    snprintf(mv->to, sizeof(mv->to), "%s", to.verifier_id);
    if (rc == TDM_OK) {
        snprintf(snap, snap_len, "%s", mr.snapshot_id);
        *generated = mr.generated;
        mv->at = mr.generated;
        snprintf(mv->how, sizeof(mv->how), "snapshot (drain; %.1f MB in %.0f ms)",
                 (double)mr.bytes / 1e6, ms);
    } else if (mr.detached) {
        snap[0] = 0;
        snprintf(mv->how, sizeof(mv->how),
                 "recomputed (drain; the snapshot did not arrive: %.160s)", err.msg);
    } else {
        gw_registry_unpick(g->reg, &to);
        tdm_log_info(LOG, "request %s stays on draining verifier %s: %s", rid, pick->verifier_id,
                     err.msg);
        return false;
    }
    tdm_log_info(LOG, "request %s: %s -> %s: %s", rid, mv->from, mv->to, mv->how);
    *next = to;
    *have_next = true;
    return true;
}

tdm_status gw_api_generate(gw_api *g, const Tandem__V1__GenerateRequest *req, const gw_sink *sink,
                           tdm_error *err)
{
    double t0 = now_ms();
    uint64_t seq = __atomic_add_fetch(&g->requests, 1, __ATOMIC_RELAXED);
    tdm_metric_add(g->in_flight, NULL, 1);
    char rid[160];
    if (req->request_id[0] &&
        tdm_req_check_label("request_id", req->request_id, 128, NULL) == TDM_OK)
        snprintf(rid, sizeof(rid), "%s", req->request_id);
    else
        snprintf(rid, sizeof(rid), "req-%llx-%llu", (unsigned long long)(t0 * 1000.0),
                 (unsigned long long)seq);
    gw_pick pick = {0};
    bool picked = false;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    uint32_t generated = 0;
    Tandem__V1__FinishReason finish = TANDEM__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED;
    gw_chan *chan = NULL;
    tdm_rpc_stream *stream = NULL;
    relay rl = {0};
    ProtobufCMessage *m = NULL;
    Tandem__V1__RequestStats progress = TANDEM__V1__REQUEST_STATS__INIT;
    ProtobufCMessage *progress_msg = NULL; /* holds progress's strings */
    double t_first = 0, t_last = 0;
    /* What carries over when the request changes verifier mid-stream (a
     * drain moves it, a crash makes it recompute): every token the
     * verifiers streamed, where it goes next and how it continues there. */
    const uint32_t max_tokens = req->max_tokens ? req->max_tokens : g->default_max_tokens;
    uint32_t *got = NULL; /* [n_got] every generated token streamed so far */
    size_t n_got = 0, got_cap = 0;
    uint32_t *resume_ids = NULL; /* prompt + got, for a recompute */
    gw_pick from = {0};          /* the verifier the request left */
    bool have_from = false;
    gw_pick next = {0}; /* where a move goes, picked already */
    bool have_next = false;
    char cont_snapshot[128] = ""; /* continue from this imported snapshot */
    uint32_t cont_generated = 0;
    gw_move_note moves[GW_MAX_MOVES];
    int n_moves = 0;
    char served[600] = "";
    uint64_t seed = 0;
    bool have_seed = false;

    tdm_status rc = tdm_req_check_generate(req, err);
    if (rc == TDM_OK && req->n_stop > 0)
        rc = need_tokenizer(g, "stop strings", err);
    if (rc == TDM_OK)
        rc = prompt_ids(g, req, &ids, &n_ids, err);
    if (rc == TDM_OK && n_ids == 0)
        rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "the prompt is empty");
    if (rc != TDM_OK)
        goto out;

    int attempt = 0;
again:
    if (have_next) {
        pick = next;
        have_next = false;
    } else if ((rc = have_from ? gw_registry_pick_peer(g->reg, want_spec(req), g->self, &from,
                                                       &pick, err)
                               : gw_registry_pick(g->reg, want_spec(req), g->self, ids, n_ids,
                                                  &pick, err)) !=
               TDM_OK) {
        if (have_from)
            tdm_error_prefix(err, "request %s left verifier %s after %zu tokens (%s) and no "
                                  "other verifier can continue it",
                             rid, from.verifier_id, n_got, moves[n_moves - 1].how);
        goto out;
    }
    picked = true;
    if (n_moves > 0 && !moves[n_moves - 1].to[0])
        snprintf(moves[n_moves - 1].to, sizeof(moves[0].to), "%s", pick.verifier_id);
    {
        size_t used = strlen(served);
        snprintf(served + used, sizeof(served) - used, "%s%s", used ? ", " : "", pick.verifier_id);
    }
    Tandem__V1__SpeculationMode mode = req->speculation
                                           ? req->speculation->mode
                                           : TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_AUTO;
    bool want = want_spec(req);
    /* The prompt must leave room for at least the first generated token. */
    uint32_t limit = pick.max_context > 0 ? pick.max_context - 1 : UINT32_MAX;
    if (!have_from && g->max_prompt_tokens > 0 && g->max_prompt_tokens < limit)
        limit = g->max_prompt_tokens;
    if (n_ids + (cont_snapshot[0] ? 0 : n_got) > limit) {
        rc = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                           "the prompt has %zu tokens, more than the %u allowed (%s)",
                           n_ids + (cont_snapshot[0] ? 0 : n_got), limit,
                           !have_from && g->max_prompt_tokens > 0 && g->max_prompt_tokens == limit
                               ? "the gateway's max_prompt_tokens"
                               : "the verifier's max_context less one position for the first "
                                 "generated token");
        goto out;
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
        if ((rc = tdm_compat_check_request_block(block, "speculation.block_size", pick.verifier_id,
                                                 pick.max_draft, err)) != TDM_OK)
            goto out;
    }

    /* Hand the request to the verifier: new, continuing a moved snapshot,
     * or recomputing from the prompt and the tokens streamed so far (its
     * draws are keyed by seed and position, so it goes on exactly). */
    Tandem__V1__RunRequest run = TANDEM__V1__RUN_REQUEST__INIT;
    Tandem__V1__SamplingParams sp_resume = TANDEM__V1__SAMPLING_PARAMS__INIT;
    run.request_id = rid;
    run.n_prompt_ids = n_ids;
    run.prompt_ids = (uint32_t *)ids;
    run.max_tokens = max_tokens;
    run.sampling = req->sampling;
    if (cont_snapshot[0]) {
        run.snapshot_id = cont_snapshot;
        run.n_prompt_ids = 0;
        run.prompt_ids = NULL;
    } else if (n_got > 0) {
        resume_ids = tdm_xrealloc(resume_ids, (n_ids + n_got) * sizeof(uint32_t));
        memcpy(resume_ids, ids, n_ids * sizeof(uint32_t));
        memcpy(resume_ids + n_ids, got, n_got * sizeof(uint32_t));
        run.prompt_ids = resume_ids;
        run.n_prompt_ids = n_ids + n_got;
        run.generated = (uint32_t)n_got; /* not prompt: the verifier goes on as if it had them */
        if (req->sampling)
            sp_resume = *req->sampling;
        if (have_seed) {
            sp_resume.seed_choice_case = TANDEM__V1__SAMPLING_PARAMS__SEED_CHOICE_SEED;
            sp_resume.seed = seed;
        }
        run.sampling = &sp_resume;
    }
    uint32_t stop_ids[2];
    if (!req->ignore_eos) {
        for (int i = 0; i < g->n_stop_ids; i++)
            stop_ids[i] = (uint32_t)g->stop_ids[i];
        run.n_stop_token_ids = (size_t)g->n_stop_ids;
        run.stop_token_ids = stop_ids;
    }
    Tandem__V1__DrafterAssignment da = TANDEM__V1__DRAFTER_ASSIGNMENT__INIT;
    Tandem__V1__FeatureRequest da_feat;
    Tandem__V1__FeatureSpec da_specs[TDM_FEAT_MAX_SPECS], *da_spec_ptrs[TDM_FEAT_MAX_SPECS];
    Tandem__V1__DraftPassCost *da_costs[TDM_REQ_MAX_DRAFT_COSTS];
    if (pick.drafter_id[0]) {
        if (pick.features.n > 0) {
            tdm_feat_request_to_proto(&pick.features, &da_feat, da_specs, da_spec_ptrs);
            da.features = &da_feat;
        }
        da.replica_id = pick.drafter_id;
        da.address = pick.drafter_addr;
        da.device_uuid = pick.drafter_device;
        da.device_mps = pick.drafter_mps;
        da.scores = pick.drafter_scores;
        da.host_id = pick.drafter_host;
        da.cpus = pick.drafter_cpus;
        for (size_t c = 0; c < pick.n_drafter_costs; c++)
            da_costs[c] = &pick.drafter_costs[c];
        da.n_draft_pass_costs = pick.n_drafter_costs;
        da.draft_pass_costs = da_costs;
        da.block_size = block;
        da.fixed_block_size = req->speculation && req->speculation->fixed_block_size;
        run.drafter = &da;
    }
    Tandem__V1__PrefixSource ps = TANDEM__V1__PREFIX_SOURCE__INIT;
    if (pick.source_id[0]) {
        ps.replica_id = pick.source_id;
        ps.address = pick.source_addr;
        ps.tokens = pick.source_tokens;
        run.prefix_source = &ps;
    }
    if (!(chan = channel_get(g, pick.verifier_addr, pick.verifier_instance, err))) {
        rc = err->code;
        goto out;
    }
    tdm_rpc_metadata md;
    tdm_rpc_call_options co = {.parent = sink->parent, .metadata = &md};
    co.n_metadata = tdm_trust_metadata(g->trust, &md);
    rc = tdm_rpc_stream_open(chan->ch, "/tandem.v1.Verifier/Run", &run.base,
                             &tandem__v1__run_response__descriptor, &co, &stream, err);
    if (rc != TDM_OK) {
        tdm_error_prefix(err, "verifier %s", pick.verifier_id);
        goto out;
    }
    if (!sink_watch(sink, stream)) {
        rc = tdm_error_set(err, TDM_ERR_CANCELLED, "the client went away");
        goto out;
    }
    if (!have_from)
        tdm_metric_add(g->prompt_tokens, NULL, (double)n_ids);

    /* Relay: ids as they come, text as far as no stop string can start.
     * The relay outlives a move: the client sees one stream. */
    if (g->tok && !rl.ts)
        tdm_tok_stream_create(g->tok, true, &rl.ts, NULL);
    for (size_t i = 0; i < req->n_stop; i++)
        if (strlen(req->stop[i]) > rl.max_stop)
            rl.max_stop = strlen(req->stop[i]);
    Tandem__V1__RunComplete *complete = NULL;
    bool heard = false;       /* this verifier sent something */
    bool leaving = false;     /* a move took the request off this verifier */
    const char *why_move = ""; /* for the log and the stats */
    for (;;) {
        tdm_error rerr = {0};
        rc = tdm_rpc_stream_read(stream, &m, &rerr);
        if (!m && rc == TDM_ERR_UNAVAILABLE && !heard && n_got == 0 && attempt < 2 &&
            !sink_cancelled(sink)) {
            /* The verifier cannot be reached (it died, is restarting or
             * draining) and nothing was streamed: the request goes to
             * another verifier, and this one is not picked again until it
             * heartbeats. */
            tdm_log_warn(LOG, "request %s: verifier %s unreachable (%s); trying another", rid,
                         pick.verifier_id, rerr.msg);
            gw_registry_suspect(g->reg, pick.verifier_id, pick.verifier_instance);
            leave_verifier(g, sink, &stream, &chan, &pick, &picked);
            served[0] = 0;
            attempt++;
            goto again;
        }
        if (!m && leaving) {
            /* The Run that a move detached ended (ABORTED, naming the
             * snapshot) after every token up to the snapshot. */
            if (cont_snapshot[0] && cont_generated != n_got) {
                tdm_log_warn(LOG,
                             "request %s: the snapshot covers %u generated tokens but %zu were "
                             "streamed; recomputing instead",
                             rid, cont_generated, n_got);
                cont_snapshot[0] = 0;
            }
            break;
        }
        if (!m && (rc == TDM_ERR_UNAVAILABLE || rc == TDM_ERR_CANCELLED) && n_got > 0 &&
            n_moves < GW_MAX_MOVES && !sink_cancelled(sink)) {
            /* The verifier died mid-request (no snapshot possible), or its
             * shutdown cut the call after its grace (CANCELLED while our
             * client is still there): another continues from the prompt
             * and the tokens already streamed. */
            tdm_log_warn(LOG, "request %s: verifier %s failed after %zu tokens (%s); resuming "
                              "elsewhere",
                         rid, pick.verifier_id, n_got, rerr.msg);
            gw_registry_suspect(g->reg, pick.verifier_id, pick.verifier_instance);
            gw_move_note *mv = &moves[n_moves++];
            *mv = (gw_move_note){.at = n_got};
            snprintf(mv->from, sizeof(mv->from), "%s", pick.verifier_id);
            snprintf(mv->how, sizeof(mv->how), "recomputed (the verifier failed: %.180s)",
                     rerr.msg);
            leaving = true;
            why_move = "crash";
            break;
        }
        heard = true;
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
        if (resp->draining && !leaving && n_moves < GW_MAX_MOVES && !sink_cancelled(sink)) {
            leaving = try_move(g, &co, rid, chan, &pick, want, n_got, &next, &have_next,
                               cont_snapshot, sizeof(cont_snapshot), &cont_generated,
                               &moves[n_moves]);
            if (leaving) {
                n_moves++;
                why_move = "drain";
            }
        }
        if (resp->chunk_case == TANDEM__V1__RUN_RESPONSE__CHUNK_TOKENS && resp->tokens) {
            if (resp->progress) {
                /* Stats so far: what the client gets if a stop string ends it. */
                if (progress_msg)
                    protobuf_c_message_free_unpacked(progress_msg, NULL);
                progress = *resp->progress;
                progress_msg = m;
                m = NULL;
                seed = progress.seed;
                have_seed = true;
            }
            const Tandem__V1__TokenChunk *tc =
                progress_msg ? ((Tandem__V1__RunResponse *)progress_msg)->tokens : resp->tokens;
            if (n_got + tc->n_ids > got_cap) {
                got_cap = (n_got + tc->n_ids) * 2 + 64;
                got = tdm_xrealloc(got, got_cap * sizeof(uint32_t));
            }
            memcpy(got + n_got, tc->ids, tc->n_ids * sizeof(uint32_t));
            n_got += tc->n_ids;
            const double t_now = now_ms();
            if (t_first == 0)
                t_first = t_now;
            /* Inter-token latency: a chunk's tokens share the time since the
             * last chunk (a speculative round brings several at once). */
            for (size_t k = 0; t_last > 0 && k < tc->n_ids; k++)
                tdm_metric_observe(g->itl, NULL, (t_now - t_last) / 1e3 / (double)tc->n_ids);
            if (tc->n_ids > 0)
                t_last = t_now;
            rc = relay_push(&rl, g, req, sink, tc, err);
        }
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        m = NULL;
        if (rc != TDM_OK || rl.stopped)
            break;
    }
    if (leaving && rc != TDM_OK && !rl.stopped && !complete) {
        /* Continue on the next verifier; the relay and the tokens stay. */
        if (n_got >= max_tokens || ends_on_stop(g, req, got, n_got)) {
            /* Everything was streamed; only the end was lost. */
            finish = n_got >= max_tokens ? TANDEM__V1__FINISH_REASON__FINISH_REASON_LENGTH
                                         : TANDEM__V1__FINISH_REASON__FINISH_REASON_STOP;
            rc = TDM_OK;
            if (have_next)
                gw_registry_unpick(g->reg, &next);
            have_next = false;
        } else {
            tdm_log_info(LOG, "request %s: leaves verifier %s after %zu tokens (%s: %s)", rid,
                         pick.verifier_id, n_got, why_move, moves[n_moves - 1].how);
            from = pick;
            have_from = true;
            leave_verifier(g, sink, &stream, &chan, &pick, &picked);
            __atomic_fetch_add(&g->moved, 1, __ATOMIC_RELAXED);
            goto again;
        }
    }
    tdm_rpc_stream_cancel(stream); /* a no-op once the verifier finished */
    if (rc == TDM_OK && (complete || rl.stopped || finish)) {
        rc = relay_flush(&rl, sink, err);
        Tandem__V1__RequestStats st = complete && complete->stats ? *complete->stats : progress;
        st.prompt_tokens = (uint32_t)n_ids;
        st.generated_tokens = rl.n_sent;
        st.time_to_first_token_ms = t_first > 0 ? t_first - t0 : 0;
        st.total_ms = now_ms() - t0;
        st.verifier = served;
        if (note[0])
            st.speculation = note;
        char move_text[GW_MAX_MOVES][600];
        char *move_list[GW_MAX_MOVES];
        for (int i = 0; i < n_moves; i++) {
            snprintf(move_text[i], sizeof(move_text[i]), "%s -> %s at %zu tokens: %s",
                     moves[i].from, moves[i].to, moves[i].at, moves[i].how);
            move_list[i] = move_text[i];
        }
        st.n_moves = (size_t)n_moves;
        st.moves = move_list;
        Tandem__V1__GenerateComplete gc = TANDEM__V1__GENERATE_COMPLETE__INIT;
        if (rl.stopped)
            finish = TANDEM__V1__FINISH_REASON__FINISH_REASON_STOP;
        else if (complete)
            finish = complete->finish_reason;
        gc.finish_reason = finish;
        gc.stats = &st;
        gc.request_id = rid;
        Tandem__V1__GenerateResponse r = TANDEM__V1__GENERATE_RESPONSE__INIT;
        r.chunk_case = TANDEM__V1__GENERATE_RESPONSE__CHUNK_COMPLETE;
        r.complete = &gc;
        if (rc == TDM_OK)
            rc = sink->write(sink->arg, &r, err);
    }
    generated = rl.n_sent;
    __atomic_fetch_add(&g->tokens, generated, __ATOMIC_RELAXED);
    if (rc == TDM_OK && t_first > 0)
        tdm_metric_observe(g->ttft, NULL, (t_first - t0) / 1e3);
out:
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    if (progress_msg)
        protobuf_c_message_free_unpacked(progress_msg, NULL);
    if (stream) {
        sink_watch(sink, NULL);
        tdm_rpc_stream_destroy(stream);
    }
    channel_put(g, chan);
    relay_free(&rl);
    if (picked)
        gw_registry_unpick(g->reg, &pick);
    if (have_next)
        gw_registry_unpick(g->reg, &next);
    free(ids);
    free(got);
    free(resume_ids);
    const bool cancelled = rc != TDM_OK && sink_cancelled(sink);
    if (rc == TDM_OK)
        __atomic_fetch_add(&g->completed, 1, __ATOMIC_RELAXED);
    else if (cancelled)
        __atomic_fetch_add(&g->cancelled, 1, __ATOMIC_RELAXED);
    else
        __atomic_fetch_add(&g->failed, 1, __ATOMIC_RELAXED);
    tdm_metrics_outcome(&g->outcomes, cancelled ? TDM_ERR_CANCELLED : rc, (int)finish);
    if (rc == TDM_OK)
        tdm_metric_observe(g->e2e, NULL, (now_ms() - t0) / 1e3);
    tdm_metric_add(g->in_flight, NULL, -1);
    log_request(rid, picked ? &pick : NULL, n_ids, generated, finish, rc,
                rc == TDM_OK ? NULL : err->msg, now_ms() - t0);
    return rc;
}

static tdm_status write_call(void *arg, const Tandem__V1__GenerateResponse *r, tdm_error *err)
{
    return tdm_rpc_call_write(arg, &r->base, err);
}

static tdm_status generate(tdm_rpc_call *call, const ProtobufCMessage *msg, tdm_error *err,
                           void *user)
{
    gw_api *g = user;
    tdm_status rc = tdm_trust_check_client(g->trust, call, err);
    if (rc != TDM_OK)
        return rc;
    gw_sink sink = {.write = write_call, .arg = call, .parent = call};
    return gw_api_generate(g, (const Tandem__V1__GenerateRequest *)msg, &sink, err);
}

/* ---- Tokenize, Detokenize, GetModelInfo ------------------------------------------ */

static void free_ids(void *arg)
{
    free(arg);
}

static tdm_status tokenize(tdm_rpc_call *call, const ProtobufCMessage *msg, ProtobufCMessage **resp,
                           tdm_error *err, void *user)
{
    gw_api *g = user;
    const Tandem__V1__TokenizeRequest *req = (const Tandem__V1__TokenizeRequest *)msg;
    tdm_status rc = tdm_trust_check_client(g->trust, call, err);
    if (rc == TDM_OK)
        rc = need_tokenizer(g, "Tokenize", err);
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
    tdm_status rc = tdm_trust_check_client(g->trust, call, err);
    if (rc == TDM_OK)
        rc = need_tokenizer(g, "Detokenize", err);
    if (rc != TDM_OK)
        return rc;
    size_t vocab = tdm_tok_vocab_size(g->tok);
    for (size_t i = 0; i < req->n_ids; i++)
        if (req->ids[i] >= vocab)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "ids[%zu] = %u is outside the vocabulary (0..%zu)", i, req->ids[i],
                                 vocab - 1);
    char *text = NULL;
    rc = tdm_tok_decode(g->tok, (const int32_t *)req->ids, req->n_ids, false, &text, NULL, err);
    if (rc != TDM_OK)
        return rc;
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
    tdm_status rc = tdm_trust_check_client(g->trust, call, err);
    if (rc != TDM_OK)
        return rc;
    Tandem__V1__ModelInfo *out = tdm_rpc_call_alloc(call, sizeof(*out));
    tandem__v1__model_info__init(out);
    if ((rc = gw_registry_pick(g->reg, true, g->self, NULL, 0, &pick, err)) != TDM_OK)
        return rc;
    gw_registry_unpick(g->reg, &pick);
    out->max_context = pick.max_context;
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
    g->trust = tdm_service_trust(svc);
    g->max_prompt_tokens = (uint32_t)tdm_cfg_int(cfg, "max_prompt_tokens");
    g->tls = tdm_service_tls(svc);
    g->max_message_bytes = tdm_cfg_int(cfg, "max_message_size");
    g->default_max_tokens = (uint32_t)tdm_cfg_int(cfg, "default_max_tokens");
    tdm_metrics *m = tdm_service_metrics(svc);
    tdm_metrics_outcomes_init(&g->outcomes, m, "tandem_request_success_total",
                              "Generate requests that completed, by finish reason.",
                              "tandem_request_errors_total",
                              "Generate requests that failed, by status code (CANCELLED: the "
                              "client went away).");
    g->ttft = tdm_metrics_histogram(m, "tandem_time_to_first_token_seconds",
                                    "Time from a Generate request to its first token.", NULL,
                                    tdm_metrics_latency_buckets, tdm_metrics_n_latency_buckets);
    g->itl =
        tdm_metrics_histogram(m, "tandem_inter_token_latency_seconds",
                              "Time between tokens streamed to a client (a chunk's tokens "
                              "share the time since the previous chunk).",
                              NULL, tdm_metrics_latency_buckets, tdm_metrics_n_latency_buckets);
    g->e2e = tdm_metrics_histogram(m, "tandem_e2e_request_latency_seconds",
                                   "Duration of completed Generate requests.", NULL,
                                   tdm_metrics_latency_buckets, tdm_metrics_n_latency_buckets);
    g->prompt_tokens = tdm_metrics_counter(m, "tandem_prompt_tokens_total",
                                           "Prompt tokens handed to verifiers.", NULL);
    g->in_flight = tdm_metrics_gauge(m, "tandem_gateway_requests_in_flight",
                                     "Generate requests being served now.", NULL);
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
                                               &tandem__v1__generate_request__descriptor, generate,
                                               g, err)) != TDM_OK ||
        (rc = tdm_rpc_server_add_unary(srv, "/tandem.v1.Gateway/Tokenize",
                                       &tandem__v1__tokenize_request__descriptor, tokenize, g,
                                       err)) != TDM_OK ||
        (rc = tdm_rpc_server_add_unary(srv, "/tandem.v1.Gateway/Detokenize",
                                       &tandem__v1__detokenize_request__descriptor, detokenize, g,
                                       err)) != TDM_OK ||
        (rc = tdm_rpc_server_add_unary(srv, "/tandem.v1.Gateway/GetModelInfo",
                                       &tandem__v1__get_model_info_request__descriptor, model_info,
                                       g, err)) != TDM_OK) {
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
        channel_put(g, g->channels[i]);
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
        {"generate_moved", (double)__atomic_load_n(&g->moved, __ATOMIC_RELAXED)},
    };
    return tdm_service_counters_copy(all, TDM_ARRAY_LEN(all), out, max);
}

const tdm_tokenizer *gw_api_tokenizer(const gw_api *g)
{
    return g->tok;
}

tdm_status gw_api_ready(gw_api *g, tdm_error *err)
{
    gw_pick pick;
    tdm_status rc = gw_registry_pick(g->reg, false, g->self, NULL, 0, &pick, err);
    if (rc == TDM_OK)
        gw_registry_unpick(g->reg, &pick);
    return rc;
}
