/*
 * cuda_test.h - helpers shared by the CUDA backend tests: the skip protocol
 * when no GPU is present, random data, and moving buffers through a backend.
 */
#ifndef TANDEM_TESTS_CUDA_TEST_H
#define TANDEM_TESTS_CUDA_TEST_H

#include "backend.h"
#include "cuda_backend.h"
#include "util.h" /* CHECK, fixtures (tests/engine) */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CT_SKIP 77 /* ctest's skip code (SKIP_RETURN_CODE) */

/* Exits with CT_SKIP, saying so, when this machine has no CUDA device. */
void ct_require_gpu(void);
/* The CUDA backend on device 0, the CPU backend with 2 threads. */
tdm_backend *ct_gpu(void);
tdm_backend *ct_cpu(void);

/* Uniform in [-a, a), from a fixed-seed generator advanced by every call. */
void ct_fill(float *x, size_t n, float a);
int ct_rand(int n);
uint16_t ct_f32_to_bf16(float f); /* round to nearest even */
uint16_t ct_f32_to_f16(float f);  /* round to nearest even; |f| < 65504 */
float ct_bf16_to_f32(uint16_t h);
float ct_f16_to_f32(uint16_t h);

/* Backend memory holding a copy of host bytes; NULL host = zeros. */
void *ct_put(tdm_backend *be, const void *host, size_t nbytes);
/* A host copy (malloc) of backend memory. */
void *ct_get(tdm_backend *be, const void *dev, size_t nbytes);
/* Fills backend memory with 0xFF bytes: NaN as floats, so an output element
 * an op fails to write shows up. */
void ct_poison(tdm_backend *be, void *dev, size_t nbytes);

/* ‖a − b‖ / ‖b‖ (plain ‖a − b‖ when ‖b‖ = 0); +inf if a has a NaN. */
double ct_nerr(const float *a, const float *b, size_t n);

#endif
