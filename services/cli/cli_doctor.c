/*
 * cli_doctor.c - `tandem doctor`: what stands between this machine and a
 * service that starts and serves, found before launch (DESIGN.md section 6).
 *
 * Each check adds findings (ok, warning or error, with a plain fix) in this
 * order: the build; the GPU, driver, CUDA runtime, cuBLAS and NCCL, probed
 * through dlopen (cli_gpu.h) so no GPU or CUDA is needed to run it; a
 * service's configuration, through the code path of --check-config
 * (tdm_svc_config_check); every model directory named, with the loaders the
 * services use (config.json, the safetensors headers and shards, every
 * tensor's shape as the engine checks it); and, given a gateway, every
 * registered replica against this build and configuration with the
 * gateway's own rule table (compat.h). The exit status is 0 when nothing is
 * an error (safe to start), 1 otherwise, 2 for a usage error.
 */
#include "defs.h"
#include "cli.h"

#include "buildinfo.h"
#include "cli_gpu.h"
#include "cli_net.h"
#include "compat.h"
#include "config.h"
#include "engine.h"
#include "model_config.h"
#include "rpc.h"
#include "safetensors.h"
#include "service_config.h"
#include "tandem/v1/gateway.pb-c.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_MODELS 8

typedef enum doctor_severity {
    DOCTOR_SEVERITY_OK = 0,
    DOCTOR_SEVERITY_WARNING,
    DOCTOR_SEVERITY_ERROR,
} doctor_severity;

static const char *const severity_names[] = {"ok", "warning", "error"};

typedef struct finding {
    char check[16]; /* "gpu", "model", ... */
    doctor_severity severity;
    char *message;
    char *fix; /* "" for an ok finding */
} finding;

typedef struct doctor {
    finding *findings;
    size_t n, cap;
    bool need_gpu; /* the configuration resolves backend to cuda */
    int need_gpus; /* and the devices it splits the model over (tensor_parallel) */
    const char *models[MAX_MODELS + 1];
    size_t n_models;
} doctor;

static void add(doctor *d, const char *check, doctor_severity sev, const char *fix, const char *fmt,
                ...) __attribute__((format(printf, 5, 6)));

static void add(doctor *d, const char *check, doctor_severity sev, const char *fix, const char *fmt,
                ...)
{
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 32;
        d->findings = realloc(d->findings, d->cap * sizeof(*d->findings));
        TDM_ASSERT(d->findings);
    }
    finding *f = &d->findings[d->n++];
    snprintf(f->check, sizeof(f->check), "%s", check);
    f->severity = sev;
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    f->message = strdup(msg);
    f->fix = strdup(fix ? fix : "");
    TDM_ASSERT(f->message && f->fix);
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tandem doctor [--config FILE --role verifier|drafter|gateway]\n"
            "                     [--model DIR ...] [--gateway HOST:PORT ...] [--json]\n\n"
            "Checks, before launch, what a service needs: a GPU whose compute capability\n"
            "this build carries code for, a driver and CUDA runtime that match the CUDA the\n"
            "build used, cuBLAS and NCCL; the service's configuration (as --check-config);\n"
            "the integrity of each model directory (config.json, every shard, headers,\n"
            "tensor shapes against config.json); and, with --gateway, every registered\n"
            "replica's protocol, build and model against this build under the gateway's\n"
            "compatibility rules. Prints each finding as ok, warning or error with a fix.\n"
            "Exits 0 when it is safe to start (no errors), 1 otherwise.\n\n"
            "  --config FILE        a service's YAML configuration, checked with this\n"
            "                       shell's environment as the service would read it\n"
            "  --role ROLE          whose configuration it is: verifier, drafter or gateway\n"
            "  --model DIR          a model directory to check (repeatable; the\n"
            "                       configuration's model is checked too)\n"
            "  --json               the findings as JSON\n"
            "  --timeout DURATION   deadline of the call to the gateway (default 5s)\n"
            "%s",
            cli_net_usage);
}

/* ---- build and GPU ---------------------------------------------------------- */

/* "12.8" -> 12080; 0 when empty or malformed. */
static int parse_cuda_version(const char *s)
{
    int major = 0, minor = 0;
    if (!s || sscanf(s, "%d.%d", &major, &minor) < 1)
        return 0;
    return major * 1000 + minor * 10;
}

static void check_build(doctor *d)
{
    const tdm_build_info *b = tdm_build_info_get();
    if (b->cuda_runtime[0])
        add(d, "build", DOCTOR_SEVERITY_OK, NULL,
            "tandem %s (revision %s, %s), protocol %d.%d, snapshot layout %d; CUDA backend built "
            "with CUDA %s for %s",
            b->version, b->git_revision, b->build_type, TDM_PROTOCOL_MAJOR, TDM_PROTOCOL_MINOR,
            TDM_SNAPSHOT_LAYOUT_VERSION, b->cuda_runtime, b->gpu_archs);
    else
        add(d, "build", DOCTOR_SEVERITY_OK, NULL,
            "tandem %s (revision %s, %s), protocol %d.%d, snapshot layout %d; no CUDA backend "
            "(cpu only)",
            b->version, b->git_revision, b->build_type, TDM_PROTOCOL_MAJOR, TDM_PROTOCOL_MINOR,
            TDM_SNAPSHOT_LAYOUT_VERSION);
}

static void check_devices(doctor *d, const cli_gpu_probe *p)
{
    const tdm_build_info *b = tdm_build_info_get();
    for (int i = 0; i < p->device_count && i < CLI_GPU_MAX_DEVICES; i++) {
        const cli_gpu_device *g = &p->devices[i];
        int cc = g->cc_major * 10 + g->cc_minor;
        char what[640];
        snprintf(what, sizeof(what), "GPU %d: %s, compute capability %d.%d, %.1f GiB%s", i, g->name,
                 g->cc_major, g->cc_minor, (double)g->total_mem / (1024.0 * 1024 * 1024),
                 g->mps == 1   ? ", work goes through an MPS server"
                 : g->mps == 0 ? ", no MPS server (processes on it take turns)"
                               : "");
        if (!b->cuda_runtime[0]) {
            add(d, "gpu", DOCTOR_SEVERITY_WARNING,
                "build tandem with CUDA (scripts/build.sh with nvcc on PATH) to use the GPU",
                "%s; this build has no CUDA backend, so the GPU stays unused", what);
            continue;
        }
        char ptx[32] = "";
        cli_gpu_arch s =
            cli_gpu_arch_support(b->gpu_archs, g->cc_major, g->cc_minor, ptx, sizeof(ptx));
        char fix[256];
        snprintf(fix, sizeof(fix),
                 "rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d (or add %d to the list), or run this "
                 "service with backend cpu",
                 cc, cc);
        if (s == CLI_GPU_ARCH_NATIVE)
            add(d, "gpu", DOCTOR_SEVERITY_OK, NULL,
                "%s; this build carries native code for it (%s)", what, b->gpu_archs);
        else if (s == CLI_GPU_ARCH_PTX)
            add(d, "gpu", DOCTOR_SEVERITY_WARNING, fix,
                "%s; this build carries no native code for it (%s), so the driver compiles %s PTX "
                "at start-up (slow first start, may differ in speed)",
                what, b->gpu_archs, ptx);
        else
            add(d, "gpu", d->need_gpu ? DOCTOR_SEVERITY_ERROR : DOCTOR_SEVERITY_WARNING, fix,
                "%s; this build carries code for %s only, which cannot run on compute capability "
                "%d.%d",
                what, b->gpu_archs, g->cc_major, g->cc_minor);
    }
}

static void check_gpu(doctor *d, const cli_gpu_probe *p)
{
    const tdm_build_info *b = tdm_build_info_get();
    bool cuda_build = b->cuda_runtime[0] != '\0';
    /* Without a GPU the cpu backend serves: an error only when the
     * configuration asks for cuda; nothing to miss for a cpu-only build. */
    doctor_severity missing = d->need_gpu  ? DOCTOR_SEVERITY_ERROR
                              : cuda_build ? DOCTOR_SEVERITY_WARNING
                                           : DOCTOR_SEVERITY_OK;
    const char *then = d->need_gpu
                           ? "the configuration asks for backend cuda, so the service would not "
                             "start"
                           : "the cpu backend will be used";
    char fix[512];
    if (!p->driver.found) {
        snprintf(fix, sizeof(fix),
                 "install the NVIDIA driver (nvidia-smi must list the GPU); in a container, run "
                 "it with the NVIDIA runtime (--gpus all)%s",
                 d->need_gpu ? ", or set backend: cpu" : "");
        add(d, "gpu", missing, missing == DOCTOR_SEVERITY_OK ? NULL : fix,
            "no NVIDIA driver found (tried %s: %s); %s", p->driver.soname, p->driver.error, then);
        return;
    }
    char v[16], want[16];
    cli_gpu_cuda_version_str(p->driver.version, v, sizeof(v));
    if (p->init_status != 0 || p->device_count == 0) {
        snprintf(fix, sizeof(fix),
                 "check that nvidia-smi lists a GPU and that /dev/nvidia* is visible here (in a "
                 "container: the NVIDIA runtime, --gpus all; CUDA_VISIBLE_DEVICES not empty)%s",
                 d->need_gpu ? ", or set backend: cpu" : "");
        add(d, "gpu", missing, missing == DOCTOR_SEVERITY_OK ? NULL : fix,
            "NVIDIA driver %s (CUDA %s) found but %s; %s", p->driver.soname, v,
            p->init_status != 0 ? p->driver.error : "it shows no device", then);
        return;
    }
    add(d, "driver", DOCTOR_SEVERITY_OK, NULL, "NVIDIA driver supports CUDA %s, %d device(s)", v,
        p->device_count);
    if (d->need_gpus > p->device_count)
        add(d, "gpu", DOCTOR_SEVERITY_ERROR,
            "run it where that many GPUs are visible (Helm: verifier.tensorParallel requests "
            "them), or lower tensor_parallel",
            "tensor_parallel %d splits the model over CUDA devices 0..%d, one a rank; %d "
            "visible",
            d->need_gpus, d->need_gpus - 1, p->device_count);
    check_devices(d, p);
    if (!cuda_build)
        return;
    int built = parse_cuda_version(b->cuda_runtime);
    cli_gpu_cuda_version_str(built, want, sizeof(want));
    snprintf(fix, sizeof(fix),
             "update the NVIDIA driver to one that supports CUDA %s or later, or rebuild tandem "
             "with the CUDA toolkit the driver supports",
             want);
    if (p->driver.version / 1000 < built / 1000)
        add(d, "driver", DOCTOR_SEVERITY_ERROR, fix,
            "the driver supports CUDA %s but this build was compiled with CUDA %s; an older major "
            "version cannot run it",
            v, want);
    else if (p->driver.version < built)
        add(d, "driver", DOCTOR_SEVERITY_WARNING, fix,
            "the driver supports CUDA %s, older than the CUDA %s this build was compiled with; it "
            "runs under CUDA's minor version compatibility, without PTX compilation",
            v, want);
}

static void check_libraries(doctor *d, const cli_gpu_probe *p)
{
    const tdm_build_info *b = tdm_build_info_get();
    int built = parse_cuda_version(b->cuda_runtime);
    char v[16], want[16];
    cli_gpu_cuda_version_str(built, want, sizeof(want));
    if (!p->runtime.found) {
        if (built)
            add(d, "cuda-runtime", DOCTOR_SEVERITY_ERROR,
                "install the CUDA runtime of the toolkit this build used (cuda-cudart), or add its "
                "lib64 folder to LD_LIBRARY_PATH",
                "no CUDA runtime found (tried %s: %s); this build's CUDA backend links CUDA %s's",
                p->runtime.soname, p->runtime.error, want);
        else
            add(d, "cuda-runtime", DOCTOR_SEVERITY_OK, NULL,
                "no CUDA runtime found; this build does not need one");
    } else {
        cli_gpu_cuda_version_str(p->runtime.version, v, sizeof(v));
        if (built && p->runtime.version / 1000 != built / 1000)
            add(d, "cuda-runtime", DOCTOR_SEVERITY_ERROR,
                "install the CUDA runtime of the toolkit this build used, or rebuild tandem with "
                "the toolkit installed here",
                "CUDA runtime %s found (%s), but this build was compiled with CUDA %s", v,
                p->runtime.soname, want);
        else if (built && p->runtime.version < built)
            add(d, "cuda-runtime", DOCTOR_SEVERITY_WARNING,
                "install the CUDA runtime of the toolkit this build used",
                "CUDA runtime %s found (%s), older than the CUDA %s this build was compiled with",
                v, p->runtime.soname, want);
        else
            add(d, "cuda-runtime", DOCTOR_SEVERITY_OK, NULL, "CUDA runtime %s (%s)%s", v,
                p->runtime.soname, built ? "" : "; this build does not use it");
    }
    /* The CUDA backend opens libcublas.so.<the build's CUDA major> (cuBLAS's
     * majors follow CUDA's) at a prompt's first prefill of 16 rows or more
     * (kernels/cuda/bulk.cu): missing, or another major found, those stay on
     * the exact kernels, which is slower, not wrong. */
    const bool other_major =
        p->cublas.found && built && p->cublas.version && p->cublas.version / 10000 != built / 1000;
    if (p->cublas.found && !other_major) {
        add(d, "cublas", DOCTOR_SEVERITY_OK, NULL, "cuBLAS %d.%d.%d (%s)%s",
            p->cublas.version / 10000, p->cublas.version / 100 % 100, p->cublas.version % 100,
            p->cublas.soname,
            built ? "; a prompt's prefill on CUDA runs its large matmuls on it"
                  : "; this build does not use it");
    } else if (!built) {
        add(d, "cublas", DOCTOR_SEVERITY_OK, NULL,
            "cuBLAS not found (%s); this build does not use it", p->cublas.soname);
    } else {
        char what[160];
        if (other_major)
            snprintf(what, sizeof(what),
                     "cuBLAS %d.%d.%d found (%s), but this build opens "
                     "libcublas.so.%d",
                     p->cublas.version / 10000, p->cublas.version / 100 % 100,
                     p->cublas.version % 100, p->cublas.soname, built / 1000);
        else
            snprintf(what, sizeof(what), "cuBLAS not found (tried %s)", p->cublas.soname);
        const bool gpu_here = p->device_count > 0;
        add(d, "cublas", gpu_here ? DOCTOR_SEVERITY_WARNING : DOCTOR_SEVERITY_OK,
            gpu_here ? "install cuBLAS of the toolkit this build used (libcublas), or add its "
                       "lib64 folder to LD_LIBRARY_PATH"
                     : NULL,
            "%s: a prompt's prefill on CUDA keeps the exact matmuls, slower from 16 tokens on%s",
            what, gpu_here ? "" : " (no GPU here would use it)");
    }
    int nv = p->nccl.version;
    if (p->nccl.found && nv >= 10000) /* since 2.9: major*10000 + minor*100 + patch */
        add(d, "nccl", DOCTOR_SEVERITY_OK, NULL, "NCCL %d.%d.%d (%s)", nv / 10000, nv / 100 % 100,
            nv % 100, p->nccl.soname);
    else if (p->nccl.found)
        add(d, "nccl", DOCTOR_SEVERITY_OK, NULL, "NCCL %d.%d.%d (%s)", nv / 1000, nv / 100 % 10,
            nv % 100, p->nccl.soname);
    else
        add(d, "nccl", DOCTOR_SEVERITY_OK, NULL, "NCCL not found (%s); the services do not need it",
            p->nccl.soname);
}

/* ---- configuration ---------------------------------------------------------- */

static const tdm_cfg_schema *schema_of_role(const char *role)
{
    if (strcmp(role, "verifier") == 0)
        return &tdm_svc_verifier_schema;
    if (strcmp(role, "drafter") == 0)
        return &tdm_svc_drafter_schema;
    if (strcmp(role, "gateway") == 0)
        return &tdm_svc_gateway_schema;
    return NULL;
}

/* Runs --check-config's path on the file; *c keeps the result (the caller
 * clears it). */
static void check_config(doctor *d, const tdm_cfg_schema *schema, const char *path,
                         tdm_svc_check *c)
{
    char *argv[] = {(char *)schema->program, "--config", (char *)path, "--check-config", NULL};
    tdm_svc_config_check(schema, 4, argv, c);
    char fix[512];
    snprintf(fix, sizeof(fix),
             "correct what is named above; `%s --check-config --config %s` prints the "
             "effective configuration with the source of every value",
             schema->program, path);
    if (!c->cfg) {
        add(d, "config", DOCTOR_SEVERITY_ERROR, NULL, "%s: out of memory", path);
        return;
    }
    for (size_t i = 0; i < c->n_warnings; i++)
        add(d, "config", DOCTOR_SEVERITY_WARNING,
            "unset the variable, or correct its name to a setting's TANDEM_ name", "%s",
            c->warnings[i]);
    for (size_t i = 0; i < tdm_cfg_error_count(c->cfg); i++)
        add(d, "config", DOCTOR_SEVERITY_ERROR, fix, "%s", tdm_cfg_error_at(c->cfg, i));
    if (c->loaded == TDM_OK && c->described != TDM_OK)
        add(d, "config", DOCTOR_SEVERITY_ERROR,
            "fix the model files named (the model findings below say more)", "%s: %s", path,
            c->desc_err.msg);
    if (c->loaded == TDM_OK && c->described == TDM_OK) {
        const char *backend = tdm_cfg_has(c->cfg, "backend") ? tdm_cfg_str(c->cfg, "backend") : "";
        add(d, "config", DOCTOR_SEVERITY_OK, NULL,
            "%s: valid; %s would start%s%s (%s --check-config --config %s)", path, schema->program,
            backend[0] ? " with backend " : "", backend, schema->program, path);
    }
    if (tdm_cfg_has(c->cfg, "backend") &&
        tdm_backend_kind_parse(tdm_cfg_str(c->cfg, "backend")) == TDM_BACKEND_CUDA) {
        d->need_gpu = true;
        if (tdm_cfg_has(c->cfg, "tensor_parallel"))
            d->need_gpus = (int)tdm_cfg_int(c->cfg, "tensor_parallel");
    }
}

/* ---- models ----------------------------------------------------------------- */

static void check_model(doctor *d, const char *dir)
{
    tdm_model_config mc;
    tdm_error err;
    bool config_ok = tdm_model_config_load(dir, &mc, &err) == TDM_OK;
    if (!config_ok)
        add(d, "model", DOCTOR_SEVERITY_ERROR,
            "restore config.json from where the model came from (it must be a Qwen3.5 text "
            "config)",
            "%s: config.json: %s", dir, err.msg);
    else
        add(d, "model", DOCTOR_SEVERITY_OK, NULL,
            "%s: config.json: %d layers, hidden size %d, vocabulary %d, context %d", dir,
            mc.num_layers, mc.hidden_size, mc.vocab_size, mc.max_position_embeddings);

    tdm_st_file *st = NULL;
    if (tdm_st_open(dir, &st, &err) != TDM_OK) {
        add(d, "model", DOCTOR_SEVERITY_ERROR,
            "download the named file again (a missing shard, a truncated file or a corrupt "
            "header); compare sizes and checksums with the model's source",
            "%s: weights: %s", dir, err.msg);
        return;
    }
    size_t bytes = 0;
    for (int i = 0; i < tdm_st_file_count(st); i++) {
        bytes += tdm_st_file_size(st, i);
        size_t extra = tdm_st_file_unused_bytes(st, i);
        if (extra)
            add(d, "model", DOCTOR_SEVERITY_WARNING,
                "download the file again; its header and its length disagree",
                "%s: %zu bytes of its data no tensor covers (%zu bytes in all): not the file "
                "that was written",
                tdm_st_file_path(st, i), extra, tdm_st_file_size(st, i));
    }
    add(d, "model", DOCTOR_SEVERITY_OK, NULL,
        "%s: weights: %zu tensors in %d file(s), %.2f GiB, every header valid and every tensor "
        "inside its file",
        dir, tdm_st_count(st), tdm_st_file_count(st), (double)bytes / (1024.0 * 1024 * 1024));
    tdm_st_close(st);

    if (config_ok) {
        size_t weight_bytes = 0;
        if (tdm_model_check(dir, &weight_bytes, &err) != TDM_OK)
            add(d, "model", DOCTOR_SEVERITY_ERROR,
                "config.json and the weights must come from the same model: download the "
                "named file (or config.json) again",
                "%s", err.msg);
        else
            add(d, "model", DOCTOR_SEVERITY_OK, NULL,
                "%s: every tensor config.json implies is present with its shape and a supported "
                "dtype",
                dir);
    }

    char path[4096], fp[65];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0)
        add(d, "model", DOCTOR_SEVERITY_WARNING,
            "copy tokenizer.json from the model's source, or point the tokenizer setting at one",
            "%s: no tokenizer.json: the gateway cannot encode text for it and its replicas "
            "advertise no tokenizer fingerprint",
            dir);
    else if (tdm_compat_tokenizer_fingerprint_file(path, fp, &err) != TDM_OK)
        add(d, "model", DOCTOR_SEVERITY_ERROR, "download tokenizer.json again", "%s", err.msg);
    else
        add(d, "model", DOCTOR_SEVERITY_OK, NULL, "%s: tokenizer fingerprint %.12s", dir, fp);
    if (config_ok && tdm_compat_model_fingerprint_dir(dir, fp, &err) == TDM_OK)
        add(d, "model", DOCTOR_SEVERITY_OK, NULL, "%s: model fingerprint %.12s", dir, fp);
}

/* ---- gateway ---------------------------------------------------------------- */

/* What to do about a refusal, by rule id. */
static const char *rule_fix(const char *rule)
{
    static const struct {
        const char *rule, *fix;
    } fixes[] = {
        {"tokenizer-fingerprint",
         "give the drafter a model with the verifier's tokenizer, or use drafter_kind ngram"},
        {"draft-block-size",
         "lower the drafter's draft_block_size or raise the verifier's max_draft_tokens"},
        {"prefix-cache-state", "set state_strategy to extra_buffer or replay, or prefix_cache off"},
        {"protocol-major",
         "run every service from builds of one protocol major version: upgrade or replace the "
         "older side"},
        {"gateway-tokenizer", "give the gateway the verifiers' tokenizer"},
        {"snapshot-layout",
         "run replicas of one role from builds with the same snapshot layout version"},
        {"snapshot-model",
         "register verifiers of one model with a gateway (one gateway per served model)"},
        {"drafter-feature-transport", "set feature_transport auto on one side"},
        {"drafter-exchange-transport",
         "set exchange_transport auto on one side (grpc where the drafter is on another host)"},
    };
    for (size_t i = 0; i < TDM_ARRAY_LEN(fixes); i++)
        if (strcmp(fixes[i].rule, rule) == 0)
            return fixes[i].fix;
    return "see the rule in `tandem status`";
}

/* Applies one rule of the table by id (the build's own rules, for a doctor
 * without a configuration). Returns whether it refused. */
static bool apply_rule(const char *id, const Tandem__V1__Descriptor *a,
                       const Tandem__V1__Descriptor *b, tdm_compat_refusal *out)
{
    size_t n;
    const tdm_compat_rule *rules = tdm_compat_rules(&n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(rules[i].id, id) == 0)
            return rules[i].check(a, b, out) != 0;
    return false;
}

static void report_refusals(doctor *d, const tdm_compat_refusal *r, size_t n)
{
    for (size_t i = 0; i < n && i < 8; i++)
        add(d, "replica", DOCTOR_SEVERITY_ERROR, rule_fix(r[i].rule), "%s", r[i].message);
}

/* Whether a service runs this very build; a warning naming both when not. */
static bool check_same_build(doctor *d, const Tandem__V1__Descriptor *r)
{
    const tdm_build_info *b = tdm_build_info_get();
    const char *version = r->build && r->build->version[0] ? r->build->version : "?";
    const char *revision = r->build && r->build->git_revision[0] ? r->build->git_revision : "?";
    if (strcmp(version, b->version) == 0 && strcmp(revision, b->git_revision) == 0)
        return true;
    char who[600];
    add(d, r->role == TANDEM__V1__ROLE__ROLE_GATEWAY ? "gateway" : "replica",
        DOCTOR_SEVERITY_WARNING, "run every service from one build (same version and revision)",
        "%s %s runs tandem %s (revision %s, CUDA %s), this build is tandem %s (revision %s, CUDA "
        "%s)",
        tdm_role_name(r->role), tdm_compat_service_name(r, who, sizeof(who)), version, revision,
        r->build && r->build->cuda_runtime[0] ? r->build->cuda_runtime : "none", b->version,
        b->git_revision, b->cuda_runtime[0] ? b->cuda_runtime : "none");
    return false;
}

/* One registered replica against this build (and configuration, when self
 * came from one). */
static void check_replica(doctor *d, const Tandem__V1__Descriptor *r, Tandem__V1__Descriptor *self,
                          bool configured)
{
    char who[600];
    tdm_compat_service_name(r, who, sizeof(who));
    const char *role = tdm_role_name(r->role);
    tdm_compat_refusal ref[8];
    size_t n = 0;
    Tandem__V1__Role saved = self->role;
    if (!configured)
        self->role = r->role; /* this build in the replica's role */
    bool pair = configured && ((self->role == TANDEM__V1__ROLE__ROLE_VERIFIER &&
                                r->role == TANDEM__V1__ROLE__ROLE_DRAFTER) ||
                               (self->role == TANDEM__V1__ROLE__ROLE_DRAFTER &&
                                r->role == TANDEM__V1__ROLE__ROLE_VERIFIER));
    if (pair && self->role == TANDEM__V1__ROLE__ROLE_VERIFIER)
        n = tdm_compat_check_pair(self, r, ref, 8);
    else if (pair)
        n = tdm_compat_check_pair(r, self, ref, 8);
    else {
        if (apply_rule("protocol-major", self, r, &ref[n]))
            n++;
        if (self->role == r->role)
            n += tdm_compat_check_replicas(self, r, &ref[n], 8 - n);
        if (configured && self->role == TANDEM__V1__ROLE__ROLE_GATEWAY &&
            r->role == TANDEM__V1__ROLE__ROLE_VERIFIER)
            n += tdm_compat_check_gateway(self, r, &ref[n], 8 - n);
    }
    self->role = saved;
    report_refusals(d, ref, n);

    bool same_build = check_same_build(d, r);
    bool same_model = true;
    if (configured && self->role == r->role && self->model_fingerprint[0] &&
        strcmp(self->model_fingerprint, r->model_fingerprint) != 0) {
        same_model = false;
        add(d, "replica", DOCTOR_SEVERITY_WARNING,
            "point every replica of one role at the same model files",
            "%s %s serves model %s (fingerprint %.12s) but this configuration's model %s has "
            "fingerprint %.12s: replicas of one role would answer differently",
            role, who, r->model_name[0] ? r->model_name : "-",
            r->model_fingerprint[0] ? r->model_fingerprint : "(none)", self->model_name,
            self->model_fingerprint);
    }
    if (n == 0 && same_build && same_model)
        add(d, "replica", DOCTOR_SEVERITY_OK, NULL,
            "%s %s: protocol %u.%u, tandem %s (revision %s), model %s (%.12s): compatible with "
            "this %s",
            role, who, r->protocol ? r->protocol->major : 0, r->protocol ? r->protocol->minor : 0,
            r->build->version, r->build->git_revision, r->model_name[0] ? r->model_name : "-",
            r->model_fingerprint[0] ? r->model_fingerprint : "-",
            configured ? "configuration" : "build");
}

/* A formed pair on one GPU whose contexts take turns on it: it works, but
 * the drafter's steps wait behind the verifier's (bench/RESULTS.md, MPS). */
static void check_gpu_sharing(doctor *d, const Tandem__V1__StatusResponse *s,
                              const Tandem__V1__PairStatus *p)
{
    const Tandem__V1__Descriptor *v = cli_status_replica(s, p->verifier),
                                 *dr = cli_status_replica(s, p->drafter);
    if (!v || !dr)
        return;
    const tdm_gpu_share share =
        tdm_gpu_sharing(v->device_uuid, v->device_mps, dr->device_uuid, dr->device_mps);
    if (share == TDM_GPU_SHARED_TURNS)
        add(d, "gateway", DOCTOR_SEVERITY_WARNING, TDM_GPU_TURNS_FIX,
            "verifier %s + drafter %s share GPU %s as two contexts (%s through an MPS server): "
            "they take turns on it, so the drafter's steps wait behind the verifier's",
            p->verifier, p->drafter, v->device_uuid,
            tdm_gpu_turns_without(v->device_mps, dr->device_mps));
    else if (share == TDM_GPU_SHARED_MPS)
        add(d, "gateway", DOCTOR_SEVERITY_OK, NULL,
            "verifier %s + drafter %s share GPU %s, both through an MPS server", p->verifier,
            p->drafter, v->device_uuid);
    else if (!v->device_uuid[0] && !dr->device_uuid[0] &&
             tdm_cores_shared(v->host_id, v->cpus, dr->host_id, dr->cpus))
        add(d, "gateway", DOCTOR_SEVERITY_OK, TDM_CORES_FIX,
            "verifier %s + drafter %s may share CPU cores (CPUs %s and %s): the drafter is not "
            "asked to draft ahead of verdicts",
            p->verifier, p->drafter, v->cpus[0] ? v->cpus : "?", dr->cpus[0] ? dr->cpus : "?");
}

static void check_gateway(doctor *d, cli_net *net, int64_t timeout_ms, tdm_svc_check *c)
{
    tdm_rpc_channel *ch = NULL;
    tdm_error err;
    const char *reach_fix = "check the address and that the gateway runs (tandem status "
                            "--gateway ...); with TLS give --tls-ca, with a token --token";
    if (cli_net_channel(net, &ch, &err) != TDM_OK) {
        add(d, "gateway", DOCTOR_SEVERITY_ERROR, reach_fix, "gateway %s: %s", net->gateway,
            err.msg);
        return;
    }
    Tandem__V1__GetStatusRequest req = TANDEM__V1__GET_STATUS_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    tdm_rpc_call_options opt = {.timeout_ms = timeout_ms};
    cli_net_call_options(net, &opt);
    tdm_status st = tdm_rpc_unary(ch, "/tandem.v1.Gateway/GetStatus", &req.base,
                                  &tandem__v1__status_response__descriptor, &resp, &opt, &err);
    if (st != TDM_OK) {
        add(d, "gateway", DOCTOR_SEVERITY_ERROR, reach_fix, "gateway %s: GetStatus: %s: %s",
            net->gateway, tdm_status_name(st), err.msg);
        tdm_rpc_channel_destroy(ch);
        return;
    }
    const Tandem__V1__StatusResponse *s = (const Tandem__V1__StatusResponse *)resp;
    /* What this build would register with: the configuration's descriptor,
     * else the build's own identity (protocol, layout, build). */
    bool configured = c && c->desc;
    Tandem__V1__Descriptor *own =
        configured ? NULL
                   : tdm_svc_descriptor_of_build(TANDEM__V1__ROLE__ROLE_UNSPECIFIED, "this-build",
                                                 "tandem doctor");
    Tandem__V1__Descriptor *self = configured ? c->desc : own;
    if (s->gateway) {
        const Tandem__V1__Descriptor *g = s->gateway;
        add(d, "gateway", DOCTOR_SEVERITY_OK, NULL,
            "gateway %s at %s: tandem %s (revision %s), protocol %u.%u, %zu replica(s) registered",
            g->replica_id, net->gateway, g->build ? g->build->version : "?",
            g->build ? g->build->git_revision : "?", g->protocol ? g->protocol->major : 0,
            g->protocol ? g->protocol->minor : 0, s->n_replicas);
        tdm_compat_refusal r;
        if (apply_rule("protocol-major", self, g, &r))
            report_refusals(d, &r, 1);
        check_same_build(d, g);
    }
    for (size_t i = 0; i < s->n_replicas; i++)
        if (s->replicas[i]->descriptor)
            check_replica(d, s->replicas[i]->descriptor, self, configured);
    /* What the gateway itself refuses among its replicas, and pairs that
     * take turns on one GPU. */
    for (size_t i = 0; i < s->n_pairs; i++) {
        const Tandem__V1__PairStatus *p = s->pairs[i];
        for (size_t k = 0; !p->compatible && k < p->n_refusals; k++)
            add(d, "gateway", DOCTOR_SEVERITY_ERROR, rule_fix(p->refusals[k]->rule),
                "the gateway refuses verifier %s + drafter %s: %s", p->verifier, p->drafter,
                p->refusals[k]->message);
        if (p->compatible)
            check_gpu_sharing(d, s, p);
    }
    for (size_t k = 0; k < s->n_replica_refusals; k++)
        add(d, "gateway", DOCTOR_SEVERITY_ERROR, rule_fix(s->replica_refusals[k]->rule),
            "the gateway reports: %s", s->replica_refusals[k]->message);
    tdm_svc_descriptor_free(own);
    protobuf_c_message_free_unpacked(resp, NULL);
    tdm_rpc_channel_destroy(ch);
}

/* ---- output ----------------------------------------------------------------- */

static void print_text(const doctor *d, size_t errors, size_t warnings)
{
    for (size_t i = 0; i < d->n; i++) {
        const finding *f = &d->findings[i];
        printf("%-8s %-13s %s\n", severity_names[f->severity], f->check, f->message);
        if (f->fix[0])
            printf("%-8s %-13s fix: %s\n", "", "", f->fix);
    }
    printf("\n%zu error(s), %zu warning(s): %s\n", errors, warnings,
           errors ? "not safe to start" : "safe to start");
}

static void print_json(const doctor *d, size_t errors, size_t warnings)
{
    const tdm_build_info *b = tdm_build_info_get();
    cJSON *root = cJSON_CreateObject();
    cJSON *build = cJSON_AddObjectToObject(root, "build");
    cJSON_AddStringToObject(build, "version", b->version);
    cJSON_AddStringToObject(build, "git_revision", b->git_revision);
    cJSON_AddStringToObject(build, "cuda_runtime", b->cuda_runtime);
    cJSON_AddStringToObject(build, "gpu_archs", b->gpu_archs);
    cJSON *arr = cJSON_AddArrayToObject(root, "findings");
    for (size_t i = 0; i < d->n; i++) {
        const finding *f = &d->findings[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "check", f->check);
        cJSON_AddStringToObject(o, "severity", severity_names[f->severity]);
        cJSON_AddStringToObject(o, "message", f->message);
        cJSON_AddStringToObject(o, "fix", f->fix);
        cJSON_AddItemToArray(arr, o);
    }
    cJSON_AddNumberToObject(root, "errors", (double)errors);
    cJSON_AddNumberToObject(root, "warnings", (double)warnings);
    cJSON_AddBoolToObject(root, "safe_to_start", errors == 0);
    char *text = cJSON_Print(root);
    if (text)
        printf("%s\n", text);
    free(text);
    cJSON_Delete(root);
}

/* ---- command ---------------------------------------------------------------- */

int cli_doctor(int argc, char **argv)
{
    cli_net net;
    cli_net_init(&net);
    bool json = false, use_gateway = false;
    const char *config = NULL, *role = NULL;
    int64_t timeout_ms = 5000;
    doctor d;
    memset(&d, 0, sizeof(d));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--gateway") == 0)
            use_gateway = true;
        int taken = cli_net_option(&net, "doctor", argc, argv, &i);
        if (taken < 0)
            return 2;
        if (taken)
            continue;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--config") == 0 && i + 1 < argc) {
            config = argv[++i];
        } else if (strcmp(a, "--role") == 0 && i + 1 < argc) {
            role = argv[++i];
        } else if (strcmp(a, "--model") == 0 && i + 1 < argc) {
            if (d.n_models == MAX_MODELS) {
                fprintf(stderr, "tandem doctor: at most %d --model\n", MAX_MODELS);
                return 2;
            }
            d.models[d.n_models++] = argv[++i];
        } else if (strcmp(a, "--timeout") == 0 && i + 1 < argc) {
            if (cli_net_timeout("doctor", argv[++i], &timeout_ms) != 0)
                return 2;
        } else {
            fprintf(stderr, "tandem doctor: unknown or incomplete argument '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    const tdm_cfg_schema *schema = role ? schema_of_role(role) : NULL;
    if (role && !schema) {
        fprintf(stderr, "tandem doctor: --role: '%s' is not verifier, drafter or gateway\n", role);
        return 2;
    }
    if ((config != NULL) != (role != NULL)) {
        fprintf(stderr, "tandem doctor: --config and --role go together (a file and whose it "
                        "is)\n");
        return 2;
    }

    check_build(&d);
    tdm_svc_check c;
    memset(&c, 0, sizeof(c));
    if (config) {
        check_config(&d, schema, config, &c);
        const char *model = c.cfg && tdm_cfg_has(c.cfg, "model") ? tdm_cfg_str(c.cfg, "model") : "";
        bool listed = false;
        for (size_t i = 0; i < d.n_models; i++)
            listed = listed || strcmp(d.models[i], model) == 0;
        if (model[0] && !listed)
            d.models[d.n_models++] = model;
    }
    cli_gpu_probe probe;
    cli_gpu_probe_run(&probe);
    check_gpu(&d, &probe);
    check_libraries(&d, &probe);
    for (size_t i = 0; i < d.n_models; i++)
        check_model(&d, d.models[i]);
    if (use_gateway)
        check_gateway(&d, &net, timeout_ms, config ? &c : NULL);
    tdm_svc_check_clear(&c);

    size_t errors = 0, warnings = 0;
    for (size_t i = 0; i < d.n; i++) {
        errors += d.findings[i].severity == DOCTOR_SEVERITY_ERROR;
        warnings += d.findings[i].severity == DOCTOR_SEVERITY_WARNING;
    }
    if (json)
        print_json(&d, errors, warnings);
    else
        print_text(&d, errors, warnings);
    for (size_t i = 0; i < d.n; i++) {
        free(d.findings[i].message);
        free(d.findings[i].fix);
    }
    free(d.findings);
    return errors ? 1 : 0;
}
