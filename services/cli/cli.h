/*
 * cli.h - the `tandem` command: one binary, one file per subcommand.
 *
 * Each subcommand is `int cli_<name>(int argc, char **argv)` where argv[0] is
 * the subcommand's name; it returns the process exit status. The dispatch
 * table lives in main.c.
 */
#ifndef TANDEM_CLI_H
#define TANDEM_CLI_H

typedef struct cli_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} cli_command;

int cli_version(int argc, char **argv);
int cli_check_config(int argc, char **argv);
int cli_doctor(int argc, char **argv);
int cli_status(int argc, char **argv);
int cli_drain(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_detokenize(int argc, char **argv);
int cli_logits(int argc, char **argv);

/* The descriptor of the replica registered as `id` in a gateway's status
 * (cli_status.c); NULL when none is. */
struct Tandem__V1__StatusResponse;
struct Tandem__V1__Descriptor;
const struct Tandem__V1__Descriptor *cli_status_replica(const struct Tandem__V1__StatusResponse *s,
                                                        const char *id);

#endif
