/*
 * compat.c - the compatibility rule table and the fingerprints a Descriptor
 * carries (see compat.h).
 */
#include "defs.h"
#include "alloc.h"
#include "compat.h"
#include "feature_stream.h"

#include "file.h"

#include "safetensors.h"
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <openssl/evp.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- naming helpers ------------------------------------------------------- */

const char *tdm_compat_service_name(const Tandem__V1__Descriptor *d, char *buf, size_t len)
{
    const char *id = (d->replica_id && d->replica_id[0]) ? d->replica_id : "(no replica id)";
    const char *addr = (d->address && d->address[0]) ? d->address : "no address";
    snprintf(buf, len, "%s (%s)", id, addr);
    return buf;
}

/* Strategies that can produce the recurrent state at any position of a
 * verified block before its commit: the prefix cache takes the states at
 * block boundaries there (engine/prefix_cache.h). */
static int strategy_has_any_position(Tandem__V1__StateStrategy s)
{
    return s == TANDEM__V1__STATE_STRATEGY__STATE_STRATEGY_EXTRA_BUFFER ||
           s == TANDEM__V1__STATE_STRATEGY__STATE_STRATEGY_REPLAY;
}

static const char *fp_or_none(const char *fp)
{
    return (fp && fp[0]) ? fp : "(none)";
}

/* First 12 hex digits of a fingerprint, for sentences. */
static const char *fp_short(const char *fp, char *buf, size_t len)
{
    if (!fp || !fp[0])
        snprintf(buf, len, "(none)");
    else
        snprintf(buf, len, "%.12s", fp);
    return buf;
}

static void fill_services(tdm_compat_refusal *r, const char *rule, const Tandem__V1__Descriptor *a,
                          const Tandem__V1__Descriptor *b)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->rule, sizeof(r->rule), "%s", rule);
    tdm_compat_service_name(a, r->a_replica, sizeof(r->a_replica));
    tdm_compat_service_name(b, r->b_replica, sizeof(r->b_replica));
}

/* ---- pair rules (a = verifier, b = drafter) ------------------------------- */

static int rule_tokenizer(const Tandem__V1__Descriptor *v, const Tandem__V1__Descriptor *d,
                          tdm_compat_refusal *out)
{
    /* An n-gram drafter proposes token ids it has seen in the sequence itself:
     * it has no vocabulary of its own to disagree about. */
    if (d->drafter_kind == TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_NGRAM)
        return 0;
    const char *a = v->tokenizer_fingerprint ? v->tokenizer_fingerprint : "";
    const char *b = d->tokenizer_fingerprint ? d->tokenizer_fingerprint : "";
    if (strcmp(a, b) == 0)
        return 0;
    fill_services(out, "tokenizer-fingerprint", v, d);
    snprintf(out->a_value, sizeof(out->a_value), "%s", fp_or_none(a));
    snprintf(out->b_value, sizeof(out->b_value), "%s", fp_or_none(b));
    char sa[16], sb[16];
    snprintf(out->message, sizeof(out->message),
             "rule tokenizer-fingerprint: verifier %s uses tokenizer %s but drafter %s uses "
             "tokenizer %s; a drafter must share the verifier's tokenizer so that its token ids "
             "mean the same text.",
             out->a_replica, fp_short(a, sa, sizeof(sa)), out->b_replica,
             fp_short(b, sb, sizeof(sb)));
    return 1;
}

/* The sentence of the draft-block-size rule, for a drafter's descriptor and
 * for a request's block alike: `who` proposes blocks of `block` tokens
 * (`field`). */
static void block_size_message(char *out, size_t len, const char *who, uint32_t block,
                               const char *field, const char *verifier, uint32_t max_draft)
{
    snprintf(out, len,
             "rule draft-block-size: %s proposes blocks of %u tokens (%s) but verifier %s "
             "verifies at most %u draft tokens per round (max_draft_tokens); a block must hold "
             "1 to max_draft_tokens drafts.",
             who, block, field, verifier, max_draft);
}

static int rule_block_size(const Tandem__V1__Descriptor *v, const Tandem__V1__Descriptor *d,
                           tdm_compat_refusal *out)
{
    if (d->draft_block_size <= v->max_draft_tokens)
        return 0;
    fill_services(out, "draft-block-size", v, d);
    snprintf(out->a_value, sizeof(out->a_value), "max_draft_tokens=%u", v->max_draft_tokens);
    snprintf(out->b_value, sizeof(out->b_value), "draft_block_size=%u", d->draft_block_size);
    char who[300];
    snprintf(who, sizeof(who), "drafter %s", out->b_replica);
    block_size_message(out->message, sizeof(out->message), who, d->draft_block_size,
                       "draft_block_size", out->a_replica, v->max_draft_tokens);
    return 1;
}

tdm_status tdm_compat_check_request_block(uint32_t block, const char *field, const char *verifier,
                                          uint32_t max_draft, tdm_error *err)
{
    if (block >= 1 && block <= max_draft)
        return TDM_OK;
    char msg[TDM_ERROR_MSG_MAX];
    block_size_message(msg, sizeof(msg), "the request", block, field, verifier, max_draft);
    return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION, "%s", msg);
}

static int rule_prefix_cache(const Tandem__V1__Descriptor *v, const Tandem__V1__Descriptor *d,
                             tdm_compat_refusal *out)
{
    int v_bad = v->prefix_cache && !strategy_has_any_position(v->state_strategy);
    int d_bad = d->prefix_cache && !strategy_has_any_position(d->state_strategy);
    if (!v_bad && !d_bad)
        return 0;
    fill_services(out, "prefix-cache-state", v, d);
    snprintf(out->a_value, sizeof(out->a_value), "prefix_cache=%s, state_strategy=%s",
             v->prefix_cache ? "on" : "off",
             tdm_state_strategy_name(tdm_state_strategy_from_proto(v->state_strategy)));
    snprintf(out->b_value, sizeof(out->b_value), "prefix_cache=%s, state_strategy=%s",
             d->prefix_cache ? "on" : "off",
             tdm_state_strategy_name(tdm_state_strategy_from_proto(d->state_strategy)));
    snprintf(out->message, sizeof(out->message),
             "rule prefix-cache-state: verifier %s has %s and drafter %s has %s; prefix caching "
             "takes the recurrent state at block boundaries inside verified draft blocks, which "
             "only extra_buffer or replay can produce, so %s cannot serve with prefix caching.",
             out->a_replica, out->a_value, out->b_replica, out->b_value,
             v_bad && d_bad ? "neither" : (v_bad ? "the verifier" : "the drafter"));
    return 1;
}

static uint32_t protocol_major(const Tandem__V1__Descriptor *d)
{
    return d->protocol ? d->protocol->major : 0;
}

static uint32_t protocol_minor(const Tandem__V1__Descriptor *d)
{
    return d->protocol ? d->protocol->minor : 0;
}

static int rule_protocol(const Tandem__V1__Descriptor *a, const Tandem__V1__Descriptor *b,
                         tdm_compat_refusal *out)
{
    if (protocol_major(a) == protocol_major(b))
        return 0;
    fill_services(out, "protocol-major", a, b);
    snprintf(out->a_value, sizeof(out->a_value), "%u.%u", protocol_major(a), protocol_minor(a));
    snprintf(out->b_value, sizeof(out->b_value), "%u.%u", protocol_major(b), protocol_minor(b));
    snprintf(out->message, sizeof(out->message),
             "rule protocol-major: %s %s speaks protocol %s but %s %s speaks protocol %s; the "
             "protocol major versions must be equal.",
             tdm_role_name(a->role), out->a_replica, out->a_value, tdm_role_name(b->role),
             out->b_replica, out->b_value);
    return 1;
}

/* "final layer after the norm, layer 3" for a list of FeatureSpec messages. */
static const char *spec_list(Tandem__V1__FeatureSpec *const *specs, size_t n, char *buf, size_t len)
{
    size_t used = 0;
    snprintf(buf, len, "none");
    for (size_t i = 0; i < n && used < len; i++) {
        tdm_feat_spec s = {.final_layer = specs[i]->final_layer,
                           .layer = specs[i]->layer,
                           .normed = specs[i]->normed};
        char one[64];
        int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "",
                         tdm_feat_spec_name(&s, one, sizeof(one)));
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return buf;
}

static bool spec_equal(const Tandem__V1__FeatureSpec *a, const Tandem__V1__FeatureSpec *b)
{
    return a->final_layer == b->final_layer && a->normed == b->normed &&
           (a->final_layer || a->layer == b->layer);
}

/* A hidden-state drafter drafts from the states its verifier streams: every
 * one it needs must be among those the verifier advertises. */
static int rule_features(const Tandem__V1__Descriptor *v, const Tandem__V1__Descriptor *d,
                         tdm_compat_refusal *out)
{
    const Tandem__V1__FeatureRequest *need = d->features_needed;
    if (!need || need->n_specs == 0)
        return 0;
    size_t missing = need->n_specs;
    for (size_t i = 0; i < need->n_specs && missing == need->n_specs; i++) {
        bool found = false;
        for (size_t j = 0; j < v->n_features_available && !found; j++)
            found = spec_equal(need->specs[i], v->features_available[j]);
        if (!found)
            missing = i;
    }
    if (missing == need->n_specs)
        return 0;
    fill_services(out, "drafter-features", v, d);
    spec_list(v->features_available, v->n_features_available, out->a_value, sizeof(out->a_value));
    spec_list(need->specs, need->n_specs, out->b_value, sizeof(out->b_value));
    char miss[128];
    spec_list(&need->specs[missing], 1, miss, sizeof(miss));
    snprintf(out->message, sizeof(out->message),
             "rule drafter-features: drafter %s needs hidden states the verifier cannot stream: "
             "it asks for %s, and verifier %s streams %s (not the %s); a hidden-state drafter "
             "drafts only from states its verifier sends.",
             out->b_replica, out->b_value, out->a_replica,
             v->n_features_available ? out->a_value : "no hidden states", miss);
    return 1;
}

/* "grpc, shm" for a list of transports. */
static const char *transport_list(char *const *list, size_t n, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && used < len; i++) {
        int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", list[i]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return buf;
}

/* A refusal by `rule` of verifier v (transports va) and drafter d (da): the
 * services and both lists as its values; the caller writes the message. */
static void transports_refused(tdm_compat_refusal *out, const char *rule,
                               const Tandem__V1__Descriptor *v, const Tandem__V1__Descriptor *d,
                               char *const *va, size_t vn, char *const *da, size_t dn)
{
    fill_services(out, rule, v, d);
    transport_list(va, vn, out->a_value, sizeof(out->a_value));
    transport_list(da, dn, out->b_value, sizeof(out->b_value));
}

/* Whether two lists of transports share one; lists that are empty (a side
 * that predates the setting) are not judged. */
static bool transports_meet(char *const *a, size_t na, char *const *b, size_t nb)
{
    if (na == 0 || nb == 0)
        return true;
    for (size_t i = 0; i < na; i++)
        for (size_t j = 0; j < nb; j++)
            if (strcmp(a[i], b[j]) == 0)
                return true;
    return false;
}

/* A hidden-state drafter and its verifier need a transport for the rows in
 * common (feature_transport): shm set on one side and grpc on the other
 * leaves none. A side that lists none predates the setting: not judged. */
static int rule_feature_transport(const Tandem__V1__Descriptor *v, const Tandem__V1__Descriptor *d,
                                  tdm_compat_refusal *out)
{
    if (!d->features_needed || d->features_needed->n_specs == 0 ||
        transports_meet(v->feature_transports, v->n_feature_transports, d->feature_transports,
                        d->n_feature_transports))
        return 0;
    transports_refused(out, "drafter-feature-transport", v, d, v->feature_transports,
                       v->n_feature_transports, d->feature_transports, d->n_feature_transports);
    snprintf(out->message, sizeof(out->message),
             "rule drafter-feature-transport: verifier %s sends hidden states by %s and drafter "
             "%s takes them by %s only (feature_transport): no transport in common; set "
             "feature_transport auto on one side.",
             out->a_replica, out->a_value, out->b_replica, out->b_value);
    return 1;
}

/* A drafter and its verifier need a transport for the Draft stream's
 * messages in common (exchange_transport): shm set on one side and grpc on
 * the other leaves none. A side that lists none predates the setting: not
 * judged. */
static int rule_exchange_transport(const Tandem__V1__Descriptor *v, const Tandem__V1__Descriptor *d,
                                   tdm_compat_refusal *out)
{
    if (transports_meet(v->exchange_transports, v->n_exchange_transports, d->exchange_transports,
                        d->n_exchange_transports))
        return 0;
    transports_refused(out, "drafter-exchange-transport", v, d, v->exchange_transports,
                       v->n_exchange_transports, d->exchange_transports, d->n_exchange_transports);
    snprintf(out->message, sizeof(out->message),
             "rule drafter-exchange-transport: verifier %s exchanges by %s and drafter %s by %s "
             "only (exchange_transport): no transport in common; set exchange_transport auto on "
             "one side.",
             out->a_replica, out->a_value, out->b_replica, out->b_value);
    return 1;
}

/* A hidden-state drafter belongs to one target: an MTP head shares its
 * checkpoint's embedding and LM head and reads that model's states. */
static int rule_target_model(const Tandem__V1__Descriptor *v, const Tandem__V1__Descriptor *d,
                             tdm_compat_refusal *out)
{
    const char *want = d->target_model_fingerprint ? d->target_model_fingerprint : "";
    const char *have = v->model_fingerprint ? v->model_fingerprint : "";
    if (!want[0] || strcmp(want, have) == 0)
        return 0;
    fill_services(out, "drafter-target-model", v, d);
    snprintf(out->a_value, sizeof(out->a_value), "%s", fp_or_none(have));
    snprintf(out->b_value, sizeof(out->b_value), "%s", want);
    char sa[16], sb[16];
    snprintf(out->message, sizeof(out->message),
             "rule drafter-target-model: drafter %s (%s) belongs to target model %s but verifier "
             "%s serves model %s; a hidden-state drafter runs only with the model it was built "
             "for (an MTP head shares that checkpoint's embedding and LM head).",
             out->b_replica, tdm_drafter_kind_name(d->drafter_kind), fp_short(want, sb, sizeof(sb)),
             out->a_replica, fp_short(have, sa, sizeof(sa)));
    return 1;
}

/* ---- gateway rules (a = gateway, b = verifier) --------------------------- */

static int rule_gateway_tokenizer(const Tandem__V1__Descriptor *g, const Tandem__V1__Descriptor *v,
                                  tdm_compat_refusal *out)
{
    /* A gateway without a tokenizer serves token ids only: any verifier. */
    const char *a = g->tokenizer_fingerprint ? g->tokenizer_fingerprint : "";
    const char *b = v->tokenizer_fingerprint ? v->tokenizer_fingerprint : "";
    if (!a[0] || strcmp(a, b) == 0)
        return 0;
    fill_services(out, "gateway-tokenizer", g, v);
    snprintf(out->a_value, sizeof(out->a_value), "%s", fp_or_none(a));
    snprintf(out->b_value, sizeof(out->b_value), "%s", fp_or_none(b));
    char sa[16], sb[16];
    snprintf(out->message, sizeof(out->message),
             "rule gateway-tokenizer: gateway %s encodes prompts with tokenizer %s but verifier "
             "%s uses tokenizer %s; the gateway's tokenizer must be the verifier's so that the "
             "token ids it sends mean the text it was given.",
             out->a_replica, fp_short(a, sa, sizeof(sa)), out->b_replica,
             fp_short(b, sb, sizeof(sb)));
    return 1;
}

/* ---- same-role rules ------------------------------------------------------ */

/* A verifier's sequence continues only on the same model (its snapshot is
 * that model's state; a recomputed one would be another model's tokens).
 * Drafters move nothing: a drained drafter's sequences go on without it. */
static int rule_snapshot_model(const Tandem__V1__Descriptor *a, const Tandem__V1__Descriptor *b,
                               tdm_compat_refusal *out)
{
    /* An empty fingerprint is unknown (tandem doctor's own build): nothing to compare. */
    if (a->role != TANDEM__V1__ROLE__ROLE_VERIFIER || b->role != TANDEM__V1__ROLE__ROLE_VERIFIER ||
        !a->model_fingerprint[0] || !b->model_fingerprint[0] ||
        strcmp(a->model_fingerprint, b->model_fingerprint) == 0)
        return 0;
    fill_services(out, "snapshot-model", a, b);
    snprintf(out->a_value, sizeof(out->a_value), "%s", a->model_fingerprint);
    snprintf(out->b_value, sizeof(out->b_value), "%s", b->model_fingerprint);
    snprintf(out->message, sizeof(out->message),
             "rule snapshot-model: verifier %s serves model fingerprint %.16s but verifier %s "
             "serves %.16s; a request moves only between verifiers of the same model.",
             out->a_replica, a->model_fingerprint, out->b_replica, b->model_fingerprint);
    return 1;
}

static int rule_snapshot_layout(const Tandem__V1__Descriptor *a, const Tandem__V1__Descriptor *b,
                                tdm_compat_refusal *out)
{
    if (a->snapshot_layout_version == b->snapshot_layout_version)
        return 0;
    fill_services(out, "snapshot-layout", a, b);
    snprintf(out->a_value, sizeof(out->a_value), "%u", a->snapshot_layout_version);
    snprintf(out->b_value, sizeof(out->b_value), "%u", b->snapshot_layout_version);
    snprintf(out->message, sizeof(out->message),
             "rule snapshot-layout: %s %s writes state snapshots in layout version %u but %s %s "
             "in layout version %u; replicas of one role must share the snapshot layout to move "
             "sequences between them.",
             tdm_role_name(a->role), out->a_replica, a->snapshot_layout_version,
             tdm_role_name(b->role), out->b_replica, b->snapshot_layout_version);
    return 1;
}

static const tdm_compat_rule g_rules[] = {
    {"tokenizer-fingerprint", TDM_COMPAT_PAIR,
     "a model drafter and its verifier use the same tokenizer (same fingerprint)", rule_tokenizer},
    {"draft-block-size", TDM_COMPAT_PAIR,
     "the drafter's draft_block_size is at most the verifier's max_draft_tokens", rule_block_size},
    {"prefix-cache-state", TDM_COMPAT_PAIR,
     "a side with prefix_cache on uses a state strategy that yields the state at any position "
     "of a verified block (extra_buffer or replay), where the prefix cache takes states",
     rule_prefix_cache},
    {"protocol-major", TDM_COMPAT_PAIR, "both sides speak the same protocol major version",
     rule_protocol},
    {"drafter-features", TDM_COMPAT_PAIR,
     "every hidden state a hidden-state drafter needs is one the verifier streams", rule_features},
    {"drafter-feature-transport", TDM_COMPAT_PAIR,
     "a hidden-state drafter and its verifier allow a feature transport in common "
     "(feature_transport: grpc, shm)",
     rule_feature_transport},
    {"drafter-exchange-transport", TDM_COMPAT_PAIR,
     "a drafter and its verifier allow an exchange transport in common (exchange_transport: "
     "grpc, shm)",
     rule_exchange_transport},
    {"drafter-target-model", TDM_COMPAT_PAIR,
     "a hidden-state drafter (mtp) runs with the target model it belongs to (same model "
     "fingerprint)",
     rule_target_model},
    {"gateway-tokenizer", TDM_COMPAT_GATEWAY,
     "the gateway's tokenizer (when it has one) is the verifier's (same fingerprint)",
     rule_gateway_tokenizer},
    {"snapshot-layout", TDM_COMPAT_REPLICAS,
     "replicas of one role write state snapshots in the same layout version", rule_snapshot_layout},
    {"snapshot-model", TDM_COMPAT_REPLICAS,
     "verifiers that move requests between them serve the same model (same fingerprint)",
     rule_snapshot_model},
};

const tdm_compat_rule *tdm_compat_rules(size_t *n)
{
    *n = TDM_ARRAY_LEN(g_rules);
    return g_rules;
}

static size_t apply(tdm_compat_scope scope, const Tandem__V1__Descriptor *a,
                    const Tandem__V1__Descriptor *b, tdm_compat_refusal *out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < TDM_ARRAY_LEN(g_rules); i++) {
        if (g_rules[i].scope != scope)
            continue;
        tdm_compat_refusal r;
        if (g_rules[i].check(a, b, &r)) {
            if (n < max)
                out[n] = r;
            n++;
        }
    }
    return n;
}

size_t tdm_compat_check_pair(const Tandem__V1__Descriptor *verifier,
                             const Tandem__V1__Descriptor *drafter, tdm_compat_refusal *out,
                             size_t max)
{
    return apply(TDM_COMPAT_PAIR, verifier, drafter, out, max);
}

size_t tdm_compat_check_gateway(const Tandem__V1__Descriptor *gateway,
                                const Tandem__V1__Descriptor *verifier, tdm_compat_refusal *out,
                                size_t max)
{
    return apply(TDM_COMPAT_GATEWAY, gateway, verifier, out, max);
}

size_t tdm_compat_check_replicas(const Tandem__V1__Descriptor *a, const Tandem__V1__Descriptor *b,
                                 tdm_compat_refusal *out, size_t max)
{
    return apply(TDM_COMPAT_REPLICAS, a, b, out, max);
}

static char *dup_or_die(const char *s)
{
    char *d = tdm_xstrdup(s);
    return d;
}

void tdm_compat_refusal_to_proto(const tdm_compat_refusal *r, Tandem__V1__Refusal *out)
{
    out->rule = dup_or_die(r->rule);
    out->message = dup_or_die(r->message);
    out->a_replica = dup_or_die(r->a_replica);
    out->a_value = dup_or_die(r->a_value);
    out->b_replica = dup_or_die(r->b_replica);
    out->b_value = dup_or_die(r->b_value);
}

void tdm_compat_refusal_proto_clear(Tandem__V1__Refusal *out)
{
    free(out->rule);
    free(out->message);
    free(out->a_replica);
    free(out->a_value);
    free(out->b_replica);
    free(out->b_value);
    tandem__v1__refusal__init(out);
}

/* ---- canonical hashing ---------------------------------------------------- */

/* Every item is hashed as an 8-byte little-endian length followed by its bytes,
 * so that no two different sequences of items hash the same stream. */
static void hash_item(EVP_MD_CTX *h, const void *data, size_t len)
{
    unsigned char n[8];
    for (int i = 0; i < 8; i++)
        n[i] = (unsigned char)((uint64_t)len >> (8 * i));
    EVP_DigestUpdate(h, n, 8);
    if (len)
        EVP_DigestUpdate(h, data, len);
}

static void hash_str(EVP_MD_CTX *h, const char *s)
{
    hash_item(h, s, strlen(s));
}

static void hash_u64(EVP_MD_CTX *h, uint64_t v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
    hash_str(h, buf);
}

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Canonical form of a JSON value: a type tag, then for objects the members
 * sorted by key, for arrays the elements in order. Depth-limited because the
 * input comes from a file. */
static int hash_json(EVP_MD_CTX *h, const cJSON *j, int depth, const char *const *skip,
                     size_t n_skip)
{
    if (depth > 64)
        return -1;
    if (!j || cJSON_IsNull(j)) {
        hash_str(h, "n");
    } else if (cJSON_IsBool(j)) {
        hash_str(h, cJSON_IsTrue(j) ? "t" : "f");
    } else if (cJSON_IsNumber(j)) {
        char buf[64];
        double v = j->valuedouble;
        if (v == (double)(int64_t)v && v > -9e15 && v < 9e15)
            snprintf(buf, sizeof(buf), "%lld", (long long)v);
        else
            snprintf(buf, sizeof(buf), "%.17g", v);
        hash_str(h, "#");
        hash_str(h, buf);
    } else if (cJSON_IsString(j)) {
        hash_str(h, "s");
        hash_str(h, j->valuestring);
    } else if (cJSON_IsArray(j)) {
        hash_str(h, "[");
        hash_u64(h, (uint64_t)cJSON_GetArraySize(j));
        for (const cJSON *c = j->child; c; c = c->next)
            if (hash_json(h, c, depth + 1, NULL, 0) != 0)
                return -1;
    } else if (cJSON_IsObject(j)) {
        size_t n = 0;
        for (const cJSON *c = j->child; c; c = c->next)
            n++;
        const char **keys = tdm_xcalloc(n ? n : 1, sizeof(char *));
        size_t k = 0;
        for (const cJSON *c = j->child; c; c = c->next) {
            int skipped = 0;
            for (size_t s = 0; s < n_skip; s++)
                skipped = skipped || strcmp(c->string, skip[s]) == 0;
            if (!skipped)
                keys[k++] = c->string;
        }
        qsort(keys, k, sizeof(char *), cmp_cstr);
        hash_str(h, "{");
        hash_u64(h, k);
        int rc = 0;
        for (size_t i = 0; i < k && rc == 0; i++) {
            hash_str(h, keys[i]);
            rc = hash_json(h, cJSON_GetObjectItemCaseSensitive(j, keys[i]), depth + 1, NULL, 0);
        }
        free(keys);
        return rc;
    } else {
        return -1;
    }
    return 0;
}

static void hex_digest(EVP_MD_CTX *h, char out[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(h, md, &len);
    for (unsigned int i = 0; i < len && i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    out[64] = '\0';
}

static tdm_status read_json(const char *path, size_t max, cJSON **out, tdm_error *err)
{
    char *text = NULL;
    size_t len = 0;
    tdm_status st = tdm_file_read(path, max, &text, &len, err);
    if (st != TDM_OK)
        return st;
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j) {
        const char *where = cJSON_GetErrorPtr();
        long off = where ? (long)(where - text) : -1;
        free(text);
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: not valid JSON (near byte %ld)",
                             path, off);
    }
    free(text);
    *out = j;
    return TDM_OK;
}

/* ---- tokenizer fingerprint ---------------------------------------------- */

tdm_status tdm_compat_tokenizer_fingerprint_file(const char *path, char out[65], tdm_error *err)
{
    /* The tokenizer module's fingerprint, so that `tandem tokenize`, the
     * gateway and every replica's Descriptor report the same value. */
    return tdm_tok_fingerprint_file(path, out, err);
}

/* ---- model fingerprint ---------------------------------------------------- */

typedef struct tensor_ref {
    const char *name;
    const tdm_st_tensor *t;
} tensor_ref;

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const tensor_ref *)a)->name, ((const tensor_ref *)b)->name);
}

tdm_status tdm_compat_model_fingerprint_dir(const char *dir, char out[65], tdm_error *err)
{
    char path[4096];
    cJSON *config = NULL;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    tdm_status st = read_json(path, (size_t)16 << 20, &config, err);
    if (st != TDM_OK)
        return st;
    /* The checkpoint reader validates every header (offsets, sizes, dtypes)
     * and handles sharded checkpoints; only names, dtypes and shapes are
     * hashed, so the fingerprint does not depend on the data. */
    tdm_st_file *sf = NULL;
    st = tdm_st_open(dir, &sf, err);
    if (st != TDM_OK) {
        cJSON_Delete(config);
        return st;
    }
    size_t n = tdm_st_count(sf);
    tensor_ref *refs = tdm_xcalloc(n ? n : 1, sizeof(*refs));
    for (size_t i = 0; i < n; i++) {
        refs[i].t = tdm_st_at(sf, i);
        refs[i].name = refs[i].t->name;
    }
    qsort(refs, n, sizeof(*refs), cmp_tensor);
    static const char *const skip[] = {"transformers_version", "_name_or_path", "dtype",
                                       "torch_dtype"};
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    TDM_ASSERT(h != NULL);
    EVP_DigestInit_ex(h, EVP_sha256(), NULL);
    hash_str(h, "tandem-model-v1");
    if (hash_json(h, config, 0, skip, TDM_ARRAY_LEN(skip)) != 0) {
        st = tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: nested too deeply", path);
    } else {
        hash_str(h, "tensors");
        hash_u64(h, n);
        for (size_t i = 0; i < n; i++) {
            const tdm_st_tensor *t = refs[i].t;
            char shape[512] = "";
            size_t used = 0;
            for (int d = 0; d < t->ndim && used < sizeof(shape); d++) {
                int w = snprintf(shape + used, sizeof(shape) - used, "%s%lld", d ? "," : "",
                                 (long long)t->shape[d]);
                if (w < 0)
                    break;
                used += (size_t)w;
            }
            hash_str(h, t->name);
            hash_str(h, tdm_st_dtype_name(t->dtype));
            hash_str(h, shape);
        }
        hex_digest(h, out);
    }
    EVP_MD_CTX_free(h);
    free(refs);
    tdm_st_close(sf);
    cJSON_Delete(config);
    return st;
}

tdm_gpu_share tdm_gpu_sharing(const char *uuid_a, bool mps_a, const char *uuid_b, bool mps_b)
{
    if (!uuid_a || !uuid_a[0] || !uuid_b || !uuid_b[0] || strcmp(uuid_a, uuid_b) != 0)
        return TDM_GPU_APART;
    return mps_a && mps_b ? TDM_GPU_SHARED_MPS : TDM_GPU_SHARED_TURNS;
}

const char *tdm_gpu_turns_without(bool verifier_mps, bool drafter_mps)
{
    return verifier_mps ? "the drafter not" : drafter_mps ? "the verifier not" : "neither";
}

/* A CPU number at *p (digits, at most TDM_CPULIST_MAX), moving *p past it; -1
 * where none starts there. */
static long cpu_number(const char **p)
{
    long v = -1;
    while (**p >= '0' && **p <= '9' && v <= TDM_CPULIST_MAX) {
        v = (v < 0 ? 0 : v * 10) + (**p - '0');
        (*p)++;
    }
    return v;
}

tdm_status tdm_cpulist_parse(const char *s, tdm_cpulist *out, tdm_error *err)
{
    memset(out, 0, sizeof(*out));
    if (!s || !s[0])
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "an empty CPU list");
    const char *p = s;
    for (;;) {
        long lo = cpu_number(&p), hi = lo;
        if (lo >= 0 && *p == '-') {
            p++;
            hi = cpu_number(&p);
        }
        if (lo < 0 || hi < lo || hi >= TDM_CPULIST_MAX)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "CPU list \"%.64s\": at character %ld, expected a CPU number "
                                 "or a range N-M (N <= M < %d), separated by commas",
                                 s, (long)(p - s) + 1, TDM_CPULIST_MAX);
        for (long c = lo; c <= hi; c++)
            out->bits[c / 64] |= (uint64_t)1 << (c % 64);
        if (*p == '\0')
            return TDM_OK;
        if (*p != ',')
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "CPU list \"%.64s\": unexpected '%c' at character %ld", s, *p,
                                 (long)(p - s) + 1);
        p++;
    }
}

void tdm_cpulist_self(char *buf, size_t len)
{
    buf[0] = '\0';
    cpu_set_t set;
    if (len == 0 || sched_getaffinity(0, sizeof(set), &set) != 0)
        return;
    size_t w = 0;
    for (int c = 0; c < CPU_SETSIZE && c < TDM_CPULIST_MAX; c++) {
        if (!CPU_ISSET(c, &set))
            continue;
        int e = c;
        while (e + 1 < CPU_SETSIZE && e + 1 < TDM_CPULIST_MAX && CPU_ISSET(e + 1, &set))
            e++;
        int n = e > c ? snprintf(buf + w, len - w, "%s%d-%d", w ? "," : "", c, e)
                      : snprintf(buf + w, len - w, "%s%d", w ? "," : "", c);
        if (n < 0 || (size_t)n >= len - w) {
            buf[0] = '\0'; /* does not fit: not known, rather than a wrong list */
            return;
        }
        w += (size_t)n;
        c = e;
    }
}

void tdm_host_id_self(char *buf, size_t len)
{
    if (len == 0)
        return;
    buf[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f)
        return;
    if (!fgets(buf, (int)len, f))
        buf[0] = '\0';
    fclose(f);
    buf[strcspn(buf, "\r\n")] = '\0';
}

bool tdm_cores_shared(const char *host_a, const char *cpus_a, const char *host_b,
                      const char *cpus_b)
{
    if (!host_a || !host_a[0] || !host_b || !host_b[0])
        return true;
    if (strcmp(host_a, host_b) != 0)
        return false;
    tdm_cpulist a, b;
    tdm_error err;
    if (tdm_cpulist_parse(cpus_a, &a, &err) != TDM_OK ||
        tdm_cpulist_parse(cpus_b, &b, &err) != TDM_OK)
        return true;
    for (size_t i = 0; i < sizeof(a.bits) / sizeof(a.bits[0]); i++)
        if (a.bits[i] & b.bits[i])
            return true;
    return false;
}
