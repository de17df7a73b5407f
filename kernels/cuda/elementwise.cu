/*
 * elementwise.cu - one thread per output element; the same formulas as the
 * CPU backend (accurate expf/log1pf/sinf/cosf, no fast-math intrinsics).
 */
#include "elementwise.cuh"

#define EW_THREADS 256

__global__ void embed_kernel(float *y, const void *e, tdm_dtype dt, const int32_t *ids, int R,
                             int H)
{
    cuda_kernel_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * (size_t)H)
        return;
    const size_t r = i / (size_t)H, c = i % (size_t)H;
    y[i] = cuda_wload(e, dt, (size_t)ids[r] * (size_t)H + c);
}

void cuda_embed(void *ctx, float *y, tdm_weight e, const int32_t *ids, int R, int H)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (R <= 0 || H <= 0)
        return;
    const int32_t *dids = (const int32_t *)cuda_stage(c, ids, (size_t)R * sizeof(int32_t));
    const size_t n = (size_t)R * (size_t)H;
    cuda_launch(c, embed_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, y, e.data, e.dtype,
                dids, R, H);
}

__global__ void split_qgate_kernel(float *q, float *gate, const float *qg, size_t n, int D)
{
    cuda_kernel_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; /* over [R, nH, D] */
    if (i >= n)
        return;
    const size_t head = i / (size_t)D, d = i % (size_t)D;
    const float *src = qg + head * 2 * (size_t)D;
    q[i] = src[d];
    gate[i] = src[D + d];
}

void cuda_split_qgate(void *ctx, float *q, float *gate, const float *qg, int R, int nH, int D)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    const size_t n = (size_t)R * (size_t)nH * (size_t)D;
    if (n == 0)
        return;
    cuda_launch(c, split_qgate_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, q, gate, qg, n,
                D);
}

/* One thread per (row, head, i < rot/2): rotates the pair (i, i + rot/2). */
__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq, int R, int nH,
                            int D, int half)
{
    cuda_kernel_begin();
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)R * (size_t)nH * (size_t)half)
        return;
    const int i = (int)(t % (size_t)half);
    const size_t rh = t / (size_t)half; /* row * nH + head */
    const int r = (int)(rh / (size_t)nH);
    const float ang = inv_freq[i] * (float)pos[r];
    const float cs = cosf(ang), sn = sinf(ang);
    float *xh = x + rh * (size_t)D;
    const float x1 = xh[i], x2 = xh[i + half];
    xh[i] = x1 * cs - x2 * sn;
    xh[i + half] = x2 * cs + x1 * sn;
}

void cuda_rope(void *ctx, float *x, const int32_t *positions, const float *inv_freq, int R, int nH,
               int D, int rot_dim)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    const int half = rot_dim / 2;
    const size_t n = (size_t)R * (size_t)nH * (size_t)half;
    if (n == 0)
        return;
    const int32_t *dpos = (const int32_t *)cuda_stage(c, positions, (size_t)R * sizeof(int32_t));
    const float *dfreq = (const float *)cuda_stage(c, inv_freq, (size_t)half * sizeof(float));
    cuda_launch(c, rope_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, x, dpos, dfreq, R, nH, D,
                half);
}

void cuda_kv_store(void *ctx, float *k_cache, float *v_cache, const float *k, const float *v,
                   int at, int nrows, int kv_width)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    const size_t n = (size_t)nrows * (size_t)kv_width * sizeof(float);
    if (n == 0)
        return;
    const size_t off = (size_t)at * (size_t)kv_width;
    CUDA_CHECK(cudaMemcpyAsync(k_cache + off, k, n, cudaMemcpyDeviceToDevice, c->stream));
    CUDA_CHECK(cudaMemcpyAsync(v_cache + off, v, n, cudaMemcpyDeviceToDevice, c->stream));
}

__global__ void mul_sigmoid_kernel(float *y, const float *gate, size_t n)
{
    cuda_kernel_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = y[i] * cuda_sigmoid(gate[i]);
}

void cuda_mul_sigmoid(void *ctx, float *y, const float *gate, size_t n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (n == 0)
        return;
    cuda_launch(c, mul_sigmoid_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, y, gate, n);
}

__global__ void silu_mul_kernel(float *y, const float *a, const float *b, size_t n)
{
    cuda_kernel_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = cuda_silu(a[i]) * b[i];
}

void cuda_silu_mul(void *ctx, float *y, const float *a, const float *b, size_t n)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    if (n == 0)
        return;
    cuda_launch(c, silu_mul_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, y, a, b, n);
}

__global__ void gdn_gates_kernel(float *g, float *beta, const float *a, const float *b,
                                 const float *A_log, const float *dt_bias, int R, int Hv)
{
    cuda_kernel_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * (size_t)Hv)
        return;
    const int h = (int)(i % (size_t)Hv);
    const float u = a[i] + dt_bias[h];
    /* torch softplus(beta=1, threshold=20) */
    const float sp = u > 20.0f ? u : log1pf(expf(u));
    g[i] = -expf(A_log[h]) * sp;
    beta[i] = cuda_sigmoid(b[i]);
}

void cuda_gdn_gates(void *ctx, float *g, float *beta, const float *a, const float *b,
                    const float *A_log, const float *dt_bias, int R, int Hv)
{
    cuda_ctx *c = (cuda_ctx *)ctx;
    const size_t n = (size_t)R * (size_t)Hv;
    if (n == 0)
        return;
    cuda_launch(c, gdn_gates_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, g, beta, a, b,
                A_log, dt_bias, R, Hv);
}
