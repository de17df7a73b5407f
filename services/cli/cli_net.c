/*
 * cli_net.c - see cli_net.h.
 */
#include "cli_net.h"

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char cli_net_usage[] =
    "  --gateway HOST:PORT  gateway address (default $TANDEM_GATEWAY, else 127.0.0.1:7700)\n"
    "  --tls-ca FILE        CA to verify the gateway's certificate ($TANDEM_TLS_CA)\n"
    "  --tls-cert FILE      client certificate for mutual TLS ($TANDEM_TLS_CERT)\n"
    "  --tls-key FILE       its private key ($TANDEM_TLS_KEY)\n"
    "  --tls-server-name N  name the gateway's certificate must carry (default: its host)\n"
    "  --token TOKEN        bearer token for a gateway that requires one ($TANDEM_TOKEN)\n";

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

void cli_net_init(cli_net *n)
{
    memset(n, 0, sizeof(*n));
    n->gateway = env("TANDEM_GATEWAY") ? env("TANDEM_GATEWAY") : "127.0.0.1:7700";
    n->ca = env("TANDEM_TLS_CA");
    n->cert = env("TANDEM_TLS_CERT");
    n->key = env("TANDEM_TLS_KEY");
    n->token = env("TANDEM_TOKEN");
}

int cli_net_option(cli_net *n, const char *cmd, int argc, char **argv, int *i)
{
    static const char *const names[] = {"--gateway", "--tls-ca",          "--tls-cert",
                                        "--tls-key", "--tls-server-name", "--token"};
    const char *a = argv[*i];
    size_t k = 0;
    while (k < sizeof(names) / sizeof(names[0]) && strcmp(a, names[k]) != 0)
        k++;
    if (k == sizeof(names) / sizeof(names[0]))
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "tandem %s: %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    if (k == 0) {
        char host[256];
        int port;
        tdm_error err;
        if (tdm_cfg_parse_address(v, host, sizeof(host), &port, &err) != TDM_OK) {
            fprintf(stderr, "tandem %s: --gateway: %s\n", cmd, err.msg);
            return -1;
        }
        n->gateway = v;
    } else {
        const char **slot[] = {NULL, &n->ca, &n->cert, &n->key, &n->server_name, &n->token};
        *slot[k] = v;
    }
    return 1;
}

tdm_status cli_net_channel(cli_net *n, tdm_rpc_channel **out, tdm_error *err)
{
    if ((n->cert != NULL) != (n->key != NULL))
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "--tls-cert and --tls-key go together (a certificate and its key)");
    n->tls = (tdm_rpc_tls){
        .ca_path = n->ca, .cert_path = n->cert, .key_path = n->key, .server_name = n->server_name};
    bool tls = n->ca || n->cert;
    tdm_rpc_channel_options o = {.target = n->gateway, .tls = tls ? &n->tls : NULL};
    return tdm_rpc_channel_create(&o, out, err);
}

int cli_net_timeout(const char *cmd, const char *value, int64_t *ms)
{
    tdm_error err;
    if (tdm_cfg_parse_duration_ms(value, ms, &err) != TDM_OK || *ms <= 0) {
        fprintf(stderr, "tandem %s: --timeout: %s\n", cmd, *ms <= 0 ? "must be positive" : err.msg);
        return -1;
    }
    return 0;
}

void cli_net_call_options(cli_net *n, tdm_rpc_call_options *opt)
{
    if (!n->token)
        return;
    snprintf(n->bearer, sizeof(n->bearer), "Bearer %s", n->token);
    n->md = (tdm_rpc_metadata){"authorization", n->bearer};
    opt->metadata = &n->md;
    opt->n_metadata = 1;
}
