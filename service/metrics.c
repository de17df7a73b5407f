/*
 * metrics.c - metric families, the Prometheus text format, and the names of
 * the Describe counters as metrics (see metrics.h).
 */
#include "metrics.h"
#include "alloc.h"

#include "service.h"
#include "status.h"
#include "tandem/v1/gateway.pb-c.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CHILDREN 64
#define MAX_FAMILIES 64
#define MAX_COLLECTORS 8

const double tdm_metrics_latency_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                              0.5,   1,      2.5,   5,    10,    20,   40,  60};
const size_t tdm_metrics_n_latency_buckets = TDM_ARRAY_LEN(tdm_metrics_latency_buckets);

/* One label value's numbers. */
typedef struct metric_child {
    char *label_value; /* NULL for an unlabelled family */
    double value;      /* counter, gauge */
    uint64_t *buckets; /* histogram: [n_bounds + 1] counts per bucket (not cumulative) */
    double sum;
    uint64_t count;
} metric_child;

struct tdm_metric {
    const char *name, *help, *label;
    tdm_metric_type type;
    double *bounds; /* histogram: [n_bounds] */
    size_t n_bounds;
    pthread_mutex_t mu;
    metric_child children[MAX_CHILDREN];
    size_t n_children;
};

typedef struct collector {
    tdm_metrics_collect_fn fn;
    void *arg;
} collector;

struct tdm_metrics {
    pthread_mutex_t mu; /* families and collectors (added before serving) */
    tdm_metric *families[MAX_FAMILIES];
    size_t n_families;
    collector collectors[MAX_COLLECTORS];
    size_t n_collectors;
};

struct tdm_metrics_writer {
    char *buf;
    size_t len, cap;
    const char *family; /* the family last started */
};

/* ---- names ------------------------------------------------------------------ */

static bool valid_name(const char *s, bool label)
{
    if (!s || !s[0])
        return false;
    if (label && s[0] == '_' && s[1] == '_')
        return false; /* reserved for Prometheus */
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool alpha =
            (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!label && c == ':');
        if (!alpha && !(p > s && c >= '0' && c <= '9'))
            return false;
    }
    return true;
}

/* ---- registry ------------------------------------------------------------------ */

tdm_metrics *tdm_metrics_create(void)
{
    tdm_metrics *m = tdm_xcalloc(1, sizeof(*m));
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

void tdm_metrics_destroy(tdm_metrics *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_families; i++) {
        tdm_metric *f = m->families[i];
        for (size_t c = 0; c < f->n_children; c++) {
            free(f->children[c].label_value);
            free(f->children[c].buckets);
        }
        free(f->bounds);
        pthread_mutex_destroy(&f->mu);
        free(f);
    }
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* A family, not yet in the registry: scrapes run while roles add families,
 * so a family is published (family_publish) only once it is whole. */
static tdm_metric *family_new(const char *name, const char *help, const char *label,
                              tdm_metric_type type)
{
    TDM_ASSERT(valid_name(name, false));
    TDM_ASSERT(!label || valid_name(label, true));
    TDM_ASSERT(!label || (strcmp(label, "le") != 0 && strcmp(label, "quantile") != 0));
    tdm_metric *f = tdm_xcalloc(1, sizeof(*f));
    f->name = name;
    f->help = help ? help : "";
    f->label = label;
    f->type = type;
    pthread_mutex_init(&f->mu, NULL);
    /* An unlabelled family is exported from the start (0, or empty). */
    if (!label)
        f->n_children = 1;
    return f;
}

static tdm_metric *family_publish(tdm_metrics *m, tdm_metric *f)
{
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n_families; i++)
        TDM_ASSERT(strcmp(m->families[i]->name, f->name) != 0);
    TDM_ASSERT(m->n_families < MAX_FAMILIES);
    m->families[m->n_families++] = f;
    pthread_mutex_unlock(&m->mu);
    return f;
}

tdm_metric *tdm_metrics_counter(tdm_metrics *m, const char *name, const char *help,
                                const char *label)
{
    return family_publish(m, family_new(name, help, label, TDM_METRIC_COUNTER));
}

tdm_metric *tdm_metrics_gauge(tdm_metrics *m, const char *name, const char *help, const char *label)
{
    return family_publish(m, family_new(name, help, label, TDM_METRIC_GAUGE));
}

tdm_metric *tdm_metrics_histogram(tdm_metrics *m, const char *name, const char *help,
                                  const char *label, const double *bounds, size_t n_bounds)
{
    for (size_t i = 1; i < n_bounds; i++)
        TDM_ASSERT(bounds[i] > bounds[i - 1]);
    tdm_metric *f = family_new(name, help, label, TDM_METRIC_HISTOGRAM);
    f->bounds = tdm_xmalloc((n_bounds ? n_bounds : 1) * sizeof(double));
    memcpy(f->bounds, bounds, n_bounds * sizeof(double));
    f->n_bounds = n_bounds;
    if (!label)
        f->children[0].buckets = tdm_xcalloc(n_bounds + 1, sizeof(uint64_t));
    return family_publish(m, f);
}

/* The child of a label value (under f->mu), created on first use; NULL when
 * the family already holds MAX_CHILDREN. */
static metric_child *child_locked(tdm_metric *f, const char *label_value)
{
    if (!f->label)
        label_value = NULL;
    else if (!label_value)
        label_value = "";
    for (size_t i = 0; i < f->n_children; i++) {
        const char *lv = f->children[i].label_value;
        if ((!lv && !label_value) || (lv && label_value && strcmp(lv, label_value) == 0))
            return &f->children[i];
    }
    if (f->n_children == MAX_CHILDREN)
        return NULL;
    metric_child *c = &f->children[f->n_children++];
    memset(c, 0, sizeof(*c));
    c->label_value = label_value ? tdm_xstrdup(label_value) : NULL;
    if (f->type == TDM_METRIC_HISTOGRAM)
        c->buckets = tdm_xcalloc(f->n_bounds + 1, sizeof(uint64_t));
    return c;
}

void tdm_metric_add(tdm_metric *f, const char *label_value, double v)
{
    TDM_ASSERT(f->type == TDM_METRIC_COUNTER || f->type == TDM_METRIC_GAUGE);
    if (f->type == TDM_METRIC_COUNTER && !(v >= 0))
        return;
    pthread_mutex_lock(&f->mu);
    metric_child *c = child_locked(f, label_value);
    if (c)
        c->value += v;
    pthread_mutex_unlock(&f->mu);
}

void tdm_metric_set(tdm_metric *f, const char *label_value, double v)
{
    TDM_ASSERT(f->type == TDM_METRIC_GAUGE);
    pthread_mutex_lock(&f->mu);
    metric_child *c = child_locked(f, label_value);
    if (c)
        c->value = v;
    pthread_mutex_unlock(&f->mu);
}

void tdm_metric_observe(tdm_metric *f, const char *label_value, double v)
{
    TDM_ASSERT(f->type == TDM_METRIC_HISTOGRAM);
    if (isnan(v))
        return;
    pthread_mutex_lock(&f->mu);
    metric_child *c = child_locked(f, label_value);
    if (c) {
        size_t b = 0;
        while (b < f->n_bounds && v > f->bounds[b])
            b++;
        c->buckets[b]++;
        c->sum += v;
        c->count++;
    }
    pthread_mutex_unlock(&f->mu);
}

double tdm_metric_value(tdm_metric *f, const char *label_value)
{
    double v = 0;
    pthread_mutex_lock(&f->mu);
    if (!f->label)
        label_value = NULL;
    for (size_t i = 0; i < f->n_children; i++) {
        const char *lv = f->children[i].label_value;
        if ((!lv && !label_value) || (lv && label_value && strcmp(lv, label_value) == 0))
            v = f->children[i].value;
    }
    pthread_mutex_unlock(&f->mu);
    return v;
}

void tdm_metrics_add_collector(tdm_metrics *m, tdm_metrics_collect_fn fn, void *arg)
{
    pthread_mutex_lock(&m->mu);
    TDM_ASSERT(m->n_collectors < MAX_COLLECTORS);
    m->collectors[m->n_collectors++] = (collector){fn, arg};
    pthread_mutex_unlock(&m->mu);
}

void tdm_metrics_outcomes_init(tdm_metrics_outcomes *o, tdm_metrics *m, const char *success_name,
                               const char *success_help, const char *errors_name,
                               const char *errors_help)
{
    o->success = tdm_metrics_counter(m, success_name, success_help, "finished_reason");
    o->errors = tdm_metrics_counter(m, errors_name, errors_help, "code");
}

void tdm_metrics_outcome(const tdm_metrics_outcomes *o, int rc, int finish_reason)
{
    if (rc != TDM_OK) {
        tdm_metric_add(o->errors, tdm_status_name((tdm_status)rc), 1);
        return;
    }
    /* FINISH_REASON_STOP -> "stop", as vLLM's finished_reason label reads. */
    const ProtobufCEnumValue *ev =
        protobuf_c_enum_descriptor_get_value(&tandem__v1__finish_reason__descriptor, finish_reason);
    char label[64] = "unspecified";
    if (ev) {
        const char *n = ev->name + (strncmp(ev->name, "FINISH_REASON_", 14) == 0 ? 14 : 0);
        size_t i = 0;
        for (; n[i] && i + 1 < sizeof(label); i++)
            label[i] = (char)(n[i] >= 'A' && n[i] <= 'Z' ? n[i] - 'A' + 'a' : n[i]);
        label[i] = '\0';
    }
    tdm_metric_add(o->success, label, 1);
}

/* ---- the text format ---------------------------------------------------------- */

static void out_append(tdm_metrics_writer *w, const char *s, size_t n)
{
    if (w->len + n + 1 > w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 16384;
        while (cap < w->len + n + 1)
            cap *= 2;
        w->buf = tdm_xrealloc(w->buf, cap);
        w->cap = cap;
    }
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
}

static void out_str(tdm_metrics_writer *w, const char *s)
{
    out_append(w, s, strlen(s));
}

/* Help text escapes backslash and newline; label values also the quote. */
static void out_escaped(tdm_metrics_writer *w, const char *s, bool quote)
{
    const char *run = s;
    for (const char *p = s; *p; p++) {
        const char *esc = *p == '\\'           ? "\\\\"
                          : *p == '\n'         ? "\\n"
                          : quote && *p == '"' ? "\\\""
                                               : NULL;
        if (!esc)
            continue;
        out_append(w, run, (size_t)(p - run));
        out_str(w, esc);
        run = p + 1;
    }
    out_str(w, run);
}

static void out_number(tdm_metrics_writer *w, double v)
{
    char b[64];
    if (isnan(v))
        snprintf(b, sizeof(b), "NaN");
    else if (isinf(v))
        snprintf(b, sizeof(b), v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 9.007199254740992e15)
        snprintf(b, sizeof(b), "%.0f", v);
    else
        snprintf(b, sizeof(b), "%.9g", v);
    out_str(w, b);
}

static const char *type_name(tdm_metric_type t)
{
    switch (t) {
    case TDM_METRIC_COUNTER:
        return "counter";
    case TDM_METRIC_GAUGE:
        return "gauge";
    case TDM_METRIC_HISTOGRAM:
        return "histogram";
    case TDM_METRIC_SUMMARY:
        return "summary";
    }
    return "untyped";
}

void tdm_metrics_write_family(tdm_metrics_writer *w, const char *name, tdm_metric_type type,
                              const char *help)
{
    TDM_ASSERT(valid_name(name, false));
    w->family = name;
    out_str(w, "# HELP ");
    out_str(w, name);
    out_str(w, " ");
    out_escaped(w, help ? help : "", false);
    out_str(w, "\n# TYPE ");
    out_str(w, name);
    out_str(w, " ");
    out_str(w, type_name(type));
    out_str(w, "\n");
}

void tdm_metrics_write_sample(tdm_metrics_writer *w, const char *suffix,
                              const tdm_metric_label *labels, size_t n_labels, double value)
{
    TDM_ASSERT(w->family);
    out_str(w, w->family);
    out_str(w, suffix ? suffix : "");
    if (n_labels > 0) {
        out_str(w, "{");
        for (size_t i = 0; i < n_labels; i++) {
            TDM_ASSERT(valid_name(labels[i].name, true) || strcmp(labels[i].name, "le") == 0);
            if (i)
                out_str(w, ",");
            out_str(w, labels[i].name);
            out_str(w, "=\"");
            out_escaped(w, labels[i].value ? labels[i].value : "", true);
            out_str(w, "\"");
        }
        out_str(w, "}");
    }
    out_str(w, " ");
    out_number(w, value);
    out_str(w, "\n");
}

static void write_registered(tdm_metrics_writer *w, tdm_metric *f)
{
    tdm_metrics_write_family(w, f->name, f->type, f->help);
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->n_children; i++) {
        const metric_child *c = &f->children[i];
        tdm_metric_label l[2] = {{f->label, c->label_value}, {"le", NULL}};
        size_t nl = f->label ? 1 : 0;
        if (f->type != TDM_METRIC_HISTOGRAM) {
            tdm_metrics_write_sample(w, "", l, nl, c->value);
            continue;
        }
        uint64_t cum = 0;
        for (size_t b = 0; b <= f->n_bounds; b++) {
            char le[48];
            cum += c->buckets[b];
            if (b < f->n_bounds)
                snprintf(le, sizeof(le), "%.9g", f->bounds[b]);
            else
                snprintf(le, sizeof(le), "+Inf");
            tdm_metric_label *bl = f->label ? &l[1] : &l[0];
            *bl = (tdm_metric_label){"le", le};
            tdm_metrics_write_sample(w, "_bucket", l, nl + 1, (double)cum);
        }
        tdm_metrics_write_sample(w, "_sum", l, nl, c->sum);
        tdm_metrics_write_sample(w, "_count", l, nl, (double)c->count);
    }
    pthread_mutex_unlock(&f->mu);
}

char *tdm_metrics_render(tdm_metrics *m, void (*prelude)(void *arg, tdm_metrics_writer *w),
                         void *arg, size_t *len)
{
    tdm_metrics_writer w = {0};
    out_str(&w, "");
    if (prelude)
        prelude(arg, &w);
    pthread_mutex_lock(&m->mu);
    size_t nf = m->n_families, nc = m->n_collectors;
    tdm_metric *fams[MAX_FAMILIES];
    collector cols[MAX_COLLECTORS];
    memcpy(fams, m->families, nf * sizeof(*fams));
    memcpy(cols, m->collectors, nc * sizeof(*cols));
    pthread_mutex_unlock(&m->mu);
    for (size_t i = 0; i < nf; i++)
        write_registered(&w, fams[i]);
    for (size_t i = 0; i < nc; i++)
        cols[i].fn(cols[i].arg, &w);
    if (len)
        *len = w.len;
    return w.buf;
}

/* ---- the Describe counters as metrics -------------------------------------------- */

/* One Describe counter as one sample of a family. A counter may feed several
 * rows ("rounds" is also the _count of every phase's summary); a family's
 * rows are contiguous and its first row carries the help. */
typedef struct counter_row {
    const char *role;    /* NULL: any role without a row of its own for this counter */
    const char *counter; /* the Describe counter */
    const char *family;  /* NULL: not exported (derived from others) */
    tdm_metric_type type;
    const char *suffix; /* "", "_sum", "_count" */
    double scale;       /* the counter's unit to the family's */
    const char *l1, *v1, *l2, *v2;
    const char *help;
} counter_row;

#define US 1e-6
#define ROW(role, counter, family, type, help)                                                     \
    {                                                                                              \
        role, counter, family, TDM_METRIC_##type, "", 1.0, NULL, NULL, NULL, NULL, help            \
    }
#define ROWL(role, counter, family, type, l, v, help)                                              \
    {                                                                                              \
        role, counter, family, TDM_METRIC_##type, "", 1.0, l, v, NULL, NULL, help                  \
    }
/* A counter of microseconds as a counter of seconds, with one label. */
#define ROWL_US(role, counter, family, l, v, help)                                                 \
    {                                                                                              \
        role, counter, family, TDM_METRIC_COUNTER, "", US, l, v, NULL, NULL, help                  \
    }
/* A phase of the verifier's round: quantiles, total and count. */
/* A runtime's CUDA graph outcomes (service.h: TDM_GRAPH_COUNTERS), for the
 * verifier and the drafter alike. */
#define GRAPH_ROWS(role)                                                                           \
    ROWL(role, "graph_steps_captured", "tandem_cuda_graph_steps_total", COUNTER, "outcome",        \
         "captured",                                                                               \
         "Forward steps on the CUDA backend by how they ran: captured into a CUDA graph, "         \
         "replayed from one, refused (the graph did not match; run again eagerly) or eager (a "    \
         "step shape seen for the first time, or given up on)."),                                  \
        ROWL(role, "graph_steps_replayed", "tandem_cuda_graph_steps_total", COUNTER, "outcome",    \
             "replayed", NULL),                                                                    \
        ROWL(role, "graph_steps_refused", "tandem_cuda_graph_steps_total", COUNTER, "outcome",     \
             "refused", NULL),                                                                     \
        ROWL(role, "graph_steps_eager", "tandem_cuda_graph_steps_total", COUNTER, "outcome",       \
             "eager", NULL),                                                                       \
        ROW(role, "graphs_evicted", "tandem_cuda_graphs_evicted_total", COUNTER,                   \
            "CUDA graphs dropped to make room for another step shape's (least recently used).")
#define PHASE(p, help)                                                                             \
    {"verifier",                                                                                   \
     "round_" p "_p50_us",                                                                         \
     "tandem_verifier_round_phase_seconds",                                                        \
     TDM_METRIC_SUMMARY,                                                                           \
     "",                                                                                           \
     US,                                                                                           \
     "phase",                                                                                      \
     p,                                                                                            \
     "quantile",                                                                                   \
     "0.5",                                                                                        \
     help},                                                                                        \
        {"verifier",                                                                               \
         "round_" p "_p99_us",                                                                     \
         "tandem_verifier_round_phase_seconds",                                                    \
         TDM_METRIC_SUMMARY,                                                                       \
         "",                                                                                       \
         US,                                                                                       \
         "phase",                                                                                  \
         p,                                                                                        \
         "quantile",                                                                               \
         "0.99",                                                                                   \
         NULL},                                                                                    \
        {"verifier",                                                                               \
         "round_" p "_us_total",                                                                   \
         "tandem_verifier_round_phase_seconds",                                                    \
         TDM_METRIC_SUMMARY,                                                                       \
         "_sum",                                                                                   \
         US,                                                                                       \
         "phase",                                                                                  \
         p,                                                                                        \
         NULL,                                                                                     \
         NULL,                                                                                     \
         NULL},                                                                                    \
    {                                                                                              \
        "verifier", "rounds", "tandem_verifier_round_phase_seconds", TDM_METRIC_SUMMARY, "_count", \
            1.0, "phase", p, NULL, NULL, NULL                                                      \
    }
#define QUANTILES(counter, family, help)                                                           \
    {"verifier", counter "_p50_us",                                                                \
     family,     TDM_METRIC_SUMMARY,                                                               \
     "",         US,                                                                               \
     "quantile", "0.5",                                                                            \
     NULL,       NULL,                                                                             \
     help},                                                                                        \
    {                                                                                              \
        "verifier", counter "_p99_us", family, TDM_METRIC_SUMMARY, "", US, "quantile", "0.99",     \
            NULL, NULL, NULL                                                                       \
    }

static const counter_row counter_rows[] = {
    /* every process */
    ROW(NULL, "uptime_seconds", "tandem_process_uptime_seconds", GAUGE,
        "Seconds since the process started."),
    ROW(NULL, "registered", "tandem_registered", GAUGE,
        "1 while this replica is registered with the gateway, else 0."),
    ROW(NULL, "registrations", "tandem_registrations_total", COUNTER,
        "Registrations of this replica with the gateway."),
    ROW(NULL, "heartbeats", "tandem_heartbeats_total", COUNTER,
        "Heartbeats this replica sent to the gateway."),
    ROW(NULL, "heartbeat_failures", "tandem_heartbeat_failures_total", COUNTER,
        "Heartbeats that failed."),
    ROW(NULL, "forgotten_by_gateway", "tandem_forgotten_by_gateway_total", COUNTER,
        "Times the gateway did not know this replica and it registered again."),

    /* gateway */
    ROWL("gateway", "verifiers", "tandem_gateway_replicas", GAUGE, "role", "verifier",
         "Replicas registered now, by role."),
    ROWL("gateway", "drafters", "tandem_gateway_replicas", GAUGE, "role", "drafter", NULL),
    ROW("gateway", "registrations", "tandem_gateway_registrations_total", COUNTER,
        "Registrations accepted."),
    ROW("gateway", "reregistrations", "tandem_gateway_reregistrations_total", COUNTER,
        "Registrations of a replica id that was already registered."),
    ROW("gateway", "heartbeats", "tandem_gateway_heartbeats_total", COUNTER,
        "Heartbeats received."),
    ROW("gateway", "unknown_heartbeats", "tandem_gateway_unknown_heartbeats_total", COUNTER,
        "Heartbeats from replicas the registry did not know."),
    ROW("gateway", "deregistrations", "tandem_gateway_deregistrations_total", COUNTER,
        "Replicas that deregistered."),
    ROW("gateway", "replicas_dropped", "tandem_gateway_replicas_dropped_total", COUNTER,
        "Replicas dropped after replica_ttl without a heartbeat."),
    ROW("gateway", "registrations_rejected", "tandem_gateway_registrations_rejected_total", COUNTER,
        "Registrations refused (trust, descriptor, layout)."),
    ROWL("gateway", "prefix_affinity_picks", "tandem_gateway_prefix_affinity_total", COUNTER,
         "outcome", "picked",
         "Requests whose prompt starts with cache blocks a verifier served last: sent to it "
         "(picked), or to the least loaded because it was busy (passed)."),
    ROWL("gateway", "prefix_affinity_passed", "tandem_gateway_prefix_affinity_total", COUNTER,
         "outcome", "passed", NULL),
    ROW("gateway", "generate_requests", "tandem_gateway_requests_total", COUNTER,
        "Generate requests received."),
    ROWL("gateway", "generate_completed", "tandem_gateway_requests_finished_total", COUNTER,
         "outcome", "completed", "Generate requests that ended, by outcome."),
    ROWL("gateway", "generate_failed", "tandem_gateway_requests_finished_total", COUNTER, "outcome",
         "failed", NULL),
    ROWL("gateway", "generate_cancelled", "tandem_gateway_requests_finished_total", COUNTER,
         "outcome", "cancelled", NULL),
    ROW("gateway", "generated_tokens", "tandem_generation_tokens_total", COUNTER,
        "Tokens streamed to clients."),
    ROW("gateway", "generate_moved", "tandem_gateway_requests_moved_total", COUNTER,
        "Times a request changed verifier mid-stream (a drain moved it, or a crash made another "
        "recompute it)."),

    /* verifier */
    ROW("verifier", "requests", "tandem_verifier_requests_total", COUNTER,
        "Run requests accepted by the scheduler."),
    ROW("verifier", "active_sequences", "tandem_num_requests_running", GAUGE,
        "Sequences in the batch now."),
    ROW("verifier", "waiting_sequences", "tandem_num_requests_waiting", GAUGE,
        "Requests waiting for a place in the batch."),
    ROW("verifier", "max_sequences", "tandem_num_requests_max", GAUGE,
        "Most sequences in the batch at once (max_sequences): the capacity."),
    ROW("verifier", "rounds", "tandem_verifier_rounds_total", COUNTER,
        "Rounds (batched forward passes) run."),
    ROW("verifier", "speculative_steps", "tandem_verifier_speculative_rounds_total", COUNTER,
        "Rounds that verified at least one draft block."),
    ROW("verifier", "speculative_rounds", "tandem_spec_decode_num_drafts_total", COUNTER,
        "Draft blocks verified: one per speculating sequence and round."),
    ROW("verifier", "drafted_tokens", "tandem_spec_decode_num_draft_tokens_total", COUNTER,
        "Draft tokens verified."),
    ROW("verifier", "accepted_tokens", "tandem_spec_decode_num_accepted_tokens_total", COUNTER,
        "Draft tokens accepted."),
    ROW("verifier", "adaptive_off_rounds", "tandem_spec_decode_adaptive_off_rounds_total", COUNTER,
        "Sequence rounds decoded plainly because the adaptive rule had switched speculation "
        "off."),
    ROW("verifier", "adaptive_switch_offs", "tandem_spec_decode_adaptive_switch_offs_total",
        COUNTER, "Times the adaptive rule switched speculation off for a sequence."),
    ROW("verifier", "adaptive_scores", "tandem_spec_decode_adaptive_scores_total", COUNTER,
        "Scores weighed: a paused greedy sequence's drafter judged on the tokens decoded "
        "without it."),
    ROW("verifier", "adaptive_scored_positions",
        "tandem_spec_decode_adaptive_scored_positions_total", COUNTER,
        "Positions those scores judged a draft at."),
    ROW("verifier", "adaptive_score_restarts", "tandem_spec_decode_adaptive_score_restarts_total",
        COUNTER, "Scores after which the adaptive rule restarted speculation."),
    ROW("verifier", "adaptive_cost_relaxes", "tandem_spec_decode_adaptive_cost_relaxes_total",
        COUNTER,
        "Requests that started paused on measured costs that lose even with every draft "
        "accepted, and moved them back towards what was timed before serving (0.1 / n of the "
        "way each at a batch of n)."),
    ROW("verifier", "plain_measure_rounds", "tandem_spec_decode_plain_measure_rounds_total",
        COUNTER,
        "Rounds run plainly, their draft blocks unverified, to measure the plain round that "
        "the adaptive rule judges speculation against."),
    ROW("verifier", "mean_accepted_per_round", NULL, GAUGE, NULL),
    ROW("verifier", "feature_rows_sent", "tandem_spec_decode_feature_rows_total", COUNTER,
        "Hidden-state rows (one a position) streamed to hidden-state drafters (mtp)."),
    ROW("verifier", "feature_bytes_sent", "tandem_spec_decode_feature_bytes_total", COUNTER,
        "Bytes of hidden states streamed to hidden-state drafters (mtp)."),
    ROWL("verifier", "feature_rows_shm", "tandem_spec_decode_feature_transport_rows_total", COUNTER,
         "transport", "shm",
         "Hidden-state rows streamed to hidden-state drafters, by transport (shm: by reference "
         "into a shared-memory ring; grpc: inline in the Draft stream's messages)."),
    ROWL("verifier", "feature_rows_grpc", "tandem_spec_decode_feature_transport_rows_total",
         COUNTER, "transport", "grpc", NULL),
    ROWL("verifier", "feature_bytes_shm", "tandem_spec_decode_feature_transport_bytes_total",
         COUNTER, "transport", "shm", "Bytes of hidden states streamed, by transport."),
    ROWL("verifier", "feature_bytes_grpc", "tandem_spec_decode_feature_transport_bytes_total",
         COUNTER, "transport", "grpc", NULL),
    ROW("verifier", "feature_ring_full", "tandem_spec_decode_feature_ring_full_total", COUNTER,
        "Messages whose hidden-state rows went inline because the shared-memory ring lacked "
        "room (feature_shm_size)."),
    ROWL("verifier", "feature_puts_shm", "tandem_spec_decode_feature_puts_total", COUNTER,
         "transport", "shm",
         "Messages (opens and verdicts) that carried hidden-state rows, by transport."),
    ROWL("verifier", "feature_puts_grpc", "tandem_spec_decode_feature_puts_total", COUNTER,
         "transport", "grpc", NULL),
    {"verifier", "feature_put_us_shm", "tandem_spec_decode_feature_put_seconds_total",
     TDM_METRIC_COUNTER, "", US, "transport", "shm", NULL, NULL,
     "Time the verifier spent putting hidden-state rows out (encoding, then the ring copy or "
     "the message's serialisation), by transport (with tandem_spec_decode_feature_puts_total: "
     "the mean per message)."},
    {"verifier", "feature_put_us_grpc", "tandem_spec_decode_feature_put_seconds_total",
     TDM_METRIC_COUNTER, "", US, "transport", "grpc", NULL, NULL, NULL},
    ROWL("verifier", "feature_streams_shm", "tandem_spec_decode_feature_streams_total", COUNTER,
         "transport", "shm",
         "Draft streams whose feature transport was settled, by the transport (shm: the "
         "drafter accepted the shared-memory ring)."),
    ROWL("verifier", "feature_streams_grpc", "tandem_spec_decode_feature_streams_total", COUNTER,
         "transport", "grpc", NULL),
    ROWL("verifier", "exchange_streams_shm", "tandem_spec_decode_exchange_streams_total", COUNTER,
         "transport", "shm",
         "Draft streams whose exchange transport was settled, by the transport (shm: the "
         "drafter accepted the shared-memory lane)."),
    ROWL("verifier", "exchange_streams_grpc", "tandem_spec_decode_exchange_streams_total", COUNTER,
         "transport", "grpc", NULL),
    ROW("verifier", "drafter_failures", "tandem_spec_decode_drafter_failures_total", COUNTER,
        "Drafter failures (stream broken, late block) that turned speculation off."),
    ROW("verifier", "drafter_reopens", "tandem_spec_decode_drafter_reopens_total", COUNTER,
        "Sequences re-opened on their drafter's address after it failed (drafter_reopen_tries)."),
    ROW("verifier", "malformed_blocks", "tandem_spec_decode_malformed_blocks_total", COUNTER,
        "Draft blocks refused as malformed."),
    ROWL("verifier", "ahead_blocks_used", "tandem_spec_decode_ahead_blocks_total", COUNTER,
         "outcome", "used", "Blocks drafted ahead of their verdict, by whether they stood."),
    ROWL("verifier", "ahead_blocks_dropped", "tandem_spec_decode_ahead_blocks_total", COUNTER,
         "outcome", "dropped", NULL),
    GRAPH_ROWS("verifier"),
    ROW("verifier", "generated_tokens", "tandem_verifier_generation_tokens_total", COUNTER,
        "Tokens generated."),
    ROW("verifier", "cancelled", "tandem_verifier_sequences_cancelled_total", COUNTER,
        "Sequences retired because their client went away."),
    ROW("verifier", "draft_streams", "tandem_verifier_draft_streams", GAUGE,
        "Draft streams open to drafters."),
    ROW("verifier", "kv_cache_bytes", "tandem_kv_cache_memory_bytes", GAUGE,
        "Attention KV cache memory held by the batch's sequences."),
    ROWL("verifier", "recurrent_state_bytes", "tandem_state_memory_bytes", GAUGE, "kind",
         "recurrent", "Linear-attention state memory held by the batch's sequences, by kind."),
    ROWL("verifier", "conv_state_bytes", "tandem_state_memory_bytes", GAUGE, "kind", "conv", NULL),
    ROWL("verifier", "strategy_state_bytes", "tandem_state_memory_bytes", GAUGE, "kind", "strategy",
         NULL),
    ROW("verifier", "weight_bytes", "tandem_model_weight_memory_bytes", GAUGE,
        "Memory of the model's weights."),
    ROWL("verifier", "snapshots_exported", "tandem_verifier_snapshots_total", COUNTER, "event",
         "exported",
         "State snapshots by event: exported, imported, dropped unused after snapshot_ttl."),
    ROWL("verifier", "snapshots_imported", "tandem_verifier_snapshots_total", COUNTER, "event",
         "imported", NULL),
    ROWL("verifier", "snapshots_expired", "tandem_verifier_snapshots_total", COUNTER, "event",
         "expired", NULL),
    ROW("verifier", "snapshots_waiting", "tandem_verifier_snapshots_waiting", GAUGE,
        "Imported state snapshots waiting for the Run that continues them."),
    ROWL("verifier", "prefix_cache_hits", "tandem_prefix_cache_requests_total", COUNTER, "outcome",
         "hit",
         "Requests with a prompt of at least one prefix-cache block, by whether they started "
         "from a cached prefix (hit) or found none (miss)."),
    ROWL("verifier", "prefix_cache_misses", "tandem_prefix_cache_requests_total", COUNTER,
         "outcome", "miss", NULL),
    ROW("verifier", "prefix_cache_tokens_saved", "tandem_prefix_cache_tokens_saved_total", COUNTER,
        "Prompt tokens restored from the prefix cache instead of prefilled."),
    ROW("verifier", "prefix_cache_blocks_stored", "tandem_prefix_cache_blocks_stored_total",
        COUNTER, "Prefix-cache blocks stored."),
    ROW("verifier", "prefix_cache_evictions", "tandem_prefix_cache_evictions_total", COUNTER,
        "Prefix-cache blocks evicted (least recently used first) to stay within "
        "prefix_cache_memory."),
    ROW("verifier", "prefix_cache_blocks", "tandem_prefix_cache_blocks", GAUGE,
        "Prefix-cache blocks held now."),
    ROW("verifier", "prefix_cache_bytes", "tandem_prefix_cache_memory_bytes", GAUGE,
        "Host memory the prefix cache holds now."),
    ROW("verifier", "prefix_cache_memory_bytes", "tandem_prefix_cache_memory_budget_bytes", GAUGE,
        "Host memory the prefix cache may hold (prefix_cache_memory; 0: the cache is off)."),
    ROWL("verifier", "prefix_fetches", "tandem_prefix_fetches_total", COUNTER, "outcome", "all",
         "Prompt-prefix fetches from a peer verifier: all made, those that failed (the prompt "
         "was prefilled), and the times the cost rule chose prefilling over fetching."),
    ROWL("verifier", "prefix_fetch_failures", "tandem_prefix_fetches_total", COUNTER, "outcome",
         "failed", NULL),
    ROWL("verifier", "prefix_fetch_recomputed", "tandem_prefix_fetches_total", COUNTER, "outcome",
         "recomputed", NULL),
    ROW("verifier", "prefix_fetch_blocks", "tandem_prefix_fetch_blocks_total", COUNTER,
        "Prefix-cache blocks fetched from peer verifiers."),
    ROW("verifier", "prefix_fetch_bytes", "tandem_prefix_fetch_bytes_total", COUNTER,
        "Bytes of prefix-cache blocks fetched from peer verifiers."),
    {"verifier", "prefix_fetch_ms", "tandem_prefix_fetch_seconds_total", TDM_METRIC_COUNTER, "",
     1e-3, NULL, NULL, NULL, NULL,
     "Time spent fetching prompt prefixes from peer verifiers, failures included."},
    {"verifier", "prefix_fetch_bandwidth_bytes_per_ms", "tandem_prefix_fetch_bandwidth_bytes",
     TDM_METRIC_GAUGE, "", 1e3, NULL, NULL, NULL, NULL,
     "The fetch bandwidth (bytes per second) the cost rule uses: measured over past fetches, "
     "else prefix_fetch_bandwidth."},
    {"verifier", "prefill_tokens_per_ms", "tandem_verifier_prefill_tokens", TDM_METRIC_GAUGE, "",
     1e3, NULL, NULL, NULL, NULL,
     "The prefill throughput (tokens per second) the prefix-fetch cost rule uses: measured "
     "over prefill calls, else a prior of 4000."},
    QUANTILES("draft_exchange_overhead", "tandem_spec_decode_exchange_overhead_seconds",
              "Time from asking for a block to receiving it, less the drafter's own drafting "
              "time (last 4096 blocks)."),
    QUANTILES("draft_time_per_token", "tandem_spec_decode_drafter_time_per_token_seconds",
              "The drafter's own time per draft token (last 4096 blocks)."),
    {"verifier", "draft_exchange_us_total", "tandem_spec_decode_exchange_seconds_total",
     TDM_METRIC_COUNTER, "", US, NULL, NULL, NULL, NULL,
     "The exchange summed over every block since the start (with "
     "tandem_spec_decode_exchange_blocks_total: its mean over any interval)."},
    ROW("verifier", "draft_exchange_blocks", "tandem_spec_decode_exchange_blocks_total", COUNTER,
        "Blocks whose exchange was timed."),
    {"verifier", "draft_open_wait_us_total", "tandem_spec_decode_open_wait_seconds_total",
     TDM_METRIC_COUNTER, "", US, NULL, NULL, NULL, NULL,
     "What requests' first blocks, asked for with their opens (as the prefill starts, or on a "
     "resume), kept them waiting beyond their prefill, summed since the start (not in the "
     "exchange)."},
    ROW("verifier", "draft_open_waits", "tandem_spec_decode_open_waits_total", COUNTER,
        "First blocks after an open whose wait was timed."),
    ROWL_US(
        "verifier", "draft_exchange_send_us_total",
        "tandem_spec_decode_exchange_part_seconds_total", "part", "send",
        "The verifier's side of the exchange, summed since the start, by part: building and "
        "queueing verdicts and opens (send), their wait for the link's writer thread (queue), its "
        "gRPC writes (write), and drafters' messages from their read to the scheduler (deliver). "
        "The rest of the exchange is the transport both ways and the drafter's own reads and "
        "writes."),
    ROWL_US("verifier", "draft_exchange_queue_us_total",
            "tandem_spec_decode_exchange_part_seconds_total", "part", "queue", NULL),
    ROWL_US("verifier", "draft_exchange_write_us_total",
            "tandem_spec_decode_exchange_part_seconds_total", "part", "write", NULL),
    ROWL_US("verifier", "draft_exchange_deliver_us_total",
            "tandem_spec_decode_exchange_part_seconds_total", "part", "deliver", NULL),
    ROWL("verifier", "draft_exchange_sends", "tandem_spec_decode_exchange_part_events_total",
         COUNTER, "part", "send",
         "Messages timed in each part of the exchange (with "
         "tandem_spec_decode_exchange_part_seconds_total: a part's mean over any interval; "
         "queue's are write's)."),
    ROWL("verifier", "draft_exchange_writes", "tandem_spec_decode_exchange_part_events_total",
         COUNTER, "part", "write", NULL),
    ROWL("verifier", "draft_exchange_delivers", "tandem_spec_decode_exchange_part_events_total",
         COUNTER, "part", "deliver", NULL),
    {"verifier", "draft_time_us_total", "tandem_spec_decode_drafter_seconds_total",
     TDM_METRIC_COUNTER, "", US, NULL, NULL, NULL, NULL,
     "The drafters' own drafting time summed over every block since the start."},
    ROW("verifier", "draft_tokens_timed", "tandem_spec_decode_drafter_timed_tokens_total", COUNTER,
        "Draft tokens in the blocks whose drafting time was summed."),
    {"verifier", "scheduler_uptime_us", "tandem_verifier_scheduler_uptime_seconds",
     TDM_METRIC_GAUGE, "", US, NULL, NULL, NULL, NULL,
     "Seconds the scheduler has run: what the round phases' sums add up to."},
    PHASE("idle", "The round's timeline: time in each phase (quantiles over the last 4096 rounds; "
                  "the sum since the start)."),
    PHASE("admit", NULL),
    PHASE("prefill", NULL),
    PHASE("wait", NULL),
    PHASE("step", NULL),
    PHASE("commit", NULL),
    PHASE("send", NULL),
    ROWL_US("verifier", "round_commit_verdicts_us_total",
            "tandem_verifier_round_commit_seconds_total", "part", "verdicts",
            "The round's commit phase by part: verdicts (the step's outputs read, a sampled "
            "rejection's row fetched and its residual drawn), emit (tokens out, the adaptive "
            "rule, the drafters' next messages), retire (finished requests), states (accepted "
            "drafts committed); the parts add up to the commit phase."),
    ROWL_US("verifier", "round_commit_emit_us_total", "tandem_verifier_round_commit_seconds_total",
            "part", "emit", NULL),
    ROWL_US("verifier", "round_commit_retire_us_total",
            "tandem_verifier_round_commit_seconds_total", "part", "retire", NULL),
    ROWL_US("verifier", "round_commit_states_us_total",
            "tandem_verifier_round_commit_seconds_total", "part", "states", NULL),

    /* drafter */
    ROW("drafter", "draft_streams", "tandem_drafter_draft_streams", GAUGE,
        "Draft streams open from verifiers."),
    ROW("drafter", "open_sequences", "tandem_drafter_sequences_open", GAUGE,
        "Sequences this drafter holds state for."),
    ROW("drafter", "max_sequences", "tandem_drafter_sequences_max", GAUGE,
        "Most sequences per Draft stream (max_sequences): the capacity."),
    ROW("drafter", "blocks", "tandem_drafter_blocks_total", COUNTER, "Draft blocks sent."),
    GRAPH_ROWS("drafter"),
    ROW("drafter", "drafted_tokens", "tandem_drafter_draft_tokens_total", COUNTER,
        "Draft tokens proposed."),
    ROWL("drafter", "ahead_blocks_used", "tandem_drafter_ahead_blocks_total", COUNTER, "outcome",
         "used", "Blocks drafted ahead of their verdict, by whether they stood."),
    ROWL("drafter", "ahead_blocks_dropped", "tandem_drafter_ahead_blocks_total", COUNTER, "outcome",
         "dropped", NULL),
    ROW("drafter", "scores", "tandem_drafter_scores_total", COUNTER,
        "Scoring opens answered: a paused sequence's positions judged against its drafts."),
    ROW("drafter", "scored_positions", "tandem_drafter_scored_positions_total", COUNTER,
        "Positions those scoring opens judged."),
    ROW("drafter", "prefilled_tokens", "tandem_drafter_prefilled_tokens_total", COUNTER,
        "Tokens a model drafter ran outside its draft passes: prompts and catch-ups (about the "
        "prompts' sum while its sequences' states hold)."),
    ROWL("drafter", "feature_rows_shm", "tandem_drafter_feature_rows_total", COUNTER, "transport",
         "shm",
         "Hidden-state rows received, by transport (shm: read from the verifier's "
         "shared-memory ring; grpc: inline in the Draft stream's messages)."),
    ROWL("drafter", "feature_rows_grpc", "tandem_drafter_feature_rows_total", COUNTER, "transport",
         "grpc", NULL),
    ROWL("drafter", "feature_bytes_shm", "tandem_drafter_feature_bytes_total", COUNTER, "transport",
         "shm", "Bytes of hidden states received, by transport."),
    ROWL("drafter", "feature_bytes_grpc", "tandem_drafter_feature_bytes_total", COUNTER,
         "transport", "grpc", NULL),
    ROWL("drafter", "feature_streams_shm", "tandem_drafter_feature_shm_offers_total", COUNTER,
         "outcome", "accepted",
         "Shared-memory rings verifiers offered, by whether this drafter took them."),
    ROWL("drafter", "feature_shm_refused", "tandem_drafter_feature_shm_offers_total", COUNTER,
         "outcome", "refused", NULL),
    ROWL("drafter", "exchange_streams_shm", "tandem_drafter_exchange_lane_offers_total", COUNTER,
         "outcome", "accepted",
         "Shared-memory exchange lanes verifiers offered, by whether this drafter took them."),
    ROWL("drafter", "exchange_lane_refused", "tandem_drafter_exchange_lane_offers_total", COUNTER,
         "outcome", "refused", NULL),
    ROW("drafter", "timed_blocks", "tandem_drafter_timed_blocks_total", COUNTER,
        "Blocks that answered a verdict, whose time is split by stage."),
#define STAGE_ROW(st, help)                                                                        \
    ROWL_US("drafter", "block_" st "_us_total", "tandem_drafter_block_stage_seconds_total",        \
            "stage", st, help)
    STAGE_ROW("wait", "Where the blocks that answered verdicts spent their time, summed by stage: "
                      "wait (the verdict waiting for the stream's thread), apply (applied, its "
                      "commit launched, waiting for the pass), chain (the device draft chain), "
                      "pass (the rest of the pass), send (building and writing the block)."),
    STAGE_ROW("apply", NULL),
    STAGE_ROW("chain", NULL),
    STAGE_ROW("pass", NULL),
    STAGE_ROW("send", NULL),
#undef STAGE_ROW
};

/* Whether row applies to counter `name` of a process in `role`. */
static bool row_applies(const counter_row *r, const char *role, const char *name)
{
    if (strcmp(r->counter, name) != 0)
        return false;
    if (r->role)
        return strcmp(r->role, role) == 0;
    for (size_t i = 0; i < TDM_ARRAY_LEN(counter_rows); i++)
        if (counter_rows[i].role && strcmp(counter_rows[i].role, role) == 0 &&
            strcmp(counter_rows[i].counter, name) == 0)
            return false; /* the role names it itself */
    return true;
}

static void write_row(tdm_metrics_writer *w, const counter_row *r, double value)
{
    tdm_metric_label l[2] = {{r->l1, r->v1}, {r->l2, r->v2}};
    size_t n = r->l2 ? 2 : r->l1 ? 1 : 0;
    tdm_metrics_write_sample(w, r->suffix, l, n, value * r->scale);
}

void tdm_metrics_write_counters(tdm_metrics_writer *w, const char *role,
                                const tdm_service_counter *c, size_t n)
{
    enum { NROWS = TDM_ARRAY_LEN(counter_rows) };
    double value[NROWS];
    bool have[NROWS];
    bool *mapped = tdm_xcalloc(n ? n : 1, sizeof(bool));
    for (size_t i = 0; i < NROWS; i++) {
        have[i] = false;
        for (size_t k = 0; k < n && !have[i]; k++)
            if (row_applies(&counter_rows[i], role, c[k].name)) {
                have[i] = counter_rows[i].family != NULL;
                value[i] = c[k].value;
                mapped[k] = true;
            }
    }
    /* A summary's _count goes out only beside its _sum (a count alone
     * would be a summary of nothing). */
    for (size_t i = 0; i < NROWS; i++) {
        const counter_row *r = &counter_rows[i];
        if (!have[i] || strcmp(r->suffix, "_count") != 0)
            continue;
        bool sum = false;
        for (size_t j = 0; j < NROWS && !sum; j++) {
            const counter_row *q = &counter_rows[j];
            sum = have[j] && strcmp(q->suffix, "_sum") == 0 && strcmp(q->family, r->family) == 0 &&
                  (!r->l1 || (q->l1 && strcmp(q->v1, r->v1) == 0));
        }
        have[i] = sum;
    }
    for (size_t i = 0; i < NROWS; i++) {
        if (!have[i])
            continue;
        const char *family = counter_rows[i].family;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = have[j] && strcmp(counter_rows[j].family, family) == 0;
        if (seen)
            continue;
        const char *help = NULL;
        for (size_t j = 0; j < NROWS && !help; j++)
            if (counter_rows[j].family && strcmp(counter_rows[j].family, family) == 0)
                help = counter_rows[j].help;
        tdm_metrics_write_family(w, family, counter_rows[i].type, help);
        for (size_t j = i; j < NROWS; j++)
            if (have[j] && strcmp(counter_rows[j].family, family) == 0)
                write_row(w, &counter_rows[j], value[j]);
    }
    /* Counters without a name here still go out, so that none is lost. */
    for (size_t k = 0; k < n; k++) {
        if (mapped[k])
            continue;
        char name[160];
        snprintf(name, sizeof(name), "tandem_%s_%s", role, c[k].name);
        if (!valid_name(name, false))
            continue;
        char help[200];
        snprintf(help, sizeof(help), "Describe counter %s.", c[k].name);
        /* The writer keeps a pointer to the family name until the next one. */
        tdm_metrics_write_family(w, name, TDM_METRIC_GAUGE, help);
        tdm_metrics_write_sample(w, "", NULL, 0, c[k].value);
        w->family = NULL;
    }
    free(mapped);
}
