/*
 * main.c - `tandem`: the command-line front of the system. Dispatches to one
 * subcommand per file (cli.h).
 */
#include "cli.h"

#include "buildinfo.h"

#include <stdio.h>
#include <string.h>

static const cli_command commands[] = {
    {"version", cli_version, "print the build's version, revision and compiled features"},
    {"check-config", cli_check_config,
     "check service config files and their compatibility offline"},
    {"doctor", cli_doctor, "check GPU, CUDA, config, model files and replicas before launch"},
    {"generate", cli_generate, "stream a continuation of a prompt from a running gateway"},
    {"status", cli_status, "show the gateway's replicas, pairs formed and pairs refused"},
    {"drain", cli_drain, "move a replica's requests to its peers and stop it (operators)"},
    {"tokenize", cli_tokenize, "print the token ids of a text (or a ChatML conversation)"},
    {"detokenize", cli_detokenize, "print the text of token ids"},
    {"logits", cli_logits,
     "run token ids through a model on the CPU and write or print the logits"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: tandem <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-14s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n`tandem <command> --help` describes a command's options.\n");
}

int cli_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const tdm_build_info *b = tdm_build_info_get();
    printf("tandem %s (revision %s)\n", b->version, b->git_revision);
    printf("compiler:    %s\n", b->compiler);
    printf("build:       %s\n", b->build_type);
    printf("gRPC core:   %s\n", b->grpc_core);
    printf("CUDA:        %s\n", b->cuda_runtime[0] ? b->cuda_runtime : "not built");
    printf("GPU archs:   %s\n", b->gpu_archs[0] ? b->gpu_archs : "none");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "tandem: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
