/*
 * compat_test.c - the compatibility rule table (DESIGN.md section 4): a
 * compatible pair passes; every rule refuses with a sentence naming the rule,
 * both values and both services; the Refusal message survives the wire; the
 * fingerprints ignore formatting and follow content.
 *
 * Usage: compat_test rules | fingerprints
 *        compat_test tokenizer-fp FILE   (prints the hex, for the Python reference test)
 *        compat_test model-fp DIR
 */
#include "../config/check.h"
#include "compat.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char FP_A[] = "aaaaaaaaaaaa1111111111111111111111111111111111111111111111111111";
static const char FP_B[] = "bbbbbbbbbbbb2222222222222222222222222222222222222222222222222222";

typedef struct desc_store {
    Tandem__V1__Descriptor d;
    Tandem__V1__ProtocolVersion pv;
} desc_store;

static void make_verifier(desc_store *s)
{
    tandem__v1__descriptor__init(&s->d);
    tandem__v1__protocol_version__init(&s->pv);
    s->pv.major = 1;
    s->pv.minor = 0;
    s->d.protocol = &s->pv;
    s->d.role = TANDEM__V1__ROLE__ROLE_VERIFIER;
    s->d.replica_id = "verifier-a";
    s->d.address = "10.0.0.1:7710";
    s->d.tokenizer_fingerprint = (char *)FP_A;
    s->d.max_draft_tokens = 8;
    s->d.state_strategy = TANDEM__V1__STATE_STRATEGY__STATE_STRATEGY_EXTRA_BUFFER;
    s->d.snapshot_layout_version = 1;
}

static void make_drafter(desc_store *s)
{
    make_verifier(s);
    s->d.role = TANDEM__V1__ROLE__ROLE_DRAFTER;
    s->d.replica_id = "drafter-b";
    s->d.address = "10.0.0.2:7720";
    s->d.max_draft_tokens = 0;
    s->d.draft_block_size = 4;
    s->d.drafter_kind = TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MODEL;
}

/* Expects exactly one refusal by `rule` whose message names both services
 * and contains every string of `want` (NULL-terminated). */
static void expect_refusal(size_t n, const tdm_compat_refusal *r, const char *rule,
                           const char *const *want)
{
    CHECK(n == 1, "want 1 refusal by %s, got %zu", rule, n);
    if (n < 1)
        return;
    CHECK(strcmp(r->rule, rule) == 0, "rule '%s', want '%s'", r->rule, rule);
    CHECK(strncmp(r->message, "rule ", 5) == 0, "message starts with the rule: %s", r->message);
    CHECK_HAS(r->message, rule);
    for (size_t i = 0; want[i]; i++)
        CHECK_HAS(r->message, want[i]);
    CHECK(r->message[strlen(r->message) - 1] == '.', "a full sentence: %s", r->message);
    CHECK(r->a_value[0] && r->b_value[0], "both values filled");
}

/* How a pair's devices relate: apart unless both name the same GPU; on one
 * GPU they run at once only when both go through MPS. */
static void test_gpu_sharing(void)
{
    const char *a = "GPU-11111111-2222-3333-4444-555555555555";
    const char *b = "GPU-66666666-7777-8888-9999-000000000000";
    static const struct {
        const char *ua;
        bool ma;
        const char *ub;
        bool mb;
        tdm_gpu_share want;
    } cases[] = {
        {"", false, "", false, TDM_GPU_APART}, /* both on the CPU */
        {"", true, "", true, TDM_GPU_APART},   /* no GPU, whatever mps says */
        {NULL, false, NULL, false, TDM_GPU_APART},
        {"", false, NULL, false, TDM_GPU_APART},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        CHECK(tdm_gpu_sharing(cases[i].ua, cases[i].ma, cases[i].ub, cases[i].mb) == cases[i].want,
              "case %zu", i);
    CHECK(tdm_gpu_sharing(a, false, "", false) == TDM_GPU_APART, "GPU and CPU");
    CHECK(tdm_gpu_sharing(a, true, b, true) == TDM_GPU_APART, "two GPUs");
    CHECK(tdm_gpu_sharing(a, false, b, false) == TDM_GPU_APART, "two GPUs, no MPS");
    CHECK(tdm_gpu_sharing(a, true, a, true) == TDM_GPU_SHARED_MPS, "one GPU through MPS");
    CHECK(tdm_gpu_sharing(a, false, a, false) == TDM_GPU_SHARED_TURNS, "one GPU, no MPS");
    CHECK(tdm_gpu_sharing(a, true, a, false) == TDM_GPU_SHARED_TURNS, "one GPU, MPS on one side");
    CHECK(tdm_gpu_sharing(a, false, a, true) == TDM_GPU_SHARED_TURNS, "the other side");
    CHECK(strcmp(tdm_gpu_turns_without(true, false), "the drafter not") == 0 &&
              strcmp(tdm_gpu_turns_without(false, true), "the verifier not") == 0 &&
              strcmp(tdm_gpu_turns_without(false, false), "neither") == 0,
          "which side lacks MPS");
}

/* CPU lists (Descriptor.cpus) and whether two replicas on the CPU share cores. */
static void test_cores(void)
{
    tdm_cpulist l;
    tdm_error err;
    CHECK(tdm_cpulist_parse("0-3,8,10-11", &l, &err) == TDM_OK, "parse: %s", err.msg);
    CHECK(l.bits[0] == 0xD0Full && l.bits[1] == 0, "0-3,8,10-11 -> %llx",
          (unsigned long long)l.bits[0]);
    CHECK(tdm_cpulist_parse("1023", &l, &err) == TDM_OK && l.bits[15] == 1ull << 63, "cpu 1023");
    static const char *const bad[] = {"",     "1024", "0-", "-3",   "3-1",
                                      "0,,2", "0 1",  "a",  "0-3,", "99999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK(tdm_cpulist_parse(bad[i], &l, &err) != TDM_OK, "'%s' refused", bad[i]);
        CHECK(bad[i][0] == '\0' || strstr(err.msg, "CPU list"), "'%s': %s", bad[i], err.msg);
    }
    /* this process's own mask, as the kernel gives it */
    char self[TDM_CPULIST_TEXT_MAX + 1];
    tdm_cpulist_self(self, sizeof(self));
    cpu_set_t set;
    CHECK(sched_getaffinity(0, sizeof(set), &set) == 0, "sched_getaffinity");
    CHECK(tdm_cpulist_parse(self, &l, &err) == TDM_OK, "own list '%s': %s", self, err.msg);
    for (int c = 0; c < TDM_CPULIST_MAX; c++)
        CHECK(((l.bits[c / 64] >> (c % 64)) & 1) == (uint64_t)(CPU_ISSET(c, &set) != 0),
              "cpu %d in '%s'", c, self);
    char tiny[4];
    tdm_cpulist_self(tiny, sizeof(tiny));
    CHECK(tiny[0] == '\0' || strlen(self) < sizeof(tiny), "a list that does not fit is ''");
    char host[80];
    tdm_host_id_self(host, sizeof(host));
    CHECK(strlen(host) == 36, "boot_id '%s'", host);
    /* sharing */
    CHECK(tdm_cores_shared("h", "0-3", "h", "3-5"), "meet at 3");
    CHECK(!tdm_cores_shared("h", "0-3", "h", "4-5"), "apart");
    CHECK(!tdm_cores_shared("h", "0-3", "g", "0-3"), "other hosts");
    CHECK(tdm_cores_shared("", "0", "h", "1"), "a host not known");
    CHECK(tdm_cores_shared("h", "", "h", "1"), "a list not known");
    CHECK(tdm_cores_shared("h", "0-x", "h", "1"), "a list that does not parse");
    CHECK(!tdm_cores_shared("h", "0,64", "h", "1-63,65"), "apart across words");
    CHECK(tdm_cores_shared("h", "0,900", "h", "900"), "meet at 900");
}

static void test_rules(void)
{
    desc_store v, d;
    tdm_compat_refusal r[8];
    make_verifier(&v);
    make_drafter(&d);
    CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 0, "compatible pair: %s", r[0].message);

    /* Block equal to max_draft_tokens is fine; one more is not. */
    d.d.draft_block_size = 8;
    CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 0, "block == max");
    d.d.draft_block_size = 9;
    {
        const char *want[] = {"drafter-b (10.0.0.2:7720)", "verifier-a (10.0.0.1:7710)",
                              "blocks of 9 tokens", "at most 8 draft tokens", NULL};
        expect_refusal(tdm_compat_check_pair(&v.d, &d.d, r, 8), r, "draft-block-size", want);
        CHECK(strcmp(r[0].a_value, "max_draft_tokens=8") == 0, "%s", r[0].a_value);
        CHECK(strcmp(r[0].b_value, "draft_block_size=9") == 0, "%s", r[0].b_value);
    }
    make_drafter(&d);

    /* Tokenizer fingerprints. */
    d.d.tokenizer_fingerprint = (char *)FP_B;
    {
        const char *want[] = {"verifier-a (10.0.0.1:7710)", "drafter-b (10.0.0.2:7720)",
                              "aaaaaaaaaaaa", "bbbbbbbbbbbb", NULL};
        expect_refusal(tdm_compat_check_pair(&v.d, &d.d, r, 8), r, "tokenizer-fingerprint", want);
        CHECK(strcmp(r[0].a_value, FP_A) == 0 && strcmp(r[0].b_value, FP_B) == 0,
              "full fingerprints as values");
    }
    d.d.tokenizer_fingerprint = "";
    {
        const char *want[] = {"(none)", NULL};
        expect_refusal(tdm_compat_check_pair(&v.d, &d.d, r, 8), r, "tokenizer-fingerprint", want);
    }
    /* An n-gram drafter has no vocabulary of its own. */
    d.d.drafter_kind = TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_NGRAM;
    CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 0, "ngram drafter: %s", r[0].message);
    make_drafter(&d);

    /* Prefix caching needs a state at any position of a verified block, on either side. */
    v.d.prefix_cache = 1;
    CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 0, "prefix cache with extra_buffer");
    v.d.state_strategy = TANDEM__V1__STATE_STRATEGY__STATE_STRATEGY_REPLAY;
    CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 0, "prefix cache with replay");
    v.d.state_strategy = TANDEM__V1__STATE_STRATEGY__STATE_STRATEGY_NO_BUFFER;
    {
        const char *want[] = {"verifier-a (10.0.0.1:7710)",
                              "drafter-b (10.0.0.2:7720)",
                              "prefix_cache=on, state_strategy=no_buffer",
                              "prefix_cache=off, state_strategy=extra_buffer",
                              "the verifier",
                              NULL};
        expect_refusal(tdm_compat_check_pair(&v.d, &d.d, r, 8), r, "prefix-cache-state", want);
    }
    make_verifier(&v);
    d.d.prefix_cache = 1;
    d.d.state_strategy = TANDEM__V1__STATE_STRATEGY__STATE_STRATEGY_NO_BUFFER;
    {
        const char *want[] = {"prefix_cache=on, state_strategy=no_buffer", "the drafter", NULL};
        expect_refusal(tdm_compat_check_pair(&v.d, &d.d, r, 8), r, "prefix-cache-state", want);
    }
    make_drafter(&d);

    /* Protocol major. */
    d.pv.major = 2;
    d.pv.minor = 3;
    {
        const char *want[] = {"verifier verifier-a (10.0.0.1:7710) speaks protocol 1.0",
                              "drafter drafter-b (10.0.0.2:7720) speaks protocol 2.3", NULL};
        expect_refusal(tdm_compat_check_pair(&v.d, &d.d, r, 8), r, "protocol-major", want);
    }
    d.pv.major = 1; /* minor differences are additive */
    CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 0, "minor differs only");
    d.d.protocol = NULL; /* a peer that sent no version at all is major 0 */
    CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 1, "missing protocol");
    make_drafter(&d);

    /* Hidden-state drafters: the states they need must be streamed. */
    {
        Tandem__V1__FeatureSpec final_normed = TANDEM__V1__FEATURE_SPEC__INIT;
        final_normed.final_layer = 1;
        final_normed.normed = 1;
        Tandem__V1__FeatureSpec layer3 = TANDEM__V1__FEATURE_SPEC__INIT;
        layer3.layer = 3;
        Tandem__V1__FeatureSpec *need[] = {&final_normed, &layer3}, *have[] = {&final_normed};
        Tandem__V1__FeatureRequest fr = TANDEM__V1__FEATURE_REQUEST__INIT;
        fr.specs = need;
        fr.n_specs = 1;
        d.d.drafter_kind = TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_MTP;
        d.d.features_needed = &fr;
        {
            const char *want[] = {"drafter-b (10.0.0.2:7720) needs hidden states",
                                  "it asks for final layer after the norm, and verifier verifier-a "
                                  "(10.0.0.1:7710) streams no hidden states (not the final "
                                  "layer after the norm)",
                                  NULL};
            expect_refusal(tdm_compat_check_pair(&v.d, &d.d, r, 8), r, "drafter-features", want);
            CHECK_STR(r[0].a_value, "none");
            CHECK_STR(r[0].b_value, "final layer after the norm");
        }
        v.d.features_available = have;
        v.d.n_features_available = 1;
        CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 0, "final normed streamed: %s",
              r[0].message);
        fr.n_specs = 2; /* an EAGLE-3-style drafter asking for layer 3 as well */
        {
            const char *want[] = {"it asks for final layer after the norm, layer 3",
                                  "streams final layer after the norm (not the layer 3)", NULL};
            expect_refusal(tdm_compat_check_pair(&v.d, &d.d, r, 8), r, "drafter-features", want);
        }
        fr.n_specs = 1;
        Tandem__V1__FeatureSpec pre_norm = final_normed;
        pre_norm.normed = 0; /* before the norm: not the same state */
        need[0] = &pre_norm;
        CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 1, "pre-norm state refused");
        need[0] = &final_normed;

        /* ... over a transport both allow (feature_transport). */
        {
            char *grpc_only[] = {"grpc"}, *shm_only[] = {"shm"}, *both[] = {"grpc", "shm"};
            v.d.feature_transports = grpc_only;
            v.d.n_feature_transports = 1;
            CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 0, "drafter lists none: not judged");
            d.d.feature_transports = shm_only;
            d.d.n_feature_transports = 1;
            const char *want[] = {"verifier verifier-a (10.0.0.1:7710) sends hidden states by "
                                  "grpc and drafter drafter-b (10.0.0.2:7720) takes them by shm "
                                  "only (feature_transport)",
                                  NULL};
            expect_refusal(tdm_compat_check_pair(&v.d, &d.d, r, 8), r, "drafter-feature-transport",
                           want);
            CHECK_STR(r[0].a_value, "grpc");
            CHECK_STR(r[0].b_value, "shm");
            v.d.feature_transports = both;
            v.d.n_feature_transports = 2;
            CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 0, "auto meets shm: %s", r[0].message);
            v.d.feature_transports = NULL;
            v.d.n_feature_transports = 0;
            d.d.feature_transports = NULL;
            d.d.n_feature_transports = 0;
        }

        /* Any drafter and its verifier: an exchange transport in common
         * (exchange_transport). */
        {
            char *grpc_only[] = {"grpc"}, *shm_only[] = {"shm"}, *both[] = {"grpc", "shm"};
            v.d.exchange_transports = shm_only;
            v.d.n_exchange_transports = 1;
            CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 0, "drafter lists none: not judged");
            d.d.exchange_transports = grpc_only;
            d.d.n_exchange_transports = 1;
            const char *want[] = {"verifier verifier-a (10.0.0.1:7710) exchanges by shm and "
                                  "drafter drafter-b (10.0.0.2:7720) by grpc only "
                                  "(exchange_transport)",
                                  NULL};
            expect_refusal(tdm_compat_check_pair(&v.d, &d.d, r, 8), r, "drafter-exchange-transport",
                           want);
            CHECK_STR(r[0].a_value, "shm");
            CHECK_STR(r[0].b_value, "grpc");
            d.d.exchange_transports = both;
            d.d.n_exchange_transports = 2;
            CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 0, "auto meets shm: %s", r[0].message);
            v.d.exchange_transports = NULL;
            v.d.n_exchange_transports = 0;
            d.d.exchange_transports = NULL;
            d.d.n_exchange_transports = 0;
        }

        /* ... and the model they belong to must be the verifier's. */
        v.d.model_fingerprint = (char *)FP_A;
        d.d.target_model_fingerprint = (char *)FP_A;
        CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 0, "same target model");
        d.d.target_model_fingerprint = (char *)FP_B;
        {
            const char *want[] = {"drafter-b (10.0.0.2:7720) (mtp) belongs to target model "
                                  "bbbbbbbbbbbb",
                                  "verifier-a (10.0.0.1:7710) serves model aaaaaaaaaaaa", NULL};
            expect_refusal(tdm_compat_check_pair(&v.d, &d.d, r, 8), r, "drafter-target-model",
                           want);
            CHECK(strcmp(r[0].a_value, FP_A) == 0 && strcmp(r[0].b_value, FP_B) == 0,
                  "full fingerprints as values");
        }
        d.d.target_model_fingerprint = ""; /* a drafter of any target */
        CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 0, "no target model");
        make_verifier(&v);
        make_drafter(&d);
    }

    /* Several rules at once: all are reported, and max bounds the array. */
    d.d.draft_block_size = 20;
    d.d.tokenizer_fingerprint = (char *)FP_B;
    CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 8) == 2, "two refusals");
    CHECK(tdm_compat_check_pair(&v.d, &d.d, r, 1) == 2, "count beyond max");
    make_drafter(&d);

    /* Same-role replicas: snapshot layout. */
    desc_store v2;
    make_verifier(&v2);
    v2.d.replica_id = "verifier-c";
    v2.d.address = "10.0.0.3:7710";
    CHECK(tdm_compat_check_replicas(&v.d, &v2.d, r, 8) == 0, "same layout");
    v2.d.snapshot_layout_version = 2;
    {
        const char *want[] = {"verifier verifier-a (10.0.0.1:7710)",
                              "verifier verifier-c (10.0.0.3:7710)", "layout version 1",
                              "layout version 2", NULL};
        expect_refusal(tdm_compat_check_replicas(&v.d, &v2.d, r, 8), r, "snapshot-layout", want);
    }
    /* Same-role replicas: the model a request moves between (verifiers only). */
    v2.d.snapshot_layout_version = v.d.snapshot_layout_version;
    v.d.model_fingerprint = (char *)FP_A;
    v2.d.model_fingerprint = (char *)FP_B;
    {
        const char *want[] = {"verifier-a (10.0.0.1:7710)", "verifier-c (10.0.0.3:7710)", NULL};
        expect_refusal(tdm_compat_check_replicas(&v.d, &v2.d, r, 8), r, "snapshot-model", want);
        CHECK(strcmp(r[0].b_value, FP_B) == 0, "b_value is the other fingerprint");
    }
    {
        desc_store d2;
        make_drafter(&d2);
        d2.d.model_fingerprint = (char *)FP_B;
        CHECK(tdm_compat_check_replicas(&d.d, &d2.d, r, 8) == 0,
              "drafters of other models move nothing between them");
    }
    v2.d.model_fingerprint = v.d.model_fingerprint;
    v2.d.snapshot_layout_version = 2;
    /* Pair rules are not replica rules and vice versa. */
    CHECK(tdm_compat_check_pair(&v.d, &v2.d, r, 8) == 0, "layout is not a pair rule");

    /* Refusal message through the wire. */
    tdm_compat_check_replicas(&v.d, &v2.d, r, 8);
    Tandem__V1__Refusal pr = TANDEM__V1__REFUSAL__INIT;
    tdm_compat_refusal_to_proto(&r[0], &pr);
    size_t n = tandem__v1__refusal__get_packed_size(&pr);
    uint8_t *buf = malloc(n);
    tandem__v1__refusal__pack(&pr, buf);
    Tandem__V1__Refusal *back = tandem__v1__refusal__unpack(NULL, n, buf);
    CHECK(back && strcmp(back->rule, "snapshot-layout") == 0, "rule survives");
    CHECK(back && strcmp(back->a_replica, "verifier-a (10.0.0.1:7710)") == 0, "a_replica");
    CHECK(back && strcmp(back->b_value, "2") == 0, "b_value");
    CHECK(back && strcmp(back->message, r[0].message) == 0, "message");
    tandem__v1__refusal__free_unpacked(back, NULL);
    free(buf);
    tdm_compat_refusal_proto_clear(&pr);

    /* The table lists each rule once with a summary. */
    size_t nr = 0;
    const tdm_compat_rule *rules = tdm_compat_rules(&nr);
    const char *ids[] = {"tokenizer-fingerprint",     "draft-block-size",
                         "prefix-cache-state",        "protocol-major",
                         "snapshot-layout",           "snapshot-model",
                         "drafter-features",          "drafter-target-model",
                         "drafter-feature-transport", "drafter-exchange-transport"};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        int found = 0;
        for (size_t j = 0; j < nr; j++)
            found += strcmp(rules[j].id, ids[i]) == 0 && rules[j].summary[0];
        CHECK(found == 1, "rule %s in the table", ids[i]);
    }
}

/* ---- fingerprints --------------------------------------------------------- */

static char g_dir[256];

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

/* Writes a safetensors file with the given header JSON and `data` zero bytes. */
static void write_safetensors(const char *path, const char *header, size_t data)
{
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(header);
    for (int i = 0; i < 8; i++)
        fputc((int)((n >> (8 * i)) & 0xff), f);
    fputs(header, f);
    for (size_t i = 0; i < data; i++)
        fputc(0, f);
    fclose(f);
}

static void test_fingerprints(void)
{
    snprintf(g_dir, sizeof(g_dir), "%s/tdm-compat-XXXXXX",
             getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        exit(2);
    }
    char a[65], b[65];
    tdm_error err;
    /* Tokenizer fingerprints are the tokenizer module's; their exact value is
     * checked against an independent implementation by
     * compat_fingerprint_reference. Here: bad input gets an error naming the
     * file, never a crash. */
    char tp[512];
    snprintf(tp, sizeof(tp), "%s/tokenizer.json", g_dir);
    write_file(tp, "{\"model\": ");
    CHECK(tdm_compat_tokenizer_fingerprint_file(tp, b, &err) != TDM_OK && strstr(err.msg, tp),
          "truncated tokenizer.json: %s", err.msg);
    write_file(tp, "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
    CHECK(tdm_compat_tokenizer_fingerprint_file(tp, b, &err) != TDM_OK, "unsupported model");
    CHECK(tdm_compat_tokenizer_fingerprint_file("/nonexistent.json", b, &err) != TDM_OK &&
              strstr(err.msg, "/nonexistent.json"),
          "missing file: %s", err.msg);

    /* Model fingerprint: config + tensor names/shapes/dtypes, not data. */
    char dir[512], p[700];
    snprintf(dir, sizeof(dir), "%s/model", g_dir);
    mkdir(dir, 0755);
    snprintf(p, sizeof(p), "%s/config.json", dir);
    write_file(p, "{\"vocab_size\": 10, \"hidden_size\": 4, \"transformers_version\": \"5.0\"}");
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                      "\"__metadata__\":{\"format\":\"pt\"}}";
    write_safetensors(p, hdr, 16);
    CHECK(tdm_compat_model_fingerprint_dir(dir, a, &err) == TDM_OK, "%s", err.msg);
    /* transformers_version and data do not count */
    snprintf(p, sizeof(p), "%s/config.json", dir);
    write_file(p, "{\"hidden_size\": 4, \"vocab_size\": 10, \"transformers_version\": \"5.9\"}");
    CHECK(tdm_compat_model_fingerprint_dir(dir, b, &err) == TDM_OK && strcmp(a, b) == 0,
          "irrelevant config key changed the fingerprint");
    /* a real config change does */
    write_file(p, "{\"hidden_size\": 8, \"vocab_size\": 10}");
    CHECK(tdm_compat_model_fingerprint_dir(dir, b, &err) == TDM_OK && strcmp(a, b) != 0,
          "config change");
    write_file(p, "{\"hidden_size\": 4, \"vocab_size\": 10}");
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    write_safetensors(p, "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}", 8);
    CHECK(tdm_compat_model_fingerprint_dir(dir, b, &err) == TDM_OK && strcmp(a, b) != 0,
          "dtype change");
    /* Sharded with the same tensors: the same fingerprint as one file. */
    write_safetensors(p,
                      "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[4,20]}}",
                      20);
    CHECK(tdm_compat_model_fingerprint_dir(dir, a, &err) == TDM_OK, "%s", err.msg);
    unlink(p);
    snprintf(p, sizeof(p), "%s/model-00001-of-00002.safetensors", dir);
    write_safetensors(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16);
    snprintf(p, sizeof(p), "%s/model-00002-of-00002.safetensors", dir);
    write_safetensors(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    snprintf(p, sizeof(p), "%s/model.safetensors.index.json", dir);
    write_file(p, "{\"metadata\":{},\"weight_map\":{\"w\":\"model-00001-of-00002.safetensors\","
                  "\"x\":\"model-00002-of-00002.safetensors\"}}");
    CHECK(tdm_compat_model_fingerprint_dir(dir, b, &err) == TDM_OK && strcmp(a, b) == 0,
          "sharded == single: %s", err.msg);
    /* Corrupt inputs: errors naming the file. */
    write_file(p, "{\"weight_map\":{\"w\":\"../evil.safetensors\"}}");
    CHECK(tdm_compat_model_fingerprint_dir(dir, b, &err) != TDM_OK &&
              strstr(err.msg, "not a plain file name"),
          "path escape: %s", err.msg);
    unlink(p);
    CHECK(tdm_compat_model_fingerprint_dir(dir, b, &err) == TDM_ERR_NOT_FOUND, "no weights");
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    FILE *f = fopen(p, "wb");
    fwrite("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 1, 10, f);
    fclose(f);
    CHECK(tdm_compat_model_fingerprint_dir(dir, b, &err) != TDM_OK &&
              strstr(err.msg, "header length"),
          "lying header length: %s", err.msg);
    write_safetensors(p, "{\"w\":{\"dtype\":\"F32\"}}", 0);
    CHECK(tdm_compat_model_fingerprint_dir(dir, b, &err) != TDM_OK && strstr(err.msg, "'w'"),
          "tensor without shape: %s", err.msg);
    write_safetensors(p, "[1,2]", 0);
    CHECK(tdm_compat_model_fingerprint_dir(dir, b, &err) != TDM_OK, "header not an object");

    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", g_dir);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "tokenizer-fp") == 0) {
        char fp[65];
        tdm_error err;
        if (tdm_compat_tokenizer_fingerprint_file(argv[2], fp, &err) != TDM_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        printf("%s\n", fp);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "model-fp") == 0) {
        char fp[65];
        tdm_error err;
        if (tdm_compat_model_fingerprint_dir(argv[2], fp, &err) != TDM_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        printf("%s\n", fp);
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "rules") == 0) {
        test_rules();
        test_gpu_sharing();
        test_cores();
    } else if (argc == 2 && strcmp(argv[1], "fingerprints") == 0)
        test_fingerprints();
    else {
        fprintf(stderr, "usage: compat_test rules|fingerprints|tokenizer-fp FILE|model-fp DIR\n");
        return 2;
    }
    if (g_failures) {
        fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
