/*
 * echo_service.h - the test-only tandem.test.Echo service used by the gRPC
 * layer's tests and by rpc_test_server (interop tests).
 */
#ifndef TANDEM_TESTS_RPC_ECHO_SERVICE_H
#define TANDEM_TESTS_RPC_ECHO_SERVICE_H

#include <stdatomic.h>

#include "rpc.h"
#include "tests/rpc/echo.pb-c.h"

#define ECHO_SAY "/tandem.test.Echo/Say"
#define ECHO_REPEAT "/tandem.test.Echo/Repeat"
#define ECHO_CHAT "/tandem.test.Echo/Chat"

/* Handlers that returned because they saw their call cancelled or its
 * deadline pass (client cancellation tests read it). */
extern atomic_int echo_cancel_seen;
/* Streaming handlers currently running. */
extern atomic_int echo_streams_running;

tdm_status echo_register(tdm_rpc_server *server, tdm_error *err);

#endif
