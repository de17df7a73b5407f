/*
 * config.c - sources, provenance, `auto` rules and validation of a service's
 * configuration (see config.h).
 */
#include "config.h"
#include "alloc.h"

#include "file.h"
#include "log.h"
#include "tandem/v1/common.pb-c.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;
#include <yaml.h>

#define CFG_MAX_ERRORS 64
#define CFG_TEXT_MAX 4096

enum { RANK_DEFAULT = 0, RANK_FILE = 1, RANK_ENV = 2, RANK_FLAG = 3 };

typedef struct cfg_value {
    char *text;      /* effective value as text (bool normalised to on/off) */
    char *source;    /* "default", "file:P:L", "env:X", "flag:--x", "auto" */
    char *reason;    /* why a rule chose the value; "" otherwise */
    char *auto_from; /* where the literal `auto` came from, when resolved */
    int rank;        /* RANK_* of the source that set text (or `auto`) */
    bool resolved;   /* text was chosen by a rule or learned after start */
    int64_t num;     /* INT, SIZE, DURATION (ms) */
    bool flag;       /* BOOL */
} cfg_value;

struct tdm_cfg {
    const tdm_cfg_schema *schema;
    cfg_value *values; /* (n_keys) parallel to schema->keys */
    char *errors[CFG_MAX_ERRORS];
    size_t n_errors;
    size_t n_dropped;                 /* errors beyond CFG_MAX_ERRORS, counted only */
    char *unused_env[CFG_MAX_ERRORS]; /* TANDEM_* variables that are not our keys */
    size_t n_unused_env;
};

/* ---- small helpers -------------------------------------------------------- */

static void replace_str(char **slot, const char *s)
{
    char *d = tdm_xstrdup(s);
    free(*slot);
    *slot = d;
}

static void add_error(tdm_cfg *cfg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_error(tdm_cfg *cfg, const char *fmt, ...)
{
    if (cfg->n_errors >= CFG_MAX_ERRORS) {
        cfg->n_dropped++;
        return;
    }
    char buf[TDM_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    cfg->errors[cfg->n_errors++] = tdm_xstrdup(buf);
}

/* Fills err with every recorded error joined, or clears it. */
static tdm_status report(const tdm_cfg *cfg, tdm_error *err)
{
    if (cfg->n_errors == 0) {
        tdm_error_clear(err);
        return TDM_OK;
    }
    if (err) {
        err->code = TDM_ERR_INVALID_ARGUMENT;
        size_t used = 0;
        err->msg[0] = '\0';
        for (size_t i = 0; i < cfg->n_errors && used + 1 < sizeof(err->msg); i++) {
            int n = snprintf(err->msg + used, sizeof(err->msg) - used, "%s%s", i ? "; " : "",
                             cfg->errors[i]);
            if (n < 0)
                break;
            used += (size_t)n;
        }
    }
    return TDM_ERR_INVALID_ARGUMENT;
}

static ssize_t find_key(const tdm_cfg_schema *s, const char *key)
{
    for (size_t i = 0; i < s->n_keys; i++)
        if (strcmp(s->keys[i].key, key) == 0)
            return (ssize_t)i;
    return -1;
}

static size_t must_find(const tdm_cfg *cfg, const char *key)
{
    ssize_t i = find_key(cfg->schema, key);
    if (i < 0) {
        fprintf(stderr, "tandem: configuration key '%s' is not in %s's table\n", key,
                cfg->schema->program);
        abort();
    }
    return (size_t)i;
}

void tdm_cfg_flag_name(const char *key, char *buf, size_t len)
{
    snprintf(buf, len, "--%s", key);
    for (char *p = buf + 2; *p; p++)
        if (*p == '_')
            *p = '-';
}

void tdm_cfg_env_name(const char *key, char *buf, size_t len)
{
    snprintf(buf, len, "TANDEM_%s", key);
    for (char *p = buf; *p; p++)
        *p = (char)toupper((unsigned char)*p);
}

static const char *type_name(const tdm_cfg_key *k)
{
    switch (k->type) {
    case TDM_CFG_STRING:
        return "string";
    case TDM_CFG_INT:
        return "integer";
    case TDM_CFG_SIZE:
        return "size";
    case TDM_CFG_BOOL:
        return "on|off";
    case TDM_CFG_ENUM:
        return k->allowed;
    case TDM_CFG_DURATION:
        return "duration";
    case TDM_CFG_ADDRESS:
        return "host:port";
    case TDM_CFG_PATH:
        return (k->flags & TDM_CFG_PATH_DIR) ? "dir" : "file";
    }
    return "?";
}

/* ---- value parsers -------------------------------------------------------- */

tdm_status tdm_cfg_parse_bool(const char *t, bool *out, tdm_error *err)
{
    static const char *const yes[] = {"on", "true", "yes", "1"};
    static const char *const no[] = {"off", "false", "no", "0"};
    for (size_t i = 0; i < TDM_ARRAY_LEN(yes); i++) {
        if (strcasecmp(t, yes[i]) == 0) {
            *out = true;
            return TDM_OK;
        }
        if (strcasecmp(t, no[i]) == 0) {
            *out = false;
            return TDM_OK;
        }
    }
    return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "'%s' is not on or off", t);
}

/* Parses a decimal integer prefix; *end gets the rest. */
static bool parse_i64_prefix(const char *t, int64_t *out, const char **end)
{
    if (!isdigit((unsigned char)t[0]) && !(t[0] == '-' && isdigit((unsigned char)t[1])))
        return false;
    errno = 0;
    char *e = NULL;
    long long v = strtoll(t, &e, 10);
    if (errno != 0)
        return false;
    *out = (int64_t)v;
    *end = e;
    return true;
}

static tdm_status parse_int(const char *t, int64_t *out, tdm_error *err)
{
    const char *end = NULL;
    if (!parse_i64_prefix(t, out, &end) || *end != '\0')
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "'%s' is not an integer", t);
    return TDM_OK;
}

tdm_status tdm_cfg_parse_duration_ms(const char *t, int64_t *out, tdm_error *err)
{
    static const struct {
        const char *unit;
        int64_t ms;
    } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
    int64_t v = 0;
    const char *end = NULL;
    if (parse_i64_prefix(t, &v, &end) && v >= 0) {
        if (*end == '\0' && v == 0) {
            *out = 0;
            return TDM_OK;
        }
        for (size_t i = 0; i < TDM_ARRAY_LEN(units); i++) {
            if (strcmp(end, units[i].unit) == 0) {
                if (v > INT64_MAX / units[i].ms)
                    break;
                *out = v * units[i].ms;
                return TDM_OK;
            }
        }
    }
    return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                         "'%s' is not a duration (a whole number with unit ms, s, m or h, "
                         "e.g. 500ms, 5s)",
                         t);
}

tdm_status tdm_cfg_parse_size(const char *t, int64_t *out, tdm_error *err)
{
    static const struct {
        const char *unit;
        int64_t mul;
    } units[] = {{"", 1},          {"B", 1},       {"KiB", 1 << 10}, {"K", 1 << 10},
                 {"MiB", 1 << 20}, {"M", 1 << 20}, {"GiB", 1 << 30}, {"G", 1 << 30}};
    int64_t v = 0;
    const char *end = NULL;
    if (parse_i64_prefix(t, &v, &end) && v >= 0) {
        for (size_t i = 0; i < TDM_ARRAY_LEN(units); i++) {
            if (strcmp(end, units[i].unit) == 0) {
                if (v > INT64_MAX / units[i].mul)
                    break;
                *out = v * units[i].mul;
                return TDM_OK;
            }
        }
    }
    return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                         "'%s' is not a size (bytes, optionally with KiB, MiB or GiB)", t);
}

tdm_status tdm_cfg_parse_address(const char *t, char *host, size_t host_len, int *port,
                                 tdm_error *err)
{
    const char *colon = NULL;
    size_t hlen = 0;
    const char *hstart = t;
    if (t[0] == '[') {
        const char *close = strchr(t, ']');
        if (!close || close[1] != ':')
            goto bad;
        hstart = t + 1;
        hlen = (size_t)(close - hstart);
        colon = close + 1;
    } else {
        colon = strrchr(t, ':');
        if (!colon || strchr(t, ':') != colon)
            goto bad;
        hlen = (size_t)(colon - t);
    }
    if (hlen == 0 || hlen >= host_len)
        goto bad;
    for (size_t i = 0; i < hlen; i++)
        if (isspace((unsigned char)hstart[i]) || hstart[i] == '/')
            goto bad;
    int64_t p = 0;
    const char *end = NULL;
    if (!parse_i64_prefix(colon + 1, &p, &end) || *end != '\0' || p < 0 || p > 65535)
        goto bad;
    memcpy(host, hstart, hlen);
    host[hlen] = '\0';
    *port = (int)p;
    return TDM_OK;
bad:
    return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                         "'%s' is not an address (host:port or [ipv6]:port, port 0-65535)", t);
}

static bool enum_has(const char *allowed, const char *t)
{
    size_t n = strlen(t);
    const char *p = allowed;
    while (p && *p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, t, n) == 0)
            return true;
        p = bar ? bar + 1 : NULL;
    }
    return false;
}

/* Checks text against the key's type and range; fills the typed fields of *v
 * (without touching v->text). Path existence is checked later, in finish. */
static tdm_status parse_value(const tdm_cfg_key *k, const char *t, cfg_value *v, tdm_error *err)
{
    if ((k->flags & TDM_CFG_AUTO) && strcmp(t, "auto") == 0)
        return TDM_OK;
    if (t[0] == '\0') {
        if (k->flags & TDM_CFG_EMPTY_OK)
            return TDM_OK;
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "must not be empty");
    }
    tdm_status st = TDM_OK;
    int64_t num = 0;
    switch (k->type) {
    case TDM_CFG_STRING:
    case TDM_CFG_PATH:
        return TDM_OK;
    case TDM_CFG_BOOL:
        return tdm_cfg_parse_bool(t, &v->flag, err);
    case TDM_CFG_ENUM:
        if (!enum_has(k->allowed, t))
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "'%s' is not one of %s", t,
                                 k->allowed);
        return TDM_OK;
    case TDM_CFG_ADDRESS: {
        char host[256];
        int port = 0;
        return tdm_cfg_parse_address(t, host, sizeof(host), &port, err);
    }
    case TDM_CFG_INT:
        st = parse_int(t, &num, err);
        break;
    case TDM_CFG_SIZE:
        st = tdm_cfg_parse_size(t, &num, err);
        break;
    case TDM_CFG_DURATION:
        st = tdm_cfg_parse_duration_ms(t, &num, err);
        break;
    }
    if (st != TDM_OK)
        return st;
    if (k->min != k->max && (num < k->min || num > k->max)) {
        if (k->type == TDM_CFG_DURATION)
            return tdm_error_set(err, TDM_ERR_OUT_OF_RANGE,
                                 "'%s' is out of range (%lldms to %lldms)", t, (long long)k->min,
                                 (long long)k->max);
        return tdm_error_set(err, TDM_ERR_OUT_OF_RANGE, "'%s' is out of range (%lld to %lld)", t,
                             (long long)k->min, (long long)k->max);
    }
    v->num = num;
    return TDM_OK;
}

/* ---- create / destroy ----------------------------------------------------- */

tdm_cfg *tdm_cfg_create(const tdm_cfg_schema *schema)
{
    tdm_cfg *cfg = calloc(1, sizeof(*cfg));
    if (!cfg)
        return NULL;
    cfg->schema = schema;
    cfg->values = calloc(schema->n_keys ? schema->n_keys : 1, sizeof(cfg_value));
    if (!cfg->values) {
        free(cfg);
        return NULL;
    }
    for (size_t i = 0; i < schema->n_keys; i++) {
        const tdm_cfg_key *k = &schema->keys[i];
        cfg_value *v = &cfg->values[i];
        const char *def = k->def ? k->def : "";
        v->text = tdm_xstrdup(def);
        v->source = tdm_xstrdup("default");
        v->reason = tdm_xstrdup("");
        v->auto_from = tdm_xstrdup("");
        v->rank = RANK_DEFAULT;
        tdm_error e;
        /* A default that does not parse is a bug in the table, not input. */
        if (parse_value(k, def, v, &e) != TDM_OK) {
            fprintf(stderr, "tandem: default of %s is invalid: %s\n", k->key, e.msg);
            abort();
        }
        if (k->type == TDM_CFG_BOOL && v->text[0]) {
            replace_str(&v->text, v->flag ? "on" : "off");
        }
    }
    return cfg;
}

void tdm_cfg_destroy(tdm_cfg *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < cfg->schema->n_keys; i++) {
        free(cfg->values[i].text);
        free(cfg->values[i].source);
        free(cfg->values[i].reason);
        free(cfg->values[i].auto_from);
    }
    for (size_t i = 0; i < cfg->n_errors; i++)
        free(cfg->errors[i]);
    for (size_t i = 0; i < cfg->n_unused_env; i++)
        free(cfg->unused_env[i]);
    free(cfg->values);
    free(cfg);
}

/* ---- setting values ------------------------------------------------------- */

static tdm_status set_value(tdm_cfg *cfg, size_t idx, const char *text, int rank,
                            const char *source)
{
    const tdm_cfg_key *k = &cfg->schema->keys[idx];
    cfg_value *v = &cfg->values[idx];
    if (rank < v->rank)
        return TDM_OK;
    cfg_value tmp = *v;
    tdm_error e;
    if (parse_value(k, text, &tmp, &e) != TDM_OK) {
        add_error(cfg, "%s: %s: %s", source, k->key, e.msg);
        return TDM_ERR_INVALID_ARGUMENT;
    }
    v->num = tmp.num;
    v->flag = tmp.flag;
    if (k->type == TDM_CFG_BOOL && text[0] && strcmp(text, "auto") != 0)
        replace_str(&v->text, v->flag ? "on" : "off");
    else
        replace_str(&v->text, text);
    replace_str(&v->source, source);
    replace_str(&v->reason, "");
    replace_str(&v->auto_from, "");
    v->rank = rank;
    v->resolved = false;
    return TDM_OK;
}

tdm_status tdm_cfg_set(tdm_cfg *cfg, const char *key, const char *value, int rank,
                       const char *source, tdm_error *err)
{
    ssize_t idx = find_key(cfg->schema, key);
    if (idx < 0) {
        add_error(cfg, "%s: unknown key '%s'", source, key);
        return report(cfg, err);
    }
    if (set_value(cfg, (size_t)idx, value, rank, source) != TDM_OK)
        return report(cfg, err);
    return TDM_OK;
}

/* ---- config file (flat YAML) ---------------------------------------------- */

static const char *yaml_event_name(yaml_event_type_t t)
{
    switch (t) {
    case YAML_SEQUENCE_START_EVENT:
        return "a list";
    case YAML_MAPPING_START_EVENT:
        return "a nested mapping";
    case YAML_ALIAS_EVENT:
        return "an alias";
    default:
        return "an unexpected YAML construct";
    }
}

/* A config file is a page of settings; anything this large is not one. */
#define CFG_FILE_MAX ((size_t)1 << 20)

tdm_status tdm_cfg_load_file(tdm_cfg *cfg, const char *path, tdm_error *err)
{
    char *text = NULL;
    size_t len = 0;
    tdm_error e;
    if (tdm_file_read(path, CFG_FILE_MAX, &text, &len, &e) != TDM_OK) {
        add_error(cfg, "config file %s", e.msg);
        return report(cfg, err);
    }
    tdm_status rc = tdm_cfg_load_text(cfg, text, len, path, err);
    free(text);
    return rc;
}

tdm_status tdm_cfg_load_text(tdm_cfg *cfg, const char *text_in, size_t text_len, const char *path,
                             tdm_error *err)
{
    size_t errors_before = cfg->n_errors;
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        add_error(cfg, "config file %s: cannot initialise the YAML parser", path);
        return report(cfg, err);
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text_in, text_len);

    /* Expected event sequence: STREAM_START [DOCUMENT_START MAPPING_START
     * (SCALAR SCALAR)* MAPPING_END DOCUMENT_END] STREAM_END. */
    enum { WANT_DOC, WANT_MAP, WANT_KEY, WANT_VALUE, WANT_DOC_END, DONE } state = WANT_DOC;
    bool *seen = tdm_xcalloc(cfg->schema->n_keys ? cfg->schema->n_keys : 1, sizeof(bool));
    char key[256] = "";
    size_t key_line = 0;
    int docs = 0;
    bool failed = false;
    while (!failed) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            add_error(cfg, "%s:%zu: invalid YAML: %s", path, parser.problem_mark.line + 1,
                      parser.problem ? parser.problem : "parse error");
            break;
        }
        size_t line = ev.start_mark.line + 1;
        yaml_event_type_t t = ev.type;
        if (t == YAML_STREAM_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        switch (t) {
        case YAML_STREAM_START_EVENT:
            break;
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1) {
                add_error(cfg, "%s:%zu: more than one YAML document; use one flat mapping", path,
                          line);
                failed = true;
            }
            state = WANT_MAP;
            break;
        case YAML_DOCUMENT_END_EVENT:
            state = WANT_DOC;
            break;
        case YAML_MAPPING_START_EVENT:
            if (state == WANT_MAP) {
                state = WANT_KEY;
            } else {
                add_error(cfg, "%s:%zu: %s: value is %s; only flat 'key: value' lines are allowed",
                          path, line, key[0] ? key : "(top level)", yaml_event_name(t));
                failed = true;
            }
            break;
        case YAML_MAPPING_END_EVENT:
            state = WANT_DOC_END;
            break;
        case YAML_SCALAR_EVENT: {
            const char *text = (const char *)ev.data.scalar.value;
            if (strlen(text) != ev.data.scalar.length) {
                /* "\0" in a quoted scalar: C strings would cut the value there. */
                add_error(cfg, "%s:%zu: %s holds a NUL character", path, line,
                          state == WANT_VALUE ? "the value" : "a key");
                failed = true;
            } else if (state == WANT_MAP) {
                /* An empty document is a scalar null; anything else is not a mapping. */
                if (ev.data.scalar.length != 0) {
                    add_error(cfg, "%s:%zu: expected 'key: value' lines, found '%s'", path, line,
                              text);
                    failed = true;
                }
                state = WANT_DOC_END;
            } else if (state == WANT_KEY) {
                snprintf(key, sizeof(key), "%s", text);
                key_line = line;
                state = WANT_VALUE;
            } else if (state == WANT_VALUE) {
                ssize_t idx = find_key(cfg->schema, key);
                if (idx < 0) {
                    add_error(cfg, "%s:%zu: unknown key '%s' (not a setting of %s; see --help)",
                              path, key_line, key, cfg->schema->program);
                } else if (seen[idx]) {
                    add_error(cfg, "%s:%zu: key '%s' appears twice", path, key_line, key);
                } else {
                    seen[idx] = true;
                    char source[CFG_TEXT_MAX];
                    snprintf(source, sizeof(source), "file:%s:%zu", path, key_line);
                    set_value(cfg, (size_t)idx, text, RANK_FILE, source);
                }
                state = WANT_KEY;
            } else {
                add_error(cfg, "%s:%zu: unexpected '%s'", path, line, text);
                failed = true;
            }
            break;
        }
        default:
            add_error(cfg, "%s:%zu: %s: value is %s; only flat 'key: value' lines are allowed",
                      path, line, key[0] ? key : "(top level)", yaml_event_name(t));
            failed = true;
            break;
        }
        yaml_event_delete(&ev);
    }
    free(seen);
    yaml_parser_delete(&parser);
    (void)state;
    return cfg->n_errors > errors_before ? report(cfg, err) : TDM_OK;
}

/* ---- environment and flags ------------------------------------------------ */

tdm_status tdm_cfg_load_env(tdm_cfg *cfg, tdm_error *err)
{
    size_t errors_before = cfg->n_errors;
    for (size_t i = 0; i < cfg->schema->n_keys; i++) {
        char name[256];
        tdm_cfg_env_name(cfg->schema->keys[i].key, name, sizeof(name));
        const char *val = getenv(name);
        if (!val)
            continue;
        char source[300];
        snprintf(source, sizeof(source), "env:%s", name);
        set_value(cfg, i, val, RANK_ENV, source);
    }
    /* Remember TANDEM_* variables that match no key: a misspelt one would
     * otherwise be silently ignored. */
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "TANDEM_", 7) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
        bool known = false;
        for (size_t i = 0; i < cfg->schema->n_keys && !known; i++) {
            char name[256];
            tdm_cfg_env_name(cfg->schema->keys[i].key, name, sizeof(name));
            known = strlen(name) == len && strncmp(name, *e, len) == 0;
        }
        if (!known && cfg->n_unused_env < CFG_MAX_ERRORS) {
            char *copy = tdm_xstrndup(*e, len);
            cfg->unused_env[cfg->n_unused_env++] = copy;
        }
    }
    return cfg->n_errors > errors_before ? report(cfg, err) : TDM_OK;
}

size_t tdm_cfg_unused_env_count(const tdm_cfg *cfg)
{
    return cfg->n_unused_env;
}

const char *tdm_cfg_unused_env_at(const tdm_cfg *cfg, size_t i)
{
    return i < cfg->n_unused_env ? cfg->unused_env[i] : "";
}

/* Matches "--name" or "--name=value" against one flag; *inline_value gets the
 * text after '=' when present. */
static bool match_flag(const char *arg, const char *flag, const char **inline_value)
{
    size_t n = strlen(flag);
    if (strncmp(arg, flag, n) != 0)
        return false;
    if (arg[n] == '\0') {
        *inline_value = NULL;
        return true;
    }
    if (arg[n] == '=') {
        *inline_value = arg + n + 1;
        return true;
    }
    return false;
}

tdm_status tdm_cfg_load(tdm_cfg *cfg, int argc, char **argv, bool use_env, tdm_cfg_action *action,
                        tdm_error *err)
{
    *action = TDM_CFG_ACTION_RUN;
    const char *config_file = NULL;
    /* Pass 1: actions and the config file, which must be read before the
     * environment and flags that override it. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *iv = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *action = TDM_CFG_ACTION_HELP;
        } else if (strcmp(a, "--check-config") == 0) {
            if (*action != TDM_CFG_ACTION_HELP)
                *action = TDM_CFG_ACTION_CHECK;
        } else if (match_flag(a, "--config", &iv)) {
            if (!iv) {
                if (i + 1 >= argc) {
                    add_error(cfg, "flag --config needs a file name");
                    continue;
                }
                iv = argv[++i];
            }
            if (config_file)
                add_error(cfg, "flag --config given twice ('%s' and '%s')", config_file, iv);
            config_file = iv;
        } else if (strncmp(a, "--", 2) == 0 && !strchr(a, '=') && i + 1 < argc) {
            i++; /* skip a setting's value (pass 2 checks it) */
        }
    }
    if (*action == TDM_CFG_ACTION_HELP)
        return TDM_OK;
    if (config_file)
        tdm_cfg_load_file(cfg, config_file, NULL);
    if (use_env)
        tdm_cfg_load_env(cfg, NULL);
    /* Pass 2: settings. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *iv = NULL;
        if (strcmp(a, "--check-config") == 0)
            continue;
        if (match_flag(a, "--config", &iv)) {
            if (!iv)
                i++;
            continue;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            add_error(cfg, "unexpected argument '%s' (settings are given as --key value)", a);
            continue;
        }
        char name[256];
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        if (nlen >= sizeof(name))
            nlen = sizeof(name) - 1;
        memcpy(name, a, nlen);
        name[nlen] = '\0';
        ssize_t idx = -1;
        for (size_t k = 0; k < cfg->schema->n_keys && idx < 0; k++) {
            char flag[256];
            tdm_cfg_flag_name(cfg->schema->keys[k].key, flag, sizeof(flag));
            if (strcmp(flag, name) == 0)
                idx = (ssize_t)k;
        }
        if (idx < 0) {
            add_error(cfg, "unknown flag %s (not a setting of %s; see --help)", name,
                      cfg->schema->program);
            if (!eq && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
                i++;
            continue;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (!val) {
            if (i + 1 >= argc) {
                add_error(cfg, "flag %s needs a value (%s)", name,
                          type_name(&cfg->schema->keys[idx]));
                continue;
            }
            val = argv[++i];
        }
        char source[300];
        snprintf(source, sizeof(source), "flag:%s", name);
        set_value(cfg, (size_t)idx, val, RANK_FLAG, source);
    }
    tdm_cfg_finish(cfg, NULL);
    return report(cfg, err);
}

/* ---- resolution and validation -------------------------------------------- */

static void validate_path(tdm_cfg *cfg, size_t i)
{
    const tdm_cfg_key *k = &cfg->schema->keys[i];
    const cfg_value *v = &cfg->values[i];
    if (v->text[0] == '\0')
        return;
    struct stat st;
    if (stat(v->text, &st) != 0) {
        add_error(cfg, "%s = '%s' (%s): %s does not exist", k->key, v->text, v->source,
                  (k->flags & TDM_CFG_PATH_DIR) ? "directory" : "file");
        return;
    }
    if ((k->flags & TDM_CFG_PATH_DIR) && !S_ISDIR(st.st_mode)) {
        add_error(cfg, "%s = '%s' (%s): not a directory", k->key, v->text, v->source);
        return;
    }
    if ((k->flags & TDM_CFG_PATH_FILE) && !S_ISREG(st.st_mode)) {
        add_error(cfg, "%s = '%s' (%s): not a regular file", k->key, v->text, v->source);
        return;
    }
    if ((k->flags & TDM_CFG_PATH_FILE) && access(v->text, R_OK) != 0) {
        add_error(cfg, "%s = '%s' (%s): not readable", k->key, v->text, v->source);
        return;
    }
    if ((k->flags & TDM_CFG_PATH_DIR) && k->must_contain) {
        char inner[CFG_TEXT_MAX];
        snprintf(inner, sizeof(inner), "%s/%s", v->text, k->must_contain);
        if (stat(inner, &st) != 0 || !S_ISREG(st.st_mode))
            add_error(cfg, "%s = '%s' (%s): directory does not contain %s", k->key, v->text,
                      v->source, k->must_contain);
    }
}

tdm_status tdm_cfg_finish(tdm_cfg *cfg, tdm_error *err)
{
    const tdm_cfg_schema *s = cfg->schema;
    for (size_t r = 0; r < s->n_rules; r++) {
        const tdm_cfg_rule *rule = &s->rules[r];
        size_t idx = must_find(cfg, rule->key);
        cfg_value *v = &cfg->values[idx];
        if (strcmp(v->text, "auto") != 0)
            continue; /* explicitly set (or a concrete default): never changed */
        char value[CFG_TEXT_MAX] = "";
        char why[TDM_ERROR_MSG_MAX] = "";
        tdm_error e;
        tdm_error_clear(&e);
        if (rule->resolve(cfg, value, sizeof(value), why, sizeof(why), &e) != TDM_OK) {
            add_error(cfg, "%s = auto (%s): rule %s cannot choose a value: %s", rule->key,
                      v->source, rule->name, e.msg);
            continue;
        }
        cfg_value tmp = *v;
        if (parse_value(&s->keys[idx], value, &tmp, &e) != TDM_OK || strcmp(value, "auto") == 0) {
            add_error(cfg, "%s: rule %s chose an invalid value '%s': %s", rule->key, rule->name,
                      value, e.msg);
            continue;
        }
        char reason[TDM_ERROR_MSG_MAX + 64];
        snprintf(reason, sizeof(reason), "rule %s: %s", rule->name, why);
        v->num = tmp.num;
        v->flag = tmp.flag;
        replace_str(&v->auto_from, v->source);
        replace_str(&v->text, value);
        replace_str(&v->source, "auto");
        replace_str(&v->reason, reason);
        v->resolved = true;
    }
    for (size_t i = 0; i < s->n_keys; i++) {
        const tdm_cfg_key *k = &s->keys[i];
        if (strcmp(cfg->values[i].text, "auto") == 0 && (k->flags & TDM_CFG_AUTO)) {
            add_error(cfg, "%s = auto (%s): no rule resolves it", k->key, cfg->values[i].source);
            continue;
        }
        if (k->type == TDM_CFG_PATH)
            validate_path(cfg, i);
    }
    for (size_t c = 0; c < s->n_checks; c++) {
        tdm_error e;
        tdm_error_clear(&e);
        if (s->checks[c].check(cfg, &e) != TDM_OK)
            add_error(cfg, "%s (check %s)", e.msg, s->checks[c].name);
    }
    return report(cfg, err);
}

tdm_status tdm_cfg_set_resolved(tdm_cfg *cfg, const char *key, const char *value,
                                const char *reason, tdm_error *err)
{
    size_t idx = must_find(cfg, key);
    cfg_value *v = &cfg->values[idx];
    if (!v->resolved && strcmp(v->text, "auto") != 0)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "%s = '%s' (%s) was set explicitly and is not changed", key, v->text,
                             v->source);
    cfg_value tmp = *v;
    tdm_error e;
    if (parse_value(&cfg->schema->keys[idx], value, &tmp, &e) != TDM_OK)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "%s: %s", key, e.msg);
    if (!v->resolved)
        replace_str(&v->auto_from, v->source);
    v->num = tmp.num;
    v->flag = tmp.flag;
    replace_str(&v->text, value);
    replace_str(&v->source, "auto");
    replace_str(&v->reason, reason);
    v->resolved = true;
    return TDM_OK;
}

/* ---- getters -------------------------------------------------------------- */

size_t tdm_cfg_error_count(const tdm_cfg *cfg)
{
    return cfg->n_errors;
}

const char *tdm_cfg_error_at(const tdm_cfg *cfg, size_t i)
{
    return i < cfg->n_errors ? cfg->errors[i] : "";
}

const char *tdm_cfg_str(const tdm_cfg *cfg, const char *key)
{
    return cfg->values[must_find(cfg, key)].text;
}

int64_t tdm_cfg_int(const tdm_cfg *cfg, const char *key)
{
    size_t i = must_find(cfg, key);
    tdm_cfg_type t = cfg->schema->keys[i].type;
    TDM_ASSERT(t == TDM_CFG_INT || t == TDM_CFG_SIZE || t == TDM_CFG_DURATION);
    return cfg->values[i].num;
}

bool tdm_cfg_bool(const tdm_cfg *cfg, const char *key)
{
    size_t i = must_find(cfg, key);
    TDM_ASSERT(cfg->schema->keys[i].type == TDM_CFG_BOOL);
    return cfg->values[i].flag;
}

const char *tdm_cfg_source(const tdm_cfg *cfg, const char *key)
{
    return cfg->values[must_find(cfg, key)].source;
}

const char *tdm_cfg_reason(const tdm_cfg *cfg, const char *key)
{
    return cfg->values[must_find(cfg, key)].reason;
}

bool tdm_cfg_is_explicit(const tdm_cfg *cfg, const char *key)
{
    const cfg_value *v = &cfg->values[must_find(cfg, key)];
    return v->rank > RANK_DEFAULT && !v->resolved;
}

const char *tdm_cfg_describe(const tdm_cfg *cfg, const char *key, char *buf, size_t len)
{
    const cfg_value *v = &cfg->values[must_find(cfg, key)];
    if (v->resolved)
        snprintf(buf, len, "%s=%s (auto, set by %s)", key, v->text, v->auto_from);
    else
        snprintf(buf, len, "%s=%s (%s)", key, v->text[0] ? v->text : "''", v->source);
    return buf;
}

const tdm_cfg_schema *tdm_cfg_schema_of(const tdm_cfg *cfg)
{
    return cfg->schema;
}

bool tdm_cfg_has(const tdm_cfg *cfg, const char *key)
{
    return find_key(cfg->schema, key) >= 0;
}

/* ---- output --------------------------------------------------------------- */

/* Writes a duration or size the way a user would type it. */
static void format_amount(const tdm_cfg_key *k, int64_t v, char *buf, size_t len)
{
    if (k->type == TDM_CFG_DURATION) {
        static const struct {
            int64_t ms;
            const char *unit;
        } u[] = {{3600000, "h"}, {60000, "m"}, {1000, "s"}};
        for (size_t i = 0; i < TDM_ARRAY_LEN(u); i++)
            if (v != 0 && v % u[i].ms == 0) {
                snprintf(buf, len, "%lld%s", (long long)(v / u[i].ms), u[i].unit);
                return;
            }
        snprintf(buf, len, "%lldms", (long long)v);
    } else if (k->type == TDM_CFG_SIZE) {
        static const struct {
            int64_t mul;
            const char *unit;
        } u[] = {{1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}};
        for (size_t i = 0; i < TDM_ARRAY_LEN(u); i++)
            if (v != 0 && v % u[i].mul == 0) {
                snprintf(buf, len, "%lld%s", (long long)(v / u[i].mul), u[i].unit);
                return;
            }
        snprintf(buf, len, "%lld", (long long)v);
    } else {
        snprintf(buf, len, "%lld", (long long)v);
    }
}

/* Prints text wrapped at 78 columns, each line indented by `indent`. */
static void print_wrapped(FILE *out, const char *text, int indent)
{
    const int width = 78;
    const char *p = text;
    while (*p) {
        int room = width - indent;
        int len = (int)strlen(p);
        int cut = len;
        if (len > room) {
            cut = room;
            while (cut > 0 && p[cut] != ' ')
                cut--;
            if (cut == 0)
                cut = room;
        }
        fprintf(out, "%*s%.*s\n", indent, "", cut, p);
        p += cut;
        while (*p == ' ')
            p++;
    }
}

void tdm_cfg_print_help(const tdm_cfg_schema *s, FILE *out)
{
    fprintf(out, "usage: %s [--config FILE] [--check-config] [--help] [--KEY VALUE ...]\n\n",
            s->program);
    print_wrapped(out, s->summary, 0);
    fprintf(out, "\nEach setting is read, lowest precedence first, from its default, the --config\n"
                 "file (flat YAML 'key: value' lines using the key names below), the environment\n"
                 "variable shown, and the command line. --check-config prints the effective\n"
                 "configuration with the source of every value and exits 0 if it would start.\n"
                 "Paths are taken relative to the current directory.\n");
    const char *groups[64];
    size_t n_groups = 0;
    for (size_t i = 0; i < s->n_keys; i++) {
        const char *g = s->keys[i].group ? s->keys[i].group : "Settings";
        bool known = false;
        for (size_t j = 0; j < n_groups; j++)
            known = known || strcmp(groups[j], g) == 0;
        if (!known && n_groups < TDM_ARRAY_LEN(groups))
            groups[n_groups++] = g;
    }
    for (size_t gi = 0; gi < n_groups; gi++) {
        fprintf(out, "\n%s:\n", groups[gi]);
        for (size_t i = 0; i < s->n_keys; i++) {
            const tdm_cfg_key *k = &s->keys[i];
            if (strcmp(k->group ? k->group : "Settings", groups[gi]) != 0)
                continue;
            char flag[256], env[256], line[1024];
            tdm_cfg_flag_name(k->key, flag, sizeof(flag));
            tdm_cfg_env_name(k->key, env, sizeof(env));
            fprintf(out, "  %s %s%s\n", flag, type_name(k),
                    (k->flags & TDM_CFG_AUTO) && k->type != TDM_CFG_ENUM ? "|auto" : "");
            print_wrapped(out, k->doc, 6);
            size_t used = (size_t)snprintf(line, sizeof(line), "default: %s",
                                           (k->def && k->def[0]) ? k->def : "(not set)");
            if (k->min != k->max) {
                char lo[64], hi[64];
                format_amount(k, k->min, lo, sizeof(lo));
                format_amount(k, k->max, hi, sizeof(hi));
                used +=
                    (size_t)snprintf(line + used, sizeof(line) - used, "; range %s..%s", lo, hi);
            }
            snprintf(line + used, sizeof(line) - used, "; env %s; file key %s", env, k->key);
            print_wrapped(out, line, 6);
        }
    }
}

static size_t key_width(const tdm_cfg_schema *s)
{
    size_t w = 0;
    for (size_t i = 0; i < s->n_keys; i++)
        if (strlen(s->keys[i].key) > w)
            w = strlen(s->keys[i].key);
    return w;
}

/* One line of the effective configuration, written as YAML so that it can be
 * pasted into a config file: `key: value  # source[: reason]`. */
static void format_entry(const tdm_cfg *cfg, size_t i, size_t width, char *buf, size_t len)
{
    const tdm_cfg_key *k = &cfg->schema->keys[i];
    const cfg_value *v = &cfg->values[i];
    char val[CFG_TEXT_MAX + 2];
    snprintf(val, sizeof(val), "%s", v->text[0] ? v->text : "''");
    if (v->resolved)
        snprintf(buf, len, "%s:%*s %-22s # auto (set by %s); %s", k->key,
                 (int)(width - strlen(k->key)), "", val, v->auto_from, v->reason);
    else
        snprintf(buf, len, "%s:%*s %-22s # %s", k->key, (int)(width - strlen(k->key)), "", val,
                 v->source);
}

void tdm_cfg_print(const tdm_cfg *cfg, FILE *out)
{
    size_t w = key_width(cfg->schema);
    fprintf(out, "# effective configuration of %s\n", cfg->schema->program);
    for (size_t i = 0; i < cfg->schema->n_keys; i++) {
        char line[CFG_TEXT_MAX * 2];
        format_entry(cfg, i, w, line, sizeof(line));
        fprintf(out, "%s\n", line);
    }
}

void tdm_cfg_log(const tdm_cfg *cfg, const char *component)
{
    size_t w = key_width(cfg->schema);
    tdm_log_info(component, "effective configuration of %s:", cfg->schema->program);
    for (size_t i = 0; i < cfg->schema->n_keys; i++) {
        char line[CFG_TEXT_MAX * 2];
        format_entry(cfg, i, w, line, sizeof(line));
        tdm_log_info(component, "  %s", line);
    }
}

tdm_status tdm_cfg_to_proto(const tdm_cfg *cfg, Tandem__V1__EffectiveConfig *out, tdm_error *err)
{
    (void)err; /* cannot fail: internal allocations abort (alloc.h) */
    size_t n = cfg->schema->n_keys;
    out->entries = tdm_xcalloc(n ? n : 1, sizeof(*out->entries));
    out->n_entries = 0;
    for (size_t i = 0; i < n; i++) {
        const cfg_value *v = &cfg->values[i];
        Tandem__V1__ConfigEntry *e = tdm_xmalloc(sizeof(*e));
        tandem__v1__config_entry__init(e);
        e->key = tdm_xstrdup(cfg->schema->keys[i].key);
        e->value = tdm_xstrdup(v->text);
        e->source = tdm_xstrdup(v->source);
        if (v->resolved) {
            char reason[TDM_ERROR_MSG_MAX + 300];
            snprintf(reason, sizeof(reason), "%s (auto set by %s)", v->reason, v->auto_from);
            e->reason = tdm_xstrdup(reason);
        } else {
            e->reason = tdm_xstrdup("");
        }
        out->entries[out->n_entries++] = e;
    }
    return TDM_OK;
}

void tdm_cfg_proto_clear(Tandem__V1__EffectiveConfig *out)
{
    for (size_t i = 0; i < out->n_entries; i++) {
        Tandem__V1__ConfigEntry *e = out->entries[i];
        free(e->key);
        free(e->value);
        free(e->source);
        free(e->reason);
        free(e);
    }
    free(out->entries);
    out->entries = NULL;
    out->n_entries = 0;
}
