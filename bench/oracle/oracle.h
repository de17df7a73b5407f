/*
 * oracle.h - controlled acceptance for benchmarks of random-weight models: a
 * drafter that still runs its model for every draft (its cost is real) but
 * proposes the target's own continuation with probability a per position,
 * and a wrong token otherwise.
 *
 * Built only into the benchmark binary bench_drafter_oracle (never into
 * tandem-drafter: no configuration can switch it on). It reads, at start,
 *   TANDEM_BENCH_ORACLE   a file of recorded greedy runs, one per line: the
 *                         prompt's ids, then the target's output ids, all
 *                         space-separated (bench_spec_client --record)
 *   TANDEM_BENCH_ACCEPT   a in [0, 1]
 *   TANDEM_BENCH_HIDE_DEVICE  set: the drafter reports no device_uuid, so a
 *                         verifier on the same GPU still lets it draft ahead
 *                         (to measure what drafting ahead does there)
 * A position's choice is drawn from a hash of (run, position): the same
 * position gets the same choice however often it is drafted again.
 */
#ifndef TANDEM_BENCH_ORACLE_H
#define TANDEM_BENCH_ORACLE_H

#include "status.h"

#include <stdint.h>

/* Loads the recorded runs (a clear error naming the variable or the line). */
tdm_status tdm_bench_oracle_load(tdm_error *err);

/* The token to propose after ctx[0..n) + ext[0..n_ext): the recorded one
 * with probability a, else another; `own` (the drafter's pick) when no
 * recorded run continues that context. */
int32_t tdm_bench_oracle(const int32_t *ctx, int n, const int32_t *ext, int n_ext, int32_t own,
                         int vocab);

#endif
