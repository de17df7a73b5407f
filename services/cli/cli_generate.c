/*
 * cli_generate.c - `tandem generate`: sends a prompt to a running gateway's
 * Generate and streams the text to stdout as it comes; the request's stats
 * go to stderr at the end (or everything as JSON lines with --json).
 */
#include "cli.h"

#include "cli_net.h"
#include "config.h"
#include "defs.h"
#include "pbjson.h"
#include "rpc.h"
#include "tandem/v1/gateway.pb-c.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tandem generate [options] PROMPT\n\n"
            "Streams the continuation of PROMPT from a running gateway.\n\n"

            "  --max-tokens N       tokens to generate (default: the gateway's)\n"
            "  --temperature T      0 = greedy (default 0)\n"
            "  --top-p P            nucleus sampling (default off)\n"
            "  --top-k K            top-k sampling (default off)\n"
            "  --seed S             seed for sampling (same seed, same output)\n"
            "  --stop STRING        stop string, repeatable; not included in the output\n"
            "  --no-spec            plain decoding, no drafter\n"
            "  --spec               require speculation (fail if no drafter can pair)\n"
            "  --block N            draft block size (default: the drafter's)\n"
            "  --fixed-block        draft --block N tokens every round: the adaptive rule\n"
            "                       neither shortens nor pauses speculation (benchmarks)\n"
            "  --ids 1,2,3          prompt as token ids instead of text\n"
            "  --chat               wrap PROMPT as a user message (ChatML)\n"
            "  --ignore-eos         keep going past end-of-sequence tokens\n"
            "  --timeout DURATION   deadline for the whole request (e.g. 30s)\n"
            "  --json               print each response message as a JSON line\n"
            "  --quiet              no stats on stderr\n"
            "  --                   end of options: what follows is the prompt\n"
            "%s",
            cli_net_usage);
}

static bool parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        return false;
    *out = v;
    return true;
}

static bool parse_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end)
        return false;
    *out = v;
    return true;
}

static bool parse_ids(const char *s, uint32_t **ids, size_t *n)
{
    size_t cap = 16;
    *ids = malloc(cap * sizeof(uint32_t));
    *n = 0;
    while (*ids && *s) {
        char *end;
        errno = 0;
        unsigned long v = strtoul(s, &end, 10);
        if (errno || end == s || v > UINT32_MAX || (*end && *end != ','))
            return false;
        if (*n == cap) {
            cap *= 2;
            uint32_t *g = realloc(*ids, cap * sizeof(uint32_t));
            if (!g)
                return false;
            *ids = g;
        }
        (*ids)[(*n)++] = (uint32_t)v;
        s = *end ? end + 1 : end;
    }
    return *ids && *n > 0;
}

int cli_generate(int argc, char **argv)
{
    cli_net net;
    cli_net_init(&net);
    Tandem__V1__GenerateRequest req = TANDEM__V1__GENERATE_REQUEST__INIT;
    Tandem__V1__SamplingParams sp = TANDEM__V1__SAMPLING_PARAMS__INIT;
    Tandem__V1__SpeculationParams spec = TANDEM__V1__SPECULATION_PARAMS__INIT;
    Tandem__V1__TokenIds tids = TANDEM__V1__TOKEN_IDS__INIT;
    Tandem__V1__ChatPrompt chat = TANDEM__V1__CHAT_PROMPT__INIT;
    Tandem__V1__ChatMessage umsg = TANDEM__V1__CHAT_MESSAGE__INIT;
    Tandem__V1__ChatMessage *umsgp = &umsg;
    req.sampling = &sp;
    req.speculation = &spec;
    char *stops[16];
    size_t n_stops = 0;
    const char *prompt = NULL;
    uint32_t *ids = NULL;
    size_t n_ids = 0;
    bool as_chat = false, json = false, quiet = false;
    int64_t timeout_ms = 0;
    int rc = 2;

    bool options = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t u;
        int taken;
        if (!options || strcmp(a, "--") == 0) {
            if (options) {
                options = false;
                continue;
            }
            if (prompt) {
                fprintf(stderr, "tandem generate: give one PROMPT (quote it)\n");
                goto out;
            }
            prompt = a;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            free(ids);
            return 0;
        } else if ((taken = cli_net_option(&net, "generate", argc, argv, &i)) != 0) {
            if (taken < 0)
                goto out;
        } else if (strcmp(a, "--max-tokens") == 0 && v && parse_u64(v, &u) && u <= UINT32_MAX) {
            req.max_tokens = (uint32_t)u;
            i++;
        } else if (strcmp(a, "--temperature") == 0 && v && parse_float(v, &sp.temperature)) {
            i++;
        } else if (strcmp(a, "--top-p") == 0 && v && parse_float(v, &sp.top_p)) {
            i++;
        } else if (strcmp(a, "--top-k") == 0 && v && parse_u64(v, &u) && u <= UINT32_MAX) {
            sp.top_k = (uint32_t)u;
            i++;
        } else if (strcmp(a, "--seed") == 0 && v && parse_u64(v, &u)) {
            sp.seed_choice_case = TANDEM__V1__SAMPLING_PARAMS__SEED_CHOICE_SEED;
            sp.seed = u;
            i++;
        } else if (strcmp(a, "--stop") == 0 && v) {
            if (n_stops == 16) {
                fprintf(stderr, "tandem generate: at most 16 --stop strings\n");
                goto out;
            }
            stops[n_stops++] = (char *)v;
            i++;
        } else if (strcmp(a, "--no-spec") == 0) {
            spec.mode = TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_OFF;
        } else if (strcmp(a, "--spec") == 0) {
            spec.mode = TANDEM__V1__SPECULATION_MODE__SPECULATION_MODE_ON;
        } else if (strcmp(a, "--block") == 0 && v && parse_u64(v, &u) && u >= 1 &&
                   u <= TDM_MAX_DRAFT_BLOCK) {
            spec.block_size = (uint32_t)u;
            i++;
        } else if (strcmp(a, "--fixed-block") == 0) {
            spec.fixed_block_size = true;
        } else if (strcmp(a, "--ids") == 0 && v) {
            if (!parse_ids(v, &ids, &n_ids)) {
                fprintf(stderr, "tandem generate: --ids expects comma-separated token ids, got "
                                "'%s'\n", v);
                goto out;
            }
            i++;
        } else if (strcmp(a, "--chat") == 0) {
            as_chat = true;
        } else if (strcmp(a, "--ignore-eos") == 0) {
            req.ignore_eos = true;
        } else if (strcmp(a, "--timeout") == 0 && v) {
            tdm_error e = {0};
            if (tdm_cfg_parse_duration_ms(v, &timeout_ms, &e) != TDM_OK) {
                fprintf(stderr, "tandem generate: --timeout: %s\n", e.msg);
                goto out;
            }
            i++;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--quiet") == 0) {
            quiet = true;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tandem generate: unknown or incomplete option '%s'\n\n", a);
            usage(stderr);
            goto out;
        } else if (!prompt) {
            prompt = a;
        } else {
            fprintf(stderr, "tandem generate: give one PROMPT (quote it)\n");
            goto out;
        }
    }
    if (ids) {
        tids.n_ids = n_ids;
        tids.ids = ids;
        req.prompt_case = TANDEM__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
        req.token_ids = &tids;
    } else if (prompt && as_chat) {
        umsg.role = "user";
        umsg.content = (char *)prompt;
        chat.n_messages = 1;
        chat.messages = &umsgp;
        chat.add_generation_prompt = true;
        req.prompt_case = TANDEM__V1__GENERATE_REQUEST__PROMPT_CHAT;
        req.chat = &chat;
    } else if (prompt) {
        req.prompt_case = TANDEM__V1__GENERATE_REQUEST__PROMPT_TEXT;
        req.text = (char *)prompt;
    } else {
        usage(stderr);
        goto out;
    }
    if (spec.fixed_block_size && !spec.block_size) {
        fprintf(stderr, "tandem generate: --fixed-block needs --block N\n");
        goto out;
    }
    req.n_stop = n_stops;
    req.stop = stops;

    tdm_error err = {0};
    tdm_rpc_channel *ch = NULL;
    if (cli_net_channel(&net, &ch, &err) != TDM_OK) {
        fprintf(stderr, "tandem generate: %s\n", err.msg);
        rc = 1;
        goto out;
    }
    tdm_rpc_call_options opt = {.timeout_ms = timeout_ms};
    cli_net_call_options(&net, &opt);
    tdm_rpc_stream *st = NULL;
    if (tdm_rpc_stream_open(ch, "/tandem.v1.Gateway/Generate", &req.base,
                            &tandem__v1__generate_response__descriptor, &opt, &st,
                            &err) != TDM_OK) {
        fprintf(stderr, "tandem generate: %s\n", err.msg);
        tdm_rpc_channel_destroy(ch);
        rc = 1;
        goto out;
    }
    rc = 1;
    for (;;) {
        ProtobufCMessage *m = NULL;
        tdm_status s = tdm_rpc_stream_read(st, &m, &err);
        if (!m) {
            if (s != TDM_OK)
                fprintf(stderr, "\ntandem generate: %s: %s\n", tdm_status_name(s), err.msg);
            break;
        }
        Tandem__V1__GenerateResponse *r = (Tandem__V1__GenerateResponse *)m;
        if (json) {
            cJSON *j = tdm_pbjson_from_message(m);
            char *text = j ? cJSON_PrintUnformatted(j) : NULL;
            if (text)
                printf("%s\n", text);
            free(text);
            cJSON_Delete(j);
        } else if (r->chunk_case == TANDEM__V1__GENERATE_RESPONSE__CHUNK_TOKENS) {
            fputs(r->tokens->text, stdout);
        }
        fflush(stdout);
        if (r->chunk_case == TANDEM__V1__GENERATE_RESPONSE__CHUNK_COMPLETE) {
            rc = 0;
            const Tandem__V1__RequestStats *t = r->complete->stats;
            if (!json && !quiet && t) {
                const ProtobufCEnumValue *fr = protobuf_c_enum_descriptor_get_value(
                    &tandem__v1__finish_reason__descriptor, r->complete->finish_reason);
                fprintf(stderr,
                        "\n--\nfinish: %s | prompt %u tokens, generated %u | rounds %u "
                        "(speculative %u), mean accepted %.2f draft tokens/round | "
                        "ttft %.1f ms, %.1f tokens/s, total %.1f ms\nverifier %s, drafter %s, "
                        "speculation %s, seed %llu\n",
                        fr ? fr->name : "?", t->prompt_tokens, t->generated_tokens, t->rounds,
                        t->speculative_rounds, t->mean_accepted, t->time_to_first_token_ms,
                        t->tokens_per_second, t->total_ms, t->verifier[0] ? t->verifier : "-",
                        t->drafter[0] ? t->drafter : "-", t->speculation,
                        (unsigned long long)t->seed);
            }
        }
        protobuf_c_message_free_unpacked(m, NULL);
    }
    if (!json && rc == 0)
        printf("\n");
    tdm_rpc_stream_destroy(st);
    tdm_rpc_channel_destroy(ch);
out:
    free(ids);
    return rc;
}
