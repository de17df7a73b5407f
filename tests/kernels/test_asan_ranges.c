/*
 * test_asan_ranges.c - the CPU backend under AddressSanitizer still stops a
 * call that reaches past a buffer, though its matmul tiles and delta-rule
 * updates run uninstrumented (cpu_internal.h, CPU_UNCHECKED):
 *  - a matmul whose y, x or weights are a row short, or whose x was freed,
 *    is stopped by the range check at its entry, naming the operand;
 *  - so is a delta rule's replay on a state one head's float short;
 *  - an instrumented op (rmsnorm) reading past a backend block is reported
 *    as a use of poisoned memory: the block's rounding to 64 bytes is
 *    poisoned, in heap blocks and in mapped ones (1 MiB and more);
 *  - the same calls on whole buffers run to the end.
 * Each case runs in a child process; the parent reads its stderr.
 */
#include "backend.h"
#include "check.h" /* tests/config */

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

enum { R = 4, IN = 64, OUT = 48, BIG = (1 << 20) / 4 + 64 };

static tdm_backend *be;

static float *fill(size_t n)
{
    float *p = be->alloc(be->ctx, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(i % 7) * 0.25f;
    return p;
}

static void matmul_case(int short_y, int short_x, int short_w, int freed_x, int big_y)
{
    float *x = fill((size_t)(R - short_x) * IN);
    float *w = fill((size_t)(OUT - short_w) * IN);
    /* a mapped block holds y with room to spare, less the rows cut */
    const size_t ny = big_y ? (size_t)BIG : (size_t)R * OUT;
    float *y = fill(ny - (size_t)short_y * OUT);
    float *yy = big_y ? y + (ny - (size_t)R * OUT) : y;
    if (freed_x)
        be->free(be->ctx, x);
    be->matmul(be->ctx, yy, x, (tdm_weight){w, TDM_DTYPE_F32, 0}, R, IN, OUT, 0);
}

static void replay_case(int short_state)
{
    enum { HK = 2, HV = 4, DK = 16, DV = 16, ROWS = 3 };
    float *state = fill((size_t)HV * DK * DV - (size_t)short_state);
    float *rec = fill((size_t)ROWS * tdm_gdn_input_floats(HK, HV, DK, DV));
    tdm_gdn_seg seg = {.nrows = ROWS, .state = state, .inputs = rec};
    be->gdn_replay(be->ctx, &seg, 1, HK, HV, DK, DV);
}

static void rmsnorm_case(int short_x, int big)
{
    const int n = big ? BIG : IN;
    float *x = fill((size_t)n - (size_t)short_x);
    float *y = fill((size_t)n);
    float *wn = fill((size_t)n);
    be->rmsnorm(be->ctx, y, x, wn, 1, n, 1e-6f, 0);
}

/* Runs case c in a child; its exit status (-signal when killed) and the
 * first 64 KiB of its stderr. */
static int run_child(int c, char *err, size_t cap)
{
    int fd[2];
    if (pipe(fd) != 0)
        return -1000;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        be = tdm_backend_cpu_create(1);
        switch (c) {
        case 0:
            matmul_case(0, 0, 0, 0, 0);
            break;
        case 1:
            matmul_case(1, 0, 0, 0, 0);
            break;
        case 2:
            matmul_case(0, 1, 0, 0, 0);
            break;
        case 3:
            matmul_case(0, 0, 1, 0, 0);
            break;
        case 4:
            matmul_case(0, 0, 0, 1, 0);
            break;
        case 5:
            matmul_case(0, 0, 0, 0, 1);
            break;
        case 6:
            matmul_case(1, 0, 0, 0, 1);
            break;
        case 7:
            replay_case(0);
            break;
        case 8:
            replay_case(1);
            break;
        case 9:
            rmsnorm_case(0, 0);
            break;
        case 10:
            rmsnorm_case(2, 0);
            break;
        case 11:
            rmsnorm_case(0, 1);
            break;
        case 12:
            rmsnorm_case(2, 1);
            break;
        }
        _exit(0);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t k;
    while ((k = read(fd[0], err + n, cap - 1 - n)) > 0 && n + (size_t)k < cap - 1)
        n += (size_t)k;
    if (k > 0)
        n += (size_t)k;
    err[n] = 0;
    char sink[4096];
    while (read(fd[0], sink, sizeof(sink)) > 0) {
    }
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

static void expect(int c, const char *what, const char *needle)
{
    static char err[65536];
    int rc = run_child(c, err, sizeof(err));
    if (!needle) {
        CHECK(rc == 0, "%s: exit %d, want 0; stderr:\n%s", what, rc, err);
        return;
    }
    const int before = g_failures;
    CHECK(rc != 0, "%s: ran to the end; want it stopped (%s)", what, needle);
    CHECK(strstr(err, needle) != NULL, "%s: stderr lacks '%s':\n%.3000s", what, needle, err);
    if (g_failures == before)
        printf("%s: stopped (exit %d), '%s' reported\n", what, rc, needle);
}

int main(void)
{
    expect(0, "matmul on whole buffers", NULL);
    expect(1, "matmul, y a row short", "matmul y:");
    expect(2, "matmul, x a row short", "matmul x:");
    expect(3, "matmul, weights a row short", "matmul weights:");
    expect(4, "matmul, x freed", "matmul x:");
    expect(5, "matmul, y in a mapped block", NULL);
    expect(6, "matmul, y a row short in a mapped block", "matmul y:");
    expect(7, "delta rule replay on a whole state", NULL);
    expect(8, "delta rule replay, state a float short", "delta rule state:");
    expect(9, "rmsnorm on a whole row", NULL);
    expect(10, "rmsnorm, x two floats short", "use-after-poison");
    expect(11, "rmsnorm on a whole row in a mapped block", NULL);
    expect(12, "rmsnorm, x two floats short in a mapped block", "use-after-poison");
    if (g_failures)
        fprintf(stderr, "%d check(s) failed\n", g_failures);
    return g_failures ? 1 : 0;
}
