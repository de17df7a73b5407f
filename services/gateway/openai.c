/*
 * openai.c - the OpenAI-compatible HTTP API (see openai.h).
 *
 * A request goes: JSON body -> oai_req (a GenerateRequest whose strings point
 * into the parsed JSON) -> gw_api_generate with a sink that either collects
 * the text (a whole response) or formats server-sent events into a buffer
 * that the connection's thread drains (a stream). A stream runs its
 * generation on a thread of its own; when the response ends (sent whole or
 * the client went away) the stream's free callback cancels the request,
 * which cancels its sequence on verifier and drafter, and joins the thread.
 *
 * Errors follow OpenAI's error object with the HTTP status that fits:
 * 400 naming the field at fault, 404 for an unknown model, 413 (the HTTP
 * server) for a body over http_max_body, 429 when the replicas are
 * saturated, 503 without a verifier.
 */
#include "openai.h"
#include "alloc.h"

#include "http.h"
#include "log.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOG "gateway-http"
#define MAX_STOP 16
#define MAX_MESSAGES 4096

struct gw_openai {
    gw_api *api;
    const tdm_trust *trust;
    tdm_http_server *http;
    char model[256];
    long long created; /* unix time the API started: the model's "created" */
    uint64_t seq;
};

/* ---- errors ------------------------------------------------------------------ */

/* An error for the client: HTTP status, the field at fault, a code. */
typedef struct oai_err {
    int status;
    const char *param; /* static or from the request's JSON; NULL: none */
    const char *code;  /* static; NULL: none */
    char msg[TDM_ERROR_MSG_MAX];
} oai_err;

static bool bad(oai_err *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static bool bad(oai_err *e, int status, const char *param, const char *code, const char *fmt, ...)
{
    e->status = status;
    e->param = param;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return false;
}

static tdm_status respond_error(tdm_http_response *resp, const oai_err *e)
{
    resp->status = e->status;
    resp->content_type = "application/json";
    resp->body = tdm_http_json_error(e->status, e->param, e->code, e->msg, &resp->body_len);
    return TDM_OK;
}

static tdm_status respond_json(tdm_http_response *resp, int status, cJSON *root)
{
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    resp->status = status;
    resp->content_type = "application/json";
    resp->body = tdm_xstrdup(json ? json : "{}");
    resp->body_len = strlen(resp->body);
    cJSON_free(json);
    return TDM_OK;
}

/* ---- requests ------------------------------------------------------------------ */

/* One request, parsed. Strings point into `root` or into `owned`. */
typedef struct oai_req {
    cJSON *root;
    bool chat, stream, include_usage;
    Tandem__V1__GenerateRequest gen;
    Tandem__V1__SamplingParams sampling;
    Tandem__V1__SpeculationParams spec;
    Tandem__V1__TokenIds tids;
    Tandem__V1__ChatPrompt chatp;
    Tandem__V1__ChatMessage *msgs; /* [n] */
    Tandem__V1__ChatMessage **msgp;
    uint32_t *ids;
    char *stop[MAX_STOP];
    char **owned; /* [n_owned] strings built here (content parts) */
    size_t n_owned;
    char rid[64];
} oai_req;

static void req_free(oai_req *r)
{
    cJSON_Delete(r->root);
    free(r->msgs);
    free(r->msgp);
    free(r->ids);
    for (size_t i = 0; i < r->n_owned; i++)
        free(r->owned[i]);
    free(r->owned);
}

/* A field that is absent or JSON null counts as not given. */
static const cJSON *field(const cJSON *obj, const char *name)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

static bool get_number(const cJSON *obj, const char *name, double lo, double hi, bool integer,
                       double *out, bool *given, oai_err *e)
{
    const cJSON *f = field(obj, name);
    *given = f != NULL;
    if (!f)
        return true;
    if (!cJSON_IsNumber(f))
        return bad(e, 400, name, "invalid_type", "%s must be a number", name);
    double v = f->valuedouble;
    if (integer && (v != floor(v)))
        return bad(e, 400, name, "invalid_type", "%s must be an integer", name);
    if (!(v >= lo && v <= hi))
        return bad(e, 400, name, "invalid_value", "%s must be between %g and %g (got %g)", name, lo,
                   hi, v);
    *out = v;
    return true;
}

static bool get_bool(const cJSON *obj, const char *name, bool *out, oai_err *e)
{
    const cJSON *f = field(obj, name);
    if (!f)
        return true;
    if (!cJSON_IsBool(f))
        return bad(e, 400, name, "invalid_type", "%s must be true or false", name);
    *out = cJSON_IsTrue(f);
    return true;
}

static bool parse_prompt(oai_req *r, const cJSON *p, oai_err *e)
{
    if (!p)
        return bad(e, 400, "prompt", "missing_field", "prompt is required");
    if (cJSON_IsString(p)) {
        r->gen.prompt_case = TANDEM__V1__GENERATE_REQUEST__PROMPT_TEXT;
        r->gen.text = p->valuestring;
        return true;
    }
    if (!cJSON_IsArray(p))
        return bad(e, 400, "prompt", "invalid_type",
                   "prompt must be a string, an array of token ids, or an array of one of those");
    int n = cJSON_GetArraySize(p);
    if (n == 1 && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        return parse_prompt(r, p->child, e);
    if (n > 0 && !cJSON_IsNumber(p->child))
        return bad(e, 400, "prompt", "invalid_value",
                   "prompt: a batch of several prompts is not supported; send one per request");
    r->ids = tdm_xcalloc((size_t)(n ? n : 1), sizeof(uint32_t));
    int i = 0;
    for (const cJSON *t = p->child; t; t = t->next, i++) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble > (double)INT32_MAX)
            return bad(e, 400, "prompt", "invalid_type",
                       "prompt[%d] must be a token id (a non-negative integer)", i);
        r->ids[i] = (uint32_t)t->valuedouble;
    }
    r->tids.n_ids = (size_t)n;
    r->tids.ids = r->ids;
    r->gen.prompt_case = TANDEM__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    r->gen.token_ids = &r->tids;
    return true;
}

/* A message's content: a string, or an array of text parts joined. */
static bool message_content(oai_req *r, const cJSON *c, int i, char **out, oai_err *e)
{
    if (cJSON_IsString(c)) {
        *out = c->valuestring;
        return true;
    }
    if (!cJSON_IsArray(c))
        return bad(e, 400, "messages", "invalid_type",
                   "messages[%d].content must be a string or an array of text parts", i);
    size_t len = 0;
    for (const cJSON *part = c->child; part; part = part->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text))
            return bad(e, 400, "messages", "invalid_value",
                       "messages[%d].content: only parts {\"type\": \"text\", \"text\": ...} are "
                       "supported",
                       i);
        len += strlen(text->valuestring);
    }
    char *s = tdm_xmalloc(len + 1), *p = s;
    for (const cJSON *part = c->child; part; part = part->next) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(p, t, n);
        p += n;
    }
    *p = '\0';
    r->owned = tdm_xrealloc(r->owned, (r->n_owned + 1) * sizeof(*r->owned));
    r->owned[r->n_owned++] = s;
    *out = s;
    return true;
}

static bool parse_messages(oai_req *r, const cJSON *m, oai_err *e)
{
    if (!m)
        return bad(e, 400, "messages", "missing_field", "messages is required");
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) == 0)
        return bad(e, 400, "messages", "invalid_type", "messages must be a non-empty array");
    int n = cJSON_GetArraySize(m);
    if (n > MAX_MESSAGES)
        return bad(e, 400, "messages", "invalid_value", "more than %d messages", MAX_MESSAGES);
    r->msgs = tdm_xcalloc((size_t)n, sizeof(*r->msgs));
    r->msgp = tdm_xcalloc((size_t)n, sizeof(*r->msgp));
    int i = 0;
    for (const cJSON *msg = m->child; msg; msg = msg->next, i++) {
        tandem__v1__chat_message__init(&r->msgs[i]);
        r->msgp[i] = &r->msgs[i];
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsObject(msg) || !cJSON_IsString(role))
            return bad(e, 400, "messages", "invalid_type",
                       "messages[%d] must be an object with a string role", i);
        const char *rs = role->valuestring;
        if (strcmp(rs, "developer") == 0)
            rs = "system";
        if (strcmp(rs, "system") != 0 && strcmp(rs, "user") != 0 && strcmp(rs, "assistant") != 0)
            return bad(e, 400, "messages", "invalid_value",
                       "messages[%d].role must be system, user or assistant (got \"%s\")", i,
                       role->valuestring);
        r->msgs[i].role = (char *)rs;
        const cJSON *content = field(msg, "content");
        char *text = (char *)"";
        if (content && !message_content(r, content, i, &text, e))
            return false;
        r->msgs[i].content = text;
    }
    tandem__v1__chat_prompt__init(&r->chatp);
    r->chatp.n_messages = (size_t)n;
    r->chatp.messages = r->msgp;
    r->chatp.add_generation_prompt = true;
    r->gen.prompt_case = TANDEM__V1__GENERATE_REQUEST__PROMPT_CHAT;
    r->gen.chat = &r->chatp;
    return true;
}

static bool parse_stop(oai_req *r, const cJSON *s, oai_err *e)
{
    if (!s)
        return true;
    if (cJSON_IsString(s)) {
        if (!s->valuestring[0])
            return bad(e, 400, "stop", "invalid_value", "stop must not be empty");
        r->stop[0] = s->valuestring;
        r->gen.n_stop = 1;
    } else if (cJSON_IsArray(s)) {
        int n = cJSON_GetArraySize(s);
        if (n > MAX_STOP)
            return bad(e, 400, "stop", "invalid_value", "stop: at most %d strings", MAX_STOP);
        int i = 0;
        for (const cJSON *t = s->child; t; t = t->next, i++) {
            if (!cJSON_IsString(t) || !t->valuestring[0])
                return bad(e, 400, "stop", "invalid_type", "stop[%d] must be a non-empty string",
                           i);
            r->stop[i] = t->valuestring;
        }
        r->gen.n_stop = (size_t)n;
    } else {
        return bad(e, 400, "stop", "invalid_type", "stop must be a string or an array of strings");
    }
    r->gen.stop = r->stop;
    return true;
}

/* The tandem extension: {"speculation": "auto"|"on"|"off", "block_size": N,
 * "fixed_block_size": bool}. */
static bool parse_extension(oai_req *r, const cJSON *x, oai_err *e)
{
    if (!x)
        return true;
    if (!cJSON_IsObject(x))
        return bad(e, 400, "tandem", "invalid_type", "tandem must be an object");
    const cJSON *mode = field(x, "speculation");
    if (mode) {
        if (!cJSON_IsString(mode))
            return bad(e, 400, "tandem.speculation", "invalid_type",
                       "tandem.speculation must be \"auto\", \"on\" or \"off\"");
        if (strcmp(mode->valuestring, "on") == 0)
            r->spec.mode = TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_ON;
        else if (strcmp(mode->valuestring, "off") == 0)
            r->spec.mode = TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_OFF;
        else if (strcmp(mode->valuestring, "auto") == 0)
            r->spec.mode = TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_AUTO;
        else
            return bad(e, 400, "tandem.speculation", "invalid_value",
                       "tandem.speculation must be \"auto\", \"on\" or \"off\" (got \"%s\")",
                       mode->valuestring);
    }
    double v;
    bool given;
    if (!get_number(x, "block_size", 0, 1024, true, &v, &given, e)) {
        e->param = "tandem.block_size";
        return false;
    }
    if (given)
        r->spec.block_size = (uint32_t)v;
    bool fixed = false;
    if (!get_bool(x, "fixed_block_size", &fixed, e)) {
        e->param = "tandem.fixed_block_size";
        return false;
    }
    r->spec.fixed_block_size = fixed;
    return true;
}

static bool parse_request(gw_openai *o, const tdm_http_request *hreq, bool chat, oai_req *r,
                          oai_err *e)
{
    memset(r, 0, sizeof(*r));
    r->chat = chat;
    tandem__v1__generate_request__init(&r->gen);
    tandem__v1__sampling_params__init(&r->sampling);
    tandem__v1__speculation_params__init(&r->spec);
    tandem__v1__token_ids__init(&r->tids);
    size_t len = 0;
    const char *body = tdm_http_request_body(hreq, &len);
    r->root = body && len ? cJSON_ParseWithLength(body, len) : NULL;
    if (!r->root)
        return bad(e, 400, NULL, "invalid_json",
                   "the body is not valid JSON (expected a JSON object)");
    if (!cJSON_IsObject(r->root))
        return bad(e, 400, NULL, "invalid_json", "the body must be a JSON object");
    const cJSON *root = r->root;
    const cJSON *model = field(root, "model");
    if (!model)
        return bad(e, 400, "model", "missing_field", "model is required");
    if (!cJSON_IsString(model))
        return bad(e, 400, "model", "invalid_type", "model must be a string");
    if (strcmp(model->valuestring, o->model) != 0)
        return bad(e, 404, "model", "model_not_found",
                   "The model `%.200s` does not exist; this server serves `%s`", model->valuestring,
                   o->model);
    if (chat ? !parse_messages(r, field(root, "messages"), e)
             : !parse_prompt(r, field(root, "prompt"), e))
        return false;

    double v;
    bool given;
    if (!get_number(root, "max_tokens", 1, 1048576, true, &v, &given, e))
        return false;
    if (given)
        r->gen.max_tokens = (uint32_t)v;
    if (!get_number(root, "max_completion_tokens", 1, 1048576, true, &v, &given, e))
        return false;
    if (given)
        r->gen.max_tokens = (uint32_t)v;
    r->sampling.temperature = 1.0f; /* OpenAI's default */
    if (!get_number(root, "temperature", 0, 2, false, &v, &given, e))
        return false;
    if (given)
        r->sampling.temperature = (float)v;
    if (!get_number(root, "top_p", 0, 1, false, &v, &given, e))
        return false;
    if (given)
        r->sampling.top_p = (float)v;
    if (!get_number(root, "top_k", -1, 1e6, true, &v, &given, e))
        return false;
    if (given && v > 0)
        r->sampling.top_k = (uint32_t)v;
    if (!get_number(root, "seed", -9.2e18, 1.8e19, true, &v, &given, e))
        return false;
    if (given) {
        r->sampling.seed_choice_case = TANDEM__V1__SAMPLING_PARAMS__SEED_CHOICE_SEED;
        r->sampling.seed = v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v;
    }
    r->gen.sampling = &r->sampling;
    if (!get_number(root, "n", 1, 1e9, true, &v, &given, e))
        return false;
    if (given && v != 1)
        return bad(e, 400, "n", "invalid_value", "n must be 1 (one choice per request)");
    if (!get_number(root, "best_of", 1, 1e9, true, &v, &given, e))
        return false;
    if (given && v != 1)
        return bad(e, 400, "best_of", "invalid_value", "best_of must be 1");
    const cJSON *lp = field(root, "logprobs");
    if (lp && !cJSON_IsFalse(lp))
        return bad(e, 400, "logprobs", "invalid_value", "logprobs are not supported");
    bool echo = false;
    if (!get_bool(root, "echo", &echo, e))
        return false;
    if (echo)
        return bad(e, 400, "echo", "invalid_value", "echo is not supported");
    if (!parse_stop(r, field(root, "stop"), e))
        return false;
    if (!get_bool(root, "stream", &r->stream, e))
        return false;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            return bad(e, 400, "stream_options", "invalid_type",
                       "stream_options must be an object");
        if (!get_bool(so, "include_usage", &r->include_usage, e)) {
            e->param = "stream_options.include_usage";
            return false;
        }
    }
    bool ignore_eos = false;
    if (!get_bool(root, "ignore_eos", &ignore_eos, e))
        return false;
    r->gen.ignore_eos = ignore_eos;
    if (!parse_extension(r, field(root, "tandem"), e))
        return false;
    r->gen.speculation = &r->spec;
    uint64_t seq = __atomic_add_fetch(&o->seq, 1, __ATOMIC_RELAXED);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(r->rid, sizeof(r->rid), "%llx%06llx", (unsigned long long)ts.tv_sec,
             (unsigned long long)(seq & 0xffffff));
    r->gen.request_id = r->rid;
    return true;
}

/* ---- results --------------------------------------------------------------------- */

/* What a finished request reports: the GenerateComplete, copied. */
typedef struct oai_done {
    bool have;
    Tandem__V1__FinishReason finish;
    uint32_t prompt_tokens, completion_tokens;
    uint32_t cached_tokens; /* prompt tokens the verifier's prefix cache restored */
    uint32_t rounds, speculative_rounds, drafted, accepted, ahead_blocks;
    double mean_accepted, ttft_ms, total_ms, tokens_per_second;
    uint64_t seed;
    char verifier[160], drafter[160], speculation[256];
    uint32_t reached[64], accepted_at[64];
    size_t n_positions;
} oai_done;

static void done_copy(oai_done *d, const Tandem__V1__GenerateComplete *c)
{
    memset(d, 0, sizeof(*d));
    d->have = true;
    d->finish = c->finish_reason;
    const Tandem__V1__RequestStats *s = c->stats;
    if (!s)
        return;
    d->prompt_tokens = s->prompt_tokens;
    d->completion_tokens = s->generated_tokens;
    d->cached_tokens = s->cached_prompt_tokens;
    d->rounds = s->rounds;
    d->speculative_rounds = s->speculative_rounds;
    d->drafted = s->drafted_tokens;
    d->accepted = s->accepted_tokens;
    d->ahead_blocks = s->ahead_blocks;
    d->mean_accepted = s->mean_accepted;
    d->ttft_ms = s->time_to_first_token_ms;
    d->total_ms = s->total_ms;
    d->tokens_per_second = s->tokens_per_second;
    d->seed = s->seed;
    snprintf(d->verifier, sizeof(d->verifier), "%s", s->verifier ? s->verifier : "");
    snprintf(d->drafter, sizeof(d->drafter), "%s", s->drafter ? s->drafter : "");
    snprintf(d->speculation, sizeof(d->speculation), "%s", s->speculation ? s->speculation : "");
    size_t n = s->n_reached_at_position < s->n_accepted_at_position ? s->n_reached_at_position
                                                                    : s->n_accepted_at_position;
    if (n > TDM_ARRAY_LEN(d->reached))
        n = TDM_ARRAY_LEN(d->reached);
    for (size_t i = 0; i < n; i++) {
        d->reached[i] = s->reached_at_position[i];
        d->accepted_at[i] = s->accepted_at_position[i];
    }
    d->n_positions = n;
}

static const char *finish_name(Tandem__V1__FinishReason f)
{
    return f == TANDEM__V1__FINISH_REASON__FINISH_REASON_LENGTH ||
                   f == TANDEM__V1__FINISH_REASON__FINISH_REASON_CONTEXT
               ? "length"
               : "stop";
}

static cJSON *usage_json(const oai_done *d)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", d->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", d->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)d->prompt_tokens + d->completion_tokens);
    /* As OpenAI's and vLLM's: prompt tokens served from the prefix cache. */
    cJSON *details = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    if (details)
        cJSON_AddNumberToObject(details, "cached_tokens", d->cached_tokens);
    return u;
}

/* The extension field of a response: how speculation went for the request. */
static cJSON *stats_json(const oai_done *d)
{
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "speculation", d->speculation[0] ? d->speculation : "on");
    cJSON_AddStringToObject(x, "verifier", d->verifier);
    cJSON_AddStringToObject(x, "drafter", d->drafter);
    cJSON_AddNumberToObject(x, "rounds", d->rounds);
    cJSON_AddNumberToObject(x, "speculative_rounds", d->speculative_rounds);
    cJSON_AddNumberToObject(x, "drafted_tokens", d->drafted);
    cJSON_AddNumberToObject(x, "accepted_tokens", d->accepted);
    cJSON_AddNumberToObject(x, "acceptance_rate",
                            d->drafted ? (double)d->accepted / d->drafted : 0);
    cJSON_AddNumberToObject(x, "mean_accepted_length", d->mean_accepted);
    cJSON *pos = cJSON_AddArrayToObject(x, "acceptance_by_position");
    for (size_t i = 0; i < d->n_positions; i++)
        cJSON_AddItemToArray(
            pos, cJSON_CreateNumber(d->reached[i] ? (double)d->accepted_at[i] / d->reached[i] : 0));
    cJSON *reached = cJSON_AddArrayToObject(x, "reached_at_position");
    cJSON *acc = cJSON_AddArrayToObject(x, "accepted_at_position");
    for (size_t i = 0; i < d->n_positions; i++) {
        cJSON_AddItemToArray(reached, cJSON_CreateNumber(d->reached[i]));
        cJSON_AddItemToArray(acc, cJSON_CreateNumber(d->accepted_at[i]));
    }
    cJSON_AddNumberToObject(x, "time_to_first_token_ms", d->ttft_ms);
    cJSON_AddNumberToObject(x, "total_ms", d->total_ms);
    cJSON_AddNumberToObject(x, "tokens_per_second", d->tokens_per_second);
    char seed[32];
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)d->seed);
    cJSON_AddStringToObject(x, "seed", seed);
    return x;
}

static cJSON *response_head(const gw_openai *o, const oai_req *r, bool chunk)
{
    cJSON *root = cJSON_CreateObject();
    char id[96];
    snprintf(id, sizeof(id), "%s-%s", r->chat ? "chatcmpl" : "cmpl", r->rid);
    cJSON_AddStringToObject(root, "id", id);
    cJSON_AddStringToObject(root, "object",
                            r->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                    : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)time(NULL));
    cJSON_AddStringToObject(root, "model", o->model);
    return root;
}

/* One choice: text (completions) or a message / delta (chat). */
static cJSON *choice_json(const oai_req *r, bool chunk, bool first, const char *text,
                          const char *finish)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    if (r->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, chunk ? "delta" : "message");
        if (!chunk || first)
            cJSON_AddStringToObject(m, "role", "assistant");
        if (text)
            cJSON_AddStringToObject(m, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text ? text : "");
    }
    cJSON_AddNullToObject(c, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    return c;
}

static oai_err err_of(tdm_status rc, const tdm_error *err, const oai_req *r)
{
    oai_err e = {0};
    bad(&e, tdm_http_status_of(rc), NULL, NULL, "%s", err->msg);
    if (e.status == 400)
        e.param = r->chat ? "messages" : "prompt";
    if (rc == TDM_ERR_UNAVAILABLE)
        e.code = "no_verifier";
    return e;
}

/* ---- whole responses --------------------------------------------------------------- */

typedef struct collect {
    const tdm_http_request *hreq;
    gw_cancel cancel;
    char *text;
    size_t len, cap;
    oai_done done;
} collect;

static tdm_status collect_write(void *arg, const Tandem__V1__GenerateResponse *r, tdm_error *err)
{
    collect *c = arg;
    if (tdm_http_request_peer_closed(c->hreq)) {
        gw_cancel_fire(&c->cancel);
        return tdm_error_set(err, TDM_ERR_CANCELLED, "the client went away");
    }
    if (r->chunk_case == TANDEM__V1__GENERATE_RESPONSE__CHUNK_COMPLETE && r->complete) {
        done_copy(&c->done, r->complete);
        return TDM_OK;
    }
    if (r->chunk_case != TANDEM__V1__GENERATE_RESPONSE__CHUNK_TOKENS || !r->tokens)
        return TDM_OK;
    size_t n = strlen(r->tokens->text);
    if (c->len + n + 1 > c->cap) {
        c->cap = (c->len + n + 1) * 2;
        c->text = tdm_xrealloc(c->text, c->cap);
    }
    memcpy(c->text + c->len, r->tokens->text, n);
    c->len += n;
    c->text[c->len] = '\0';
    return TDM_OK;
}

static tdm_status serve_whole(gw_openai *o, const tdm_http_request *hreq, oai_req *r,
                              tdm_http_response *resp)
{
    collect c = {.hreq = hreq};
    gw_cancel_init(&c.cancel);
    gw_sink sink = {.write = collect_write, .arg = &c, .cancel = &c.cancel};
    tdm_error err = {0};
    tdm_status rc = gw_api_generate(o->api, &r->gen, &sink, &err);
    gw_cancel_destroy(&c.cancel);
    if (rc != TDM_OK) {
        free(c.text);
        oai_err e = err_of(rc, &err, r);
        return respond_error(resp, &e);
    }
    cJSON *root = response_head(o, r, false);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON_AddItemToArray(
        choices, choice_json(r, false, true, c.text ? c.text : "", finish_name(c.done.finish)));
    cJSON_AddItemToObject(root, "usage", usage_json(&c.done));
    cJSON_AddItemToObject(root, "tandem", stats_json(&c.done));
    free(c.text);
    return respond_json(resp, 200, root);
}

/* ---- streams ------------------------------------------------------------------------ */

/* A streamed response: the generation thread appends events, the
 * connection's thread drains them. */
typedef struct oai_stream {
    gw_openai *o;
    oai_req req;
    gw_cancel cancel;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *buf; /* events not yet sent (under mu) */
    size_t len, cap, off;
    bool started;  /* the first event is in buf (under mu) */
    bool finished; /* the generation ended; buf holds its last events (under mu) */
    bool sent_role;
    tdm_status rc; /* the generation's status (once finished) */
    oai_err error; /* when rc is not OK */
} oai_stream;

/* Appends "data: JSON\n\n" (takes root). */
static void stream_event(oai_stream *st, cJSON *root)
{
    char *json = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    const char *data = json ? json : "[DONE]";
    size_t n = strlen(data) + 8;
    pthread_mutex_lock(&st->mu);
    if (st->len + n + 1 > st->cap) {
        st->cap = (st->len + n + 1) * 2;
        st->buf = tdm_xrealloc(st->buf, st->cap);
    }
    st->len += (size_t)snprintf(st->buf + st->len, st->cap - st->len, "data: %s\n\n", data);
    st->started = true;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    cJSON_free(json);
}

static cJSON *chunk_json(oai_stream *st, const char *text, const char *finish)
{
    cJSON *root = response_head(st->o, &st->req, true);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON_AddItemToArray(choices, choice_json(&st->req, true, !st->sent_role, text, finish));
    st->sent_role = true;
    if (st->req.include_usage)
        cJSON_AddNullToObject(root, "usage");
    return root;
}

static tdm_status stream_write(void *arg, const Tandem__V1__GenerateResponse *r, tdm_error *err)
{
    oai_stream *st = arg;
    if (__atomic_load_n(&st->cancel.cancelled, __ATOMIC_ACQUIRE))
        return tdm_error_set(err, TDM_ERR_CANCELLED, "the client went away");
    if (r->chunk_case == TANDEM__V1__GENERATE_RESPONSE__CHUNK_TOKENS && r->tokens) {
        if (r->tokens->text[0] || !st->sent_role)
            stream_event(st, chunk_json(st, r->tokens->text, NULL));
        return TDM_OK;
    }
    if (r->chunk_case != TANDEM__V1__GENERATE_RESPONSE__CHUNK_COMPLETE || !r->complete)
        return TDM_OK;
    oai_done d;
    done_copy(&d, r->complete);
    cJSON *last = chunk_json(st, st->req.chat ? NULL : "", finish_name(d.finish));
    if (!st->req.include_usage)
        cJSON_AddItemToObject(last, "tandem", stats_json(&d));
    stream_event(st, last);
    if (st->req.include_usage) {
        cJSON *u = response_head(st->o, &st->req, true);
        cJSON_AddArrayToObject(u, "choices");
        cJSON_AddItemToObject(u, "usage", usage_json(&d));
        cJSON_AddItemToObject(u, "tandem", stats_json(&d));
        stream_event(st, u);
    }
    return TDM_OK;
}

static void *stream_main(void *arg)
{
    oai_stream *st = arg;
    gw_sink sink = {.write = stream_write, .arg = st, .cancel = &st->cancel};
    tdm_error err = {0};
    tdm_status rc = gw_api_generate(st->o->api, &st->req.gen, &sink, &err);
    oai_err e = {0};
    if (rc != TDM_OK)
        e = err_of(rc, &err, &st->req);
    pthread_mutex_lock(&st->mu);
    bool started = st->started;
    pthread_mutex_unlock(&st->mu);
    if (rc != TDM_OK && started && rc != TDM_ERR_CANCELLED) {
        /* The stream is under way: the error goes out as an event. */
        size_t len;
        char *body = tdm_http_json_error(e.status, e.param, e.code, e.msg, &len);
        stream_event(st, cJSON_Parse(body));
        free(body);
    }
    if (rc == TDM_OK || started)
        stream_event(st, NULL); /* data: [DONE] */
    pthread_mutex_lock(&st->mu);
    st->rc = rc;
    st->error = e;
    st->finished = true;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* Waits for events (sending a comment now and then, which also finds a
 * client that went away) and copies them out. */
static ssize_t stream_read(void *arg, char *out, size_t max)
{
    oai_stream *st = arg;
    pthread_mutex_lock(&st->mu);
    while (st->off == st->len && !st->finished) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 2;
        if (pthread_cond_timedwait(&st->cv, &st->mu, &ts) != 0 && st->off == st->len &&
            !st->finished) {
            pthread_mutex_unlock(&st->mu);
            static const char ping[] = ": keep-alive\n\n";
            size_t n = sizeof(ping) - 1 < max ? sizeof(ping) - 1 : max;
            memcpy(out, ping, n);
            return (ssize_t)n;
        }
    }
    size_t n = st->len - st->off;
    if (n > max)
        n = max;
    memcpy(out, st->buf + st->off, n);
    st->off += n;
    if (st->off == st->len)
        st->off = st->len = 0;
    pthread_mutex_unlock(&st->mu);
    return (ssize_t)n;
}

static void stream_destroy(void *arg)
{
    oai_stream *st = arg;
    gw_cancel_fire(&st->cancel); /* a no-op for the verifier once it finished */
    pthread_join(st->thread, NULL);
    gw_cancel_destroy(&st->cancel);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    req_free(&st->req);
    free(st->buf);
    free(st);
}

static tdm_status serve_stream(gw_openai *o, oai_req *r, tdm_http_response *resp)
{
    oai_stream *st = tdm_xcalloc(1, sizeof(*st));
    st->o = o;
    st->req = *r; /* the stream owns the request now */
    /* The GenerateRequest points into the request: re-aim the copies. */
    st->req.gen.sampling = &st->req.sampling;
    st->req.gen.speculation = &st->req.spec;
    st->req.gen.request_id = st->req.rid;
    if (st->req.gen.prompt_case == TANDEM__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS)
        st->req.gen.token_ids = &st->req.tids;
    if (st->req.gen.prompt_case == TANDEM__V1__GENERATE_REQUEST__PROMPT_CHAT)
        st->req.gen.chat = &st->req.chatp;
    if (st->req.gen.n_stop)
        st->req.gen.stop = st->req.stop;
    memset(r, 0, sizeof(*r));
    gw_cancel_init(&st->cancel);
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    if (pthread_create(&st->thread, NULL, stream_main, st) != 0) {
        oai_err e;
        bad(&e, 503, NULL, NULL, "cannot start a thread for the stream");
        gw_cancel_destroy(&st->cancel);
        pthread_mutex_destroy(&st->mu);
        pthread_cond_destroy(&st->cv);
        req_free(&st->req);
        free(st);
        return respond_error(resp, &e);
    }
    /* An error before the first event is an HTTP error, as OpenAI's. */
    pthread_mutex_lock(&st->mu);
    while (!st->started && !st->finished)
        pthread_cond_wait(&st->cv, &st->mu);
    bool failed = !st->started;
    oai_err e = st->error;
    pthread_mutex_unlock(&st->mu);
    if (failed) {
        stream_destroy(st);
        return respond_error(resp, &e);
    }
    resp->status = 200;
    resp->content_type = "text/event-stream";
    resp->reader = stream_read;
    resp->reader_arg = st;
    resp->reader_free = stream_destroy;
    return TDM_OK;
}

/* ---- routes -------------------------------------------------------------------------- */

/* False (and the 401 in resp) when a bearer token is required and missing. */
static bool authorized(const gw_openai *o, const tdm_http_request *hreq, tdm_http_response *resp)
{
    tdm_error err = {0};
    if (tdm_trust_check_bearer(o->trust, tdm_http_request_header(hreq, "Authorization"),
                               tdm_http_request_path(hreq), &err) == TDM_OK)
        return true;
    oai_err e;
    bad(&e, 401, NULL, "invalid_api_key", "%s", err.msg);
    respond_error(resp, &e);
    return false;
}

static tdm_status serve_generate(const tdm_http_request *hreq, tdm_http_response *resp, void *arg,
                                 bool chat)
{
    gw_openai *o = arg;
    if (!authorized(o, hreq, resp))
        return TDM_OK;
    oai_req r;
    oai_err e = {0};
    if (!parse_request(o, hreq, chat, &r, &e)) {
        req_free(&r);
        return respond_error(resp, &e);
    }
    tdm_status rc = r.stream ? serve_stream(o, &r, resp) : serve_whole(o, hreq, &r, resp);
    req_free(&r);
    return rc;
}

static tdm_status handle_completions(const tdm_http_request *hreq, tdm_http_response *resp,
                                     tdm_error *err, void *arg)
{
    (void)err;
    return serve_generate(hreq, resp, arg, false);
}

static tdm_status handle_chat(const tdm_http_request *hreq, tdm_http_response *resp, tdm_error *err,
                              void *arg)
{
    (void)err;
    return serve_generate(hreq, resp, arg, true);
}

static tdm_status handle_models(const tdm_http_request *hreq, tdm_http_response *resp,
                                tdm_error *err, void *arg)
{
    (void)err;
    gw_openai *o = arg;
    if (!authorized(o, hreq, resp))
        return TDM_OK;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", o->model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)o->created);
    cJSON_AddStringToObject(m, "owned_by", "tandem");
    cJSON_AddItemToArray(data, m);
    return respond_json(resp, 200, root);
}

static tdm_status handle_health(const tdm_http_request *hreq, tdm_http_response *resp,
                                tdm_error *err, void *arg)
{
    (void)hreq;
    (void)err;
    gw_openai *o = arg;
    tdm_error why = {0};
    tdm_status rc = gw_api_ready(o->api, &why);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", rc == TDM_OK ? "ok" : "unavailable");
    if (rc != TDM_OK)
        cJSON_AddStringToObject(root, "reason", why.msg);
    return respond_json(resp, rc == TDM_OK ? 200 : 503, root);
}

/* ---- life cycle ------------------------------------------------------------------------ */

tdm_status gw_openai_create(const tdm_cfg *cfg, gw_api *api, const tdm_trust *trust,
                            gw_openai **out, tdm_error *err)
{
    *out = NULL;
    const char *listen = tdm_cfg_str(cfg, "http_listen");
    if (!listen[0])
        return TDM_OK;
    gw_openai *o = tdm_xcalloc(1, sizeof(*o));
    o->api = api;
    o->trust = trust;
    o->created = (long long)time(NULL);
    snprintf(o->model, sizeof(o->model), "%s", tdm_cfg_str(cfg, "http_model_name"));
    tdm_http_options ho = {.listen = listen,
                           .name = "tandem-gateway http",
                           .max_body_bytes = (size_t)tdm_cfg_int(cfg, "http_max_body"),
                           .thread_per_connection = true,
                           .json_errors = true,
                           .tls_cert = tdm_cfg_str(cfg, "tls_cert"),
                           .tls_key = tdm_cfg_str(cfg, "tls_key")};
    tdm_status rc = tdm_http_server_create(&ho, &o->http, err);
    if (rc == TDM_OK)
        rc = tdm_http_server_route(o->http, "POST", "/v1/completions", handle_completions, o, err);
    if (rc == TDM_OK)
        rc = tdm_http_server_route(o->http, "POST", "/v1/chat/completions", handle_chat, o, err);
    if (rc == TDM_OK)
        rc = tdm_http_server_route(o->http, "GET", "/v1/models", handle_models, o, err);
    if (rc == TDM_OK)
        rc = tdm_http_server_route(o->http, "GET", "/health", handle_health, o, err);
    if (rc == TDM_OK)
        rc = tdm_http_server_start(o->http, err);
    if (rc != TDM_OK) {
        gw_openai_destroy(o);
        return tdm_error_prefix(err, "http_listen %s", listen);
    }
    tdm_log_info(LOG, "OpenAI-compatible API on %s (port %d, %s), model %s", listen,
                 tdm_http_server_port(o->http), ho.tls_cert[0] ? "https" : "http", o->model);
    *out = o;
    return TDM_OK;
}

void gw_openai_destroy(gw_openai *o)
{
    if (!o)
        return;
    tdm_http_server_destroy(o->http);
    free(o);
}
