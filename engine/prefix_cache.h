/*
 * prefix_cache.h - the prefix-state cache: committed states of prompt
 * prefixes, kept in host memory within a byte budget, so that a request
 * whose prompt starts with a cached prefix starts from its state instead of
 * prefilling it again.
 *
 * Owns: the entries (one per cached block of a prefix), their hash index,
 * the least-recently-used order and the budget; the host copies of the
 * states (downloaded from a sequence at a block boundary, uploaded into a
 * new sequence on a hit).
 *
 * Boundaries. A linear-attention layer's recurrent state is valid only at
 * the exact position it was taken and cannot be cut back like a KV cache, so
 * states are kept only at fixed, aligned boundaries: every `block` tokens
 * (positions block, 2·block, ...). Entry i holds the state at position
 * i·block: every linear layer's conv window and recurrent state there, and
 * the K and V of the attention layers for the block's own positions
 * [(i-1)·block, i·block) only, so a prefix of n blocks costs n recurrent
 * states but its KV once. Its key chains the blocks, as vLLM's block hashes
 * do: key_i = H(key_{i-1}, tokens of block i), and the entry keeps its
 * parent (entry i-1) and its block's tokens, so a lookup compares every
 * token of the prefix: a hash collision can cost a miss, never a wrong
 * state.
 *
 * Layout: a block is in the checkpoint's layout (tdm_model_checkpoint_config):
 * a tensor-parallel model's ranks each write their slices of it into place
 * and read them back from there (group.c), so a block serves, and moves
 * between, whole models and groups of any size.
 *
 * Where states live: host memory (malloc), not the backend's. A hit costs
 * one upload of the prefix's state, far less than its prefill; the
 * sequences' device memory stays as capacity.h accounts it, so turning the
 * cache on does not lower how many sequences a verifier holds.
 *
 * Eviction: when an entry would take the cache past its budget, the least
 * recently used entries without children (leaves) go first, so a cached
 * entry's ancestors are always cached: evicting the middle of a chain would
 * strand the entries after it.
 *
 * Threading: none of its own; its user serialises the calls (the verifier:
 * its scheduler thread, and the RPC handlers that fetch or send a prefix,
 * under one lock).
 */
#ifndef TANDEM_ENGINE_PREFIX_CACHE_H
#define TANDEM_ENGINE_PREFIX_CACHE_H

#include "engine.h"
#include "snapshot.h"
#include "status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tdm_prefix_cache tdm_prefix_cache;

typedef struct tdm_prefix_params {
    int block;     /* tokens per cached block (> 0) */
    size_t budget; /* bytes the entries may hold, payloads and bookkeeping */
    /* The chained hash of a block; NULL: the built-in one. For tests, which
     * force collisions with it. */
    uint64_t (*hash)(uint64_t parent_key, const int32_t *tokens, int n);
} tdm_prefix_params;

typedef struct tdm_prefix_stats {
    uint64_t entries;   /* cached blocks now */
    uint64_t bytes;     /* what they hold (payloads and bookkeeping) */
    uint64_t inserted;  /* blocks stored since creation */
    uint64_t evictions; /* blocks evicted to stay within the budget */
    uint64_t refused;   /* blocks not stored: larger than the budget, or their parent gone */
} tdm_prefix_stats;

/* A cache of at most p->budget bytes; the caller destroys it. */
tdm_prefix_cache *tdm_prefix_cache_create(const tdm_prefix_params *p);
void tdm_prefix_cache_destroy(tdm_prefix_cache *c); /* NULL is fine */
int tdm_prefix_cache_block(const tdm_prefix_cache *c);
void tdm_prefix_cache_stats(const tdm_prefix_cache *c, tdm_prefix_stats *out);

/* ---- entries with opaque payloads (what the sequence functions build on) -- */

/* The longest chain of cached blocks that tokens starts with, covering at
 * most max_tokens tokens: returns the tokens it covers (a multiple of the
 * block, 0 when the first block is not cached) and, when payloads is not
 * NULL, each block's payload in order (payloads holds max_tokens / block
 * entries). The chain becomes the most recently used. */
int tdm_prefix_cache_match(tdm_prefix_cache *c, const int32_t *tokens, int max_tokens,
                           const void **payloads);

/* Whether the block ending at `end` (a multiple of the block) of tokens is
 * cached; marks nothing as used. */
bool tdm_prefix_cache_contains(const tdm_prefix_cache *c, const int32_t *tokens, int end);

typedef enum tdm_prefix_put {
    TDM_PREFIX_PUT_STORED,      /* a new entry */
    TDM_PREFIX_PUT_PRESENT,     /* cached already (now the most recently used) */
    TDM_PREFIX_PUT_NO_PARENT,   /* the blocks before it are not all cached */
    TDM_PREFIX_PUT_OVER_BUDGET, /* larger than the budget even in an empty cache */
} tdm_prefix_put;

/* Stores the block of tokens ending at `end` (a multiple of the block, > 0)
 * with its payload of payload_bytes (malloc'ed; the cache owns it from here,
 * and frees it at once unless the result is STORED), evicting leaves as the
 * budget needs. The blocks before it must be cached. */
tdm_prefix_put tdm_prefix_cache_insert(tdm_prefix_cache *c, const int32_t *tokens, int end,
                                       void *payload, size_t payload_bytes);

/* ---- sequences ------------------------------------------------------------ */

/* A block's payload: tdm_capacity_prefix_block_bytes (capacity.h). */

/* Stores the state of s at its committed position n (no verify pending; n a
 * multiple of the block; tokens[0..n) the tokens it ran) as the block ending
 * at n. *result says what happened (nothing is downloaded when the block is
 * cached already or cannot be stored). RESOURCE_EXHAUSTED when the host
 * cannot hold the payload. */
tdm_status tdm_prefix_cache_put_seq(tdm_prefix_cache *c, const tdm_seq *s, const int32_t *tokens,
                                    tdm_prefix_put *result, tdm_error *err);

/* Stores the state after row j of s's pending verify (position base + j +
 * 1, a multiple of the block, with base the committed length before the
 * verify; tokens[0..base + j + 1) the tokens it ran) as the block ending
 * there, before the verify is committed: a boundary inside a verified block.
 * Under extra_buffer the verify kept that state; under replay it is the
 * committed state advanced by rows 0..j of the record (in scratch backend
 * memory; s is not touched). FAILED_PRECONDITION under no_buffer, which
 * keeps only a checkpoint from before the verify, or with nothing pending. */
tdm_status tdm_prefix_cache_put_pending(tdm_prefix_cache *c, const tdm_seq *s,
                                        const int32_t *tokens, int j, tdm_prefix_put *result,
                                        tdm_error *err);

/* A new sequence (params p) holding the state of the longest cached prefix
 * of tokens that covers at most max_tokens tokens: *covered gets its length
 * (0: nothing cached, *out stays NULL). On success with *covered > 0 the
 * caller owns *out, whose committed length is *covered. */
tdm_status tdm_prefix_cache_get_seq(tdm_prefix_cache *c, tdm_model *m, const tdm_seq_params *p,
                                    const int32_t *tokens, int max_tokens, tdm_seq **out,
                                    int *covered, tdm_error *err);

/* ---- between replicas (a verifier's FetchPrefix) ------------------------ */

/* The longest chain of cached blocks that tokens starts with, covering at
 * most max_tokens tokens, as a prefix layout
 * (tdm_snap_layout_expected_prefix, tokens copied, sha256 left zero: seal
 * it with tdm_snap_seal, off the cache's thread) and a payload of the
 * blocks' bytes in order (*payload malloc'ed; the caller frees both). A
 * copy of host memory, no backend call. Nothing cached: layout->committed
 * 0 and *payload NULL. RESOURCE_EXHAUSTED when the host cannot hold the
 * copy. */
tdm_status tdm_prefix_cache_export(tdm_prefix_cache *c, const tdm_model_config *cfg,
                                   const char *fingerprint, const int32_t *tokens, int max_tokens,
                                   tdm_snap_layout *layout, uint8_t **payload, tdm_error *err);

/* Stores a received prefix (layout checked, e.g. by the assembler, and of
 * this cache's block; payload its bytes, borrowed) block by block as
 * tdm_prefix_cache_insert does: *stored gets the blocks newly stored,
 * *covered the tokens of the prefix cached afterwards (blocks cached
 * already count; eviction for the budget may leave fewer). Refuses a
 * layout of another block size or not verified against its SHA-256
 * (INVALID_ARGUMENT). */
tdm_status tdm_prefix_cache_import(tdm_prefix_cache *c, const tdm_model_config *cfg,
                                   const tdm_snap_layout *layout, const uint8_t *payload,
                                   int *stored, int *covered, tdm_error *err);

#endif
