/*
 * cli_logits.c - `tandem logits`: run token ids through a model on the CPU
 * and write the logits of every position (.npy) or print the top-k.
 *
 *   tandem logits --model DIR --ids 1,2,3 [--then 4,5 ...] [--out FILE.npy | --top K]
 *                 [--strategy extra_buffer|no_buffer|replay] [--threads N]
 *                 [--hidden-out FILE.npy] [--mtp-out FILE.npy [--mtp-draft K]]
 *                 [--weights checkpoint|fp8]
 *
 * The --ids are a prefill; each --then is a continuation through the cache
 * (one multi-token forward). With --strategy, each continuation runs as a
 * verify block that is then fully committed, exercising that strategy.
 *
 * --hidden-out writes the target's hidden states after the final norm
 * [positions, hidden]. --mtp-out runs the checkpoint's MTP head (engine/mtp.h)
 * on them: primed at every position p with the token at p + 1 (after the
 * last position, the target's argmax), then K - 1 greedy draft rows; it
 * writes the head's logits [positions + K - 1, vocab], row r for the head's
 * row at position r, and prints the K drafts. --weights fp8 computes with the
 * model's matrices rounded to FP8, and the MTP head's, as a drafter with
 * weights fp8 does (tdm_model_set_weights_fp8, tdm_mtp_set_weights_fp8).
 */
#include "cli.h"

#include "engine.h"
#include "mtp.h"
#include "npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOGITS_MAX_CALLS 64

static void logits_usage(FILE *out)
{
    fprintf(
        out,
        "usage: tandem logits --model DIR --ids 1,2,3 [--then 4,5 ...] [--out FILE.npy | --top K]\n"
        "                     [--strategy extra_buffer|no_buffer|replay] [--threads N]\n"
        "                     [--hidden-out FILE.npy]\n"
        "                     [--mtp-out FILE.npy [--mtp-draft K] [--mtp-next ID]]\n"
        "                     [--weights checkpoint|fp8]\n\n"
        "Runs the ids as a prefill, then each --then as a continuation through the cache,\n"
        "and writes the float32 logits of every position as one .npy [positions, vocab]\n"
        "(--out) or prints the top K tokens of each position (--top, default 5).\n"
        "--hidden-out writes the hidden states after the final norm [positions, hidden].\n"
        "--mtp-out runs the checkpoint's MTP head on them (each position with the next\n"
        "token; after the last, the target's argmax or --mtp-next), drafts K tokens\n"
        "(default 1), writes its logits [positions + K - 1, vocab] and prints the drafts.\n"
        "--weights fp8 rounds the model's matrices (and the MTP head's) to FP8 E4M3\n"
        "first, as a drafter with weights fp8 does.\n");
}

/* Parses "1,2,3" into a new array; returns its length or -1. */
static int parse_ids(const char *s, int32_t **out)
{
    int cap = 16, n = 0;
    int32_t *v = malloc((size_t)cap * sizeof(int32_t));
    const char *p = s;
    while (v && *p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            free(v);
            return -1;
        }
        if (n == cap) {
            int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof(int32_t));
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
        }
        v[n++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (!v || n == 0) {
        free(v);
        return -1;
    }
    *out = v;
    return n;
}

static void print_top(const float *row, int V, int k, int pos)
{
    printf("position %d:", pos);
    int taken[64];
    if (k > 64)
        k = 64;
    for (int j = 0; j < k && j < V; j++) {
        int best = -1;
        for (int i = 0; i < V; i++) {
            int used = 0;
            for (int t = 0; t < j; t++)
                used |= taken[t] == i;
            if (!used && (best < 0 || row[i] > row[best]))
                best = i;
        }
        taken[j] = best;
        printf(" %d (%.4f)", best, (double)row[best]);
    }
    printf("\n");
}

/* --mtp-out: model's MTP head, loaded as a drafter loads it (tdm_mtp_open:
 * with its own embedding and LM head; rounded to FP8 where fp8 is set),
 * primed at every position (hidden [total, H], the next token of each; after
 * the last, `last_next`, or the target's argmax there when it is negative),
 * then k - 1 draft rows; writes [total + k - 1, vocab] to path and prints
 * the drafts. 0 or 1. */
static int logits_mtp(const char *model, tdm_backend *be, tdm_model *m, int32_t *const *ids,
                      const int *nids, int ncalls, int total, const float *logits,
                      const float *hidden, int k, int32_t last_next, int fp8, const char *path)
{
    const int V = tdm_model_get_config(m)->vocab_size;
    int rc = 1;
    tdm_error err;
    tdm_mtp *h = NULL;
    tdm_mtp_seq *q = NULL;
    int32_t *next = malloc((size_t)total * sizeof(int32_t)), *drafts = malloc((size_t)k * 4);
    float *out = malloc((size_t)(total + k - 1) * (size_t)V * sizeof(float));
    float *dl = malloc((size_t)k * (size_t)V * sizeof(float));
    if (!next || !drafts || !out || !dl) {
        fprintf(stderr, "tandem logits: out of memory\n");
        goto done;
    }
    for (int c = 0, at = 0; c < ncalls; c++)
        for (int j = 0; j < nids[c]; j++, at++)
            if (at > 0)
                next[at - 1] = ids[c][j];
    const float *lastrow = logits + (size_t)(total - 1) * (size_t)V;
    next[total - 1] = 0;
    for (int i = 1; i < V; i++)
        if (lastrow[i] > lastrow[next[total - 1]])
            next[total - 1] = i;
    if (last_next >= 0)
        next[total - 1] = last_next;
    if (tdm_mtp_open(model, be, &h, &err) != TDM_OK ||
        (fp8 && tdm_mtp_set_weights_fp8(h, NULL, &err) != TDM_OK) ||
        tdm_mtp_seq_create(h, 0, &q, &err) != TDM_OK ||
        tdm_mtp_prime(q, hidden, next, total, out, &err) != TDM_OK ||
        tdm_mtp_draft(q, k, drafts, dl, &err) != TDM_OK) {
        fprintf(stderr, "tandem logits: %s\n", err.msg);
        goto done;
    }
    /* Draft 1 comes from the last primed row (out's last row); rows 2..k follow. */
    memcpy(out + (size_t)total * (size_t)V, dl + (size_t)V,
           (size_t)(k - 1) * (size_t)V * sizeof(float));
    int64_t shape[2] = {total + k - 1, V};
    if (tdm_npy_write_f32(path, out, 2, shape, &err) != TDM_OK) {
        fprintf(stderr, "tandem logits: %s\n", err.msg);
        goto done;
    }
    printf("mtp drafts:");
    for (int j = 0; j < k; j++)
        printf(" %d", (int)drafts[j]);
    printf("\n");
    rc = 0;
done:
    tdm_mtp_seq_destroy(q);
    tdm_mtp_destroy(h);
    free(next);
    free(drafts);
    free(out);
    free(dl);
    return rc;
}

int cli_logits(int argc, char **argv)
{
    const char *model = NULL, *out = NULL, *strategy = NULL, *hidden_out = NULL, *mtp_out = NULL;
    const char *calls_s[LOGITS_MAX_CALLS];
    int ncalls = 0, top = 5, threads = 0, mtp_draft = 1, fp8 = 0;
    long mtp_next = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            if (i + 1 < argc) {
                fprintf(stderr, "tandem logits: takes no arguments, got '%s'\n", argv[i + 1]);
                return 2;
            }
            break;
        }
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            logits_usage(stdout);
            return 0;
        }
        if (!val) {
            fprintf(stderr, "tandem logits: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--model") == 0) {
            model = val;
        } else if (strcmp(a, "--ids") == 0 || strcmp(a, "--then") == 0) {
            if ((strcmp(a, "--ids") == 0) != (ncalls == 0)) {
                fprintf(stderr, "tandem logits: --ids comes once, before any --then\n");
                return 2;
            }
            if (ncalls == LOGITS_MAX_CALLS) {
                fprintf(stderr, "tandem logits: at most %d calls\n", LOGITS_MAX_CALLS);
                return 2;
            }
            calls_s[ncalls++] = val;
        } else if (strcmp(a, "--out") == 0) {
            out = val;
        } else if (strcmp(a, "--top") == 0) {
            top = atoi(val);
            if (top < 1) {
                fprintf(stderr, "tandem logits: --top needs a positive number\n");
                return 2;
            }
        } else if (strcmp(a, "--strategy") == 0) {
            strategy = val;
        } else if (strcmp(a, "--threads") == 0) {
            threads = atoi(val);
        } else if (strcmp(a, "--weights") == 0) {
            if (strcmp(val, "fp8") != 0 && strcmp(val, "checkpoint") != 0) {
                fprintf(stderr, "tandem logits: --weights is checkpoint or fp8, not '%s'\n", val);
                return 2;
            }
            fp8 = strcmp(val, "fp8") == 0;
        } else if (strcmp(a, "--hidden-out") == 0) {
            hidden_out = val;
        } else if (strcmp(a, "--mtp-out") == 0) {
            mtp_out = val;
        } else if (strcmp(a, "--mtp-next") == 0) {
            char *end;
            mtp_next = strtol(val, &end, 10);
            if (*end || end == val || mtp_next < 0 || mtp_next > INT32_MAX) {
                fprintf(stderr, "tandem logits: --mtp-next needs a token id, got '%s'\n", val);
                return 2;
            }
        } else if (strcmp(a, "--mtp-draft") == 0) {
            mtp_draft = atoi(val);
            if (mtp_draft < 1 || mtp_draft > TDM_MAX_DRAFT_BLOCK) {
                fprintf(stderr, "tandem logits: --mtp-draft needs 1..%d\n", TDM_MAX_DRAFT_BLOCK);
                return 2;
            }
        } else {
            fprintf(stderr, "tandem logits: unknown option '%s'\n\n", a);
            logits_usage(stderr);
            return 2;
        }
    }
    if (!model || ncalls == 0) {
        logits_usage(stderr);
        return 2;
    }
    int strat = TDM_STATE_EXTRA_BUFFER;
    if (strategy && (strat = tdm_state_strategy_parse(strategy)) < 0) {
        fprintf(stderr, "tandem logits: --strategy '%s' is not extra_buffer, no_buffer or replay\n",
                strategy);
        return 2;
    }
    int32_t *ids[LOGITS_MAX_CALLS];
    int nids[LOGITS_MAX_CALLS], total = 0, maxcont = 1;
    for (int c = 0; c < ncalls; c++) {
        nids[c] = parse_ids(calls_s[c], &ids[c]);
        if (nids[c] < 0) {
            fprintf(stderr, "tandem logits: '%s' is not a comma-separated list of token ids\n",
                    calls_s[c]);
            for (int j = 0; j < c; j++)
                free(ids[j]);
            return 2;
        }
        total += nids[c];
        if (c > 0 && nids[c] > maxcont)
            maxcont = nids[c];
    }

    int rc = 1;
    tdm_error err;
    tdm_model *m = NULL;
    tdm_seq *s = NULL;
    float *logits = NULL, *hidden = NULL;
    tdm_backend *be = tdm_backend_cpu_create(threads);
    if (!be) {
        fprintf(stderr, "tandem logits: cannot start the CPU backend\n");
        goto done;
    }
    if (tdm_model_load(model, be, &m, &err) != TDM_OK ||
        (fp8 && tdm_model_set_weights_fp8(m, NULL, NULL, &err) != TDM_OK)) {
        fprintf(stderr, "tandem logits: %s\n", err.msg);
        goto done;
    }
    const int V = tdm_model_get_config(m)->vocab_size, H = tdm_model_get_config(m)->hidden_size;
    tdm_seq_params p = {(tdm_state_strategy)strat, maxcont - 1, 0};
    logits = malloc((size_t)total * (size_t)V * sizeof(float));
    if (hidden_out || mtp_out)
        hidden = malloc((size_t)total * (size_t)H * sizeof(float));
    if (!logits || ((hidden_out || mtp_out) && !hidden) ||
        tdm_seq_create(m, &p, &s, &err) != TDM_OK) {
        fprintf(stderr, "tandem logits: %s\n", logits ? err.msg : "out of memory");
        goto done;
    }
    size_t at = 0;
    for (int c = 0; c < ncalls; c++) {
        const tdm_step_out o = {.logits = logits + at * (size_t)V,
                                .hidden = hidden ? hidden + at * (size_t)H : NULL};
        tdm_status st;
        if (c > 0 && strategy) {
            const int32_t *t = ids[c];
            st = tdm_seq_verify_out(&s, 1, &t, &nids[c], &o, &err);
            if (st == TDM_OK)
                st = tdm_seq_commit(s, nids[c] - 1, &err);
        } else {
            st = tdm_seq_prefill_out(s, ids[c], nids[c], &o, &err);
        }
        if (st != TDM_OK) {
            fprintf(stderr, "tandem logits: call %d: %s\n", c + 1, err.msg);
            goto done;
        }
        at += (size_t)nids[c];
    }
    if (out) {
        int64_t shape[2] = {total, V};
        if (tdm_npy_write_f32(out, logits, 2, shape, &err) != TDM_OK) {
            fprintf(stderr, "tandem logits: %s\n", err.msg);
            goto done;
        }
    } else {
        for (int r = 0; r < total; r++)
            print_top(logits + (size_t)r * (size_t)V, V, top, r);
    }
    if (hidden_out) {
        int64_t shape[2] = {total, H};
        if (tdm_npy_write_f32(hidden_out, hidden, 2, shape, &err) != TDM_OK) {
            fprintf(stderr, "tandem logits: %s\n", err.msg);
            goto done;
        }
    }
    if (mtp_next >= V) {
        fprintf(stderr, "tandem logits: --mtp-next %ld is outside the vocabulary (0..%d)\n",
                mtp_next, V - 1);
        goto done;
    }
    if (mtp_out && logits_mtp(model, be, m, ids, nids, ncalls, total, logits, hidden, mtp_draft,
                              (int32_t)mtp_next, fp8, mtp_out) != 0)
        goto done;
    rc = 0;
done:
    free(hidden);
    free(logits);
    tdm_seq_destroy(s);
    tdm_model_destroy(m);
    if (be)
        be->destroy(be);
    for (int c = 0; c < ncalls; c++)
        free(ids[c]);
    return rc;
}
