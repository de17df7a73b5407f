/*
 * config_test.c - configuration without ghosts, as DESIGN.md section 5
 * specifies it: sources in precedence order with provenance, `auto`
 * resolved by named rules that say why, explicit values never changed,
 * conflicts naming both settings with values and sources, errors naming the
 * file and line. Expected values come from the specification, not from the
 * code under test. Usage: config_test <case>.
 */
#include "check.h"
#include "config.h"
#include "service_config.h"
#include "tandem/v1/common.pb-c.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];

static void make_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof(g_dir), "%s/tdm-config-XXXXXX", base && base[0] ? base : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        exit(2);
    }
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(2);
    }
    fputs(text, f);
    fclose(f);
}

static void cleanup(void)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", g_dir);
}

/* Unsets every TANDEM_<KEY> so the caller's environment cannot leak in. */
static void clear_env(void)
{
    const tdm_cfg_schema *schemas[] = {&tdm_svc_gateway_schema, &tdm_svc_verifier_schema,
                                       &tdm_svc_drafter_schema};
    for (size_t s = 0; s < 3; s++)
        for (size_t i = 0; i < schemas[s]->n_keys; i++) {
            char env[256];
            tdm_cfg_env_name(schemas[s]->keys[i].key, env, sizeof(env));
            unsetenv(env);
        }
}

static char g_model[300];

/* Loads a schema from a NULL-terminated argument list (argv[0] added). A
 * verifier needs a model; one is added unless the arguments name one. */
static tdm_cfg *load(const tdm_cfg_schema *schema, tdm_status *st, tdm_cfg_action *action,
                     tdm_error *err, ...)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)schema->program;
    va_list ap;
    va_start(ap, err);
    const char *a;
    bool has_model = false;
    while ((a = va_arg(ap, const char *)) != NULL && argc < 61) {
        has_model = has_model || strncmp(a, "--model", 7) == 0;
        argv[argc++] = (char *)a;
    }
    va_end(ap);
    argv[argc] = NULL;
    if (schema == &tdm_svc_verifier_schema && !has_model && !getenv("TANDEM_MODEL")) {
        /* First, so that a flag missing its value at the end stays so. */
        memmove(argv + 3, argv + 1, (size_t)argc * sizeof(char *));
        argv[1] = "--model";
        argv[2] = g_model;
        argc += 2;
    }
    tdm_cfg *cfg = tdm_cfg_create(schema);
    tdm_cfg_action act;
    *st = tdm_cfg_load(cfg, argc, argv, true, action ? action : &act, err);
    return cfg;
}

static bool has_error(const tdm_cfg *cfg, const char *a, const char *b)
{
    for (size_t i = 0; i < tdm_cfg_error_count(cfg); i++) {
        const char *e = tdm_cfg_error_at(cfg, i);
        if (strstr(e, a) && (!b || strstr(e, b)))
            return true;
    }
    return false;
}

static void dump_errors(const tdm_cfg *cfg)
{
    for (size_t i = 0; i < tdm_cfg_error_count(cfg); i++)
        fprintf(stderr, "  error: %s\n", tdm_cfg_error_at(cfg, i));
}

/* ---- cases ---------------------------------------------------------------- */

static void test_precedence(void)
{
    char file[512], want_src[600];
    snprintf(file, sizeof(file), "%s/v.yaml", g_dir);
    /* max_draft_tokens is on line 3 of the file. */
    write_file(file, "# verifier\nlisten: 127.0.0.1:9100\nmax_draft_tokens: 5\n"
                     "log_level: warn\n");
    tdm_status st;
    tdm_error err;

    /* default */
    tdm_cfg *cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, NULL);
    CHECK(st == TDM_OK, "%s", err.msg);
    CHECK(tdm_cfg_int(cfg, "max_draft_tokens") == 8, "default is 8");
    CHECK_STR(tdm_cfg_source(cfg, "max_draft_tokens"), "default");
    CHECK(!tdm_cfg_is_explicit(cfg, "max_draft_tokens"), "default is not explicit");
    tdm_cfg_destroy(cfg);

    /* file over default, with file and line */
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    CHECK(st == TDM_OK, "%s", err.msg);
    CHECK(tdm_cfg_int(cfg, "max_draft_tokens") == 5, "file value");
    snprintf(want_src, sizeof(want_src), "file:%s:3", file);
    CHECK_STR(tdm_cfg_source(cfg, "max_draft_tokens"), want_src);
    snprintf(want_src, sizeof(want_src), "file:%s:2", file);
    CHECK_STR(tdm_cfg_source(cfg, "listen"), want_src);
    CHECK(tdm_cfg_is_explicit(cfg, "max_draft_tokens"), "file value is explicit");
    tdm_cfg_destroy(cfg);

    /* environment over file */
    setenv("TANDEM_MAX_DRAFT_TOKENS", "6", 1);
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    CHECK(st == TDM_OK, "%s", err.msg);
    CHECK(tdm_cfg_int(cfg, "max_draft_tokens") == 6, "env value");
    CHECK_STR(tdm_cfg_source(cfg, "max_draft_tokens"), "env:TANDEM_MAX_DRAFT_TOKENS");
    CHECK_STR(tdm_cfg_str(cfg, "log_level"), "warn"); /* untouched keys keep the file's */
    tdm_cfg_destroy(cfg);

    /* flag over environment; both spellings of a flag; --config anywhere */
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--max-draft-tokens", "7", "--config",
               file, NULL);
    CHECK(st == TDM_OK, "%s", err.msg);
    CHECK(tdm_cfg_int(cfg, "max_draft_tokens") == 7, "flag value");
    CHECK_STR(tdm_cfg_source(cfg, "max_draft_tokens"), "flag:--max-draft-tokens");
    tdm_cfg_destroy(cfg);
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config=", NULL);
    CHECK(st != TDM_OK, "empty --config= is an error");
    tdm_cfg_destroy(cfg);
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--max-draft-tokens=9", NULL);
    CHECK(st == TDM_OK && tdm_cfg_int(cfg, "max_draft_tokens") == 9, "--key=value form");
    tdm_cfg_destroy(cfg);
    unsetenv("TANDEM_MAX_DRAFT_TOKENS");

    /* a bool from the environment, normalised */
    setenv("TANDEM_PREFIX_CACHE", "true", 1);
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, NULL);
    CHECK(st == TDM_OK, "%s", err.msg);
    CHECK(tdm_cfg_bool(cfg, "prefix_cache"), "env bool");
    CHECK_STR(tdm_cfg_str(cfg, "prefix_cache"), "on");
    tdm_cfg_destroy(cfg);
    unsetenv("TANDEM_PREFIX_CACHE");

    /* durations and sizes parse to ms and bytes */
    cfg = load(&tdm_svc_gateway_schema, &st, NULL, &err, "--heartbeat-interval", "250ms",
               "--replica-ttl", "2m", "--max-message-size", "4MiB", NULL);
    CHECK(st == TDM_OK, "%s", err.msg);
    CHECK(tdm_cfg_int(cfg, "heartbeat_interval") == 250, "250ms");
    CHECK(tdm_cfg_int(cfg, "replica_ttl") == 120000, "2m");
    CHECK(tdm_cfg_int(cfg, "max_message_size") == 4 * 1024 * 1024, "4MiB");
    tdm_cfg_destroy(cfg);

    /* --help and --check-config are actions, not settings */
    tdm_cfg_action action;
    cfg = load(&tdm_svc_verifier_schema, &st, &action, &err, "--check-config", NULL);
    CHECK(action == TDM_CFG_ACTION_CHECK && st == TDM_OK, "check action");
    tdm_cfg_destroy(cfg);
    cfg = load(&tdm_svc_verifier_schema, &st, &action, &err, "--bogus", "1", "--help", NULL);
    CHECK(action == TDM_CFG_ACTION_HELP, "help wins");
    tdm_cfg_destroy(cfg);
}

static void test_auto_rules(void)
{
    tdm_status st;
    tdm_error err;
    /* --prefix-cache on --state-strategy auto. */
    tdm_cfg *cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--prefix-cache", "on",
                        "--state-strategy", "auto", NULL);
    CHECK(st == TDM_OK, "%s", err.msg);
    CHECK_STR(tdm_cfg_str(cfg, "state_strategy"), "extra_buffer");
    CHECK_STR(tdm_cfg_source(cfg, "state_strategy"), "auto");
    CHECK(!tdm_cfg_is_explicit(cfg, "state_strategy"), "a rule's value is not explicit");
    CHECK_HAS(tdm_cfg_reason(cfg, "state_strategy"), "state-strategy-for-prefix-cache");
    CHECK_HAS(tdm_cfg_reason(cfg, "state_strategy"), "prefix_cache=on (flag:--prefix-cache)");
    CHECK_HAS(tdm_cfg_reason(cfg, "state_strategy"), "inside verified draft blocks");
    char d[512];
    CHECK_HAS(tdm_cfg_describe(cfg, "state_strategy", d, sizeof(d)), "flag:--state-strategy");
    tdm_cfg_destroy(cfg);

    /* auto by default, prefix cache off: a stated default rule */
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, NULL);
    CHECK(st == TDM_OK, "%s", err.msg);
    CHECK_STR(tdm_cfg_source(cfg, "state_strategy"), "auto");
    CHECK_HAS(tdm_cfg_reason(cfg, "state_strategy"), "prefix_cache=off (default)");
    CHECK_HAS(tdm_cfg_reason(cfg, "state_strategy"), "default");
    tdm_cfg_destroy(cfg);

    /* An explicit value is never changed by a rule. */
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--state-strategy", "no_buffer", NULL);
    CHECK(st == TDM_OK, "%s", err.msg);
    CHECK_STR(tdm_cfg_str(cfg, "state_strategy"), "no_buffer");
    CHECK_STR(tdm_cfg_source(cfg, "state_strategy"), "flag:--state-strategy");
    CHECK_STR(tdm_cfg_reason(cfg, "state_strategy"), "");
    tdm_error e2;
    CHECK(tdm_cfg_set_resolved(cfg, "state_strategy", "extra_buffer", "x", &e2) != TDM_OK,
          "set_resolved refuses an explicit value");
    CHECK_STR(tdm_cfg_str(cfg, "state_strategy"), "no_buffer");
    /* ... but may refine a value a rule chose (the bound port). */
    CHECK(tdm_cfg_set_resolved(cfg, "advertise", "127.0.0.1:4242", "bound port", &e2) == TDM_OK,
          "%s", e2.msg);
    CHECK_STR(tdm_cfg_str(cfg, "advertise"), "127.0.0.1:4242");
    tdm_cfg_destroy(cfg);

    /* replica_id and advertise */
    cfg = load(&tdm_svc_drafter_schema, &st, NULL, &err, "--listen", "127.0.0.1:0", NULL);
    CHECK(st == TDM_OK, "%s", err.msg);
    char want[64];
    snprintf(want, sizeof(want), "-%ld", (long)getpid());
    CHECK_HAS(tdm_cfg_str(cfg, "replica_id"), "drafter-");
    CHECK_HAS(tdm_cfg_str(cfg, "replica_id"), want);
    CHECK_STR(tdm_cfg_str(cfg, "advertise"), "127.0.0.1:0");
    CHECK_HAS(tdm_cfg_reason(cfg, "advertise"), "listen=127.0.0.1:0 (flag:--listen)");
    /* no model: drafter_kind auto -> ngram, tokenizer auto -> none */
    CHECK_STR(tdm_cfg_str(cfg, "drafter_kind"), "ngram");
    CHECK_HAS(tdm_cfg_reason(cfg, "drafter_kind"), "model='' (default)");
    CHECK_STR(tdm_cfg_str(cfg, "tokenizer"), "");
    tdm_cfg_destroy(cfg);

    /* with a model directory: drafter_kind -> model, tokenizer -> its tokenizer.json */
    char model[512], path[600];
    snprintf(model, sizeof(model), "%s/m", g_dir);
    mkdir(model, 0755);
    snprintf(path, sizeof(path), "%s/config.json", model);
    write_file(path, "{\"vocab_size\": 10}");
    snprintf(path, sizeof(path), "%s/tokenizer.json", model);
    write_file(path, "{}");
    setenv("TANDEM_MODEL", model, 1);
    cfg = load(&tdm_svc_drafter_schema, &st, NULL, &err, NULL);
    CHECK(st == TDM_OK, "%s", err.msg);
    CHECK_STR(tdm_cfg_str(cfg, "drafter_kind"), "model");
    CHECK_STR(tdm_cfg_str(cfg, "tokenizer"), path);
    char want_reason[700];
    snprintf(want_reason, sizeof(want_reason), "model=%s (env:TANDEM_MODEL)", model);
    CHECK_HAS(tdm_cfg_reason(cfg, "tokenizer"), want_reason);
    tdm_cfg_destroy(cfg);
    unsetenv("TANDEM_MODEL");

    /* backend auto follows the build */
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, NULL);
    CHECK(strcmp(tdm_cfg_str(cfg, "backend"), "cpu") == 0 ||
              strcmp(tdm_cfg_str(cfg, "backend"), "cuda") == 0,
          "backend resolved");
    CHECK_HAS(tdm_cfg_reason(cfg, "backend"), "backend-from-build");
    /* max_context auto is the model's max_position_embeddings */
    CHECK(tdm_cfg_int(cfg, "max_context") == 3000, "max_context %lld",
          (long long)tdm_cfg_int(cfg, "max_context"));
    CHECK_HAS(tdm_cfg_reason(cfg, "max_context"), "max_position_embeddings");
    tdm_cfg_destroy(cfg);
    /* ... and an explicit one above it is refused, naming both */
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--max-context", "5000", NULL);
    CHECK(st != TDM_OK && has_error(cfg, "max_context=5000 (flag:--max-context)", "3000"),
          "max_context above the model's: %s", err.msg);
    tdm_cfg_destroy(cfg);
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--max-context", "2000", NULL);
    CHECK(st == TDM_OK && tdm_cfg_int(cfg, "max_context") == 2000, "max_context 2000: %s", err.msg);
    tdm_cfg_destroy(cfg);
    /* tls_client_auth auto: mutual TLS when a certificate and a CA are set */
    cfg = load(&tdm_svc_gateway_schema, &st, NULL, &err, NULL);
    CHECK_STR(tdm_cfg_str(cfg, "tls_client_auth"), "none");
    CHECK_HAS(tdm_cfg_reason(cfg, "tls_client_auth"), "client-auth-from-tls");
    tdm_cfg_destroy(cfg);
    cfg = load(&tdm_svc_gateway_schema, &st, NULL, &err, "--tls-client-auth", "require", NULL);
    CHECK(st != TDM_OK &&
              has_error(cfg, "tls_client_auth=require (flag:--tls-client-auth)", "tls_ca"),
          "tls_client_auth require without TLS: %s", err.msg);
    tdm_cfg_destroy(cfg);
}

static void test_conflicts(void)
{
    tdm_status st;
    tdm_error err;
    /* A conflict: both settings, values and sources named. */
    tdm_cfg *cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--prefix-cache", "on",
                        "--state-strategy", "no_buffer", NULL);
    CHECK(st != TDM_OK, "conflict must fail");
    CHECK_HAS(err.msg, "prefix_cache=on (flag:--prefix-cache)");
    CHECK_HAS(err.msg, "state_strategy=no_buffer (flag:--state-strategy)");
    CHECK(has_error(cfg, "prefix-cache-needs-state", NULL), "names the check");
    /* The explicit value stays what the operator said. */
    CHECK_STR(tdm_cfg_str(cfg, "state_strategy"), "no_buffer");
    tdm_cfg_destroy(cfg);

    /* Mixed sources: env and file. */
    char file[512], src[600];
    snprintf(file, sizeof(file), "%s/d.yaml", g_dir);
    write_file(file, "state_strategy: no_buffer\n");
    setenv("TANDEM_PREFIX_CACHE", "on", 1);
    cfg = load(&tdm_svc_drafter_schema, &st, NULL, &err, "--config", file, NULL);
    CHECK(st != TDM_OK, "conflict must fail");
    CHECK_HAS(err.msg, "prefix_cache=on (env:TANDEM_PREFIX_CACHE)");
    snprintf(src, sizeof(src), "state_strategy=no_buffer (file:%s:1)", file);
    CHECK_HAS(err.msg, src);
    tdm_cfg_destroy(cfg);
    unsetenv("TANDEM_PREFIX_CACHE");

    /* A certificate without its key. */
    snprintf(file, sizeof(file), "%s/cert.pem", g_dir);
    write_file(file, "not checked here\n");
    cfg = load(&tdm_svc_gateway_schema, &st, NULL, &err, "--tls-cert", file, NULL);
    CHECK(st != TDM_OK, "cert without key");
    CHECK(has_error(cfg, "tls_cert=", "tls_key='' (default)"), "names both");
    tdm_cfg_destroy(cfg);

    /* drafter_kind model without a model. */
    cfg = load(&tdm_svc_drafter_schema, &st, NULL, &err, "--drafter-kind", "model", NULL);
    CHECK(st != TDM_OK, "model drafter needs a model");
    CHECK(has_error(cfg, "drafter_kind=model (flag:--drafter-kind)", "model='' (default)"),
          "names both");
    tdm_cfg_destroy(cfg);

    /* TTL versus heartbeat interval. */
    cfg = load(&tdm_svc_gateway_schema, &st, NULL, &err, "--replica-ttl", "1s",
               "--heartbeat-interval", "1s", NULL);
    CHECK(st != TDM_OK, "ttl too short");
    CHECK(has_error(cfg, "replica_ttl=1s (flag:--replica-ttl)",
                    "heartbeat_interval=1s (flag:--heartbeat-interval)"),
          "names both");
    tdm_cfg_destroy(cfg);

    /* backend=cuda where it cannot work fails the check, before any GPU call. */
    if (access("/dev/nvidiactl", F_OK) != 0 && access("/dev/nvidia0", F_OK) != 0) {
        cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--backend", "cuda", NULL);
        CHECK(st != TDM_OK && has_error(cfg, "backend=cuda (flag:--backend)", "backend-is-built"),
              "cuda without a device or CUDA build");
        tdm_cfg_destroy(cfg);
        cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, NULL);
        CHECK(st == TDM_OK && strcmp(tdm_cfg_str(cfg, "backend"), "cpu") == 0,
              "auto picks cpu without a device");
        tdm_cfg_destroy(cfg);
    }

    /* A verifier serves a model: none set is an error, not a late failure. */
    cfg = tdm_cfg_create(&tdm_svc_verifier_schema);
    {
        char *argv[] = {"tandem-verifier", NULL};
        tdm_cfg_action act;
        st = tdm_cfg_load(cfg, 1, argv, true, &act, &err);
    }
    CHECK(st != TDM_OK && has_error(cfg, "model='' (default)", "verifier-needs-model"),
          "verifier without a model");
    tdm_cfg_destroy(cfg);

    /* Main and health port the same. */
    cfg = load(&tdm_svc_gateway_schema, &st, NULL, &err, "--listen", "127.0.0.1:9000",
               "--health-listen", "127.0.0.1:9000", NULL);
    CHECK(st != TDM_OK, "same ports");
    CHECK(has_error(cfg, "listen=127.0.0.1:9000 (flag:--listen)", "health_listen="), "both");
    tdm_cfg_destroy(cfg);
}

static void test_file_errors(void)
{
    tdm_status st;
    tdm_error err;
    char file[512], want[700];
    snprintf(file, sizeof(file), "%s/bad.yaml", g_dir);

    write_file(file, "listen: 127.0.0.1:1\n\nmax_drfat_tokens: 4\n");
    tdm_cfg *cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    CHECK(st != TDM_OK, "unknown key");
    snprintf(want, sizeof(want), "%s:3: unknown key 'max_drfat_tokens'", file);
    CHECK(has_error(cfg, want, NULL), "names file, line and key");
    tdm_cfg_destroy(cfg);

    /* A key of another service is unknown here too (no silent ghosts). */
    write_file(file, "draft_block_size: 4\n");
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    snprintf(want, sizeof(want), "%s:1: unknown key 'draft_block_size'", file);
    CHECK(st != TDM_OK && has_error(cfg, want, NULL), "other service's key");
    tdm_cfg_destroy(cfg);

    write_file(file, "listen:\n  host: x\n");
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    CHECK(st != TDM_OK && has_error(cfg, file, "nested mapping"), "nested value");
    tdm_cfg_destroy(cfg);

    write_file(file, "listen: [1, 2]\n");
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    CHECK(st != TDM_OK && has_error(cfg, file, "a list"), "list value");
    tdm_cfg_destroy(cfg);

    write_file(file, "listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n");
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    snprintf(want, sizeof(want), "%s:2: key 'listen' appears twice", file);
    CHECK(st != TDM_OK && has_error(cfg, want, NULL), "duplicate key");
    tdm_cfg_destroy(cfg);

    write_file(file, "listen: \"unterminated\n");
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    CHECK(st != TDM_OK && has_error(cfg, file, "invalid YAML"), "bad YAML");
    dump_errors(cfg);
    tdm_cfg_destroy(cfg);

    write_file(file, "just a scalar\n");
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    CHECK(st != TDM_OK && has_error(cfg, file, "key: value"), "scalar document");
    tdm_cfg_destroy(cfg);

    write_file(file, "a: 1\n---\nb: 2\n");
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    CHECK(st != TDM_OK && has_error(cfg, file, "more than one YAML document"), "two docs");
    tdm_cfg_destroy(cfg);

    /* A bad value in a file names the file and line. */
    write_file(file, "# x\nmax_draft_tokens: lots\n");
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    snprintf(want, sizeof(want), "file:%s:2: max_draft_tokens: 'lots' is not an integer", file);
    CHECK(st != TDM_OK && has_error(cfg, want, NULL), "bad value in file");
    tdm_cfg_destroy(cfg);

    /* Empty file and comments only: fine. */
    write_file(file, "");
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    CHECK(st == TDM_OK, "empty file: %s", err.msg);
    tdm_cfg_destroy(cfg);
    write_file(file, "# nothing\n");
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    CHECK(st == TDM_OK, "comment-only file: %s", err.msg);
    tdm_cfg_destroy(cfg);

    /* A NUL in a quoted value would cut it short: refused, naming file and line. */
    write_file(file, "max_sequences: 4\nreplica_id: \"v1\\0-other\"\n");
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    snprintf(want, sizeof(want), "%s:2: the value holds a NUL character", file);
    CHECK(st != TDM_OK && has_error(cfg, want, NULL), "NUL in a value: %s", err.msg);
    tdm_cfg_destroy(cfg);
    /* The same text from memory. */
    cfg = tdm_cfg_create(&tdm_svc_verifier_schema);
    static const char text[] = "replica_id: \"a\\0b\"\n";
    st = tdm_cfg_load_text(cfg, text, sizeof(text) - 1, "mem.yaml", &err);
    CHECK(st != TDM_OK && has_error(cfg, "mem.yaml:1: the value holds a NUL character", NULL),
          "NUL from memory: %s", err.msg);
    tdm_cfg_destroy(cfg);

    /* Missing file. */
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", "/nonexistent/x.yaml", NULL);
    CHECK(st != TDM_OK && has_error(cfg, "/nonexistent/x.yaml", "cannot open"), "missing file");
    tdm_cfg_destroy(cfg);

    /* Binary garbage. */
    FILE *f = fopen(file, "wb");
    for (int i = 0; i < 4096; i++)
        fputc((i * 131 + 7) & 0xff, f);
    fclose(f);
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--config", file, NULL);
    CHECK(st != TDM_OK && has_error(cfg, file, NULL), "garbage file");
    tdm_cfg_destroy(cfg);
}

static void test_value_errors(void)
{
    static const struct {
        const char *flag, *value, *want;
    } cases[] = {
        {"--max-draft-tokens", "abc", "'abc' is not an integer"},
        {"--max-draft-tokens", "0", "'0' is out of range (1 to 64)"},
        {"--max-draft-tokens", "65", "out of range"},
        {"--max-draft-tokens", "99999999999999999999", "not an integer"},
        {"--state-strategy", "replay_all",
         "'replay_all' is not one of auto|extra_buffer|no_buffer|replay"},
        {"--prefix-cache", "maybe", "'maybe' is not on or off"},
        {"--listen", "localhost", "is not an address"},
        {"--listen", "host:99999", "is not an address"},
        {"--listen", ":80", "is not an address"},
        {"--gateway", "", "must not be empty"},
        {"--shutdown-grace", "5", "is not a duration"},
        {"--shutdown-grace", "11m", "out of range"},
        {"--max-message-size", "12XB", "is not a size"},
        {"--log-level", "verbose", "is not one of debug|info|warn|error"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tdm_status st;
        tdm_error err;
        tdm_cfg *cfg =
            load(&tdm_svc_verifier_schema, &st, NULL, &err, cases[i].flag, cases[i].value, NULL);
        char src[128];
        snprintf(src, sizeof(src), "flag:%s", cases[i].flag);
        CHECK(st != TDM_OK, "%s %s must fail", cases[i].flag, cases[i].value);
        CHECK(has_error(cfg, src, cases[i].want), "%s %s: want '%s'", cases[i].flag, cases[i].value,
              cases[i].want);
        if (!has_error(cfg, src, cases[i].want))
            dump_errors(cfg);
        tdm_cfg_destroy(cfg);
    }
    tdm_status st;
    tdm_error err;
    tdm_cfg *cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--no-such-flag", "1", NULL);
    CHECK(st != TDM_OK && has_error(cfg, "unknown flag --no-such-flag", NULL), "unknown flag");
    tdm_cfg_destroy(cfg);
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--draft-block-size", "4", NULL);
    CHECK(st != TDM_OK && has_error(cfg, "unknown flag --draft-block-size", NULL),
          "drafter flag on the verifier");
    tdm_cfg_destroy(cfg);
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--listen", NULL);
    CHECK(st != TDM_OK && has_error(cfg, "flag --listen needs a value", NULL), "missing value");
    tdm_cfg_destroy(cfg);
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "stray", NULL);
    CHECK(st != TDM_OK && has_error(cfg, "unexpected argument 'stray'", NULL), "positional");
    tdm_cfg_destroy(cfg);
    setenv("TANDEM_MAX_SEQUENCES", "-3", 1);
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, NULL);
    CHECK(st != TDM_OK && has_error(cfg, "env:TANDEM_MAX_SEQUENCES", "out of range"), "bad env");
    tdm_cfg_destroy(cfg);
    unsetenv("TANDEM_MAX_SEQUENCES");
    /* Several errors are all reported, not only the first. */
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--max-draft-tokens", "x", "--log-level",
               "y", NULL);
    CHECK(tdm_cfg_error_count(cfg) == 2, "two errors, got %zu", tdm_cfg_error_count(cfg));
    tdm_cfg_destroy(cfg);
    /* IPv6 addresses parse. */
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--listen", "[::1]:7000", NULL);
    CHECK(st == TDM_OK, "ipv6: %s", err.msg);
    tdm_cfg_destroy(cfg);
}

static void test_paths(void)
{
    tdm_status st;
    tdm_error err;
    char dir[512], path[700];
    snprintf(dir, sizeof(dir), "%s/empty-model", g_dir);
    mkdir(dir, 0755);
    tdm_cfg *cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--model", dir, NULL);
    CHECK(st != TDM_OK && has_error(cfg, "does not contain config.json", "flag:--model"),
          "model dir without config.json");
    tdm_cfg_destroy(cfg);
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--model", "/nonexistent/model", NULL);
    CHECK(st != TDM_OK && has_error(cfg, "/nonexistent/model", "does not exist"), "no dir");
    tdm_cfg_destroy(cfg);
    snprintf(path, sizeof(path), "%s/file", g_dir);
    write_file(path, "x");
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--model", path, NULL);
    CHECK(st != TDM_OK && has_error(cfg, path, "not a directory"), "model is a file");
    tdm_cfg_destroy(cfg);
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--tokenizer", g_dir, NULL);
    CHECK(st != TDM_OK && has_error(cfg, "tokenizer", "not a regular file"), "tokenizer dir");
    tdm_cfg_destroy(cfg);
}

static void test_help(void)
{
    const tdm_cfg_schema *schemas[] = {&tdm_svc_gateway_schema, &tdm_svc_verifier_schema,
                                       &tdm_svc_drafter_schema};
    for (size_t s = 0; s < 3; s++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        tdm_cfg_print_help(schemas[s], f);
        fclose(f);
        CHECK_HAS(buf, schemas[s]->program);
        /* Help is wrapped: compare with runs of white space collapsed. */
        size_t w = 0;
        for (size_t r = 0; buf[r]; r++) {
            bool space = buf[r] == ' ' || buf[r] == '\n';
            if (space && w > 0 && buf[w - 1] == ' ')
                continue;
            buf[w++] = space ? ' ' : buf[r];
        }
        buf[w] = '\0';
        for (size_t i = 0; i < schemas[s]->n_keys; i++) {
            const tdm_cfg_key *k = &schemas[s]->keys[i];
            char flag[128], env[128];
            tdm_cfg_flag_name(k->key, flag, sizeof(flag));
            tdm_cfg_env_name(k->key, env, sizeof(env));
            CHECK_HAS(buf, flag);
            CHECK_HAS(buf, env);
            CHECK_HAS(buf, k->doc);
        }
        free(buf);
    }
    /* Spot checks of the derived names against their documented spelling. */
    char b[64];
    tdm_cfg_flag_name("state_strategy", b, sizeof(b));
    CHECK_STR(b, "--state-strategy");
    tdm_cfg_env_name("state_strategy", b, sizeof(b));
    CHECK_STR(b, "TANDEM_STATE_STRATEGY");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    tdm_cfg_print_help(&tdm_svc_verifier_schema, f);
    fclose(f);
    CHECK_HAS(buf, "--state-strategy auto|extra_buffer|no_buffer|replay");
    CHECK_HAS(buf, "default: auto");
    CHECK_HAS(buf, "--prefix-cache on|off");
    CHECK_HAS(buf, "--max-draft-tokens integer");
    CHECK_HAS(buf, "range 1..64");
    free(buf);
}

/* cuda_graphs: on unless set, from any source, on verifier and drafter. */
static void test_cuda_graphs(void)
{
    const tdm_cfg_schema *schemas[] = {&tdm_svc_verifier_schema, &tdm_svc_drafter_schema};
    tdm_status st;
    tdm_error err;
    char d[256];
    for (size_t i = 0; i < 2; i++) {
        tdm_cfg *cfg = load(schemas[i], &st, NULL, &err, NULL);
        CHECK(st == TDM_OK, "%s", err.msg);
        CHECK(tdm_cfg_bool(cfg, "cuda_graphs"), "%s: default", schemas[i]->program);
        CHECK_STR(tdm_cfg_describe(cfg, "cuda_graphs", d, sizeof(d)), "cuda_graphs=on (default)");
        tdm_cfg_destroy(cfg);
        cfg = load(schemas[i], &st, NULL, &err, "--cuda-graphs", "off", NULL);
        CHECK(st == TDM_OK && !tdm_cfg_bool(cfg, "cuda_graphs"), "%s: flag", schemas[i]->program);
        CHECK_STR(tdm_cfg_describe(cfg, "cuda_graphs", d, sizeof(d)),
                  "cuda_graphs=off (flag:--cuda-graphs)");
        tdm_cfg_destroy(cfg);
        setenv("TANDEM_CUDA_GRAPHS", "false", 1);
        cfg = load(schemas[i], &st, NULL, &err, NULL);
        CHECK(st == TDM_OK && !tdm_cfg_bool(cfg, "cuda_graphs"), "%s: env", schemas[i]->program);
        CHECK_STR(tdm_cfg_describe(cfg, "cuda_graphs", d, sizeof(d)),
                  "cuda_graphs=off (env:TANDEM_CUDA_GRAPHS)");
        tdm_cfg_destroy(cfg);
        unsetenv("TANDEM_CUDA_GRAPHS");
        cfg = load(schemas[i], &st, NULL, &err, "--cuda-graphs", "sometimes", NULL);
        CHECK(st != TDM_OK && has_error(cfg, "cuda_graphs", NULL), "%s: a bad value is an error",
              schemas[i]->program);
        tdm_cfg_destroy(cfg);
    }
    /* The gateway runs no model. */
    tdm_cfg *cfg = tdm_cfg_create(&tdm_svc_gateway_schema);
    CHECK(!tdm_cfg_has(cfg, "cuda_graphs"), "the gateway has cuda_graphs");
    tdm_cfg_destroy(cfg);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    tdm_cfg_print_help(&tdm_svc_verifier_schema, f);
    fclose(f);
    CHECK_HAS(buf, "--cuda-graphs on|off");
    CHECK_HAS(buf, "TANDEM_CUDA_GRAPHS");
    free(buf);
}

static void test_proto(void)
{
    tdm_status st;
    tdm_error err;
    tdm_cfg *cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--prefix-cache", "on", NULL);
    CHECK(st == TDM_OK, "%s", err.msg);
    Tandem__V1__EffectiveConfig ec = TANDEM__V1__EFFECTIVE_CONFIG__INIT;
    CHECK(tdm_cfg_to_proto(cfg, &ec, &err) == TDM_OK, "%s", err.msg);
    CHECK(ec.n_entries == tdm_svc_verifier_schema.n_keys, "one entry per key");
    /* Through the wire format and back, decoded by protobuf-c. */
    size_t n = tandem__v1__effective_config__get_packed_size(&ec);
    uint8_t *bytes = malloc(n);
    tandem__v1__effective_config__pack(&ec, bytes);
    Tandem__V1__EffectiveConfig *back = tandem__v1__effective_config__unpack(NULL, n, bytes);
    CHECK(back != NULL, "unpack");
    bool saw_prefix = false, saw_strategy = false;
    for (size_t i = 0; back && i < back->n_entries; i++) {
        const Tandem__V1__ConfigEntry *e = back->entries[i];
        if (strcmp(e->key, "prefix_cache") == 0) {
            saw_prefix = true;
            CHECK_STR(e->value, "on");
            CHECK_STR(e->source, "flag:--prefix-cache");
            CHECK_STR(e->reason, "");
        }
        if (strcmp(e->key, "state_strategy") == 0) {
            saw_strategy = true;
            CHECK_STR(e->value, "extra_buffer");
            CHECK_STR(e->source, "auto");
            CHECK_HAS(e->reason, "prefix_cache=on (flag:--prefix-cache)");
            CHECK_HAS(e->reason, "auto set by default");
        }
    }
    CHECK(saw_prefix && saw_strategy, "entries present");
    if (back)
        tandem__v1__effective_config__free_unpacked(back, NULL);
    free(bytes);
    tdm_cfg_proto_clear(&ec);

    /* The printed configuration carries value, source and reason. */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    tdm_cfg_print(cfg, f);
    fclose(f);
    CHECK_HAS(buf, "prefix_cache:");
    CHECK_HAS(buf, "# flag:--prefix-cache");
    CHECK_HAS(buf, "state_strategy:");
    CHECK_HAS(buf, "rule state-strategy-for-prefix-cache");
    free(buf);
    tdm_cfg_destroy(cfg);
}

static void test_capacity(void)
{
    tdm_status st;
    tdm_error err;
    char d[512];
    /* auto: the capacity of the budget, with the rule and the budget named. */
    tdm_cfg *cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--gpu-memory", "1GiB", NULL);
    CHECK(st == TDM_OK, "%s", err.msg);
    tdm_capacity_params p;
    tdm_capacity c;
    CHECK(tdm_svc_verifier_capacity(cfg, &p, &c, &err) == TDM_OK, "%s", err.msg);
    CHECK(c.max_sequences > 0 && tdm_cfg_int(cfg, "max_sequences") == c.max_sequences,
          "max_sequences %lld, capacity %d", (long long)tdm_cfg_int(cfg, "max_sequences"),
          c.max_sequences);
    CHECK_HAS(tdm_cfg_reason(cfg, "max_sequences"), "rule max-sequences-from-capacity");
    CHECK_HAS(tdm_cfg_reason(cfg, "max_sequences"), "gpu_memory=1GiB (flag:--gpu-memory)");
    const int cap = c.max_sequences;
    tdm_cfg_destroy(cfg);
    /* An explicit value at the capacity stays; above it is refused naming both. */
    char at[16], above[16];
    snprintf(at, sizeof(at), "%d", cap);
    snprintf(above, sizeof(above), "%d", cap + 1);
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--gpu-memory", "1GiB", "--max-sequences",
               at, NULL);
    CHECK(st == TDM_OK, "%s", err.msg);
    tdm_cfg_destroy(cfg);
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--gpu-memory", "1GiB", "--max-sequences",
               above, NULL);
    snprintf(d, sizeof(d), "max_sequences=%d (flag:--max-sequences)", cap + 1);
    char capd[64];
    snprintf(capd, sizeof(capd), "capacity of %d sequences", cap);
    CHECK(st != TDM_OK && has_error(cfg, d, capd) &&
              has_error(cfg, "gpu_memory=1GiB (flag:--gpu-memory)", "max-sequences-within"),
          "above the capacity");
    CHECK(tdm_cfg_int(cfg, "max_sequences") == cap + 1, "an explicit value is never changed");
    tdm_cfg_destroy(cfg);
    /* Explicit zeros are no budget. */
    cfg = load(&tdm_svc_verifier_schema, &st, NULL, &err, "--gpu-memory", "0", NULL);
    CHECK(st != TDM_OK && has_error(cfg, "gpu_memory=0 (flag:--gpu-memory)", "more than 0"),
          "gpu_memory 0");
    /* Its arithmetic without a budget: measured at start. */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    tdm_svc_print_capacity(cfg, "# ", f);
    fclose(f);
    CHECK_HAS(buf, "# per sequence (extra_buffer, max_draft_tokens 8, max_context 3000)");
    CHECK_HAS(buf, "# budget: measured at start");
    free(buf);
    tdm_cfg_destroy(cfg);
    /* The drafter keeps its own max_sequences. */
    cfg = load(&tdm_svc_drafter_schema, &st, NULL, &err, NULL);
    CHECK(st == TDM_OK && tdm_cfg_int(cfg, "max_sequences") == 64 &&
              !tdm_cfg_has(cfg, "gpu_memory"),
          "drafter");
    tdm_cfg_destroy(cfg);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {
        {"precedence", test_precedence},
        {"auto_rules", test_auto_rules},
        {"conflicts", test_conflicts},
        {"file_errors", test_file_errors},
        {"value_errors", test_value_errors},
        {"paths", test_paths},
        {"help", test_help},
        {"cuda_graphs", test_cuda_graphs},
        {"proto", test_proto},
        {"capacity", test_capacity},
    };
    clear_env();
    make_tmpdir();
    snprintf(g_model, sizeof(g_model), "%s/verifier-model", g_dir);
    mkdir(g_model, 0755);
    char cfg_path[400];
    snprintf(cfg_path, sizeof(cfg_path), "%s/config.json", g_model);
    /* Small shapes: the verifier's capacity rule sizes the model against
     * this host's memory. */
    write_file(cfg_path, "{\"model_type\": \"qwen3_5_text\", \"vocab_size\": 16, "
                         "\"max_position_embeddings\": 3000, \"hidden_size\": 64, "
                         "\"intermediate_size\": 128, \"num_hidden_layers\": 4, "
                         "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
                         "\"head_dim\": 32, \"linear_num_key_heads\": 2, "
                         "\"linear_num_value_heads\": 2, \"linear_key_head_dim\": 16, "
                         "\"linear_value_head_dim\": 16}");
    int ran = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0)
            continue;
        cases[i].fn();
        ran++;
    }
    cleanup();
    if (!ran) {
        fprintf(stderr, "unknown case %s\n", argc > 1 ? argv[1] : "");
        return 2;
    }
    if (g_failures) {
        fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
