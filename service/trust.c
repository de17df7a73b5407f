/*
 * trust.c - see trust.h.
 */
#include "trust.h"

#include "alloc.h"
#include "file.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

/* A token is kept as its SHA-256, so that comparing two takes the same time
 * whatever their lengths and contents. */
typedef struct token_set {
    unsigned char (*digests)[32];
    size_t n;
} token_set;

struct tdm_trust {
    bool mtls;
    char *cluster_token; /* what this process sends; NULL: none */
    token_set cluster;   /* what it accepts: the same token */
    token_set api;
    token_set operators;
};

static void digest(const char *s, size_t n, unsigned char out[32])
{
    unsigned int len = 32;
    EVP_Digest(s, n, out, &len, EVP_sha256(), NULL);
}

/* Reads one token per line from path into set (and the first into *first). */
static tdm_status load_tokens(const char *key, const char *path, token_set *set, char **first,
                              tdm_error *err)
{
    char *text = NULL;
    size_t len = 0;
    tdm_status st = tdm_file_read(path, 1 << 20, &text, &len, err);
    if (st != TDM_OK)
        return tdm_error_prefix(err, "%s", key);
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        size_t n = strlen(line);
        while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
            line[--n] = '\0';
        while (*line == ' ' || *line == '\t')
            line++, n--;
        if (n == 0 || line[0] == '#')
            continue;
        set->digests = tdm_xrealloc(set->digests, (set->n + 1) * sizeof(*set->digests));
        digest(line, n, set->digests[set->n++]);
        if (first && !*first)
            *first = tdm_xstrdup(line);
    }
    free(text);
    if (set->n == 0)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: %s holds no token", key, path);
    return TDM_OK;
}

static bool set_has(const token_set *set, const char *token)
{
    if (!token)
        return false;
    unsigned char d[32];
    digest(token, strlen(token), d);
    bool found = false;
    for (size_t i = 0; i < set->n; i++)
        found |= CRYPTO_memcmp(d, set->digests[i], 32) == 0;
    return found;
}

static const char *path_of(const tdm_cfg *cfg, const char *key)
{
    return tdm_cfg_has(cfg, key) ? tdm_cfg_str(cfg, key) : "";
}

tdm_status tdm_trust_create(const tdm_cfg *cfg, bool mtls, tdm_trust **out, tdm_error *err)
{
    *out = NULL;
    tdm_trust *t = tdm_xcalloc(1, sizeof(*t));
    t->mtls = mtls;
    const char *p;
    tdm_status st = TDM_OK;
    if (st == TDM_OK && (p = path_of(cfg, "cluster_token_file"))[0])
        st = load_tokens("cluster_token_file", p, &t->cluster, &t->cluster_token, err);
    if (st == TDM_OK && (p = path_of(cfg, "api_tokens_file"))[0])
        st = load_tokens("api_tokens_file", p, &t->api, NULL, err);
    if (st == TDM_OK && (p = path_of(cfg, "operator_tokens_file"))[0])
        st = load_tokens("operator_tokens_file", p, &t->operators, NULL, err);
    if (st != TDM_OK) {
        tdm_trust_destroy(t);
        return st;
    }
    *out = t;
    return TDM_OK;
}

void tdm_trust_destroy(tdm_trust *t)
{
    if (!t)
        return;
    if (t->cluster_token)
        OPENSSL_cleanse(t->cluster_token, strlen(t->cluster_token));
    free(t->cluster_token);
    free(t->cluster.digests);
    free(t->api.digests);
    free(t->operators.digests);
    free(t);
}

/* Whether the peer's certificate names role: URI SAN tandem:role:ROLE or
 * OU=tandem-ROLE in its subject. */
static bool cert_has_role(const tdm_rpc_call *call, const char *role)
{
    char buf[4096], want[64];
    snprintf(want, sizeof(want), "tandem:role:%s\n", role);
    if (tdm_rpc_call_peer_property(call, "peer_uri", buf, sizeof(buf)) > 0) {
        for (const char *p = buf; (p = strstr(p, want)); p++)
            if (p == buf || p[-1] == '\n')
                return true;
    }
    snprintf(want, sizeof(want), "OU=tandem-%s", role);
    if (tdm_rpc_call_peer_property(call, "x509_subject", buf, sizeof(buf)) > 0) {
        size_t wl = strlen(want);
        for (const char *p = buf; (p = strstr(p, want)); p++) {
            bool starts = p == buf || p[-1] == ',' || p[-1] == '/' || p[-1] == ' ' || p[-1] == '\n';
            char end = p[wl];
            if (starts && (end == '\0' || end == ',' || end == '/' || end == '\n' || end == '+'))
                return true;
        }
    }
    return false;
}

tdm_status tdm_trust_check_internal(const tdm_trust *t, const tdm_rpc_call *call,
                                    const char *role_name, tdm_error *err)
{
    const char *method = tdm_rpc_call_method(call);
    if (t->cluster.n > 0) {
        const char *tok = tdm_rpc_call_metadata(call, TDM_TRUST_CLUSTER_TOKEN_KEY);
        if (!set_has(&t->cluster, tok))
            return tdm_error_set(err, TDM_ERR_UNAUTHENTICATED,
                                 "%s from %s: %s cluster token (metadata %s); a %s must be given "
                                 "the same cluster_token_file as this service",
                                 method, tdm_rpc_call_peer(call), tok ? "wrong" : "no",
                                 TDM_TRUST_CLUSTER_TOKEN_KEY, role_name);
    }
    if (t->mtls && !cert_has_role(call, role_name))
        return tdm_error_set(err, TDM_ERR_PERMISSION_DENIED,
                             "%s from %s: the client certificate does not name the %s role (URI "
                             "SAN tandem:role:%s or OU=tandem-%s in its subject)",
                             method, tdm_rpc_call_peer(call), role_name, role_name, role_name);
    if (t->cluster.n == 0 && !t->mtls && !tdm_rpc_call_peer_is_local(call))
        return tdm_error_set(err, TDM_ERR_PERMISSION_DENIED,
                             "%s from %s: this service accepts calls from other hosts' services "
                             "only with a cluster token (cluster_token_file) or mutual TLS "
                             "(tls_client_auth require); set one on every service",
                             method, tdm_rpc_call_peer(call));
    return TDM_OK;
}

/* The token of an "authorization: Bearer TOKEN" header, or NULL. */
/* The token of an "authorization: Bearer TOKEN" value, or NULL. */
static const char *bearer_of(const char *a)
{
    if (!a || strncasecmp(a, "Bearer ", 7) != 0)
        return NULL;
    a += 7;
    while (*a == ' ')
        a++;
    return a;
}

static const char *bearer(const tdm_rpc_call *call)
{
    return bearer_of(tdm_rpc_call_metadata(call, "authorization"));
}

tdm_status tdm_trust_check_bearer(const tdm_trust *t, const char *authorization, const char *what,
                                  tdm_error *err)
{
    const char *b = bearer_of(authorization);
    if (t->api.n == 0 || set_has(&t->api, b) || set_has(&t->operators, b))
        return TDM_OK;
    return tdm_error_set(err, TDM_ERR_UNAUTHENTICATED,
                         "%s: this gateway requires a bearer token (authorization: Bearer "
                         "TOKEN); %s",
                         what, b ? "this one is not valid" : "none was given");
}

tdm_status tdm_trust_check_client(const tdm_trust *t, const tdm_rpc_call *call, tdm_error *err)
{
    return tdm_trust_check_bearer(t, tdm_rpc_call_metadata(call, "authorization"),
                                  tdm_rpc_call_method(call), err);
}

bool tdm_trust_is_operator(const tdm_trust *t, const tdm_rpc_call *call)
{
    if (t->operators.n > 0)
        return set_has(&t->operators, bearer(call));
    return tdm_rpc_call_peer_is_local(call);
}

size_t tdm_trust_metadata(const tdm_trust *t, tdm_rpc_metadata *md)
{
    if (!t || !t->cluster_token)
        return 0;
    md->key = TDM_TRUST_CLUSTER_TOKEN_KEY;
    md->value = t->cluster_token;
    return 1;
}
