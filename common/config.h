/*
 * config.h - configuration without ghosts.
 *
 * This module owns a service's effective configuration: a declarative table
 * of keys (tdm_cfg_key) per service, the values those keys take from four
 * sources, and the provenance of every value. Sources, lowest first:
 *
 *     default  <  config file (--config FILE, flat YAML)  <  environment
 *     (TANDEM_<KEY>)  <  command line (--<key-with-dashes> VALUE)
 *
 * Each value remembers where it came from ("default", "file:PATH:LINE",
 * "env:TANDEM_X", "flag:--x", or "auto"). Keys that accept `auto` are resolved
 * by named rules (tdm_cfg_rule) that record why they chose what they chose; a
 * rule only ever runs on a value that is literally `auto`, so an explicitly
 * set value is never changed. Checks across settings (tdm_cfg_check) fail
 * start-up naming both settings, their values and their sources.
 *
 * The CLI flag and environment variable of a key are derived from its name,
 * never written twice: key `state_strategy` is flag `--state-strategy` and
 * environment variable `TANDEM_STATE_STRATEGY`. `--help` is generated from the
 * table. Errors are collected (not only the first) so `--check-config` can
 * show everything that is wrong at once.
 *
 * Ownership: a tdm_cfg is created from a schema that must outlive it (schemas
 * are static tables) and is freed with tdm_cfg_destroy. Strings returned by
 * getters belong to the tdm_cfg and live until it is destroyed or the key is
 * set again. Not thread-safe while loading; read-only use from many threads
 * after loading is fine.
 */
#ifndef TANDEM_COMMON_CONFIG_H
#define TANDEM_COMMON_CONFIG_H

#include "status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum tdm_cfg_type {
    TDM_CFG_STRING = 0,
    TDM_CFG_INT,      /* decimal integer, range [min, max] */
    TDM_CFG_SIZE,     /* bytes: "1048576", "64KiB", "64MiB", "1GiB" */
    TDM_CFG_BOOL,     /* on/off (also true/false, yes/no, 1/0) */
    TDM_CFG_ENUM,     /* one of `allowed` ("a|b|c") */
    TDM_CFG_DURATION, /* "250ms", "5s", "2m", "1h"; stored as milliseconds */
    TDM_CFG_ADDRESS,  /* "host:port" or "[v6]:port", port 0..65535 */
    TDM_CFG_PATH,     /* file or directory, checked per flags */
} tdm_cfg_type;

/* tdm_cfg_key.flags */
#define TDM_CFG_EMPTY_OK 0x1u  /* "" is valid and means "not set" */
#define TDM_CFG_AUTO 0x2u      /* "auto" is valid and resolved by a rule */
#define TDM_CFG_PATH_FILE 0x4u /* path must be a readable regular file */
#define TDM_CFG_PATH_DIR 0x8u  /* path must be a directory */

/* One row of a service's configuration table. */
typedef struct tdm_cfg_key {
    const char *key; /* "state_strategy"; flag and env var derive from it */
    tdm_cfg_type type;
    const char *def;          /* default, as it would be written in a file */
    const char *allowed;      /* ENUM: "auto|extra_buffer|no_buffer|replay"; else NULL */
    int64_t min, max;         /* INT/SIZE/DURATION(ms) inclusive range; min == max: none */
    unsigned flags;           /* TDM_CFG_* above */
    const char *must_contain; /* PATH_DIR: a file that must exist inside, or NULL */
    const char *group;        /* heading under which --help lists it */
    const char *doc;          /* one sentence for --help */
} tdm_cfg_key;

typedef struct tdm_cfg tdm_cfg;

/* Resolves a key whose value is "auto". Writes the chosen value into `value`
 * and a sentence saying why into `reason` (which names the settings it looked
 * at with their sources, via tdm_cfg_describe). Returns TDM_OK, or an error
 * (in err) when no value can be chosen. */
typedef struct tdm_cfg_rule {
    const char *name; /* "state-strategy-for-prefix-cache" */
    const char *key;  /* the key it resolves */
    tdm_status (*resolve)(const tdm_cfg *cfg, char *value, size_t value_len, char *reason,
                          size_t reason_len, tdm_error *err);
} tdm_cfg_rule;

/* A check across settings, run after rules. Returns non-OK with a message
 * naming both settings, their values and sources. */
typedef struct tdm_cfg_check {
    const char *name;
    tdm_status (*check)(const tdm_cfg *cfg, tdm_error *err);
} tdm_cfg_check;

typedef struct tdm_cfg_schema {
    const char *program; /* "tandem-verifier" */
    const char *summary; /* one line for --help */
    const tdm_cfg_key *keys;
    size_t n_keys;
    const tdm_cfg_rule *rules; /* applied in order; a later rule may read an earlier one's result */
    size_t n_rules;
    const tdm_cfg_check *checks;
    size_t n_checks;
} tdm_cfg_schema;

/* What the command line asked for besides settings. */
typedef enum tdm_cfg_action {
    TDM_CFG_ACTION_RUN = 0,
    TDM_CFG_ACTION_HELP,  /* --help / -h */
    TDM_CFG_ACTION_CHECK, /* --check-config */
} tdm_cfg_action;

/* Creates a configuration holding every key's default. `schema` is borrowed
 * and must outlive the result. Returns NULL only when out of memory. */
tdm_cfg *tdm_cfg_create(const tdm_cfg_schema *schema);
void tdm_cfg_destroy(tdm_cfg *cfg);

/* The whole start-up pipeline: reads --config FILE, --help and --check-config
 * from argv, then applies the file, the environment (when use_env), the other
 * flags, resolves `auto` values and runs validation and checks. argv[0] is the
 * program name and is skipped. Returns TDM_OK when the configuration would
 * start; otherwise the errors are in tdm_cfg_error_count/tdm_cfg_error_at and
 * `err` carries them joined. *action is set even when errors occurred. */
tdm_status tdm_cfg_load(tdm_cfg *cfg, int argc, char **argv, bool use_env, tdm_cfg_action *action,
                        tdm_error *err);

/* The steps of tdm_cfg_load, for callers that assemble sources themselves
 * (tests, the offline `tandem check-config`). Each records its errors. */
tdm_status tdm_cfg_load_file(tdm_cfg *cfg, const char *path, tdm_error *err);
/* The same for config file text held in memory (len bytes, need not end in
 * NUL); `origin` stands for the file's path in sources and errors. */
tdm_status tdm_cfg_load_text(tdm_cfg *cfg, const char *text, size_t len, const char *origin,
                             tdm_error *err);
tdm_status tdm_cfg_load_env(tdm_cfg *cfg, tdm_error *err);
/* Sets one key from text as if it came from `source` (e.g. "flag:--listen").
 * rank orders sources: 0 default, 1 file, 2 env, 3 flag; a lower rank never
 * replaces a value from a higher one. */
tdm_status tdm_cfg_set(tdm_cfg *cfg, const char *key, const char *value, int rank,
                       const char *source, tdm_error *err);
/* Resolves `auto` values, validates every value (paths, ranges) and runs the
 * schema's checks. */
tdm_status tdm_cfg_finish(tdm_cfg *cfg, tdm_error *err);

/* Replaces a value that is still `auto` or was resolved by a rule with one a
 * service learned after start (e.g. the port it actually bound). Refuses to
 * touch an explicitly set value. */
tdm_status tdm_cfg_set_resolved(tdm_cfg *cfg, const char *key, const char *value,
                                const char *reason, tdm_error *err);

/* TANDEM_* environment variables seen by tdm_cfg_load_env that are not keys
 * of this schema (names only), for warnings: a misspelt variable would
 * otherwise be ignored without a word. */
size_t tdm_cfg_unused_env_count(const tdm_cfg *cfg);
const char *tdm_cfg_unused_env_at(const tdm_cfg *cfg, size_t i);

size_t tdm_cfg_error_count(const tdm_cfg *cfg);
const char *tdm_cfg_error_at(const tdm_cfg *cfg, size_t i);

/* Getters. An unknown key is a programming error and aborts. */
const char *tdm_cfg_str(const tdm_cfg *cfg, const char *key);
int64_t tdm_cfg_int(const tdm_cfg *cfg, const char *key); /* INT, SIZE, DURATION (ms) */
bool tdm_cfg_bool(const tdm_cfg *cfg, const char *key);
const char *tdm_cfg_source(const tdm_cfg *cfg, const char *key);
const char *tdm_cfg_reason(const tdm_cfg *cfg, const char *key); /* "" unless resolved by a rule */
/* True when the value came from a file, the environment or a flag. */
bool tdm_cfg_is_explicit(const tdm_cfg *cfg, const char *key);
/* "key=value (source)", for messages that name a setting. */
const char *tdm_cfg_describe(const tdm_cfg *cfg, const char *key, char *buf, size_t len);
const tdm_cfg_schema *tdm_cfg_schema_of(const tdm_cfg *cfg);
/* Whether the schema has this key (code shared between services asks). */
bool tdm_cfg_has(const tdm_cfg *cfg, const char *key);

/* Flag and environment variable names of a key ("--state-strategy",
 * "TANDEM_STATE_STRATEGY"). */
void tdm_cfg_flag_name(const char *key, char *buf, size_t len);
void tdm_cfg_env_name(const char *key, char *buf, size_t len);

/* Generated --help: usage line, then keys grouped, each with its flag, type
 * or allowed values, default, env var and doc. */
void tdm_cfg_print_help(const tdm_cfg_schema *schema, FILE *out);
/* The effective configuration, one key per line with value, source and, for
 * values resolved by a rule, the rule's reason. */
void tdm_cfg_print(const tdm_cfg *cfg, FILE *out);
/* The same, through the log (INFO), as a service does at start. */
void tdm_cfg_log(const tdm_cfg *cfg, const char *component);

/* Fills `out` (initialised by the caller with TANDEM__V1__EFFECTIVE_CONFIG__INIT)
 * with one ConfigEntry per key. Free with tdm_cfg_proto_clear. */
struct Tandem__V1__EffectiveConfig;
tdm_status tdm_cfg_to_proto(const tdm_cfg *cfg, struct Tandem__V1__EffectiveConfig *out,
                            tdm_error *err);
void tdm_cfg_proto_clear(struct Tandem__V1__EffectiveConfig *out);

/* Value parsers, shared with code that takes the same kinds of values from
 * elsewhere. Each returns TDM_OK or fills err naming the text. */
tdm_status tdm_cfg_parse_bool(const char *text, bool *out, tdm_error *err);
tdm_status tdm_cfg_parse_duration_ms(const char *text, int64_t *out, tdm_error *err);
tdm_status tdm_cfg_parse_size(const char *text, int64_t *out, tdm_error *err);
/* Splits "host:port" / "[v6]:port"; host gets the host without brackets. */
tdm_status tdm_cfg_parse_address(const char *text, char *host, size_t host_len, int *port,
                                 tdm_error *err);

#endif
