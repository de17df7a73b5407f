/*
 * gpu_arch_test.c - which compute capabilities run which compiled archs
 * (cli_gpu_arch_support), against CUDA's compatibility rules: native code
 * (sm_XY) runs on devices of major X and minor >= Y; PTX (compute_XY) on any
 * device of capability >= X.Y; arch-specific code (sm_90a) on that one
 * capability only.
 */
#include "cli_gpu.h"

#include <stdio.h>
#include <string.h>

static int failures;

static void expect(const char *archs, int major, int minor, cli_gpu_arch want, const char *want_ptx)
{
    char ptx[32] = "";
    cli_gpu_arch got = cli_gpu_arch_support(archs, major, minor, ptx, sizeof(ptx));
    if (got != want || (want == CLI_GPU_ARCH_PTX && strcmp(ptx, want_ptx) != 0)) {
        printf("FAIL: archs '%s' on %d.%d: got %d (%s), want %d (%s)\n", archs, major, minor,
               (int)got, ptx, (int)want, want_ptx);
        failures++;
    }
}

int main(void)
{
    const cli_gpu_arch N = CLI_GPU_ARCH_NATIVE, P = CLI_GPU_ARCH_PTX, X = CLI_GPU_ARCH_NONE;
    expect("sm_90", 9, 0, N, "");            /* H100, H200 */
    expect("sm_90", 10, 0, P, "compute_90"); /* B200: the PTX, compiled at start-up */
    expect("sm_90", 8, 0, X, "");            /* A100: older than the code */
    expect("sm_80", 8, 6, N, "");            /* a later minor of the same major */
    expect("sm_86", 8, 0, X, "");            /* an earlier minor */
    expect("sm_80,sm_90", 9, 0, N, "");
    expect("sm_80,sm_90", 8, 9, N, "");
    expect("sm_80,sm_90", 12, 0, P, "compute_90"); /* the newest PTX */
    expect("sm_90a", 9, 0, N, "");
    expect("sm_90a", 10, 0, X, ""); /* arch-specific: that device only */
    expect("sm_90-real", 10, 0, X, "");
    expect("sm_90-virtual", 9, 0, P, "compute_90");
    expect("sm_100", 10, 3, N, "");
    expect("sm_120", 10, 0, X, "");
    expect("", 9, 0, X, "");
    if (failures)
        return 1;
    printf("ok\n");
    return 0;
}
