/*
 * defs.h - the names of tandem's enumerations and the limits every module
 * shares, each written once.
 *
 * Every list below is an X-macro: X(NAME, "name", served). Engine enums,
 * the allowed values of the configuration tables (TDM_DEFS_ALLOWED), the
 * name <-> value functions and help texts all derive from these lists; the
 * tandem.v1 proto enums must number them in the same order from 1
 * (0 is *_UNSPECIFIED there), which defs.c checks at compile time.
 * `served` is 1 when this build serves the value (it may be configured), 0
 * for a value the protocol names but no service implements yet: it still
 * has a name (a peer may send it), but no configuration accepts it.
 */
#ifndef TANDEM_COMMON_DEFS_H
#define TANDEM_COMMON_DEFS_H

#include <stdbool.h>

/* The most draft tokens one block may carry, everywhere: the configuration
 * maximum of max_draft_tokens and draft_block_size, the engine's verify
 * rows (1 + this), the drafter's block arrays and the verifier's per-round
 * arrays are all sized by it. */
#define TDM_MAX_DRAFT_BLOCK 64

/* Roles of a service (tandem.v1.Role). */
#define TDM_ROLES(X)                                                                               \
    X(GATEWAY, "gateway", 1)                                                                       \
    X(VERIFIER, "verifier", 1)                                                                     \
    X(DRAFTER, "drafter", 1)

/* How recurrent state is committed after a verify (tandem.v1.StateStrategy;
 * engine.h documents each). */
#define TDM_STATE_STRATEGIES(X)                                                                    \
    X(EXTRA_BUFFER, "extra_buffer", 1)                                                             \
    X(NO_BUFFER, "no_buffer", 1)                                                                   \
    X(REPLAY, "replay", 1)

/* What a drafter drafts with (tandem.v1.DrafterKind). */
#define TDM_DRAFTER_KINDS(X)                                                                       \
    X(MODEL, "model", 1)                                                                           \
    X(NGRAM, "ngram", 1)                                                                           \
    X(MTP, "mtp", 1)                                                                               \
    X(DFLASH, "dflash", 0)

/* Compute backends (engine/runtime.h). */
#define TDM_BACKENDS(X)                                                                            \
    X(CPU, "cpu", 1)                                                                               \
    X(CUDA, "cuda", 1)

/* "auto|name|name...": the allowed values of a configuration key that takes
 * `auto` or any served value of LIST, as one string literal. */
#define TDM_DEFS_ALLOWED(LIST) "auto" LIST(TDM_DEFS__PIPE)
#define TDM_DEFS__PIPE(e, n, served) TDM_DEFS__PIPE_##served(n)
#define TDM_DEFS__PIPE_1(n) "|" n
#define TDM_DEFS__PIPE_0(n)

/* The engine's strategy enum: the list in its order from 0 (so a zeroed
 * tdm_seq_params means extra_buffer); its proto value is one more. */
typedef enum tdm_state_strategy {
#define TDM_DEFS__ENUM(e, n, served) TDM_STATE_##e,
    TDM_STATE_STRATEGIES(TDM_DEFS__ENUM)
#undef TDM_DEFS__ENUM
} tdm_state_strategy;

/* "extra_buffer", ...; "unspecified" for a value outside the enum. */
const char *tdm_state_strategy_name(tdm_state_strategy s);
/* The strategy of a name; -1 for anything else ("auto" included). */
int tdm_state_strategy_parse(const char *name);
static inline int tdm_state_strategy_to_proto(tdm_state_strategy s)
{
    return (int)s + 1;
}
/* -1 for UNSPECIFIED and unknown values. */
int tdm_state_strategy_from_proto(int proto_value);

/* The compute backends, in TDM_BACKENDS order from 0. */
typedef enum tdm_backend_kind {
#define TDM_DEFS__ENUM(e, n, served) TDM_BACKEND_##e,
    TDM_BACKENDS(TDM_DEFS__ENUM)
#undef TDM_DEFS__ENUM
} tdm_backend_kind;

/* "cpu", "cuda"; "unspecified" outside the enum. */
const char *tdm_backend_kind_name(tdm_backend_kind b);
/* -1 for anything else ("auto" included). */
int tdm_backend_kind_parse(const char *name);

/* Names by proto value (1-based; 0 and unknown values give "unspecified"),
 * and the proto value of a name (0 when it is none of them). */
const char *tdm_role_name(int proto_value);
const char *tdm_drafter_kind_name(int proto_value);
int tdm_drafter_kind_parse(const char *name);

#endif
