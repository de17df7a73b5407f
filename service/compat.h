/*
 * compat.h - the compatibility rules between replicas (DESIGN.md section 4).
 *
 * This module owns the rule table that decides whether a verifier and a
 * drafter may work together, and whether replicas of one role may exchange
 * state snapshots. Rules read only tandem.v1.Descriptor messages, so the same
 * table runs in the gateway (on descriptors sent at registration) and offline
 * in `tandem check-config` (on descriptors built from config files). It also
 * owns the fingerprints that go into a Descriptor: the tokenizer fingerprint
 * (the tokenizer module's, behind one function) and the model fingerprint.
 *
 * Every refusal names the rule id, both values and both services (replica id
 * and address) in a full sentence; tdm_compat_refusal_to_proto turns it into
 * the tandem.v1.Refusal message served by GetStatus and RegisterReplica.
 *
 * Ownership: descriptors are borrowed for the duration of a call; refusals are
 * plain values written into caller-provided arrays. Thread-safe (no state).
 */
#ifndef TANDEM_COMMON_COMPAT_H
#define TANDEM_COMMON_COMPAT_H

#include "status.h"
#include "tandem/v1/common.pb-c.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum tdm_compat_scope {
    TDM_COMPAT_PAIR = 0,     /* a verifier with a drafter */
    TDM_COMPAT_REPLICAS = 1, /* two replicas of the same role */
    TDM_COMPAT_GATEWAY = 2   /* the gateway with a verifier it would send requests to */
} tdm_compat_scope;

typedef struct tdm_compat_refusal {
    char rule[48];       /* rule id, e.g. "tokenizer-fingerprint" */
    char message[2048];  /* full sentence naming both values and services */
    char a_replica[256]; /* "replica-id (address)"; the verifier in a pair */
    char a_value[256];
    char b_replica[256]; /* the drafter in a pair */
    char b_value[256];
} tdm_compat_refusal;

typedef struct tdm_compat_rule {
    const char *id;
    tdm_compat_scope scope;
    const char *summary; /* what the rule requires, one sentence */
    /* Returns 1 and fills *out when a and b are refused, 0 when they pass. */
    int (*check)(const Tandem__V1__Descriptor *a, const Tandem__V1__Descriptor *b,
                 tdm_compat_refusal *out);
} tdm_compat_rule;

/* How two replicas' devices relate (Descriptor.device_uuid, device_mps).
 * Not a refusal: a drafter on its verifier's GPU works, but unless both are
 * clients of an MPS server their contexts take turns on the GPU, so the
 * drafter's steps wait behind the verifier's and the other way round. */
typedef enum tdm_gpu_share {
    TDM_GPU_APART = 0,    /* different GPUs, or either on the CPU */
    TDM_GPU_SHARED_MPS,   /* one GPU, both through MPS: their kernels run at once */
    TDM_GPU_SHARED_TURNS, /* one GPU, a context each: they take turns */
} tdm_gpu_share;

tdm_gpu_share tdm_gpu_sharing(const char *uuid_a, bool mps_a, const char *uuid_b, bool mps_b);

/* For TDM_GPU_SHARED_TURNS of a pair: which side lacks MPS, as the subject of
 * "... through an MPS server": "the drafter not", "the verifier not" or
 * "neither". */
const char *tdm_gpu_turns_without(bool verifier_mps, bool drafter_mps);

/* CPU lists (Descriptor.cpus): a Linux CPU list ("0-3,8,10-11") as bits of
 * CPUs 0 .. TDM_CPULIST_MAX - 1. */
#define TDM_CPULIST_MAX 1024
/* The longest CPU list a Descriptor carries, in characters; a longer
 * affinity mask goes out as "" (not known). */
#define TDM_CPULIST_TEXT_MAX 256
typedef struct tdm_cpulist {
    uint64_t bits[TDM_CPULIST_MAX / 64];
} tdm_cpulist;

/* Parses a CPU list; an error names what is wrong with it. */
tdm_status tdm_cpulist_parse(const char *s, tdm_cpulist *out, tdm_error *err);

/* The calling process's affinity mask as a CPU list ("" if it cannot be read). */
void tdm_cpulist_self(char *buf, size_t len);

/* The host this process runs on: the kernel's boot_id, the same in every
 * container of one host ("" if it cannot be read). */
void tdm_host_id_self(char *buf, size_t len);

/* Whether two replicas on the CPU backend compute on the same cores
 * (Descriptor.host_id and cpus): one host and CPU lists that meet. Where
 * either side is not known (a host_id or a list that is "" or does not
 * parse) they are taken to share. */
bool tdm_cores_shared(const char *host_a, const char *cpus_a, const char *host_b,
                      const char *cpus_b);

/* What to do about a drafter on its verifier's CPU cores, one sentence. */
#define TDM_CORES_FIX                                                                              \
    "give each CPUs of its own (taskset, a container's cpuset) or the drafter a host of its "      \
    "own, for it to draft ahead while the verifier verifies"

/* What to do about TDM_GPU_SHARED_TURNS, one sentence. */
#define TDM_GPU_TURNS_FIX                                                                          \
    "run both under one MPS control daemon (nvidia-cuda-mps-control -d, with the same "            \
    "CUDA_MPS_PIPE_DIRECTORY for both), or give the drafter a GPU of its own"

/* The rule table, in the order rules are applied. */
const tdm_compat_rule *tdm_compat_rules(size_t *n);

/* Applies every pair rule to a verifier and a drafter. Writes up to `max`
 * refusals into out and returns how many rules refused (which may exceed
 * max). 0 means the pair is compatible. */
size_t tdm_compat_check_pair(const Tandem__V1__Descriptor *verifier,
                             const Tandem__V1__Descriptor *drafter, tdm_compat_refusal *out,
                             size_t max);

/* Applies every same-role rule to two replicas of one role. */
size_t tdm_compat_check_replicas(const Tandem__V1__Descriptor *a, const Tandem__V1__Descriptor *b,
                                 tdm_compat_refusal *out, size_t max);

/* Applies every gateway rule to the gateway and a verifier (a = gateway). */
size_t tdm_compat_check_gateway(const Tandem__V1__Descriptor *gateway,
                                const Tandem__V1__Descriptor *verifier, tdm_compat_refusal *out,
                                size_t max);

/* The draft-block-size rule for a block size a request carries (`field`
 * names where it came from, e.g. "speculation.block_size") against the
 * verifier `verifier` (a name for the message) with max_draft_tokens
 * `max_draft`: FAILED_PRECONDITION worded as the rule table words it, or
 * TDM_OK for 1..max_draft. */
tdm_status tdm_compat_check_request_block(uint32_t block, const char *field, const char *verifier,
                                          uint32_t max_draft, tdm_error *err);

/* Fills a Refusal message (initialised by the caller) with copies of the
 * refusal's strings; free them with tdm_compat_refusal_proto_clear. */
void tdm_compat_refusal_to_proto(const tdm_compat_refusal *r, Tandem__V1__Refusal *out);
void tdm_compat_refusal_proto_clear(Tandem__V1__Refusal *out);

/* "replica-id (address)" for messages. */
const char *tdm_compat_service_name(const Tandem__V1__Descriptor *d, char *buf, size_t len);

/* SHA-256 (hex, 64 chars + NUL) of a tokenizer.json's canonical content:
 * tdm_tok_fingerprint_file (tokenizer.h documents the canonical form), so
 * every place that compares tokenizers uses one definition. Errors name the
 * file and what is wrong or unsupported. */
tdm_status tdm_compat_tokenizer_fingerprint_file(const char *path, char out[65], tdm_error *err);

/* SHA-256 (hex) of a model directory: config.json as canonical JSON without
 * the keys that do not change what the model computes (transformers_version,
 * _name_or_path; dtype and torch_dtype, which the tensors' dtypes capture),
 * then every tensor of model.safetensors (or of the shards listed in
 * model.safetensors.index.json) sorted by name as (name, dtype, shape), read
 * and validated by the safetensors module. Tensor data is not hashed. */
tdm_status tdm_compat_model_fingerprint_dir(const char *dir, char out[65], tdm_error *err);

#endif
