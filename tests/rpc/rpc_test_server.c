/*
 * rpc_test_server.c - a small server for interop tests: tandem.test.Echo and
 * grpc.health.v1.Health on the main port, Health alone on a second plaintext
 * port. Prints "ready port=N health_port=M" once serving; exits 0 after
 * SIGTERM/SIGINT and a clean shutdown.
 *   rpc_test_server [--listen ADDR] [--health-listen ADDR] [--not-ready]
 */
#include <stdio.h>
#include <string.h>

#include "echo_service.h"
#include "health.h"
#include "log.h"
#include "reflection.h"
#include "rpc.h"

int main(int argc, char **argv)
{
    const char *listen = "127.0.0.1:0", *health_listen = "127.0.0.1:0";
    bool ready = true;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc)
            listen = argv[++i];
        else if (strcmp(argv[i], "--health-listen") == 0 && i + 1 < argc)
            health_listen = argv[++i];
        else if (strcmp(argv[i], "--not-ready") == 0)
            ready = false;
        else {
            fprintf(stderr, "rpc_test_server: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    tdm_rpc_signals_install();
    tdm_error err;
    tdm_rpc_server *s = NULL, *hs = NULL;
    tdm_health *h = tdm_health_create();
    tdm_rpc_server_options so = {.listen = listen, .name = "test-server"};
    if (tdm_rpc_server_create(&so, &s, &err) != TDM_OK ||
        tdm_health_add_service(h, "tandem.test.Echo", &err) != TDM_OK ||
        echo_register(s, &err) != TDM_OK || tdm_health_register(h, s, &err) != TDM_OK ||
        tdm_reflection_register(s, &err) != TDM_OK ||
        tdm_rpc_server_start(s, &err) != TDM_OK ||
        tdm_health_server_start(h, health_listen, &hs, &err) != TDM_OK) {
        fprintf(stderr, "rpc_test_server: %s\n", err.msg);
        tdm_rpc_server_destroy(s);
        tdm_health_destroy(h);
        return 1;
    }
    if (ready)
        tdm_health_set_all(h, true);
    printf("ready port=%d health_port=%d\n", tdm_rpc_server_port(s), tdm_rpc_server_port(hs));
    fflush(stdout);
    int sig = tdm_rpc_wait_for_signal();
    tdm_log_info("test-server", "signal %d: shutting down", sig);
    tdm_rpc_server_shutdown(s, 2000);
    tdm_rpc_server_shutdown(hs, 500);
    tdm_rpc_server_destroy(s);
    tdm_rpc_server_destroy(hs);
    tdm_health_destroy(h);
    return 0;
}
