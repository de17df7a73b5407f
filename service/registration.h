/*
 * registration.h - a replica's membership in the gateway's registry.
 *
 * Owns one background thread per drafter or verifier process that registers
 * the process's Descriptor with the gateway (tandem.v1.Registry), heartbeats
 * at the interval the gateway asks for, retries with backoff while the
 * gateway is unreachable, registers again when a heartbeat answers
 * known=false (the gateway restarted or dropped us), logs the refusals the
 * gateway reports, and deregisters on stop.
 *
 * Ownership: the options (descriptor, TLS paths) are borrowed and must
 * outlive the tdm_reg; tdm_reg_stop joins the thread and frees it.
 */
#ifndef TANDEM_COMMON_REGISTRATION_H
#define TANDEM_COMMON_REGISTRATION_H

#include "rpc.h"
#include "status.h"
#include "trust.h"
#include "tandem/v1/registry.pb-c.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct tdm_reg tdm_reg;

typedef struct tdm_reg_options {
    const char *gateway;                      /* "host:port" */
    const tdm_rpc_tls *tls;                   /* NULL: plaintext */
    int64_t max_message_bytes;                /* 0: the rpc default */
    const Tandem__V1__Descriptor *descriptor; /* what this replica is */
    const tdm_trust *trust;                   /* the credential every call carries; may be NULL */
    /* Fills the load reported with each heartbeat; optional. Called on the
     * registration thread. */
    void (*load)(void *arg, Tandem__V1__ReplicaLoad *out);
    void *load_arg;
} tdm_reg_options;

typedef struct tdm_reg_counters {
    uint64_t registrations;      /* successful RegisterReplica calls */
    uint64_t heartbeats;         /* heartbeats answered known=true */
    uint64_t heartbeat_failures; /* heartbeats that did not reach the gateway */
    uint64_t forgotten;          /* heartbeats answered known=false */
} tdm_reg_counters;

/* Starts the thread; the first registration attempt happens at once. */
tdm_status tdm_reg_start(const tdm_reg_options *opt, tdm_reg **out, tdm_error *err);
/* Deregisters (when registered; bounded by a 1 s deadline) with `reason`,
 * stops and joins the thread, frees everything. NULL is a no-op. */
void tdm_reg_stop(tdm_reg *reg, const char *reason);

bool tdm_reg_is_registered(tdm_reg *reg);
tdm_reg_counters tdm_reg_get_counters(tdm_reg *reg);

#endif
