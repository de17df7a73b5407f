/*
 * spec_client.c - the load of the speculation benchmark: N requests of
 * random token-id prompts sent to a running gateway's Generate by C
 * concurrent clients, greedy (or sampled: --sampling), ignoring EOS, with
 * one speculation setting.
 *
 *   bench_spec_client --gateway HOST:PORT [--requests N] [--concurrency C]
 *       [--prompt-len L | --prompts FILE] [--tokens T] [--seed S] [--mode off|auto|on]
 *       [--block K] [--fixed] [--record FILE] [--check FILE]
 *       [--vocab V] [--verifier HOST:PORT] [--drafter HOST:PORT]
 *       [--sampling TEMPERATURE,TOP_P,TOP_K]
 *
 * --sampling samples every request (request i seeded with S + i), so that
 * the load pays the host's distribution of each sampled row (verifier and
 * drafter); it is refused with --check (a greedy run's tokens).
 * Prints one line, "key=value ..." : tokens/s over the wall time of the
 * whole load, the median of the requests' own decode rates, mean accepted
 * drafts per speculative round, the acceptance per drafted token, the
 * fraction of rounds that speculated, blocks drafted ahead that stood, and
 * failures. --record writes each request's prompt and output ids (the
 * oracle drafter's input); --check compares every output with such a file
 * (a greedy run must give the same tokens with and without speculation).
 * Prompt ids are drawn from 10..V-1 (default V 200010), or with --prompts
 * taken from FILE, a prompt's token ids a line (request i the line i modulo
 * their count: e.g. tokenized text, where a drafter that fits the text is
 * right from the first rounds, as it is not after random ids). With --verifier,
 * a second line gives the verifier's round timeline over the load: the mean
 * time per round in each phase (from its counters' growth), the exchange's
 * median and 99th percentile and the drafter's time per draft token (over
 * the verifier's last 4096 blocks: they mix in earlier loads), and the means
 * of the exchange and of the drafter's time per token over this load alone,
 * after the CUDA graph slots' outcomes over the load on the verifier (and,
 * with --drafter, on the drafter): captured/replayed/refused/eager/evicted,
 * and the drafter's stages of a block that answers a verdict, means over
 * the load (drafter_block_us: wait, apply, chain, pass, send; draft.c).
 */
#include "bench_util.h"
#include "rpc.h"
#include "tandem/v1/common.pb-c.h"
#include "tandem/v1/gateway.pb-c.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct job {
    uint32_t *prompt;
    int n_prompt;
    uint32_t *out;
    int n_out;
    double tps; /* the request's own decode rate */
    uint32_t rounds, spec_rounds, drafted, accepted, ahead;
    uint32_t reached_at[64], accepted_at[64]; /* per draft position */
    int failed;
    char why[256];
    char note[400]; /* the stats' speculation note */
} job;

static struct {
    const char *gateway, *verifier, *drafter;
    uint32_t vocab;
    int requests, concurrency, prompt_len, tokens;
    uint64_t seed;
    Tandem__V1__SpeculationMode mode;
    int block, fixed;
    int sampled; /* --sampling given */
    float temperature, top_p;
    uint32_t top_k;
    job *jobs;
    int next;
    pthread_mutex_t mu;
} g = {.gateway = "127.0.0.1:7700",
       .requests = 10,
       .concurrency = 1,
       .prompt_len = 64,
       .tokens = 128,
       .seed = 1,
       .vocab = 200010,
       .mode = TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_AUTO,
       .mu = PTHREAD_MUTEX_INITIALIZER};

static void run_job(tdm_rpc_channel *ch, job *j)
{
    Tandem__V1__GenerateRequest req = TANDEM__V1__GENERATE_REQUEST__INIT;
    Tandem__V1__TokenIds ids = TANDEM__V1__TOKEN_IDS__INIT;
    Tandem__V1__SpeculationParams sp = TANDEM__V1__SPECULATION_PARAMS__INIT;
    ids.n_ids = (size_t)j->n_prompt;
    ids.ids = j->prompt;
    req.prompt_case = TANDEM__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    req.token_ids = &ids;
    req.max_tokens = (uint32_t)g.tokens;
    req.ignore_eos = 1;
    sp.mode = g.mode;
    sp.block_size = (uint32_t)g.block;
    sp.fixed_block_size = g.fixed;
    req.speculation = &sp;
    Tandem__V1__SamplingParams sa = TANDEM__V1__SAMPLING_PARAMS__INIT;
    if (g.sampled) {
        sa.temperature = g.temperature;
        sa.top_p = g.top_p;
        sa.top_k = g.top_k;
        sa.seed_choice_case = TANDEM__V1__SAMPLING_PARAMS__SEED_CHOICE_SEED;
        sa.seed = g.seed + (uint64_t)(j - g.jobs);
        req.sampling = &sa;
    }
    tdm_rpc_stream *st = NULL;
    tdm_error err = {0};
    tdm_rpc_call_options opt = {.timeout_ms = 600000};
    if (tdm_rpc_stream_open(ch, "/tandem.v1.Gateway/Generate", &req.base,
                            &tandem__v1__generate_response__descriptor, &opt, &st,
                            &err) != TDM_OK) {
        j->failed = 1;
        snprintf(j->why, sizeof(j->why), "%s", err.msg);
        return;
    }
    j->out = calloc((size_t)g.tokens + 1, sizeof(uint32_t));
    for (;;) {
        ProtobufCMessage *m = NULL;
        tdm_status rc = tdm_rpc_stream_read(st, &m, &err);
        if (!m) {
            if (rc != TDM_OK) {
                j->failed = 1;
                snprintf(j->why, sizeof(j->why), "%s: %s", tdm_status_name(rc), err.msg);
            }
            break;
        }
        const Tandem__V1__GenerateResponse *r = (const Tandem__V1__GenerateResponse *)m;
        if (r->chunk_case == TANDEM__V1__GENERATE_RESPONSE__CHUNK_TOKENS)
            for (size_t i = 0; i < r->tokens->n_ids && j->n_out < g.tokens; i++)
                j->out[j->n_out++] = r->tokens->ids[i];
        if (r->chunk_case == TANDEM__V1__GENERATE_RESPONSE__CHUNK_COMPLETE && r->complete->stats) {
            const Tandem__V1__RequestStats *s = r->complete->stats;
            j->tps = s->tokens_per_second;
            j->rounds = s->rounds;
            j->spec_rounds = s->speculative_rounds;
            j->drafted = s->drafted_tokens;
            j->accepted = s->accepted_tokens;
            j->ahead = s->ahead_blocks;
            snprintf(j->note, sizeof(j->note), "%s", s->speculation ? s->speculation : "");
            for (size_t i = 0; i < s->n_reached_at_position && i < 64; i++)
                j->reached_at[i] = s->reached_at_position[i];
            for (size_t i = 0; i < s->n_accepted_at_position && i < 64; i++)
                j->accepted_at[i] = s->accepted_at_position[i];
        }
        protobuf_c_message_free_unpacked(m, NULL);
    }
    tdm_rpc_stream_destroy(st);
}

static void *worker(void *arg)
{
    tdm_rpc_channel *ch = arg;
    for (;;) {
        pthread_mutex_lock(&g.mu);
        int i = g.next < g.requests ? g.next++ : -1;
        pthread_mutex_unlock(&g.mu);
        if (i < 0)
            return NULL;
        run_job(ch, &g.jobs[i]);
    }
}

/* The verifier's counters, by name. */
typedef struct counters {
    int n;
    char name[256][64];
    double value[256];
} counters;

static double counter(const counters *c, const char *name)
{
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->name[i], name))
            return c->value[i];
    return 0;
}

static int describe(counters *c, const char *target, const char *method)
{
    c->n = 0;
    tdm_rpc_channel *ch = NULL;
    tdm_error err = {0};
    tdm_rpc_channel_options co = {.target = target};
    if (tdm_rpc_channel_create(&co, &ch, &err) != TDM_OK)
        return -1;
    Tandem__V1__DescribeRequest req = TANDEM__V1__DESCRIBE_REQUEST__INIT;
    ProtobufCMessage *m = NULL;
    tdm_rpc_call_options opt = {.timeout_ms = 10000};
    tdm_status rc = tdm_rpc_unary(ch, method, &req.base, &tandem__v1__describe_response__descriptor,
                                  &m, &opt, &err);
    tdm_rpc_channel_destroy(ch);
    if (rc != TDM_OK) {
        fprintf(stderr, "bench_spec_client: Describe %s: %s\n", target, err.msg);
        return -1;
    }
    const Tandem__V1__DescribeResponse *d = (const Tandem__V1__DescribeResponse *)m;
    for (size_t i = 0; i < d->n_counters && c->n < 256; i++) {
        snprintf(c->name[c->n], sizeof(c->name[0]), "%s", d->counters[i]->name);
        c->value[c->n++] = d->counters[i]->value;
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}

static void print_timeline(const counters *a, const counters *b)
{
    static const char *const phases[] = {"idle", "admit",  "prefill", "wait",
                                         "step", "commit", "send"};
    double rounds = counter(b, "rounds") - counter(a, "rounds");
    if (rounds <= 0)
        return;
    printf("timeline rounds=%.0f", rounds);
    double sum = 0;
    for (size_t i = 0; i < sizeof(phases) / sizeof(phases[0]); i++) {
        char k[64];
        snprintf(k, sizeof(k), "round_%s_us_total", phases[i]);
        double us = (counter(b, k) - counter(a, k)) / rounds;
        sum += us;
        printf(" %s_us=%.1f", phases[i], us);
    }
    const double xb = counter(b, "draft_exchange_blocks") - counter(a, "draft_exchange_blocks");
    const double dtk = counter(b, "draft_tokens_timed") - counter(a, "draft_tokens_timed");
    printf(" exchange_mean_us=%.0f draft_token_mean_us=%.0f",
           xb > 0
               ? (counter(b, "draft_exchange_us_total") - counter(a, "draft_exchange_us_total")) /
                     xb
               : 0.0,
           dtk > 0 ? (counter(b, "draft_time_us_total") - counter(a, "draft_time_us_total")) / dtk
                   : 0.0);
    /* the commit phase by part, a round's mean (vsched_commit_part) */
    static const char *const cparts[] = {"verdicts", "emit", "retire", "states"};
    printf(" cparts_us");
    for (size_t i = 0; i < sizeof(cparts) / sizeof(cparts[0]); i++) {
        char k[64];
        snprintf(k, sizeof(k), "round_commit_%s_us_total", cparts[i]);
        printf("%s%s:%.1f", i ? "," : "=", cparts[i], (counter(b, k) - counter(a, k)) / rounds);
    }
    /* the verifier's parts of the exchange, a message's mean (vlink.h) */
    static const char *const parts[][2] = {
        {"send", "sends"}, {"queue", "writes"}, {"write", "writes"}, {"deliver", "delivers"}};
    printf(" xparts_us");
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        char t[64], n[64];
        snprintf(t, sizeof(t), "draft_exchange_%s_us_total", parts[i][0]);
        snprintf(n, sizeof(n), "draft_exchange_%s", parts[i][1]);
        const double events = counter(b, n) - counter(a, n);
        printf("%s%s:%.1f", i ? "," : "=", parts[i][0],
               events > 0 ? (counter(b, t) - counter(a, t)) / events : 0.0);
    }
    /* each request's first block beyond its prefill (not in the exchange) */
    const double ow = counter(b, "draft_open_waits") - counter(a, "draft_open_waits");
    printf(" open_waits=%.0f open_wait_mean_us=%.0f", ow,
           ow > 0
               ? (counter(b, "draft_open_wait_us_total") - counter(a, "draft_open_wait_us_total")) /
                     ow
               : 0.0);
    printf(" plain_measured=%.0f",
           counter(b, "plain_measure_rounds") - counter(a, "plain_measure_rounds"));
    /* paused sequences' drafters scored, and the scores that restarted speculation */
    printf(" scores=%.0f scored=%.0f score_restarts=%.0f cost_relaxes=%.0f",
           counter(b, "adaptive_scores") - counter(a, "adaptive_scores"),
           counter(b, "adaptive_scored_positions") - counter(a, "adaptive_scored_positions"),
           counter(b, "adaptive_score_restarts") - counter(a, "adaptive_score_restarts"),
           counter(b, "adaptive_cost_relaxes") - counter(a, "adaptive_cost_relaxes"));
    /* the Draft streams by exchange transport, since the verifier started */
    printf(" exchange_streams=shm:%.0f,grpc:%.0f", counter(b, "exchange_streams_shm"),
           counter(b, "exchange_streams_grpc"));
    printf(" round_us=%.1f exchange_p50_us=%.0f exchange_p99_us=%.0f draft_token_p50_us=%.0f "
           "draft_token_p99_us=%.0f step_p50_us=%.0f step_p99_us=%.0f\n",
           sum, counter(b, "draft_exchange_overhead_p50_us"),
           counter(b, "draft_exchange_overhead_p99_us"), counter(b, "draft_time_per_token_p50_us"),
           counter(b, "draft_time_per_token_p99_us"), counter(b, "round_step_p50_us"),
           counter(b, "round_step_p99_us"));
}

/* The CUDA graph slots' outcomes over the load (graph_steps_*, graphs_evicted). */
static void print_graphs(const char *who, const counters *a, const counters *b)
{
    static const char *const k[] = {"graph_steps_captured", "graph_steps_replayed",
                                    "graph_steps_refused", "graph_steps_eager", "graphs_evicted"};
    printf("%s_graphs=", who);
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++)
        printf("%s%.0f", i ? "/" : "", counter(b, k[i]) - counter(a, k[i]));
    printf(" ");
}

/* The drafter's stages of a block that answers a verdict, means over the
 * load (draft.c: block_<stage>_us_total over timed_blocks). */
static void print_stages(const counters *a, const counters *b)
{
    static const char *const k[] = {"wait", "apply", "chain", "pass", "send"};
    const double n = counter(b, "timed_blocks") - counter(a, "timed_blocks");
    if (n <= 0)
        return;
    printf("drafter_block_us=");
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        char t[64];
        snprintf(t, sizeof(t), "block_%s_us_total", k[i]);
        printf("%s%s:%.1f", i ? "," : "", k[i], (counter(b, t) - counter(a, t)) / n);
    }
    printf(" ");
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Reads a --record file into lines of ids; returns how many. */
static int read_runs(const char *path, uint32_t **runs, int *lens, int max)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int n = 0;
    char *line = NULL;
    size_t cap = 0;
    while (n < max && getline(&line, &cap, f) > 0) {
        int c = 0, k = 0;
        for (char *p = line; *p;) {
            char *e;
            unsigned long v = strtoul(p, &e, 10);
            if (e == p)
                break;
            if (k == c) {
                c = c ? 2 * c : 256;
                runs[n] = realloc(runs[n], (size_t)c * sizeof(uint32_t));
            }
            runs[n][k++] = (uint32_t)v;
            p = e;
        }
        lens[n++] = k;
    }
    free(line);
    fclose(f);
    return n;
}

/* --prompts: request r takes line r modulo their count (the jobs share
 * the lines). Returns 0, or says what is wrong with the file. */
static int take_prompts(const char *path)
{
    enum { MOST = 4096 };
    static uint32_t *lines[MOST];
    static int lens[MOST];
    const int n = read_runs(path, lines, lens, MOST);
    if (n <= 0) {
        fprintf(stderr, "bench_spec_client: --prompts %s: %s\n", path,
                n < 0 ? "cannot be read" : "no prompts (a prompt's token ids a line)");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int bad = lens[i] < 1;
        for (int t = 0; t < lens[i] && !bad; t++)
            bad = lines[i][t] >= g.vocab;
        if (bad) {
            fprintf(stderr, "bench_spec_client: --prompts %s: line %d: %s (ids below %u)\n", path,
                    i + 1, lens[i] < 1 ? "no ids" : "an id past the vocabulary", g.vocab);
            return -1;
        }
    }
    for (int r = 0; r < g.requests; r++) {
        g.jobs[r].prompt = lines[r % n];
        g.jobs[r].n_prompt = lens[r % n];
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *record = NULL, *check = NULL, *prompts = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--gateway"))
            g.gateway = v, i++;
        else if (!strcmp(a, "--requests"))
            g.requests = atoi(v), i++;
        else if (!strcmp(a, "--concurrency"))
            g.concurrency = atoi(v), i++;
        else if (!strcmp(a, "--prompt-len"))
            g.prompt_len = atoi(v), i++;
        else if (!strcmp(a, "--tokens"))
            g.tokens = atoi(v), i++;
        else if (!strcmp(a, "--seed"))
            g.seed = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--block"))
            g.block = atoi(v), i++;
        else if (!strcmp(a, "--verifier"))
            g.verifier = v, i++;
        else if (!strcmp(a, "--drafter"))
            g.drafter = v, i++;
        else if (!strcmp(a, "--vocab"))
            g.vocab = (uint32_t)strtoul(v, NULL, 10), i++;
        else if (!strcmp(a, "--fixed"))
            g.fixed = 1;
        else if (!strcmp(a, "--sampling")) {
            unsigned k = 0;
            if (sscanf(v, "%f,%f,%u", &g.temperature, &g.top_p, &k) != 3 ||
                !(g.temperature > 0.0f)) {
                fprintf(stderr,
                        "bench_spec_client: --sampling wants TEMPERATURE>0,TOP_P,TOP_K, "
                        "got '%s'\n",
                        v);
                return 2;
            }
            g.top_k = k;
            g.sampled = 1;
            i++;
        } else if (!strcmp(a, "--prompts"))
            prompts = v, i++;
        else if (!strcmp(a, "--record"))
            record = v, i++;
        else if (!strcmp(a, "--check"))
            check = v, i++;
        else if (!strcmp(a, "--mode")) {
            g.mode = !strcmp(v, "off")  ? TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_OFF
                     : !strcmp(v, "on") ? TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_ON
                                        : TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_AUTO;
            i++;
        } else {
            fprintf(stderr,
                    "bench_spec_client: unknown option %s (see the head of "
                    "bench/spec_client.c)\n",
                    a);
            return 2;
        }
    }
    if (g.requests < 1 || g.concurrency < 1 || g.prompt_len < 1 || g.tokens < 1 || g.vocab < 11)
        return 2;
    if (g.sampled && check) {
        fprintf(stderr,
                "bench_spec_client: --check compares greedy outputs; not with --sampling\n");
        return 2;
    }
    g.jobs = calloc((size_t)g.requests, sizeof(job));
    if (prompts && take_prompts(prompts) != 0)
        return 2;
    /* Prompts from a fixed stream: the same seed, the same prompts. */
    uint64_t x = g.seed * 0x9e3779b97f4a7c15ull + 1;
    for (int r = 0; r < g.requests && !prompts; r++) {
        g.jobs[r].prompt = malloc((size_t)g.prompt_len * sizeof(uint32_t));
        g.jobs[r].n_prompt = g.prompt_len;
        for (int i = 0; i < g.prompt_len; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            g.jobs[r].prompt[i] = (uint32_t)(x % (g.vocab - 10u)) + 10u;
        }
    }
    tdm_rpc_channel *ch = NULL;
    tdm_error err = {0};
    tdm_rpc_channel_options co = {.target = g.gateway};
    if (tdm_rpc_channel_create(&co, &ch, &err) != TDM_OK) {
        fprintf(stderr, "bench_spec_client: %s\n", err.msg);
        return 1;
    }
    static counters before, after, dbefore, dafter;
    if (g.verifier && describe(&before, g.verifier, "/tandem.v1.Verifier/Describe") != 0)
        return 1;
    if (g.drafter && describe(&dbefore, g.drafter, "/tandem.v1.Drafter/Describe") != 0)
        return 1;
    pthread_t th[512];
    int nt = g.concurrency < 512 ? g.concurrency : 512;
    double t0 = bench_now();
    for (int i = 0; i < nt; i++)
        pthread_create(&th[i], NULL, worker, ch);
    for (int i = 0; i < nt; i++)
        pthread_join(th[i], NULL);
    double wall = bench_now() - t0;
    long tokens = 0;
    uint64_t rounds = 0, spec = 0, drafted = 0, accepted = 0, ahead = 0;
    static uint64_t reached_at[64], accepted_at[64];
    int failed = 0, mismatched = 0;
    double *tps = calloc((size_t)g.requests, sizeof(double));
    int ntps = 0;
    uint32_t *runs[4096] = {0};
    int lens[4096];
    int nruns = check ? read_runs(check, runs, lens, 4096) : 0;
    FILE *rec = record ? fopen(record, "w") : NULL;
    for (int r = 0; r < g.requests; r++) {
        job *j = &g.jobs[r];
        if (j->failed) {
            if (failed++ == 0)
                fprintf(stderr, "bench_spec_client: a request failed: %s\n", j->why);
            continue;
        }
        tokens += j->n_out;
        rounds += j->rounds;
        spec += j->spec_rounds;
        drafted += j->drafted;
        accepted += j->accepted;
        ahead += j->ahead;
        for (int i = 0; i < 64; i++) {
            reached_at[i] += j->reached_at[i];
            accepted_at[i] += j->accepted_at[i];
        }
        tps[ntps++] = j->tps;
        /* why the adaptive rule last paused it, where it did (client log) */
        if (strstr(j->note, "switched off"))
            fprintf(stderr, "bench_spec_client: request %d: %s\n", r, j->note);
        if (rec) {
            for (int i = 0; i < j->n_prompt; i++)
                fprintf(rec, "%u ", j->prompt[i]);
            for (int i = 0; i < j->n_out; i++)
                fprintf(rec, "%u%s", j->out[i], i + 1 < j->n_out ? " " : "");
            fprintf(rec, "\n");
        }
        if (check && r < nruns) {
            int same = lens[r] == j->n_prompt + j->n_out &&
                       !memcmp(runs[r] + j->n_prompt, j->out, (size_t)j->n_out * 4);
            mismatched += !same;
        }
    }
    if (rec)
        fclose(rec);
    qsort(tps, (size_t)ntps, sizeof(double), cmp_double);
    printf("tokens_per_s=%.1f request_tps_p50=%.1f mean_accepted=%.3f acceptance=%.3f "
           "spec_round_share=%.3f ahead_blocks=%llu requests=%d failed=%d mismatched=%d "
           "wall_s=%.2f\n",
           tokens / wall, ntps ? tps[ntps / 2] : 0.0, spec ? (double)accepted / spec : 0.0,
           drafted ? (double)accepted / drafted : 0.0, rounds ? (double)spec / rounds : 0.0,
           (unsigned long long)ahead, g.requests, failed, mismatched, wall);
    /* The acceptance per draft position, and over all positions: what the
     * oracle's a is (each drafted token accepted with probability a, given
     * the ones before it were). */
    uint64_t rs = 0, as = 0;
    printf("position_acceptance");
    for (int i = 0; i < 64 && reached_at[i]; i++) {
        printf("%s%.3f", i ? "," : "=", (double)accepted_at[i] / (double)reached_at[i]);
        rs += reached_at[i];
        as += accepted_at[i];
    }
    printf(" token_acceptance=%.3f\n", rs ? (double)as / (double)rs : 0.0);
    if (g.verifier && describe(&after, g.verifier, "/tandem.v1.Verifier/Describe") == 0) {
        print_graphs("verifier", &before, &after);
        if (g.drafter && describe(&dafter, g.drafter, "/tandem.v1.Drafter/Describe") == 0) {
            print_graphs("drafter", &dbefore, &dafter);
            print_stages(&dbefore, &dafter);
        }
        print_timeline(&before, &after);
    }
    tdm_rpc_channel_destroy(ch);
    return failed || mismatched ? 1 : 0;
}
