/*
 * ngram.h - the model-free drafter: prompt lookup.
 *
 * Finds the most recent earlier occurrence of the context's last n tokens
 * (n from n_max down to n_min) and proposes the tokens that followed it.
 * Costs no model and pays on repetitive text (code edits, quoting, lists).
 */
#ifndef TANDEM_SPEC_NGRAM_H
#define TANDEM_SPEC_NGRAM_H

#include <stdint.h>

/* Writes up to k proposed tokens to out and returns how many (0 when no
 * earlier occurrence exists). */
int tdm_ngram_propose(const uint32_t *ctx, int len, int n_min, int n_max, int k, uint32_t *out);

#endif
