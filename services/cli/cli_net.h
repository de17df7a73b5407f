/*
 * cli_net.h - how the commands that call a running gateway reach it: its
 * address, TLS and the bearer token, from options or the environment (the
 * same variables the services read).
 *
 *   --gateway HOST:PORT   $TANDEM_GATEWAY, else 127.0.0.1:7700
 *   --tls-ca FILE         $TANDEM_TLS_CA: verify the gateway's certificate
 *   --tls-cert FILE       $TANDEM_TLS_CERT: present a client certificate
 *   --tls-key FILE        $TANDEM_TLS_KEY: its key
 *   --tls-server-name N   the name the gateway's certificate must carry
 *   --token TOKEN         $TANDEM_TOKEN: sent as authorization: Bearer TOKEN
 */
#ifndef TANDEM_CLI_NET_H
#define TANDEM_CLI_NET_H

#include "rpc.h"
#include "status.h"

typedef struct cli_net {
    const char *gateway;
    const char *ca, *cert, *key, *server_name;
    const char *token;
    char bearer[1100];
    tdm_rpc_tls tls;
    tdm_rpc_metadata md;
} cli_net;

/* The usage lines of the options above. */
extern const char cli_net_usage[];

/* Defaults from the environment. */
void cli_net_init(cli_net *n);
/* When argv[*i] is one of the options above, takes it (and its value,
 * advancing *i) and returns 1; 0 when it is not; -1 after printing what is
 * wrong (prefixed by cmd). */
int cli_net_option(cli_net *n, const char *cmd, int argc, char **argv, int *i);
/* The channel to the gateway (TLS when a CA or certificate was given). */
tdm_status cli_net_channel(cli_net *n, tdm_rpc_channel **out, tdm_error *err);
/* A call's --timeout: a positive duration (e.g. 5s) into *ms; 0, or -1
 * after printing what is wrong (prefixed by cmd). */
int cli_net_timeout(const char *cmd, const char *value, int64_t *ms);
/* Adds the bearer token (when given) to a call's options. */
void cli_net_call_options(cli_net *n, tdm_rpc_call_options *opt);

#endif
