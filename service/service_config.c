/*
 * service_config.c - the three services' configuration tables, rules and
 * checks, their start-up sequence, and Descriptor building (see
 * service_config.h).
 */
#include "service_config.h"
#include "alloc.h"
#include "safetensors.h"
#include "shard.h"
#include "token_list.h"

#include "buildinfo.h"
#include "defs.h"
#include "model_config.h"
#include "compat.h"
#include "feature_shm.h"
#include "feature_stream.h"
#include "lane.h"
#include "log.h"

#include <libgen.h>
#include <openssl/rand.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- tables --------------------------------------------------------------- */

#define GRP_NET "Network"
#define GRP_TLS "TLS (all three paths empty: plaintext)"
#define GRP_REG "Registration with the gateway"
#define GRP_MODEL "Model and compute"
#define GRP_SPEC "Speculative decoding"
#define GRP_OPS "Operations"
#define GRP_TRUST "Trust (who may call what)"

/* Rows every service has. */
#define KEY_LISTEN(def)                                                                            \
    {                                                                                              \
        "listen", TDM_CFG_ADDRESS, def, NULL, 0, 0, 0, NULL, GRP_NET,                              \
            "Address of the main gRPC port (host:port; port 0 picks a free one)."                  \
    }
#define KEY_HEALTH_LISTEN(def)                                                                     \
    {                                                                                              \
        "health_listen", TDM_CFG_ADDRESS, def, NULL, 0, 0, 0, NULL, GRP_NET,                       \
            "Address of a plaintext port serving only grpc.health.v1.Health, for Kubernetes gRPC " \
            "probes, which cannot speak TLS."                                                      \
    }
#define KEY_METRICS_LISTEN                                                                         \
    {                                                                                              \
        "metrics_listen", TDM_CFG_ADDRESS, "auto", NULL, 0, 0, TDM_CFG_AUTO | TDM_CFG_EMPTY_OK,    \
            NULL, GRP_NET,                                                                         \
            "Address of a plaintext HTTP port serving Prometheus metrics on /metrics; empty: no "  \
            "metrics port; auto: health_listen's host and the port above it (port 0 when "         \
            "health_listen's is 0)."                                                               \
    }
#define KEYS_COMMON                                                                                \
    {"max_message_size",                                                                           \
     TDM_CFG_SIZE,                                                                                 \
     "64MiB",                                                                                      \
     NULL,                                                                                         \
     1024,                                                                                         \
     1073741824,                                                                                   \
     0,                                                                                            \
     NULL,                                                                                         \
     GRP_NET,                                                                                      \
     "Largest gRPC message this process sends or accepts."},                                       \
        {"tls_cert",                                                                               \
         TDM_CFG_PATH,                                                                             \
         "",                                                                                       \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         TDM_CFG_EMPTY_OK | TDM_CFG_PATH_FILE,                                                     \
         NULL,                                                                                     \
         GRP_TLS,                                                                                  \
         "PEM certificate chain this process presents; needs tls_key."},                           \
        {"tls_key",                                                                                \
         TDM_CFG_PATH,                                                                             \
         "",                                                                                       \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         TDM_CFG_EMPTY_OK | TDM_CFG_PATH_FILE,                                                     \
         NULL,                                                                                     \
         GRP_TLS,                                                                                  \
         "PEM private key of tls_cert."},                                                          \
        {"tls_ca",                                                                                 \
         TDM_CFG_PATH,                                                                             \
         "",                                                                                       \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         TDM_CFG_EMPTY_OK | TDM_CFG_PATH_FILE,                                                     \
         NULL,                                                                                     \
         GRP_TLS,                                                                                  \
         "PEM CA bundle that peers' certificates must chain to (clients verify servers with it; "  \
         "a server given one also requires client certificates)."},                                \
        {"log_level", TDM_CFG_ENUM,                                                                \
         "info",      "debug|info|warn|error",                                                     \
         0,           0,                                                                           \
         0,           NULL,                                                                        \
         GRP_OPS,     "Least severe log level written to stderr."},                                \
        {"shutdown_grace",                                                                         \
         TDM_CFG_DURATION,                                                                         \
         "5s",                                                                                     \
         NULL,                                                                                     \
         0,                                                                                        \
         600000,                                                                                   \
         0,                                                                                        \
         NULL,                                                                                     \
         GRP_OPS,                                                                                  \
         "On SIGTERM/SIGINT, how long in-flight calls may finish before they are cancelled."},     \
        {"tls_client_auth",                                                                        \
         TDM_CFG_ENUM,                                                                             \
         "auto",                                                                                   \
         "auto|none|require",                                                                      \
         0,                                                                                        \
         0,                                                                                        \
         TDM_CFG_AUTO,                                                                             \
         NULL,                                                                                     \
         GRP_TLS,                                                                                  \
         "Whether this process's servers demand client certificates that chain to tls_ca "         \
         "(mutual TLS); auto: require when tls_cert and tls_ca are both set."},                    \
    {                                                                                              \
        "cluster_token_file", TDM_CFG_PATH, "", NULL, 0, 0, TDM_CFG_EMPTY_OK | TDM_CFG_PATH_FILE,  \
            NULL, GRP_TRUST,                                                                       \
            "A secret shared by the gateway, the verifiers and the drafters (the file's first "    \
            "line): the calls between them carry it and are refused without it. With neither "     \
            "this nor mutual TLS those calls are accepted only from this host."                    \
    }

/* Rows drafters and verifiers share. */
#define KEYS_REPLICA                                                                               \
    {"gateway",                                                                                    \
     TDM_CFG_ADDRESS,                                                                              \
     "127.0.0.1:7700",                                                                             \
     NULL,                                                                                         \
     0,                                                                                            \
     0,                                                                                            \
     0,                                                                                            \
     NULL,                                                                                         \
     GRP_REG,                                                                                      \
     "Address of the gateway this replica registers with and heartbeats to."},                     \
        {"replica_id",                                                                             \
         TDM_CFG_STRING,                                                                           \
         "auto",                                                                                   \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         TDM_CFG_AUTO,                                                                             \
         NULL,                                                                                     \
         GRP_REG,                                                                                  \
         "Name of this replica, unique among the gateway's replicas; auto: "                       \
         "<role>-<hostname>-<pid>."},                                                              \
        {"advertise",                                                                              \
         TDM_CFG_ADDRESS,                                                                          \
         "auto",                                                                                   \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         TDM_CFG_AUTO,                                                                             \
         NULL,                                                                                     \
         GRP_REG,                                                                                  \
         "Address peers use to reach this replica's main port; auto: listen, with a wildcard "     \
         "host replaced by the host name and port 0 by the bound port."},                          \
        {"model",                                                                                  \
         TDM_CFG_PATH,                                                                             \
         "",                                                                                       \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         TDM_CFG_EMPTY_OK | TDM_CFG_PATH_DIR,                                                      \
         "config.json",                                                                            \
         GRP_MODEL,                                                                                \
         "Hugging Face model directory (config.json, safetensors weights, tokenizer.json)."},      \
        {"tokenizer",                                                                              \
         TDM_CFG_PATH,                                                                             \
         "auto",                                                                                   \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         TDM_CFG_AUTO | TDM_CFG_EMPTY_OK | TDM_CFG_PATH_FILE,                                      \
         NULL,                                                                                     \
         GRP_MODEL,                                                                                \
         "tokenizer.json whose fingerprint this replica advertises; auto: the model "              \
         "directory's tokenizer.json."},                                                           \
        {"backend",                                                                                \
         TDM_CFG_ENUM,                                                                             \
         "auto",                                                                                   \
         TDM_DEFS_ALLOWED(TDM_BACKENDS),                                                           \
         0,                                                                                        \
         0,                                                                                        \
         TDM_CFG_AUTO,                                                                             \
         NULL,                                                                                     \
         GRP_MODEL,                                                                                \
         "Compute backend; auto: cuda when this build has CUDA and an NVIDIA device is present, "  \
         "else cpu."},                                                                             \
        {"cuda_graphs",                                                                            \
         TDM_CFG_BOOL,                                                                             \
         "on",                                                                                     \
         NULL,                                                                                     \
         0,                                                                                        \
         0,                                                                                        \
         0,                                                                                        \
         NULL,                                                                                     \
         GRP_MODEL,                                                                                \
         "On the cuda backend, run each decode or verify step (and an MTP head's draft steps) "    \
         "as a CUDA graph: captured the second time a step of its shape comes, then replayed as "  \
         "one launch instead of hundreds (same results to the bit). The cpu backend has no "       \
         "graphs; there it changes nothing."},                                                     \
        {"state_strategy",                                                                         \
         TDM_CFG_ENUM,                                                                             \
         "auto",                                                                                   \
         TDM_DEFS_ALLOWED(TDM_STATE_STRATEGIES),                                                   \
         0,                                                                                        \
         0,                                                                                        \
         TDM_CFG_AUTO,                                                                             \
         NULL,                                                                                     \
         GRP_SPEC,                                                                                 \
         "How the recurrent state is committed after a verify step: extra_buffer keeps a state "   \
         "per position, no_buffer recomputes accepted positions from a checkpoint, replay "        \
         "records each position's recurrence inputs and replays the accepted ones."},              \
    {                                                                                              \
        "prefix_cache", TDM_CFG_BOOL, "off", NULL, 0, 0, 0, NULL, GRP_SPEC,                        \
            "Verifier: keep the states of prompt prefixes and generated text at every "            \
            "prefix_cache_block tokens (within prefix_cache_memory) and start a request whose "    \
            "prompt begins with cached blocks from them instead of prefilling them; needs "        \
            "extra_buffer or replay, which have the state inside a verified draft block. A "       \
            "drafter only advertises it (the pairing rule prefix-cache-state)."                    \
    }

/* How long the exchange's threads poll before they sleep (common/spin.h). */
#define KEY_BUSY_POLL                                                                              \
    {                                                                                              \
        "busy_poll", TDM_CFG_DURATION, "auto", NULL, 0, 1000, TDM_CFG_AUTO, NULL, GRP_SPEC,        \
            "How long the threads of the drafter-verifier exchange poll for the next message "     \
            "before "                                                                              \
            "they sleep. Polling keeps their cores awake, so a message is taken the moment it "    \
            "lands "                                                                               \
            "(waking a sleeping thread costs 50-600 us on many hosts, and a round crosses "        \
            "several), "                                                                           \
            "at the price of those cores' time while requests run (a few threads of each "         \
            "replica); an "                                                                        \
            "idle replica sleeps. 0ms: never poll. auto: 50ms on the cuda backend (longer than a " \
            "round), 0ms on the cpu backend (whose cores compute)."                                \
    }

/* How hidden-state rows travel between a verifier and an MTP drafter
 * (feature_shm.h); decided per Draft stream by the shared-memory handshake. */
#define KEY_FEATURE_TRANSPORT                                                                      \
    {                                                                                              \
        "feature_transport", TDM_CFG_ENUM, "auto", TDM_FEAT_TRANSPORTS, 0, 0, 0, NULL, GRP_SPEC,   \
            "How the hidden states of a hidden-state drafter (drafter_kind mtp) travel: grpc: in " \
            "the Draft stream's messages; shm: through a POSIX shared-memory ring in /dev/shm "    \
            "(drafter and verifier on one host or in one pod), proved per Draft stream by a "      \
            "handshake (the verifier offers a segment with a random nonce, the drafter maps it "   \
            "and finds the nonce); a stream where that fails gets no feature stream at all (its "  \
            "sequences run without speculation, the error naming this setting), never a quiet "    \
            "fallback; auto: shm where the handshake succeeds, else grpc (the choice is logged "   \
            "and counted). Both sides must allow shm for it to be used."                           \
    }

/* How a Draft stream's messages travel (lane.h); decided per stream by the
 * shared-memory handshake. */
#define KEY_EXCHANGE_TRANSPORT                                                                     \
    {                                                                                              \
        "exchange_transport", TDM_CFG_ENUM, "auto", TDM_LANE_TRANSPORTS, 0, 0, 0, NULL, GRP_SPEC,  \
            "How the messages of a Draft stream (opens, verdicts, blocks) travel between a "       \
            "verifier and its drafter: grpc: on the stream; shm: through a pair of POSIX "         \
            "shared-memory pipes in /dev/shm (drafter and verifier on one host or in one pod), "   \
            "proved per stream by a handshake (the verifier offers a segment with a random "       \
            "nonce, the drafter maps it and finds the nonce), with the stream kept for its end; "  \
            "a stream where that fails carries no speculation (its sequences run plain, the "      \
            "error naming this setting), never a quiet fallback; auto: shm where the handshake "   \
            "succeeds, else grpc (the choice is logged and counted). Both sides must allow shm "   \
            "for it to be used."                                                                   \
    }

static const tdm_cfg_key gateway_keys[] = {
    KEY_LISTEN("127.0.0.1:7700"),
    KEY_HEALTH_LISTEN("127.0.0.1:7701"),
    KEY_METRICS_LISTEN,
    KEYS_COMMON,
    {"heartbeat_interval", TDM_CFG_DURATION, "1s", NULL, 50, 60000, 0, NULL, GRP_REG,
     "How often replicas are told to heartbeat."},
    {"replica_ttl", TDM_CFG_DURATION, "5s", NULL, 100, 600000, 0, NULL, GRP_REG,
     "Silence after which a replica is dropped from the registry."},
    {"tokenizer", TDM_CFG_PATH, "", NULL, 0, 0, TDM_CFG_EMPTY_OK | TDM_CFG_PATH_FILE, NULL,
     GRP_MODEL,
     "tokenizer.json the gateway encodes prompts and decodes outputs with; it must be the "
     "verifiers' tokenizer (same fingerprint). Empty: only token-id prompts."},
    {"default_max_tokens", TDM_CFG_INT, "256", NULL, 1, 1048576, 0, NULL, GRP_MODEL,
     "max_tokens of a Generate request that does not set it."},
    {"prefix_affinity_slack", TDM_CFG_INT, "4", NULL, -1, 65536, 0, NULL, GRP_MODEL,
     "Prefix affinity: a request whose prompt starts with cache blocks that a verifier with "
     "prefix_cache on served last goes to that verifier (its cache likely holds them) while it "
     "has a free place and carries at most this many more requests than the least loaded "
     "verifier; else to the least loaded. -1: no affinity (always the least loaded)."},
    {"max_prompt_tokens", TDM_CFG_INT, "0", NULL, 0, 16777216, 0, NULL, GRP_MODEL,
     "Longest prompt accepted, in tokens; 0: whatever the chosen verifier's max_context "
     "leaves room for (one position for the first generated token)."},
    {"http_listen", TDM_CFG_ADDRESS, "", NULL, 0, 0, TDM_CFG_EMPTY_OK, NULL, GRP_NET,
     "Address of an HTTP port serving the OpenAI-compatible API (/v1/completions, "
     "/v1/chat/completions, /v1/models, /health); HTTPS with tls_cert and tls_key when they "
     "are set (no client certificates: use api_tokens_file); empty: none."},
    {"http_model_name", TDM_CFG_STRING, "tandem", NULL, 0, 0, 0, NULL, GRP_MODEL,
     "The model name the OpenAI-compatible API lists and accepts in `model`; requests for "
     "another are answered 404."},
    {"http_max_body", TDM_CFG_SIZE, "1MiB", NULL, 1024, 268435456, 0, NULL, GRP_NET,
     "Largest request body the OpenAI-compatible API accepts; more is answered 413."},
    {"api_tokens_file", TDM_CFG_PATH, "", NULL, 0, 0, TDM_CFG_EMPTY_OK | TDM_CFG_PATH_FILE, NULL,
     GRP_TRUST,
     "Bearer tokens clients must present to the public API (one per line, metadata "
     "authorization: Bearer TOKEN); empty: none is required."},
    {"operator_tokens_file", TDM_CFG_PATH, "", NULL, 0, 0, TDM_CFG_EMPTY_OK | TDM_CFG_PATH_FILE,
     NULL, GRP_TRUST,
     "Bearer tokens whose callers see GetStatus details (model paths, addresses, "
     "configuration); empty: callers on this host see them."},
};

static const tdm_cfg_key verifier_keys[] = {
    KEY_LISTEN("127.0.0.1:7710"),
    KEY_HEALTH_LISTEN("127.0.0.1:7711"),
    KEY_METRICS_LISTEN,
    KEYS_COMMON,
    KEYS_REPLICA,
    {"max_sequences", TDM_CFG_INT, "auto", NULL, 0, TDM_CAPACITY_MAX_SEQUENCES, TDM_CFG_AUTO, NULL,
     GRP_MODEL,
     "Most sequences this verifier holds state for at once; more requests wait in line. It may "
     "not exceed the capacity gpu_memory holds (--check-config prints the arithmetic); auto: "
     "that capacity."},
    {"gpu_memory", TDM_CFG_SIZE, "auto", NULL, 0, (int64_t)1 << 50, TDM_CFG_AUTO, NULL, GRP_MODEL,
     "Backend memory this verifier may use: weights, the workspace of its largest step and, per "
     "sequence, recurrent, conv and strategy state with KV for max_context positions. auto: on "
     "the cuda backend the weights plus 90% of the device memory free once they are loaded "
     "(measured at start); on the cpu backend 90% of the host's MemAvailable (free + buffer memory "
     "without /proc)."},
    {"tensor_parallel", TDM_CFG_INT, "1", NULL, 1, 8, 0, NULL, GRP_MODEL,
     "Ranks the model is split over (tensor parallel): attention and linear-attention heads, MLP "
     "columns and the vocabulary divided among them, partial sums added by one all-reduce a "
     "sublayer. On the cuda backend CUDA devices 0..N-1 joined by NCCL; on the cpu backend N "
     "ranks sharing the cores. The model's head counts, intermediate size and vocabulary must "
     "divide by it (--check-config says which does not). gpu_memory and the capacity are one "
     "rank's. State snapshots (moves, drains) are in the whole model's layout, so they move "
     "between verifiers split any way; prefix_cache needs 1."},
    {"max_waiting", TDM_CFG_INT, "256", NULL, 0, 1048576, 0, NULL, GRP_MODEL,
     "Most requests waiting for a place in the batch (max_sequences, or memory reserved for "
     "running requests); more are refused with RESOURCE_EXHAUSTED naming this limit. 0: "
     "none waits."},
    {"max_draft_tokens", TDM_CFG_INT, "8", NULL, 1, TDM_MAX_DRAFT_BLOCK, 0, NULL, GRP_SPEC,
     "Most draft tokens verified in one round; a drafter's draft_block_size must not exceed "
     "it."},
    {"draft_timeout", TDM_CFG_DURATION, "2s", NULL, 1, 600000, 0, NULL, GRP_SPEC,
     "Longest wait for a drafter's block; a drafter slower than this is dropped for the "
     "sequence, which goes on without speculation."},
    {"drafter_reopen_tries", TDM_CFG_INT, "6", NULL, 0, 30, 0, NULL, GRP_SPEC,
     "Times a sequence opens again on its drafter's address after the drafter failed (a "
     "restarted drafter takes it up with every token and, for a hidden-state drafter, the "
     "states of every position), 250 ms after the failure, doubling; 0: never, the sequence "
     "goes on without speculation. A sequence whose drafter takes hidden states keeps the rows "
     "it sent in host memory for this (hidden_size x 2 bytes a position in bf16)."},
    {"max_context", TDM_CFG_INT, "auto", NULL, 2, 16777216, TDM_CFG_AUTO, NULL, GRP_MODEL,
     "Most positions (prompt and generated tokens) a sequence may reach: longer prompts are "
     "refused and generation stops there (finish reason CONTEXT); auto: the model's "
     "max_position_embeddings."},
    {"prefill_chunk", TDM_CFG_INT, "256", NULL, 1, 65536, 0, NULL, GRP_MODEL,
     "Prompt tokens prefilled per round, over all new requests: a long prompt is prefilled a "
     "chunk at a time between decode rounds, so it delays other requests' tokens by one chunk "
     "a round, not by its whole prefill."},
    {"snapshot_ttl", TDM_CFG_DURATION, "60s", NULL, 1, 86400000, 0, NULL, GRP_MODEL,
     "How long an imported state snapshot waits for the Run that continues it (Run with "
     "snapshot_id) before it is dropped."},
    {"max_snapshots", TDM_CFG_INT, "64", NULL, 1, 65536, 0, NULL, GRP_MODEL,
     "Most imported state snapshots held at once waiting for their Run (a drain moves every "
     "running request at once); more are refused (RESOURCE_EXHAUSTED)."},
    {"max_snapshot_bytes", TDM_CFG_SIZE, "4GiB", NULL, 1, 1099511627776LL, 0, NULL, GRP_MODEL,
     "Most bytes of imported state snapshots held at once waiting for their Run; more are "
     "refused (RESOURCE_EXHAUSTED)."},
    {"prefix_cache_block", TDM_CFG_INT, "256", NULL, 1, 65536, 0, NULL, GRP_MODEL,
     "With prefix_cache on: the prompt-prefix states are kept every this many tokens "
     "(positions block, 2 x block, ...), where prefill stops a chunk to take them; a request "
     "whose prompt starts with cached blocks starts after the longest run of them. Smaller "
     "blocks match more of a prompt but keep a recurrent state per block."},
    {"prefix_cache_memory", TDM_CFG_SIZE, "4GiB", NULL, 1, (int64_t)1 << 50, 0, NULL, GRP_MODEL,
     "With prefix_cache on: host memory the prompt-prefix states may hold (per block: the "
     "linear layers' conv and recurrent states and the block's attention K and V); the least "
     "recently used go first when it is full. Host, not backend, memory: it is outside "
     "gpu_memory, except on the cpu backend, whose gpu_memory auto leaves it out of the host "
     "memory it takes."},
    {"prefix_fetch_bandwidth", TDM_CFG_SIZE, "100MiB", NULL, 1, (int64_t)1 << 40, 0, NULL,
     GRP_MODEL,
     "With prefix_cache on: bytes per second assumed for fetching a prompt prefix's cached "
     "states from the verifier the gateway names as holding it, until a fetch has been "
     "measured (then the measured bandwidth counts). A fetch runs only when its estimated "
     "time (prefix_fetch_latency plus the bytes over the bandwidth) is below prefilling the "
     "tokens at this verifier's measured prefill rate."},
    {"prefix_fetch_latency", TDM_CFG_DURATION, "5ms", NULL, 0, 60000, 0, NULL, GRP_MODEL,
     "With prefix_cache on: the fixed cost of a prefix fetch from a peer verifier (connection "
     "and first chunk), added to its bytes over the bandwidth."},
    {"prefix_fetch_timeout", TDM_CFG_DURATION, "2s", NULL, 1, 600000, 0, NULL, GRP_MODEL,
     "With prefix_cache on: the longest a prefix fetch from a peer verifier may take; a fetch "
     "that fails or takes longer leaves the request to prefill the prompt here."},
    KEY_FEATURE_TRANSPORT,
    {"feature_shm_size", TDM_CFG_SIZE, "32MiB", NULL, (int64_t)TDM_FEAT_SHM_MIN,
     (int64_t)TDM_FEAT_SHM_MAX, 0, NULL, GRP_SPEC,
     "feature_transport auto or shm: the shared-memory ring of each Draft stream with a "
     "hidden-state drafter (taken from /dev/shm at the stream's first sequence, reserved at "
     "once). Rows that do not fit in its free space go inline in the stream's messages: size it "
     "for a long prompt's rows (positions x hidden_size x 2 bytes in bf16)."},
    KEY_EXCHANGE_TRANSPORT,
    KEY_BUSY_POLL,
};

static const tdm_cfg_key drafter_keys[] = {
    KEY_LISTEN("127.0.0.1:7720"),
    KEY_HEALTH_LISTEN("127.0.0.1:7721"),
    KEY_METRICS_LISTEN,
    KEYS_COMMON,
    KEYS_REPLICA,
    {"max_sequences", TDM_CFG_INT, "64", NULL, 1, 65536, 0, NULL, GRP_MODEL,
     "Most sequences this replica holds state for at once."},
    {"drafter_kind", TDM_CFG_ENUM, "auto", TDM_DEFS_ALLOWED(TDM_DRAFTER_KINDS), 0, 0, TDM_CFG_AUTO,
     NULL, GRP_SPEC,
     "model: a small model of the verifier's family; ngram: model-free prompt lookup; mtp: the "
     "multi-token-prediction head of model (a Qwen3.5/3.6 checkpoint with mtp.* tensors, the "
     "verifier's own model), drafting from the hidden states the verifier streams; auto: model "
     "when model is set, else ngram."},
    {"feature_dtype", TDM_CFG_ENUM, "bf16", "bf16|f32", 0, 0, 0, NULL, GRP_SPEC,
     "drafter_kind mtp: the dtype the verifier streams hidden states in (bf16: half the bytes, "
     "rounded to nearest even; f32: the verifier's values to the bit). Other kinds stream "
     "none and ignore it."},
    {"draft_block_size", TDM_CFG_INT, "4", NULL, 1, TDM_MAX_DRAFT_BLOCK, 0, NULL, GRP_SPEC,
     "Tokens proposed per round; at most the verifier's max_draft_tokens."},
    {"draft_vocab", TDM_CFG_PATH, "", NULL, 0, 0, TDM_CFG_EMPTY_OK | TDM_CFG_PATH_FILE, NULL,
     GRP_SPEC,
     "drafter_kind model or mtp: a file of token ids (decimal, any order; tools/draft_vocab.py "
     "ranks a corpus's tokens into one) that the drafter drafts from instead of the whole "
     "vocabulary: a draft step's LM head reads only their rows (32768 of Qwen3.5's 248320 are an "
     "eighth of its bytes; a third of a 0.8B drafter's step streams its LM head), and a token "
     "outside them is never proposed. Outputs are the same either way; acceptance is what it "
     "costs. Empty: the whole vocabulary."},
    {"weights", TDM_CFG_ENUM, "checkpoint", "checkpoint|fp8", 0, 0, 0, NULL, GRP_SPEC,
     "drafter_kind model or mtp: what the drafter's matrices compute with. checkpoint: the "
     "values stored. fp8: every projection matrix (a model's layers, or an MTP head's fc and "
     "layer) and its LM head (a draft vocabulary's rows, or an untied head) rounded to FP8 "
     "E4M3 with one power-of-two scale a matrix, the embedding table as stored: a draft step "
     "streams half the matrix bytes. Drafts then come from the rounded matrices, so "
     "acceptance may move a little; the verifier's outputs are the same either way."},
    {"run_ahead", TDM_CFG_ENUM, "auto", "auto|on|off", 0, 0, TDM_CFG_AUTO, NULL, GRP_SPEC,
     "Draft the next block while the verifier verifies this one, assuming it is accepted "
     "whole (used only when the verdict bears that out; greedy requests); auto: on for a model "
     "drafter, else off. A verifier asks it only of a drafter that computes apart from it: never "
     "of one on its own GPU, nor on the CPU of one on its host whose CPUs (affinity mask) meet "
     "its own."},
    KEY_FEATURE_TRANSPORT,
    KEY_EXCHANGE_TRANSPORT,
    KEY_BUSY_POLL,
};

/* ---- rules ---------------------------------------------------------------- */

Tandem__V1__Role tdm_svc_role_of(const tdm_cfg_schema *schema)
{
    if (schema == &tdm_svc_verifier_schema)
        return TANDEM__V1__ROLE__ROLE_VERIFIER;
    if (schema == &tdm_svc_drafter_schema)
        return TANDEM__V1__ROLE__ROLE_DRAFTER;
    if (schema == &tdm_svc_gateway_schema)
        return TANDEM__V1__ROLE__ROLE_GATEWAY;
    return TANDEM__V1__ROLE__ROLE_UNSPECIFIED;
}

static void host_name(char *buf, size_t len)
{
    if (gethostname(buf, len) != 0 || !buf[0])
        snprintf(buf, len, "localhost");
    buf[len - 1] = '\0';
}

static tdm_status rule_replica_id(const tdm_cfg *cfg, char *value, size_t vlen, char *reason,
                                  size_t rlen, tdm_error *err)
{
    (void)err;
    char host[256];
    host_name(host, sizeof(host));
    snprintf(value, vlen, "%s-%s-%ld", tdm_role_name(tdm_svc_role_of(tdm_cfg_schema_of(cfg))), host,
             (long)getpid());
    snprintf(reason, rlen, "no replica_id given; named after the role, host name and process id");
    return TDM_OK;
}

static int is_wildcard(const char *host)
{
    return strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0 || strcmp(host, "*") == 0;
}

static tdm_status rule_advertise(const tdm_cfg *cfg, char *value, size_t vlen, char *reason,
                                 size_t rlen, tdm_error *err)
{
    char host[256], d[512];
    int port = 0;
    if (tdm_cfg_parse_address(tdm_cfg_str(cfg, "listen"), host, sizeof(host), &port, err) != TDM_OK)
        return TDM_ERR_INVALID_ARGUMENT;
    tdm_cfg_describe(cfg, "listen", d, sizeof(d));
    if (is_wildcard(host)) {
        char me[256];
        host_name(me, sizeof(me));
        snprintf(value, vlen, "%s:%d", me, port);
        snprintf(reason, rlen, "%s listens on every interface; peers are given the host name%s", d,
                 port == 0 ? " (port 0 is replaced by the bound port at start)" : "");
    } else {
        snprintf(value, vlen, "%s", tdm_cfg_str(cfg, "listen"));
        snprintf(reason, rlen, "peers reach the address of %s%s", d,
                 port == 0 ? " (port 0 is replaced by the bound port at start)" : "");
    }
    return TDM_OK;
}

static tdm_status rule_metrics_listen(const tdm_cfg *cfg, char *value, size_t vlen, char *reason,
                                      size_t rlen, tdm_error *err)
{
    char host[256], d[512];
    int port = 0;
    if (tdm_cfg_parse_address(tdm_cfg_str(cfg, "health_listen"), host, sizeof(host), &port, err) !=
        TDM_OK)
        return TDM_ERR_INVALID_ARGUMENT;
    tdm_cfg_describe(cfg, "health_listen", d, sizeof(d));
    if (port == 65535)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "metrics_listen auto takes the port above %s, and there is none; set "
                             "metrics_listen (or empty for no metrics port)",
                             d);
    int mport = port == 0 ? 0 : port + 1;
    snprintf(value, vlen, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, mport);
    snprintf(reason, rlen, "%s: %s", d,
             port == 0 ? "the same host, and a free port (0) as health has"
                       : "the same host and the port above it");
    return TDM_OK;
}

static tdm_status rule_tokenizer(const tdm_cfg *cfg, char *value, size_t vlen, char *reason,
                                 size_t rlen, tdm_error *err)
{
    (void)err;
    const char *model = tdm_cfg_str(cfg, "model");
    char d[512];
    tdm_cfg_describe(cfg, "model", d, sizeof(d));
    if (!model[0]) {
        value[0] = '\0';
        snprintf(reason, rlen, "no tokenizer: %s is not set", d);
        return TDM_OK;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/tokenizer.json", model);
    struct stat st;
    if (stat(path, &st) == 0) {
        snprintf(value, vlen, "%s", path);
        snprintf(reason, rlen, "the tokenizer.json of %s", d);
    } else {
        value[0] = '\0';
        snprintf(reason, rlen, "no tokenizer: %s has no tokenizer.json", d);
    }
    return TDM_OK;
}

/* Whether the NVIDIA driver exposes a device here. Checked without CUDA so
 * that configuration stays free of GPU calls (--check-config never touches
 * a GPU). */
static bool nvidia_device_present(void)
{
    return access("/dev/nvidiactl", F_OK) == 0 || access("/dev/nvidia0", F_OK) == 0;
}

static tdm_status rule_backend(const tdm_cfg *cfg, char *value, size_t vlen, char *reason,
                               size_t rlen, tdm_error *err)
{
    (void)cfg;
    (void)err;
    const tdm_build_info *b = tdm_build_info_get();
    if (!b->cuda_runtime[0]) {
        snprintf(value, vlen, "%s", tdm_backend_kind_name(TDM_BACKEND_CPU));
        snprintf(reason, rlen, "this build has no CUDA backend");
    } else if (!nvidia_device_present()) {
        snprintf(value, vlen, "%s", tdm_backend_kind_name(TDM_BACKEND_CPU));
        snprintf(reason, rlen,
                 "this build has CUDA %s, but this machine shows no NVIDIA device "
                 "(/dev/nvidiactl)",
                 b->cuda_runtime);
    } else {
        snprintf(value, vlen, "%s", tdm_backend_kind_name(TDM_BACKEND_CUDA));
        snprintf(reason, rlen, "this build has CUDA %s (archs %s) and an NVIDIA device is present",
                 b->cuda_runtime, b->gpu_archs);
    }
    return TDM_OK;
}

static tdm_status rule_state_strategy(const tdm_cfg *cfg, char *value, size_t vlen, char *reason,
                                      size_t rlen, tdm_error *err)
{
    (void)err;
    char d[512];
    tdm_cfg_describe(cfg, "prefix_cache", d, sizeof(d));
    if (tdm_backend_kind_parse(tdm_cfg_str(cfg, "backend")) == TDM_BACKEND_CUDA) {
        char b[512];
        snprintf(value, vlen, "%s", tdm_state_strategy_name(TDM_STATE_REPLAY));
        snprintf(reason, rlen,
                 "%s, %s: on the GPU replay verifies fastest (a verify writes no per-position "
                 "states; commit replays the accepted positions exactly) and holds the least "
                 "state memory but no_buffer's",
                 tdm_cfg_describe(cfg, "backend", b, sizeof(b)), d);
        return TDM_OK;
    }
    snprintf(value, vlen, "%s", tdm_state_strategy_name(TDM_STATE_EXTRA_BUFFER));
    if (tdm_cfg_bool(cfg, "prefix_cache"))
        snprintf(reason, rlen,
                 "%s takes the recurrent state at block boundaries inside verified draft "
                 "blocks, which extra_buffer (and replay) produce and no_buffer cannot",
                 d);
    else
        snprintf(reason, rlen,
                 "%s; default: extra_buffer commits by picking a per-position state, without "
                 "recomputation (replay keeps recurrence inputs instead of states, far less "
                 "memory; no_buffer the least, recomputing rejected positions)",
                 d);
    return TDM_OK;
}

static tdm_status rule_client_auth(const tdm_cfg *cfg, char *value, size_t vlen, char *reason,
                                   size_t rlen, tdm_error *err)
{
    (void)err;
    char a[512], b[512];
    bool mutual = tdm_cfg_str(cfg, "tls_cert")[0] && tdm_cfg_str(cfg, "tls_ca")[0];
    snprintf(value, vlen, "%s", mutual ? "require" : "none");
    snprintf(reason, rlen, "%s and %s: %s", tdm_cfg_describe(cfg, "tls_cert", a, sizeof(a)),
             tdm_cfg_describe(cfg, "tls_ca", b, sizeof(b)),
             mutual ? "clients must present certificates from that CA (mutual TLS)"
                    : "no mutual TLS");
    return TDM_OK;
}

static tdm_status rule_max_context(const tdm_cfg *cfg, char *value, size_t vlen, char *reason,
                                   size_t rlen, tdm_error *err)
{
    char d[512];
    tdm_cfg_describe(cfg, "model", d, sizeof(d));
    const char *model = tdm_cfg_str(cfg, "model");
    tdm_model_config mc;
    if (!model[0] || tdm_model_config_load(model, &mc, err) != TDM_OK)
        return model[0] ? err->code
                        : tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                                        "max_context auto needs a model (%s)", d);
    snprintf(value, vlen, "%d", mc.max_position_embeddings);
    snprintf(reason, rlen, "the max_position_embeddings of %s", d);
    return TDM_OK;
}

/* ---- memory --------------------------------------------------------------- */

/* Bytes an element of a weight matrix takes in backend memory: the storage
 * dtype of the embedding table (bf16 stays bf16; f16 is converted to f32).
 * A model folder with only config.json is taken as bf16, as Qwen3.5
 * checkpoints are published. */
static size_t matrix_elem_bytes(const char *model, char *why, size_t len)
{
    tdm_st_file *st = NULL;
    if (tdm_st_open(model, &st, NULL) != TDM_OK) {
        snprintf(why, len, "no safetensors: matrices taken as bf16");
        return 2;
    }
    size_t bytes = 2;
    snprintf(why, len, "no embed_tokens.weight: matrices taken as bf16");
    for (size_t i = 0; i < tdm_st_count(st); i++) {
        const tdm_st_tensor *t = tdm_st_at(st, i);
        const size_t n = strlen(t->name), suf = strlen("embed_tokens.weight");
        if (n >= suf && strcmp(t->name + n - suf, "embed_tokens.weight") == 0) {
            bytes = t->dtype == TDM_ST_DTYPE_BF16 ? 2 : 4;
            snprintf(why, len, "matrices stored %s", tdm_st_dtype_name(t->dtype));
            break;
        }
    }
    tdm_st_close(st);
    return bytes;
}

tdm_status tdm_svc_verifier_capacity(const tdm_cfg *cfg, tdm_capacity_params *p, tdm_capacity *c,
                                     tdm_error *err)
{
    memset(p, 0, sizeof(*p));
    memset(c, 0, sizeof(*c));
    const char *model = tdm_cfg_str(cfg, "model");
    if (!model[0])
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION, "no model: nothing to account");
    if (tdm_model_config_load(model, &p->cfg, err) != TDM_OK)
        return err ? err->code : TDM_ERR_INVALID_ARGUMENT;
    const int tp = (int)tdm_cfg_int(cfg, "tensor_parallel");
    if (tp > 1) { /* what one rank, one device, holds */
        const tdm_model_config whole = p->cfg;
        tdm_shard shard;
        if (tdm_shard_config(&whole, 0, tp, &p->cfg, &shard, err) != TDM_OK)
            return err ? err->code : TDM_ERR_INVALID_ARGUMENT;
    }
    char why[128];
    p->strategy = tdm_state_strategy_parse(tdm_cfg_str(cfg, "state_strategy"));
    p->max_draft = (int)tdm_cfg_int(cfg, "max_draft_tokens");
    p->max_context = (int)tdm_cfg_int(cfg, "max_context");
    p->matrix_elem_bytes = matrix_elem_bytes(model, why, sizeof(why));
    p->budget = (size_t)tdm_cfg_int(cfg, "gpu_memory");
    tdm_capacity_compute(p, c);
    return TDM_OK;
}

/* gpu_memory 0 stands for "measured at start" (auto on the cuda backend). */
static bool gpu_memory_pending(const tdm_cfg *cfg)
{
    return tdm_cfg_int(cfg, "gpu_memory") == 0;
}

static tdm_status rule_gpu_memory(const tdm_cfg *cfg, char *value, size_t vlen, char *reason,
                                  size_t rlen, tdm_error *err)
{
    char b[512];
    tdm_cfg_describe(cfg, "backend", b, sizeof(b));
    if (tdm_backend_kind_parse(tdm_cfg_str(cfg, "backend")) == TDM_BACKEND_CUDA) {
        snprintf(value, vlen, "0");
        snprintf(reason, rlen,
                 "%s: measured at start, the weights plus 90%% of the device memory free once "
                 "they are loaded (0 until then: the configuration is checked without a GPU); "
                 "10%% is left to the CUDA context, graphs and allocator slack",
                 b);
        return TDM_OK;
    }
    size_t avail = 0, total = 0;
    const char *source = NULL;
    if (tdm_host_memory(&avail, &total, &source) != 0 || avail == 0)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "%s: neither /proc/meminfo nor sysinfo(2) tells the host's "
                             "available memory; set gpu_memory",
                             b);
    char a[32];
    size_t take = avail / 10 * 9;
    if (!tdm_cfg_bool(cfg, "prefix_cache")) {
        snprintf(value, vlen, "%zu", take);
        snprintf(reason, rlen,
                 "%s: 90%% of the host's available memory (%s, %s); "
                 "10%% is left to the process's host buffers and the system",
                 b, tdm_capacity_bytes_str(avail, a, sizeof(a)), source);
        return TDM_OK;
    }
    /* The prefix cache's states are host memory too: on the cpu backend
     * they share it with the sequences. */
    const size_t pc = (size_t)tdm_cfg_int(cfg, "prefix_cache_memory");
    take = take > pc ? take - pc : 0;
    char d[512];
    snprintf(value, vlen, "%zu", take);
    snprintf(reason, rlen,
             "%s: 90%% of the host's available memory (%s, %s) less %s, which the prefix cache "
             "holds in the same host memory; 10%% is left to the process's host buffers and "
             "the system",
             b, tdm_capacity_bytes_str(avail, a, sizeof(a)), source,
             tdm_cfg_describe(cfg, "prefix_cache_memory", d, sizeof(d)));
    return TDM_OK;
}

static tdm_status rule_max_sequences(const tdm_cfg *cfg, char *value, size_t vlen, char *reason,
                                     size_t rlen, tdm_error *err)
{
    char g[512];
    tdm_cfg_describe(cfg, "gpu_memory", g, sizeof(g));
    if (gpu_memory_pending(cfg)) {
        snprintf(value, vlen, "0");
        snprintf(reason, rlen,
                 "the capacity of %s, computed at start once the device is measured (0 until "
                 "then)",
                 g);
        return TDM_OK;
    }
    tdm_capacity_params p;
    tdm_capacity c;
    if (tdm_svc_verifier_capacity(cfg, &p, &c, err) != TDM_OK)
        return err->code;
    if (c.max_sequences < 1) {
        char a[32], b[32], u[32];
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "%s holds no sequence: weights %s + workspace %s + one sequence of "
                             "%zu bytes need %s",
                             g, tdm_capacity_bytes_str(c.weights, a, sizeof(a)),
                             tdm_capacity_bytes_str(c.workspace, b, sizeof(b)), c.seq_total,
                             tdm_capacity_bytes_str(c.used, u, sizeof(u)));
    }
    char s[32];
    snprintf(value, vlen, "%d", c.max_sequences);
    snprintf(reason, rlen,
             "the capacity of %s: %d sequences of %s each (%s, KV for max_context %d "
             "positions, max_draft_tokens %d) besides weights and workspace%s",
             g, c.max_sequences, tdm_capacity_bytes_str(c.seq_total, s, sizeof(s)),
             tdm_state_strategy_name(p.strategy), p.max_context, p.max_draft,
             c.capped ? " (the count stops at its limit)" : "");
    return TDM_OK;
}

static tdm_status rule_busy_poll(const tdm_cfg *cfg, char *value, size_t vlen, char *reason,
                                 size_t rlen, tdm_error *err)
{
    (void)err;
    char b[512];
    bool cuda = tdm_backend_kind_parse(tdm_cfg_str(cfg, "backend")) == TDM_BACKEND_CUDA;
    snprintf(value, vlen, "%s", cuda ? "50ms" : "0ms");
    snprintf(reason, rlen, "%s: %s", tdm_cfg_describe(cfg, "backend", b, sizeof(b)),
             cuda ? "the host's cores are free to poll while the GPU computes"
                  : "the cores compute the model; polling would take their time");
    return TDM_OK;
}

static tdm_status rule_run_ahead(const tdm_cfg *cfg, char *value, size_t vlen, char *reason,
                                 size_t rlen, tdm_error *err)
{
    (void)err;
    char d[512];
    bool model = tdm_drafter_kind_parse(tdm_cfg_str(cfg, "drafter_kind")) ==
                 TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MODEL;
    bool mtp = tdm_drafter_kind_parse(tdm_cfg_str(cfg, "drafter_kind")) ==
               TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MTP;
    snprintf(value, vlen, "%s", model ? "on" : "off");
    snprintf(reason, rlen, "%s: %s", tdm_cfg_describe(cfg, "drafter_kind", d, sizeof(d)),
             mtp      ? "an MTP head drafts from the hidden states that come with the verdict"
             : !model ? "a lookup costs nothing to redo after the verdict"
                      : "a model's next block can be drafted while the verifier verifies; a "
                        "verifier asks for it only where this drafter computes apart from it "
                        "(another GPU, or on the CPU another host or other cores)");
    return TDM_OK;
}

static tdm_status rule_drafter_kind(const tdm_cfg *cfg, char *value, size_t vlen, char *reason,
                                    size_t rlen, tdm_error *err)
{
    (void)err;
    char d[512];
    tdm_cfg_describe(cfg, "model", d, sizeof(d));
    if (tdm_cfg_str(cfg, "model")[0]) {
        snprintf(value, vlen, "%s",
                 tdm_drafter_kind_name(TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MODEL));
        snprintf(reason, rlen, "%s is set: draft with that model", d);
    } else {
        snprintf(value, vlen, "%s",
                 tdm_drafter_kind_name(TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_NGRAM));
        snprintf(reason, rlen, "%s is not set: draft model-free by prompt lookup", d);
    }
    return TDM_OK;
}

/* ---- checks --------------------------------------------------------------- */

static tdm_status check_prefix_cache(const tdm_cfg *cfg, tdm_error *err)
{
    if (!tdm_cfg_bool(cfg, "prefix_cache") ||
        tdm_state_strategy_parse(tdm_cfg_str(cfg, "state_strategy")) != TDM_STATE_NO_BUFFER)
        return TDM_OK;
    char a[512], b[512];
    return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                         "%s conflicts with %s: prefix caching takes the recurrent state at block "
                         "boundaries inside verified draft blocks, which no_buffer cannot produce "
                         "(it keeps only a checkpoint from before the block); set state_strategy "
                         "to extra_buffer or replay (or auto), or prefix_cache to off",
                         tdm_cfg_describe(cfg, "prefix_cache", a, sizeof(a)),
                         tdm_cfg_describe(cfg, "state_strategy", b, sizeof(b)));
}

/* tensor_parallel: the model splits that way. */
static tdm_status check_tensor_parallel(const tdm_cfg *cfg, tdm_error *err)
{
    const int tp = (int)tdm_cfg_int(cfg, "tensor_parallel");
    if (tp <= 1)
        return TDM_OK;
    char a[512], b[512];
    tdm_cfg_describe(cfg, "tensor_parallel", a, sizeof(a));
    const char *model = tdm_cfg_str(cfg, "model");
    tdm_model_config whole, rank;
    tdm_shard shard;
    if (!model[0] || tdm_model_config_load(model, &whole, NULL) != TDM_OK)
        return TDM_OK; /* the model's own checks say what is wrong with it */
    if (tdm_shard_config(&whole, 0, tp, &rank, &shard, err) != TDM_OK)
        return tdm_error_prefix(err, "%s, %s", a, tdm_cfg_describe(cfg, "model", b, sizeof(b)));
    return TDM_OK;
}

static tdm_status check_tls(const tdm_cfg *cfg, tdm_error *err)
{
    int cert = tdm_cfg_str(cfg, "tls_cert")[0] != 0;
    int key = tdm_cfg_str(cfg, "tls_key")[0] != 0;
    if (cert == key)
        return TDM_OK;
    char a[4200], b[4200];
    return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                         "%s and %s: a certificate and its key are set together or not at all",
                         tdm_cfg_describe(cfg, "tls_cert", a, sizeof(a)),
                         tdm_cfg_describe(cfg, "tls_key", b, sizeof(b)));
}

static tdm_status check_ports(const tdm_cfg *cfg, tdm_error *err)
{
    char h1[256], h2[256];
    int p1 = 0, p2 = 0;
    if (tdm_cfg_parse_address(tdm_cfg_str(cfg, "listen"), h1, sizeof(h1), &p1, NULL) != TDM_OK ||
        tdm_cfg_parse_address(tdm_cfg_str(cfg, "health_listen"), h2, sizeof(h2), &p2, NULL) !=
            TDM_OK)
        return TDM_OK; /* already reported as a type error */
    if (p1 == 0 || p1 != p2)
        return TDM_OK;
    char a[512], b[512];
    return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                         "%s and %s use the same port; the health port must be separate",
                         tdm_cfg_describe(cfg, "listen", a, sizeof(a)),
                         tdm_cfg_describe(cfg, "health_listen", b, sizeof(b)));
}

/* The metrics port is neither the main nor the health port. */
static tdm_status check_metrics_port(const tdm_cfg *cfg, tdm_error *err)
{
    char h[256];
    int pm = 0;
    const char *ml = tdm_cfg_str(cfg, "metrics_listen");
    if (!ml[0] || tdm_cfg_parse_address(ml, h, sizeof(h), &pm, NULL) != TDM_OK || pm == 0)
        return TDM_OK;
    const char *others[] = {"listen", "health_listen"};
    for (size_t i = 0; i < TDM_ARRAY_LEN(others); i++) {
        int p = 0;
        if (tdm_cfg_parse_address(tdm_cfg_str(cfg, others[i]), h, sizeof(h), &p, NULL) != TDM_OK ||
            p != pm)
            continue;
        char a[512], b[512];
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "%s and %s use the same port; the metrics port must be separate",
                             tdm_cfg_describe(cfg, "metrics_listen", a, sizeof(a)),
                             tdm_cfg_describe(cfg, others[i], b, sizeof(b)));
    }
    return TDM_OK;
}

static tdm_status check_backend(const tdm_cfg *cfg, tdm_error *err)
{
    if (tdm_backend_kind_parse(tdm_cfg_str(cfg, "backend")) != TDM_BACKEND_CUDA)
        return TDM_OK;
    char a[512];
    if (!tdm_build_info_get()->cuda_runtime[0])
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "%s, but this build has no CUDA backend; use backend cpu or a CUDA "
                             "build",
                             tdm_cfg_describe(cfg, "backend", a, sizeof(a)));
    if (!nvidia_device_present())
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "%s, but this machine shows no NVIDIA device (/dev/nvidiactl is "
                             "missing); use backend cpu or auto",
                             tdm_cfg_describe(cfg, "backend", a, sizeof(a)));
    return TDM_OK;
}

static tdm_status check_drafter_model(const tdm_cfg *cfg, tdm_error *err)
{
    const int kind = tdm_drafter_kind_parse(tdm_cfg_str(cfg, "drafter_kind"));
    if ((kind != TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MODEL &&
         kind != TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MTP) ||
        tdm_cfg_str(cfg, "model")[0])
        return TDM_OK;
    char a[512], b[512];
    return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                         "%s needs %s, but %s; set model to a model directory or "
                         "drafter_kind to ngram",
                         tdm_cfg_describe(cfg, "drafter_kind", a, sizeof(a)),
                         kind == TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MTP
                             ? "the verifier's checkpoint with its MTP head"
                             : "a draft model",
                         tdm_cfg_describe(cfg, "model", b, sizeof(b)));
}

/* An MTP drafter's model must carry the head: checked here by its first
 * tensor's name in the checkpoint's headers (--check-config links no
 * engine); the start loads the whole head and checks every tensor. */
static tdm_status check_mtp_head(const tdm_cfg *cfg, tdm_error *err)
{
    const char *model = tdm_cfg_str(cfg, "model");
    if (tdm_drafter_kind_parse(tdm_cfg_str(cfg, "drafter_kind")) !=
            TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MTP ||
        !model[0])
        return TDM_OK;
    tdm_st_file *st = NULL;
    if (tdm_st_open(model, &st, NULL) != TDM_OK)
        return TDM_OK; /* the model's own checks say what is wrong with its files */
    const bool has = tdm_st_find(st, "mtp.fc.weight") != NULL;
    tdm_st_close(st);
    if (has)
        return TDM_OK;
    char a[512], b[512];
    return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                         "%s drafts with the MTP head of %s, but that checkpoint has no tensor "
                         "mtp.fc.weight (no MTP head); set model to a Qwen3.5/3.6 checkpoint "
                         "with its mtp.* tensors (the verifier's own), or another drafter_kind",
                         tdm_cfg_describe(cfg, "drafter_kind", a, sizeof(a)),
                         tdm_cfg_describe(cfg, "model", b, sizeof(b)));
}

/* weights fp8 rounds a drafter's matrices (its model's or its MTP head's):
 * an n-gram drafter has none. */
static tdm_status check_weights(const tdm_cfg *cfg, tdm_error *err)
{
    if (strcmp(tdm_cfg_str(cfg, "weights"), "fp8") != 0 ||
        tdm_drafter_kind_parse(tdm_cfg_str(cfg, "drafter_kind")) !=
            TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_NGRAM)
        return TDM_OK;
    char a[512], b[512];
    return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                         "%s rounds a drafter's matrices, but %s drafts without any; unset "
                         "weights or set drafter_kind to model or mtp",
                         tdm_cfg_describe(cfg, "weights", a, sizeof(a)),
                         tdm_cfg_describe(cfg, "drafter_kind", b, sizeof(b)));
}

/* An MTP head drafts from the hidden states of the verdict it answers: it
 * has nothing to draft ahead of that verdict with. */
static tdm_status check_mtp_run_ahead(const tdm_cfg *cfg, tdm_error *err)
{
    if (tdm_drafter_kind_parse(tdm_cfg_str(cfg, "drafter_kind")) !=
            TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MTP ||
        strcmp(tdm_cfg_str(cfg, "run_ahead"), "on") != 0)
        return TDM_OK;
    char a[512], b[512];
    return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                         "%s conflicts with %s: an MTP head drafts from the verifier's hidden "
                         "states, which come with the verdict it would draft ahead of; set "
                         "run_ahead to off or auto",
                         tdm_cfg_describe(cfg, "run_ahead", a, sizeof(a)),
                         tdm_cfg_describe(cfg, "drafter_kind", b, sizeof(b)));
}

/* A draft vocabulary restricts an LM head (a drafter model's or an MTP
 * head's), and its ids belong to the model's vocabulary: read here as the
 * start would read it. */
static tdm_status check_draft_vocab(const tdm_cfg *cfg, tdm_error *err)
{
    const char *path = tdm_cfg_str(cfg, "draft_vocab");
    if (!path[0])
        return TDM_OK;
    char a[512], b[512];
    if (tdm_drafter_kind_parse(tdm_cfg_str(cfg, "drafter_kind")) ==
        TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_NGRAM)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "%s is set, but %s drafts without an LM head to restrict; unset "
                             "draft_vocab or set drafter_kind to model or mtp",
                             tdm_cfg_describe(cfg, "draft_vocab", a, sizeof(a)),
                             tdm_cfg_describe(cfg, "drafter_kind", b, sizeof(b)));
    tdm_model_config mc;
    const int vocab =
        tdm_model_config_load(tdm_cfg_str(cfg, "model"), &mc, NULL) == TDM_OK ? mc.vocab_size : 0;
    int32_t *ids = NULL;
    int n = 0;
    tdm_status rc = tdm_token_list_read(path, vocab, &ids, &n, err);
    free(ids);
    if (rc != TDM_OK)
        return tdm_error_prefix(err, "%s", tdm_cfg_describe(cfg, "draft_vocab", a, sizeof(a)));
    return TDM_OK;
}

static tdm_status check_verifier_model(const tdm_cfg *cfg, tdm_error *err)
{
    if (tdm_cfg_str(cfg, "model")[0])
        return TDM_OK;
    char a[512];
    return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                         "%s: a verifier serves a target model; set model to a model directory",
                         tdm_cfg_describe(cfg, "model", a, sizeof(a)));
}

static tdm_status check_max_context(const tdm_cfg *cfg, tdm_error *err)
{
    const char *model = tdm_cfg_str(cfg, "model");
    tdm_model_config mc;
    if (!model[0] || tdm_model_config_load(model, &mc, NULL) != TDM_OK)
        return TDM_OK; /* the model's own checks say what is wrong with it */
    if (tdm_cfg_int(cfg, "max_context") <= mc.max_position_embeddings)
        return TDM_OK;
    char a[512], b[512];
    return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                         "%s exceeds the max_position_embeddings %d of %s: the model was not made "
                         "for positions that far",
                         tdm_cfg_describe(cfg, "max_context", a, sizeof(a)),
                         mc.max_position_embeddings, tdm_cfg_describe(cfg, "model", b, sizeof(b)));
}

/* An explicit 0 is no budget; 0 from auto means "measured at start". */
static tdm_status check_gpu_memory(const tdm_cfg *cfg, tdm_error *err)
{
    const char *keys[] = {"gpu_memory", "max_sequences"};
    for (size_t i = 0; i < TDM_ARRAY_LEN(keys); i++) {
        if (!tdm_cfg_is_explicit(cfg, keys[i]) || tdm_cfg_int(cfg, keys[i]) > 0)
            continue;
        char a[512];
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION, "%s: must be more than 0 (or auto)",
                             tdm_cfg_describe(cfg, keys[i], a, sizeof(a)));
    }
    return TDM_OK;
}

static void print_prefix_cache(const tdm_cfg *cfg, const tdm_model_config *mc, const char *prefix,
                               FILE *out);

void tdm_svc_print_capacity(const tdm_cfg *cfg, const char *prefix, FILE *out)
{
    if (tdm_svc_role_of(tdm_cfg_schema_of(cfg)) != TANDEM__V1__ROLE__ROLE_VERIFIER ||
        !tdm_cfg_str(cfg, "model")[0])
        return;
    tdm_capacity_params p;
    tdm_capacity c;
    if (tdm_svc_verifier_capacity(cfg, &p, &c, NULL) != TDM_OK)
        return;
    char text[2048];
    fprintf(out, "%scapacity (engine/capacity.c):\n", prefix);
    if (gpu_memory_pending(cfg)) {
        /* The terms that do not depend on the budget. */
        p.budget = 0;
        tdm_capacity_compute(&p, &c);
        tdm_capacity_format(&p, &c, prefix, text, sizeof(text));
        char *budget = strstr(text, "budget: ");
        if (budget) {
            char *line = budget - strlen(prefix);
            *line = '\0';
        }
        fprintf(out,
                "%s%sbudget: measured at start (gpu_memory auto on the cuda backend); max "
                "sequences = the most n with weights + workspace(n) + n x %zu <= budget\n",
                text, prefix, c.seq_total);
        print_prefix_cache(cfg, &p.cfg, prefix, out);
        return;
    }
    tdm_capacity_format(&p, &c, prefix, text, sizeof(text));
    fputs(text, out);
    print_prefix_cache(cfg, &p.cfg, prefix, out);
}

/* The prefix cache's host memory, beside the capacity (outside its budget). */
static void print_prefix_cache(const tdm_cfg *cfg, const tdm_model_config *mc, const char *prefix,
                               FILE *out)
{
    if (tdm_cfg_bool(cfg, "prefix_cache")) {
        char m[32];
        fprintf(
            out,
            "%sprefix cache: up to %s of host memory (prefix_cache_memory), outside the "
            "budget; a block of %lld positions holds %zu bytes\n",
            prefix,
            tdm_capacity_bytes_str((size_t)tdm_cfg_int(cfg, "prefix_cache_memory"), m, sizeof(m)),
            (long long)tdm_cfg_int(cfg, "prefix_cache_block"),
            tdm_capacity_prefix_block_bytes(mc, (int)tdm_cfg_int(cfg, "prefix_cache_block")));
    }
}

tdm_status tdm_svc_check_capacity(const tdm_cfg *cfg, const tdm_capacity *c, tdm_error *err)
{
    if (tdm_cfg_int(cfg, "max_sequences") <= c->max_sequences)
        return TDM_OK;
    char a[512], b[512], w[32], ws[32], ps[32];
    return tdm_error_set(
        err, TDM_ERR_FAILED_PRECONDITION,
        "%s exceeds the capacity of %d sequences that %s holds (weights %s + workspace %s + %d x "
        "%s per sequence, KV for max_context %d positions, state_strategy %s, max_draft_tokens "
        "%lld); lower max_sequences or max_context, raise gpu_memory, or set max_sequences to "
        "auto",
        tdm_cfg_describe(cfg, "max_sequences", a, sizeof(a)), c->max_sequences,
        tdm_cfg_describe(cfg, "gpu_memory", b, sizeof(b)),
        tdm_capacity_bytes_str(c->weights, w, sizeof(w)),
        tdm_capacity_bytes_str(c->workspace, ws, sizeof(ws)), c->max_sequences,
        tdm_capacity_bytes_str(c->seq_total, ps, sizeof(ps)), (int)tdm_cfg_int(cfg, "max_context"),
        tdm_cfg_str(cfg, "state_strategy"), (long long)tdm_cfg_int(cfg, "max_draft_tokens"));
}

static tdm_status check_max_sequences(const tdm_cfg *cfg, tdm_error *err)
{
    if (gpu_memory_pending(cfg))
        return TDM_OK; /* checked at start, once the device is measured */
    tdm_capacity_params p;
    tdm_capacity c;
    if (tdm_svc_verifier_capacity(cfg, &p, &c, NULL) != TDM_OK)
        return TDM_OK; /* the model's own checks say what is wrong with it */
    return tdm_svc_check_capacity(cfg, &c, err);
}

static tdm_status check_client_auth(const tdm_cfg *cfg, tdm_error *err)
{
    if (strcmp(tdm_cfg_str(cfg, "tls_client_auth"), "require") != 0 ||
        (tdm_cfg_str(cfg, "tls_ca")[0] && tdm_cfg_str(cfg, "tls_cert")[0]))
        return TDM_OK;
    char a[512], b[512], c[512];
    return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                         "%s needs a server certificate and a CA to check clients against, but %s "
                         "and %s",
                         tdm_cfg_describe(cfg, "tls_client_auth", a, sizeof(a)),
                         tdm_cfg_describe(cfg, "tls_cert", b, sizeof(b)),
                         tdm_cfg_describe(cfg, "tls_ca", c, sizeof(c)));
}

static tdm_status check_ttl(const tdm_cfg *cfg, tdm_error *err)
{
    if (tdm_cfg_int(cfg, "replica_ttl") > 2 * tdm_cfg_int(cfg, "heartbeat_interval"))
        return TDM_OK;
    char a[512], b[512];
    return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                         "%s must be more than twice %s, or a replica is dropped after one late "
                         "heartbeat",
                         tdm_cfg_describe(cfg, "replica_ttl", a, sizeof(a)),
                         tdm_cfg_describe(cfg, "heartbeat_interval", b, sizeof(b)));
}

/* Rule order matters: tokenizer, drafter_kind and max_context read model;
 * advertise reads listen (never auto). */
#define RULE_CLIENT_AUTH                                                                           \
    {"client-auth-from-tls", "tls_client_auth", rule_client_auth},                                 \
    {                                                                                              \
        "metrics-beside-health", "metrics_listen", rule_metrics_listen                             \
    }
#define RULES_REPLICA                                                                              \
    RULE_CLIENT_AUTH, {"replica-id-from-host", "replica_id", rule_replica_id},                     \
        {"advertise-from-listen", "advertise", rule_advertise},                                    \
        {"tokenizer-from-model", "tokenizer", rule_tokenizer},                                     \
        {"backend-from-build", "backend", rule_backend},                                           \
    {                                                                                              \
        "state-strategy-for-prefix-cache", "state_strategy", rule_state_strategy                   \
    }

#define CHECKS_COMMON                                                                              \
    {"tls-cert-and-key", check_tls}, {"client-auth-needs-tls", check_client_auth},                 \
        {"separate-health-port", check_ports},                                                     \
    {                                                                                              \
        "separate-metrics-port", check_metrics_port                                                \
    }
#define CHECKS_REPLICA                                                                             \
    {"prefix-cache-needs-state", check_prefix_cache},                                              \
    {                                                                                              \
        "backend-is-built", check_backend                                                          \
    }

static const tdm_cfg_rule gateway_rules[] = {RULE_CLIENT_AUTH};
static const tdm_cfg_rule verifier_rules[] = {
    RULES_REPLICA,
    {"max-context-from-model", "max_context", rule_max_context},
    {"gpu-memory-from-device", "gpu_memory", rule_gpu_memory},
    {"max-sequences-from-capacity", "max_sequences", rule_max_sequences},
    {"busy-poll-for-backend", "busy_poll", rule_busy_poll}};
static const tdm_cfg_rule drafter_rules[] = {
    RULES_REPLICA,
    {"drafter-kind-from-model", "drafter_kind", rule_drafter_kind},
    {"run-ahead-for-models", "run_ahead", rule_run_ahead},
    {"busy-poll-for-backend", "busy_poll", rule_busy_poll}};

static const tdm_cfg_check gateway_checks[] = {CHECKS_COMMON,
                                               {"ttl-outlasts-heartbeats", check_ttl}};
static const tdm_cfg_check verifier_checks[] = {
    CHECKS_COMMON,
    CHECKS_REPLICA,
    {"verifier-needs-model", check_verifier_model},
    {"max-context-within-model", check_max_context},
    {"memory-settings-positive", check_gpu_memory},
    {"tensor-parallel-split", check_tensor_parallel},
    {"max-sequences-within-capacity", check_max_sequences}};
static const tdm_cfg_check drafter_checks[] = {CHECKS_COMMON,
                                               CHECKS_REPLICA,
                                               {"model-drafter-needs-model", check_drafter_model},
                                               {"mtp-drafter-needs-head", check_mtp_head},
                                               {"mtp-drafts-after-verdicts", check_mtp_run_ahead},
                                               {"draft-vocab-needs-lm-head", check_draft_vocab},
                                               {"fp8-weights-need-matrices", check_weights}};

const tdm_cfg_schema tdm_svc_gateway_schema = {
    "tandem-gateway",
    "The tandem gateway: the registry of drafters and verifiers, the compatibility rules "
    "between them, and the public API.",
    gateway_keys,
    TDM_ARRAY_LEN(gateway_keys),
    gateway_rules,
    TDM_ARRAY_LEN(gateway_rules),
    gateway_checks,
    TDM_ARRAY_LEN(gateway_checks),
};

const tdm_cfg_schema tdm_svc_verifier_schema = {
    "tandem-verifier", "The tandem verifier: owns the target model and verifies draft blocks.",
    verifier_keys,     TDM_ARRAY_LEN(verifier_keys),
    verifier_rules,    TDM_ARRAY_LEN(verifier_rules),
    verifier_checks,   TDM_ARRAY_LEN(verifier_checks),
};

const tdm_cfg_schema tdm_svc_drafter_schema = {
    "tandem-drafter",
    "The tandem drafter: proposes draft blocks with a small model, by n-gram lookup, or with "
    "the target's MTP head from the hidden states the verifier streams.",
    drafter_keys,
    TDM_ARRAY_LEN(drafter_keys),
    drafter_rules,
    TDM_ARRAY_LEN(drafter_rules),
    drafter_checks,
    TDM_ARRAY_LEN(drafter_checks),
};

/* ---- start-up ------------------------------------------------------------- */

size_t tdm_svc_env_warnings(const tdm_cfg *cfg, char (*out)[TDM_SVC_WARNING_MAX], size_t max)
{
    /* Variables of another tandem service are expected in a shared
     * environment; anything else starting with TANDEM_ is likely a typo. */
    const tdm_cfg_schema *all[] = {&tdm_svc_gateway_schema, &tdm_svc_verifier_schema,
                                   &tdm_svc_drafter_schema};
    size_t n_warn = 0;
    for (size_t i = 0; i < tdm_cfg_unused_env_count(cfg) && n_warn < max; i++) {
        const char *name = tdm_cfg_unused_env_at(cfg, i);
        bool elsewhere = false;
        for (size_t s = 0; s < TDM_ARRAY_LEN(all) && !elsewhere; s++)
            for (size_t k = 0; k < all[s]->n_keys && !elsewhere; k++) {
                char env[256];
                tdm_cfg_env_name(all[s]->keys[k].key, env, sizeof(env));
                elsewhere = strcmp(env, name) == 0;
            }
        if (!elsewhere)
            snprintf(out[n_warn++], TDM_SVC_WARNING_MAX,
                     "environment variable %s is not a setting of any tandem service; ignored",
                     name);
    }
    return n_warn;
}

void tdm_svc_config_check(const tdm_cfg_schema *schema, int argc, char **argv, tdm_svc_check *out)
{
    memset(out, 0, sizeof(*out));
    out->loaded = TDM_ERR_RESOURCE_EXHAUSTED;
    out->described = TDM_OK;
    out->cfg = tdm_cfg_create(schema);
    if (!out->cfg)
        return;
    tdm_error err;
    out->loaded = tdm_cfg_load(out->cfg, argc, argv, true, &out->action, &err);
    out->n_warnings = tdm_svc_env_warnings(out->cfg, out->warnings, TDM_ARRAY_LEN(out->warnings));
    /* Building the descriptor reads the model files, as start-up would. */
    if (out->action == TDM_CFG_ACTION_CHECK && out->loaded == TDM_OK)
        out->described = tdm_svc_descriptor_build(out->cfg, &out->desc, &out->desc_err);
}

void tdm_svc_check_clear(tdm_svc_check *c)
{
    tdm_svc_descriptor_free(c->desc);
    tdm_cfg_destroy(c->cfg);
    memset(c, 0, sizeof(*c));
}

int tdm_svc_config_main(const tdm_cfg_schema *schema, int argc, char **argv, tdm_cfg **out)
{
    *out = NULL;
    tdm_svc_check c;
    tdm_svc_config_check(schema, argc, argv, &c);
    if (!c.cfg) {
        fprintf(stderr, "%s: out of memory\n", schema->program);
        return 2;
    }
    if (c.action == TDM_CFG_ACTION_HELP) {
        tdm_cfg_print_help(schema, stdout);
        tdm_svc_check_clear(&c);
        return 0;
    }
    if (c.action == TDM_CFG_ACTION_CHECK) {
        tdm_cfg_print(c.cfg, stdout);
        for (size_t i = 0; i < c.n_warnings; i++)
            printf("warning: %s\n", c.warnings[i]);
        if (c.desc && c.desc->model_fingerprint[0])
            printf("# model fingerprint:     %s\n", c.desc->model_fingerprint);
        if (c.desc && c.desc->tokenizer_fingerprint[0])
            printf("# tokenizer fingerprint: %s\n", c.desc->tokenizer_fingerprint);
        if (c.loaded == TDM_OK)
            tdm_svc_print_capacity(c.cfg, "#   ", stdout);
        size_t n = tdm_cfg_error_count(c.cfg);
        for (size_t i = 0; i < n; i++)
            printf("error: %s\n", tdm_cfg_error_at(c.cfg, i));
        if (c.described != TDM_OK)
            printf("error: %s\n", c.desc_err.msg);
        bool ok = c.loaded == TDM_OK && c.described == TDM_OK;
        printf("%s: configuration %s\n", schema->program,
               ok ? "is valid; the service would start"
                  : "has errors; the service would not start");
        tdm_svc_check_clear(&c);
        return ok ? 0 : 1;
    }
    if (c.loaded != TDM_OK) {
        size_t n = tdm_cfg_error_count(c.cfg);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, "%s: configuration error: %s\n", schema->program,
                    tdm_cfg_error_at(c.cfg, i));
        fprintf(stderr, "%s: not starting (--check-config shows the effective configuration)\n",
                schema->program);
        tdm_svc_check_clear(&c);
        return 2;
    }
    tdm_log_set_level((tdm_log_level)tdm_log_parse_level(tdm_cfg_str(c.cfg, "log_level")));
    for (size_t i = 0; i < c.n_warnings; i++)
        tdm_log_warn(schema->program, "%s", c.warnings[i]);
    *out = c.cfg; /* handed to the caller, who destroys it */
    return -1;
}

/* ---- descriptor ----------------------------------------------------------- */

static char *dup_str(const char *s)
{
    char *d = tdm_xstrdup(s ? s : "");
    return d;
}

/* Splits "sm_80,sm_90" into a repeated string field. */
static void split_archs(const char *archs, Tandem__V1__BuildInfo *b)
{
    b->n_gpu_archs = 0;
    b->gpu_archs = NULL;
    if (!archs[0])
        return;
    size_t n = 1;
    for (const char *p = archs; *p; p++)
        n += *p == ',';
    b->gpu_archs = tdm_xcalloc(n, sizeof(char *));
    const char *p = archs;
    while (*p) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        char *s = tdm_xstrndup(p, len);
        b->gpu_archs[b->n_gpu_archs++] = s;
        p = c ? c + 1 : p + len;
    }
}

Tandem__V1__Descriptor *tdm_svc_descriptor_of_build(Tandem__V1__Role role, const char *replica_id,
                                                    const char *address)
{
    Tandem__V1__Descriptor *d = tdm_xmalloc(sizeof(*d));
    Tandem__V1__ProtocolVersion *pv = tdm_xmalloc(sizeof(*pv));
    Tandem__V1__BuildInfo *b = tdm_xmalloc(sizeof(*b));
    tandem__v1__descriptor__init(d);
    tandem__v1__protocol_version__init(pv);
    tandem__v1__build_info__init(b);
    d->protocol = pv;
    d->build = b;
    pv->major = TDM_PROTOCOL_MAJOR;
    pv->minor = TDM_PROTOCOL_MINOR;
    const tdm_build_info *bi = tdm_build_info_get();
    b->version = dup_str(bi->version);
    b->git_revision = dup_str(bi->git_revision);
    b->cuda_runtime = dup_str(bi->cuda_runtime);
    b->grpc_core = dup_str(bi->grpc_core);
    b->compiler = dup_str(bi->compiler);
    b->build_type = dup_str(bi->build_type);
    b->backend = dup_str("");
    split_archs(bi->gpu_archs, b);

    d->role = role;
    d->snapshot_layout_version = TDM_SNAPSHOT_LAYOUT_VERSION;
    d->replica_id = dup_str(replica_id);
    d->address = dup_str(address);
    d->model_name = dup_str("");
    d->model_fingerprint = dup_str("");
    d->tokenizer_fingerprint = dup_str("");
    d->instance_id = dup_str("");
    d->device_uuid = dup_str("");
    d->target_model_fingerprint = dup_str("");
    d->host_id = dup_str("");
    d->cpus = dup_str("");
    d->weights = dup_str("");
    return d;
}

/* The specs into a Descriptor's repeated FeatureSpec (heap, freed with it). */
static Tandem__V1__FeatureSpec **specs_dup(const tdm_feat_spec *s, int n)
{
    Tandem__V1__FeatureSpec **out = tdm_xcalloc((size_t)(n ? n : 1), sizeof(*out));
    for (int i = 0; i < n; i++) {
        out[i] = tdm_xmalloc(sizeof(**out));
        tandem__v1__feature_spec__init(out[i]);
        out[i]->final_layer = s[i].final_layer;
        out[i]->layer = s[i].layer;
        out[i]->normed = s[i].normed;
    }
    return out;
}

tdm_status tdm_svc_descriptor_build(const tdm_cfg *cfg, Tandem__V1__Descriptor **out,
                                    tdm_error *err)
{
    *out = NULL;
    Tandem__V1__Role role = tdm_svc_role_of(tdm_cfg_schema_of(cfg));
    Tandem__V1__Descriptor *d = tdm_svc_descriptor_of_build(role, "", "");
    free(d->build->backend);
    d->build->backend = dup_str(tdm_cfg_has(cfg, "backend") ? tdm_cfg_str(cfg, "backend") : "");
    free(d->replica_id);
    free(d->address);
    if (role == TANDEM__V1__ROLE__ROLE_GATEWAY) {
        char host[256], id[300];
        host_name(host, sizeof(host));
        snprintf(id, sizeof(id), "gateway-%s", host);
        d->replica_id = dup_str(id);
        d->address = dup_str(tdm_cfg_str(cfg, "listen"));
    } else {
        d->replica_id = dup_str(tdm_cfg_str(cfg, "replica_id"));
        d->address = dup_str(tdm_cfg_str(cfg, "advertise"));
        unsigned char raw[16];
        char hex[33];
        if (RAND_bytes(raw, sizeof(raw)) != 1)
            TDM_ASSERT(!"RAND_bytes failed");
        for (int i = 0; i < 16; i++)
            snprintf(hex + 2 * i, 3, "%02x", raw[i]);
        free(d->instance_id);
        d->instance_id = dup_str(hex);
        /* where it computes, when on the CPU: the host and its cores */
        char place[TDM_CPULIST_TEXT_MAX + 1];
        tdm_host_id_self(place, sizeof(place));
        free(d->host_id);
        d->host_id = dup_str(place);
        tdm_cpulist_self(place, sizeof(place));
        free(d->cpus);
        d->cpus = dup_str(place);
        d->state_strategy = tdm_state_strategy_parse(tdm_cfg_str(cfg, "state_strategy")) + 1;
        d->prefix_cache = tdm_cfg_bool(cfg, "prefix_cache");
        d->max_sequences = (uint32_t)tdm_cfg_int(cfg, "max_sequences");
    }
    if (role == TANDEM__V1__ROLE__ROLE_VERIFIER) {
        d->max_draft_tokens = (uint32_t)tdm_cfg_int(cfg, "max_draft_tokens");
        d->max_context = (uint32_t)tdm_cfg_int(cfg, "max_context");
        d->tensor_parallel = (uint32_t)tdm_cfg_int(cfg, "tensor_parallel");
        if (d->prefix_cache)
            d->prefix_cache_block = (uint32_t)tdm_cfg_int(cfg, "prefix_cache_block");
        tdm_feat_spec av[TDM_FEAT_MAX_SPECS];
        int n = tdm_feat_available(av, TDM_FEAT_MAX_SPECS);
        d->features_available = specs_dup(av, n);
        d->n_features_available = (size_t)n;
    }
    if (role == TANDEM__V1__ROLE__ROLE_DRAFTER) {
        d->draft_block_size = (uint32_t)tdm_cfg_int(cfg, "draft_block_size");
        d->drafter_kind =
            (Tandem__V1__DrafterKind)tdm_drafter_kind_parse(tdm_cfg_str(cfg, "drafter_kind"));
    }
    const char *model = tdm_cfg_has(cfg, "model") ? tdm_cfg_str(cfg, "model") : "";
    char fp[65];
    if (model[0]) {
        char copy[4096];
        snprintf(copy, sizeof(copy), "%s", model);
        size_t len = strlen(copy);
        while (len > 1 && copy[len - 1] == '/')
            copy[--len] = '\0';
        free(d->model_name);
        d->model_name = dup_str(basename(copy));
        if (tdm_compat_model_fingerprint_dir(model, fp, err) != TDM_OK) {
            tdm_error_prefix(err, "model fingerprint of %s", model);
            tdm_svc_descriptor_free(d);
            return err ? err->code : TDM_ERR_INVALID_ARGUMENT;
        }
        free(d->model_fingerprint);
        d->model_fingerprint = dup_str(fp);
        if (d->drafter_kind == TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MTP) {
            /* The head is its checkpoint's: it drafts only for that model,
             * from the last layer's output after the final norm. */
            free(d->target_model_fingerprint);
            d->target_model_fingerprint = dup_str(fp);
            Tandem__V1__FeatureRequest *fr = tdm_xmalloc(sizeof(*fr));
            tandem__v1__feature_request__init(fr);
            const tdm_feat_spec need = {.final_layer = true, .normed = true};
            fr->specs = specs_dup(&need, 1);
            fr->n_specs = 1;
            fr->dtype = strcmp(tdm_cfg_str(cfg, "feature_dtype"), "f32") == 0
                            ? TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_F32
                            : TANDEM__V1__FEATURE_DTYPE__FEATURE_DTYPE_BF16;
            d->features_needed = fr;
        }
        tdm_model_config mc;
        if (tdm_model_config_load(model, &mc, err) != TDM_OK) {
            tdm_svc_descriptor_free(d);
            return err ? err->code : TDM_ERR_INVALID_ARGUMENT;
        }
        d->vocab_size = (uint32_t)mc.vocab_size;
        if (role == TANDEM__V1__ROLE__ROLE_DRAFTER &&
            d->drafter_kind != TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_NGRAM) {
            /* what it drafts with (what it drafts from is set once its
             * list is loaded: tdm_service_set_draft_vocab) */
            free(d->weights);
            d->weights = dup_str(tdm_cfg_str(cfg, "weights"));
        }
    }
    if (role == TANDEM__V1__ROLE__ROLE_VERIFIER || d->features_needed) {
        /* How rows may travel (feature_transport): auto allows both. */
        const tdm_feat_transport ft =
            tdm_feat_transport_parse(tdm_cfg_str(cfg, "feature_transport"));
        d->feature_transports = tdm_xcalloc(2, sizeof(char *));
        if (ft != TDM_FEAT_TRANSPORT_SHM)
            d->feature_transports[d->n_feature_transports++] = dup_str("grpc");
        if (ft != TDM_FEAT_TRANSPORT_GRPC)
            d->feature_transports[d->n_feature_transports++] = dup_str("shm");
    }
    if (role == TANDEM__V1__ROLE__ROLE_VERIFIER || role == TANDEM__V1__ROLE__ROLE_DRAFTER) {
        /* How a Draft stream's messages may travel (exchange_transport):
         * auto allows both. */
        const tdm_lane_transport lt =
            tdm_lane_transport_parse(tdm_cfg_str(cfg, "exchange_transport"));
        d->exchange_transports = tdm_xcalloc(2, sizeof(char *));
        if (lt != TDM_LANE_TRANSPORT_SHM)
            d->exchange_transports[d->n_exchange_transports++] = dup_str("grpc");
        if (lt != TDM_LANE_TRANSPORT_GRPC)
            d->exchange_transports[d->n_exchange_transports++] = dup_str("shm");
    }
    const char *tok = tdm_cfg_str(cfg, "tokenizer");
    if (tok[0]) {
        if (tdm_compat_tokenizer_fingerprint_file(tok, fp, err) != TDM_OK) {
            tdm_error_prefix(err, "tokenizer fingerprint of %s", tok);
            tdm_svc_descriptor_free(d);
            return err ? err->code : TDM_ERR_INVALID_ARGUMENT;
        }
        free(d->tokenizer_fingerprint);
        d->tokenizer_fingerprint = dup_str(fp);
    }
    *out = d;
    return TDM_OK;
}

void tdm_svc_descriptor_free(Tandem__V1__Descriptor *d)
{
    if (!d)
        return;
    free(d->replica_id);
    free(d->address);
    free(d->model_name);
    free(d->model_fingerprint);
    free(d->tokenizer_fingerprint);
    free(d->instance_id);
    free(d->device_uuid);
    free(d->target_model_fingerprint);
    free(d->host_id);
    free(d->cpus);
    free(d->weights);
    for (size_t i = 0; i < d->n_feature_transports; i++)
        free(d->feature_transports[i]);
    free(d->feature_transports);
    for (size_t i = 0; i < d->n_exchange_transports; i++)
        free(d->exchange_transports[i]);
    free(d->exchange_transports);
    for (size_t i = 0; i < d->n_features_available; i++)
        free(d->features_available[i]);
    free(d->features_available);
    for (size_t i = 0; i < d->n_draft_pass_costs; i++)
        free(d->draft_pass_costs[i]);
    free(d->draft_pass_costs);
    if (d->features_needed) {
        for (size_t i = 0; i < d->features_needed->n_specs; i++)
            free(d->features_needed->specs[i]);
        free(d->features_needed->specs);
        free(d->features_needed);
    }
    free(d->protocol);
    if (d->build) {
        Tandem__V1__BuildInfo *b = d->build;
        free(b->version);
        free(b->git_revision);
        free(b->cuda_runtime);
        free(b->grpc_core);
        free(b->compiler);
        free(b->build_type);
        free(b->backend);
        for (size_t i = 0; i < b->n_gpu_archs; i++)
            free(b->gpu_archs[i]);
        free(b->gpu_archs);
        free(b);
    }
    free(d);
}
