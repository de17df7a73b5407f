/*
 * metrics.h - a service's metrics in the Prometheus text exposition format
 * (version 0.0.4), served on /metrics by service.c.
 *
 * This module owns a registry of metric families that a role updates as
 * things happen (counters, gauges and histograms, each with at most one
 * label), the collectors that write families computed when scraped, and the
 * rendering of a scrape: the registry's families, the collectors' output,
 * and the counters of Describe (service.h's tdm_service_counter list) named
 * by this file's table of metric names (metrics.c: which Describe counter is
 * which Prometheus family, type, unit and labels). A Describe counter the
 * table does not name is still exported, as a gauge tandem_<role>_<counter>,
 * so that none goes missing; `promtool check metrics` flags it if its name
 * does not follow the conventions.
 *
 * Names follow Prometheus's conventions (vLLM's and SGLang's too): snake
 * case under the tandem_ prefix, base units (seconds, bytes), counters
 * ending in _total.
 *
 * Threading: updates and scrapes may come from any thread at once (each
 * family has its own lock). Families are created before the service starts
 * serving and live as long as the registry.
 *
 * Ownership: tdm_metrics_create/tdm_metrics_destroy; families belong to the
 * registry. tdm_metrics_render's text is the caller's to free().
 */
#ifndef TANDEM_SERVICE_METRICS_H
#define TANDEM_SERVICE_METRICS_H

#include <stddef.h>

typedef struct tdm_metrics tdm_metrics;
typedef struct tdm_metric tdm_metric;
typedef struct tdm_metrics_writer tdm_metrics_writer;
struct tdm_service_counter;

typedef enum tdm_metric_type {
    TDM_METRIC_COUNTER = 0,
    TDM_METRIC_GAUGE,
    TDM_METRIC_HISTOGRAM,
    TDM_METRIC_SUMMARY, /* only written by collectors and the Describe table */
} tdm_metric_type;

/* Bucket bounds (seconds) for latencies from a millisecond to a minute. */
extern const double tdm_metrics_latency_buckets[];
extern const size_t tdm_metrics_n_latency_buckets;

tdm_metrics *tdm_metrics_create(void);
void tdm_metrics_destroy(tdm_metrics *m);

/* Families. `name` and `label` must be valid Prometheus names (a bad one is
 * a programming error and aborts); label is NULL for an unlabelled family.
 * The strings must outlive the registry (literals). A name created twice is
 * a programming error. */
tdm_metric *tdm_metrics_counter(tdm_metrics *m, const char *name, const char *help,
                                const char *label);
tdm_metric *tdm_metrics_gauge(tdm_metrics *m, const char *name, const char *help,
                              const char *label);
/* bounds: ascending upper bounds, copied; +Inf is added. */
tdm_metric *tdm_metrics_histogram(tdm_metrics *m, const char *name, const char *help,
                                  const char *label, const double *bounds, size_t n_bounds);

/* Updates. label_value is NULL for an unlabelled family, else any text
 * (escaped when written); a family keeps at most 64 label values, and
 * updates for more are dropped (labels are for small sets: finish reasons,
 * status codes). A counter refuses negative increments (ignored). */
void tdm_metric_add(tdm_metric *f, const char *label_value, double v);
void tdm_metric_set(tdm_metric *f, const char *label_value, double v);
void tdm_metric_observe(tdm_metric *f, const char *label_value, double v);
/* A counter's or gauge's value (0 for a label value not seen). */
double tdm_metric_value(tdm_metric *f, const char *label_value);

/* How requests ended, as two families: successes by finish reason (label
 * finished_reason: length, eos, stop, context) and failures by status code
 * (label code: the gRPC code name, e.g. UNAVAILABLE). Names and help are
 * literals. */
typedef struct tdm_metrics_outcomes {
    tdm_metric *success, *errors;
} tdm_metrics_outcomes;

void tdm_metrics_outcomes_init(tdm_metrics_outcomes *o, tdm_metrics *m, const char *success_name,
                               const char *success_help, const char *errors_name,
                               const char *errors_help);
/* Counts one request: an error when rc != TDM_OK, else a success with the
 * finish reason (a tandem.v1.FinishReason value). */
void tdm_metrics_outcome(const tdm_metrics_outcomes *o, int rc, int finish_reason);

/* ---- writing at scrape time ---------------------------------------------- */

typedef struct tdm_metric_label {
    const char *name, *value;
} tdm_metric_label;

/* Starts a family: # HELP and # TYPE lines. */
void tdm_metrics_write_family(tdm_metrics_writer *w, const char *name, tdm_metric_type type,
                              const char *help);
/* One sample of the family last started; `suffix` ("", "_sum", "_count",
 * "_bucket") is appended to its name. */
void tdm_metrics_write_sample(tdm_metrics_writer *w, const char *suffix,
                              const tdm_metric_label *labels, size_t n_labels, double value);

/* A collector writes whole families (tdm_metrics_write_family, then its
 * samples) on every scrape. Called on the scraping thread. */
typedef void (*tdm_metrics_collect_fn)(void *arg, tdm_metrics_writer *w);
void tdm_metrics_add_collector(tdm_metrics *m, tdm_metrics_collect_fn fn, void *arg);

/* The Describe counters of a process in `role` ("gateway", "verifier",
 * "drafter") as families, named by the table in metrics.c. */
void tdm_metrics_write_counters(tdm_metrics_writer *w, const char *role,
                                const struct tdm_service_counter *c, size_t n);

/* A whole scrape: `prelude` (may be NULL; writes the process's own families,
 * e.g. build info and the Describe counters), then the registry's families,
 * then the collectors'. Returns malloc'd text (caller frees) and its length. */
char *tdm_metrics_render(tdm_metrics *m, void (*prelude)(void *arg, tdm_metrics_writer *w),
                         void *arg, size_t *len);

/* The Content-Type of a scrape. */
#define TDM_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
