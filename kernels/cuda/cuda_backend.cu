// cuda_backend.cu - the CUDA backend, first version: float32 weights and
// activations on the device, cuBLAS SGEMM for every projection, simple
// kernels for the rest, and attention that reads K/V through the same block
// tables as the CPU backend.  It is the exactness baseline the bf16 /
// tensor-core kernels of issue 5 will be measured against; tests/gpu compares
// it with the CPU backend.
//
// KV layout, as on the CPU: per layer, K and V each hold num_blocks blocks of
// (n_kv_heads, block_size, head_dim) floats.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend.h"
#include "util.h"
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            QLOGE("cuda: %s: %s", #call, cudaGetErrorString(e_));                                  \
            return QERR_DEVICE;                                                                    \
        }                                                                                          \
    } while (0)

typedef struct {
    float *attn_norm, *wq, *wk, *wv, *bq, *bk, *bv, *wo, *ffn_norm, *w_gate, *w_up, *w_down;
} dlayer;

typedef struct {
    qbackend base;
    cublasHandle_t blas;
    cudaStream_t stream;
    dlayer *L;
    float *tok_embd, *out_norm, *output, *inv_freq;
    float *kc, *vc;              // (n_layers, num_blocks, n_kv, bs, hd)
    size_t block_floats;
    // scratch
    int cap_t, cap_ctx_blocks, cap_logits;
    float *x, *xn, *q, *k, *v, *att, *g, *u, *tmp;
    int32_t *d_tok, *d_pos, *d_seq, *d_tables, *d_seq_info, *d_lidx;
    float *d_logits, *h_out;
    size_t tables_cap;
} cuda_be;

// ---- host helpers -------------------------------------------------------------

static int upload_f32(const qtensor *t, float **out)
{
    *out = NULL;
    if (!t->data) return 0;
    size_t n = (size_t)qt_numel(t);
    float *h = (float *)malloc(n * sizeof(float));
    if (!h) return QERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == QDT_F32) h[i] = ((const float *)t->data)[i];
        else if (t->dtype == QDT_F16) h[i] = q_f16_to_f32(((const uint16_t *)t->data)[i]);
        else h[i] = q_bf16_to_f32(((const uint16_t *)t->data)[i]);
    }
    cudaError_t e = cudaMalloc(out, n * sizeof(float));
    if (e == cudaSuccess) e = cudaMemcpy(*out, h, n * sizeof(float), cudaMemcpyHostToDevice);
    free(h);
    if (e != cudaSuccess) {
        QLOGE("cuda: uploading weights: %s", cudaGetErrorString(e));
        return QERR_DEVICE;
    }
    return 0;
}

// ---- kernels ----------------------------------------------------------------------

__global__ void embed_kernel(float *x, const float *emb, const int32_t *tok, int D)
{
    int t = blockIdx.x;
    for (int i = threadIdx.x; i < D; i += blockDim.x) x[(size_t)t * D + i] = emb[(size_t)tok[t] * D + i];
}

// y = x / rms(x) * w, one block per row (double accumulation, as the CPU).
__global__ void rmsnorm_kernel(float *y, const float *x, const float *w, int D, float eps, const int32_t *rows)
{
    __shared__ double red[256];
    int r = rows ? rows[blockIdx.x] : blockIdx.x;
    const float *xr = x + (size_t)r * D;
    double s = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) s += (double)xr[i] * xr[i];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    float scale = (float)(1.0 / sqrt(red[0] / D + eps));
    float *yr = y + (size_t)blockIdx.x * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) yr[i] = (xr[i] * scale) * w[i];
}

__global__ void add_bias_kernel(float *y, const float *b, int N)
{
    int t = blockIdx.x;
    for (int i = threadIdx.x; i < N; i += blockDim.x) y[(size_t)t * N + i] += b[i];
}

__global__ void add_kernel(float *y, const float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

__global__ void swiglu_kernel(float *g, const float *u, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// RoPE on q (H heads) and k (KV heads) of token blockIdx.x; then k, v go to
// the cache at the token's position.
__global__ void rope_store_kernel(float *q, float *k, const float *v, float *kc, float *vc, const float *inv_freq,
                                  const int32_t *pos, const int32_t *seq, const int32_t *seq_info,
                                  const int32_t *tables, int H, int KV, int hd, int rope_dim, int neox, int bs,
                                  size_t block_floats)
{
    int t = blockIdx.x, p = pos[t], half = rope_dim / 2;
    for (int idx = threadIdx.x; idx < (H + KV) * half; idx += blockDim.x) {
        int h = idx / half, i = idx % half;
        float *base = h < H ? q + ((size_t)t * H + h) * hd : k + ((size_t)t * KV + (h - H)) * hd;
        int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float ang = (float)p * inv_freq[i];
        float c = cosf(ang), s = sinf(ang), x0 = base[a], x1 = base[b];
        base[a] = x0 * c - x1 * s;
        base[b] = x1 * c + x0 * s;
    }
    __syncthreads();
    const int32_t *tab = tables + seq_info[seq[t] * 2];
    size_t blk = (size_t)tab[p / bs] * block_floats;
    for (int idx = threadIdx.x; idx < KV * hd; idx += blockDim.x) {
        int g = idx / hd, d = idx % hd;
        size_t off = blk + ((size_t)g * bs + p % bs) * hd + d;
        kc[off] = k[(size_t)t * KV * hd + idx];
        vc[off] = v[(size_t)t * KV * hd + idx];
    }
}

// One block per (token, head): scores over positions 0..pos, softmax, V sum.
__global__ void attn_kernel(float *out, const float *q, const float *kc, const float *vc, const int32_t *pos,
                            const int32_t *seq, const int32_t *seq_info, const int32_t *tables, int H, int KV,
                            int hd, int bs, size_t block_floats, float scale)
{
    extern __shared__ float sh[];
    int t = blockIdx.x / H, h = blockIdx.x % H, g = h / (H / KV), n = pos[t] + 1;
    float *sc = sh;                 // (n)
    __shared__ float red[256];
    const float *qv = q + ((size_t)t * H + h) * hd;
    const int32_t *tab = tables + seq_info[seq[t] * 2];
    float mx = -INFINITY;
    for (int p = threadIdx.x; p < n; p += blockDim.x) {
        const float *kp = kc + (size_t)tab[p / bs] * block_floats + ((size_t)g * bs + p % bs) * hd;
        float s = 0;
        for (int d = 0; d < hd; d++) s += qv[d] * kp[d];
        s *= scale;
        sc[p] = s;
        mx = fmaxf(mx, s);
    }
    red[threadIdx.x] = mx;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + k]);
        __syncthreads();
    }
    mx = red[0];
    __syncthreads();
    float sum = 0;
    for (int p = threadIdx.x; p < n; p += blockDim.x) {
        sc[p] = expf(sc[p] - mx);
        sum += sc[p];
    }
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    float inv = 1.0f / red[0];
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0;
        for (int p = 0; p < n; p++)
            acc += sc[p] * vc[(size_t)tab[p / bs] * block_floats + ((size_t)g * bs + p % bs) * hd + d];
        out[((size_t)t * H + h) * hd + d] = acc * inv;
    }
}

// ---- the forward pass ---------------------------------------------------------------

static int dalloc(float **p, size_t n)
{
    cudaFree(*p);
    *p = NULL;
    return cudaMalloc(p, n * sizeof(float)) == cudaSuccess ? 0 : QERR_DEVICE;
}

static int ensure(cuda_be *be, int T, int n_logits, size_t n_table)
{
    const qhparams *hp = &be->base.w->hp;
    if (T > be->cap_t) {
        int cap = T < 64 ? 64 : T;
        size_t D = hp->dim, Q = (size_t)hp->n_heads * hp->head_dim, KVd = (size_t)hp->n_kv_heads * hp->head_dim,
               F = hp->ffn_dim, mx = D > Q ? D : Q;
        if (dalloc(&be->x, cap * D) || dalloc(&be->xn, cap * mx) || dalloc(&be->q, cap * Q) ||
            dalloc(&be->k, cap * KVd) || dalloc(&be->v, cap * KVd) || dalloc(&be->att, cap * Q) ||
            dalloc(&be->g, cap * F) || dalloc(&be->u, cap * F) || dalloc(&be->tmp, cap * mx))
            return QERR_DEVICE;
        cudaFree(be->d_tok);
        cudaFree(be->d_pos);
        cudaFree(be->d_seq);
        cudaFree(be->d_lidx);
        if (cudaMalloc(&be->d_tok, cap * 4) || cudaMalloc(&be->d_pos, cap * 4) || cudaMalloc(&be->d_seq, cap * 4) ||
            cudaMalloc(&be->d_lidx, cap * 4))
            return QERR_DEVICE;
        be->cap_t = cap;
    }
    if (n_logits > be->cap_logits) {
        cudaFree(be->d_logits);
        free(be->h_out);
        if (cudaMalloc(&be->d_logits, (size_t)n_logits * hp->n_vocab * sizeof(float))) return QERR_DEVICE;
        be->cap_logits = n_logits;
    }
    if (n_table > be->tables_cap) {
        cudaFree(be->d_tables);
        cudaFree(be->d_seq_info);
        if (cudaMalloc(&be->d_tables, n_table * 4) || cudaMalloc(&be->d_seq_info, n_table * 2 * 4)) return QERR_DEVICE;
        be->tables_cap = n_table;
    }
    return 0;
}

// y(T, N) = x(T, K) W(N, K)^T, row-major, through column-major SGEMM.
static int gemm(cuda_be *be, float *y, const float *x, const float *W, int T, int N, int K)
{
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasSgemm(be->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, W, K, x, K, &zero, y, N);
    if (s != CUBLAS_STATUS_SUCCESS) {
        QLOGE("cuda: cublasSgemm failed (%d)", (int)s);
        return QERR_DEVICE;
    }
    return 0;
}

static int cuda_forward(qbackend *base, const qbatch *b, float *logits)
{
    cuda_be *be = (cuda_be *)base;
    const qhparams *hp = &base->w->hp;
    const int T = b->n_tokens, D = hp->dim, H = hp->n_heads, KV = hp->n_kv_heads, hd = hp->head_dim;
    const int bs = base->opts.block_size, nb = base->opts.num_blocks;
    // The same checks as the CPU backend: nothing invalid reaches a kernel.
    if (T <= 0 || b->n_seqs <= 0) return QERR_INVAL;
    int32_t *pos = (int32_t *)malloc(sizeof(int32_t) * T), *seq = (int32_t *)malloc(sizeof(int32_t) * T);
    size_t n_table = 0;
    int max_ctx = 0, rc = 0, covered = 0;
    for (int s = 0; s < b->n_seqs && !rc; s++) {
        const qbatch_seq *q = &b->seqs[s];
        if (q->first != covered || q->n_tokens <= 0 || q->pos0 < 0) rc = QERR_INVAL;
        covered += q->n_tokens;
        long need = ((long)q->pos0 + q->n_tokens + bs - 1) / bs;
        if (!rc && (need > q->n_blocks || covered > T)) rc = QERR_RANGE;
        for (long i = 0; !rc && i < need; i++)
            if (q->block_table[i] < 0 || q->block_table[i] >= nb) rc = QERR_RANGE;
        for (int i = 0; !rc && i < q->n_tokens; i++) {
            pos[q->first + i] = q->pos0 + i;
            seq[q->first + i] = s;
        }
        if (q->pos0 + q->n_tokens > max_ctx) max_ctx = q->pos0 + q->n_tokens;
        n_table += (size_t)need;
    }
    if (!rc && covered != T) rc = QERR_INVAL;
    for (int i = 0; !rc && i < T; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= hp->n_vocab) rc = QERR_RANGE;
    for (int r = 0; !rc && r < b->n_logits; r++)
        if (b->logits_idx[r] < 0 || b->logits_idx[r] >= T || (r && b->logits_idx[r] <= b->logits_idx[r - 1])) rc = QERR_INVAL;
    if (!rc && (size_t)max_ctx * sizeof(float) > 40000) rc = QERR_LIMIT; // attention scores live in shared memory
    if (!rc) rc = ensure(be, T, b->n_logits, n_table + (size_t)b->n_seqs);
    int32_t *tables = NULL, *info = NULL;
    if (!rc) {
        tables = (int32_t *)malloc(sizeof(int32_t) * (n_table + 1));
        info = (int32_t *)malloc(sizeof(int32_t) * 2 * b->n_seqs);
        size_t off = 0;
        for (int s = 0; s < b->n_seqs; s++) {
            const qbatch_seq *q = &b->seqs[s];
            long need = ((long)q->pos0 + q->n_tokens + bs - 1) / bs;
            info[2 * s] = (int32_t)off;
            info[2 * s + 1] = (int32_t)need;
            memcpy(tables + off, q->block_table, sizeof(int32_t) * need);
            off += (size_t)need;
        }
        cudaStream_t st = be->stream;
        if (cudaMemcpyAsync(be->d_tok, b->tokens, 4 * T, cudaMemcpyHostToDevice, st) ||
            cudaMemcpyAsync(be->d_pos, pos, 4 * T, cudaMemcpyHostToDevice, st) ||
            cudaMemcpyAsync(be->d_seq, seq, 4 * T, cudaMemcpyHostToDevice, st) ||
            cudaMemcpyAsync(be->d_tables, tables, 4 * n_table, cudaMemcpyHostToDevice, st) ||
            cudaMemcpyAsync(be->d_seq_info, info, 8 * b->n_seqs, cudaMemcpyHostToDevice, st) ||
            (b->n_logits && cudaMemcpyAsync(be->d_lidx, b->logits_idx, 4 * b->n_logits, cudaMemcpyHostToDevice, st)))
            rc = QERR_DEVICE;
        cudaStreamSynchronize(st);
    }
    free(pos);
    free(seq);
    free(tables);
    free(info);
    if (rc) return rc;

    cudaStream_t st = be->stream;
    const int qd = H * hd, kvd = KV * hd, F = hp->ffn_dim;
    const size_t layer_floats = (size_t)nb * be->block_floats;
    embed_kernel<<<T, 128, 0, st>>>(be->x, be->tok_embd, be->d_tok, D);
    for (int l = 0; l < hp->n_layers && !rc; l++) {
        const dlayer *L = &be->L[l];
        rmsnorm_kernel<<<T, 256, 0, st>>>(be->xn, be->x, L->attn_norm, D, hp->norm_eps, NULL);
        if ((rc = gemm(be, be->q, be->xn, L->wq, T, qd, D)) || (rc = gemm(be, be->k, be->xn, L->wk, T, kvd, D)) ||
            (rc = gemm(be, be->v, be->xn, L->wv, T, kvd, D)))
            break;
        if (L->bq) add_bias_kernel<<<T, 128, 0, st>>>(be->q, L->bq, qd);
        if (L->bk) add_bias_kernel<<<T, 128, 0, st>>>(be->k, L->bk, kvd);
        if (L->bv) add_bias_kernel<<<T, 128, 0, st>>>(be->v, L->bv, kvd);
        float *kc = be->kc + (size_t)l * layer_floats, *vc = be->vc + (size_t)l * layer_floats;
        rope_store_kernel<<<T, 128, 0, st>>>(be->q, be->k, be->v, kc, vc, be->inv_freq, be->d_pos, be->d_seq,
                                             be->d_seq_info, be->d_tables, H, KV, hd, hp->rope_dim, hp->rope_neox, bs,
                                             be->block_floats);
        attn_kernel<<<T * H, 128, (size_t)max_ctx * sizeof(float), st>>>(
            be->att, be->q, kc, vc, be->d_pos, be->d_seq, be->d_seq_info, be->d_tables, H, KV, hd, bs,
            be->block_floats, 1.0f / sqrtf((float)hd));
        if ((rc = gemm(be, be->tmp, be->att, L->wo, T, D, qd))) break;
        add_kernel<<<(T * D + 255) / 256, 256, 0, st>>>(be->x, be->tmp, (size_t)T * D);
        rmsnorm_kernel<<<T, 256, 0, st>>>(be->xn, be->x, L->ffn_norm, D, hp->norm_eps, NULL);
        if ((rc = gemm(be, be->g, be->xn, L->w_gate, T, F, D)) || (rc = gemm(be, be->u, be->xn, L->w_up, T, F, D)))
            break;
        swiglu_kernel<<<(T * F + 255) / 256, 256, 0, st>>>(be->g, be->u, (size_t)T * F);
        if ((rc = gemm(be, be->tmp, be->g, L->w_down, T, D, F))) break;
        add_kernel<<<(T * D + 255) / 256, 256, 0, st>>>(be->x, be->tmp, (size_t)T * D);
    }
    if (!rc && b->n_logits > 0) {
        rmsnorm_kernel<<<b->n_logits, 256, 0, st>>>(be->xn, be->x, be->out_norm, D, hp->norm_eps, be->d_lidx);
        rc = gemm(be, be->d_logits, be->xn, be->output, b->n_logits, hp->n_vocab, D);
        if (!rc && cudaMemcpyAsync(logits, be->d_logits, sizeof(float) * b->n_logits * hp->n_vocab,
                                   cudaMemcpyDeviceToHost, st))
            rc = QERR_DEVICE;
    }
    cudaError_t e = cudaStreamSynchronize(st);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) {
        QLOGE("cuda: forward: %s", cudaGetErrorString(e));
        return QERR_DEVICE;
    }
    return rc;
}

// ---- blocks -------------------------------------------------------------------------

static size_t cuda_block_bytes(const qbackend *base)
{
    const cuda_be *be = (const cuda_be *)base;
    return 2 * (size_t)base->w->hp.n_layers * be->block_floats * sizeof(float);
}

static int cuda_copy_block(qbackend *base, int src, int dst)
{
    cuda_be *be = (cuda_be *)base;
    const int nb = base->opts.num_blocks;
    if (src < 0 || src >= nb || dst < 0 || dst >= nb) return QERR_RANGE;
    if (src == dst) return 0;
    size_t n = be->block_floats * sizeof(float);
    for (int l = 0; l < base->w->hp.n_layers; l++) {
        size_t lo = (size_t)l * nb * be->block_floats;
        CK(cudaMemcpyAsync(be->kc + lo + (size_t)dst * be->block_floats, be->kc + lo + (size_t)src * be->block_floats, n,
                           cudaMemcpyDeviceToDevice, be->stream));
        CK(cudaMemcpyAsync(be->vc + lo + (size_t)dst * be->block_floats, be->vc + lo + (size_t)src * be->block_floats, n,
                           cudaMemcpyDeviceToDevice, be->stream));
    }
    CK(cudaStreamSynchronize(be->stream));
    return 0;
}

static int cuda_rw_block(qbackend *base, int block, void *host, int write)
{
    cuda_be *be = (cuda_be *)base;
    const int nb = base->opts.num_blocks, L = base->w->hp.n_layers;
    if (block < 0 || block >= nb) return QERR_RANGE;
    size_t n = be->block_floats * sizeof(float);
    char *h = (char *)host;
    for (int c = 0; c < 2; c++) {
        float *cache = c ? be->vc : be->kc;
        for (int l = 0; l < L; l++, h += n) {
            float *p = cache + ((size_t)l * nb + (size_t)block) * be->block_floats;
            if (write) CK(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice));
            else CK(cudaMemcpy(h, p, n, cudaMemcpyDeviceToHost));
        }
    }
    return 0;
}

static int cuda_read_block(qbackend *base, int block, void *dst) { return cuda_rw_block(base, block, dst, 0); }
static int cuda_write_block(qbackend *base, int block, const void *src)
{
    return cuda_rw_block(base, block, (void *)src, 1);
}

static void cuda_destroy(qbackend *base)
{
    cuda_be *be = (cuda_be *)base;
    if (!be) return;
    if (be->L) {
        for (int l = 0; l < base->w->hp.n_layers; l++) {
            float **ps = &be->L[l].attn_norm;
            for (size_t i = 0; i < sizeof(dlayer) / sizeof(float *); i++) cudaFree(ps[i]);
        }
        free(be->L);
    }
    float *bufs[] = { be->tok_embd, be->out_norm, be->inv_freq, be->kc, be->vc, be->x, be->xn, be->q, be->k,
                      be->v, be->att, be->g, be->u, be->tmp, be->d_logits };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    if (be->output && be->output != be->tok_embd) cudaFree(be->output);
    int32_t *ibufs[] = { be->d_tok, be->d_pos, be->d_seq, be->d_tables, be->d_seq_info, be->d_lidx };
    for (size_t i = 0; i < sizeof ibufs / sizeof ibufs[0]; i++) cudaFree(ibufs[i]);
    free(be->h_out);
    if (be->blas) cublasDestroy(be->blas);
    if (be->stream) cudaStreamDestroy(be->stream);
    free(be);
}

static const qbackend_ops cuda_ops = {
    "cuda", cuda_forward, cuda_copy_block, cuda_block_bytes, cuda_read_block, cuda_write_block, cuda_destroy,
};

extern "C" int cuda_backend_create(const qweights *w, const qbackend_opts *opts, qbackend **out, char *err,
                                   size_t errlen)
{
    *out = NULL;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
        return qerr_set(err, errlen, QERR_DEVICE, "no CUDA device");
    if (opts->num_blocks <= 0 || opts->block_size <= 0 || opts->block_size > 4096)
        return qerr_set(err, errlen, QERR_INVAL, "cuda backend: %d blocks of %d tokens", opts->num_blocks,
                        opts->block_size);
    const qhparams *hp = &w->hp;
    cuda_be *be = (cuda_be *)calloc(1, sizeof *be);
    if (!be) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    be->base.ops = &cuda_ops;
    be->base.w = w;
    be->base.opts = *opts;
    be->block_floats = (size_t)hp->n_kv_heads * opts->block_size * hp->head_dim;
    int rc = 0;
    if (cudaStreamCreate(&be->stream) != cudaSuccess || cublasCreate(&be->blas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(be->blas, be->stream) != CUBLAS_STATUS_SUCCESS)
        rc = QERR_DEVICE;
    // Exact float32 products: no TF32 shortcut.
    if (!rc) cublasSetMathMode(be->blas, CUBLAS_PEDANTIC_MATH);
    be->L = (dlayer *)calloc((size_t)hp->n_layers, sizeof *be->L);
    if (!be->L) rc = QERR_NOMEM;
    for (int l = 0; !rc && l < hp->n_layers; l++) {
        const qlayer *s = &w->layers[l];
        dlayer *d = &be->L[l];
        if ((rc = upload_f32(&s->attn_norm, &d->attn_norm)) || (rc = upload_f32(&s->wq, &d->wq)) ||
            (rc = upload_f32(&s->wk, &d->wk)) || (rc = upload_f32(&s->wv, &d->wv)) || (rc = upload_f32(&s->bq, &d->bq)) ||
            (rc = upload_f32(&s->bk, &d->bk)) || (rc = upload_f32(&s->bv, &d->bv)) || (rc = upload_f32(&s->wo, &d->wo)) ||
            (rc = upload_f32(&s->ffn_norm, &d->ffn_norm)) || (rc = upload_f32(&s->w_gate, &d->w_gate)) ||
            (rc = upload_f32(&s->w_up, &d->w_up)) || (rc = upload_f32(&s->w_down, &d->w_down)))
            break;
    }
    if (!rc) rc = upload_f32(&w->tok_embd, &be->tok_embd);
    if (!rc) rc = upload_f32(&w->out_norm, &be->out_norm);
    if (!rc) {
        if (w->output.data == w->tok_embd.data) be->output = be->tok_embd;
        else rc = upload_f32(&w->output, &be->output);
    }
    // RoPE frequencies: computed once on the host exactly as the CPU backend does.
    if (!rc) {
        int half = hp->rope_dim / 2;
        float *f = (float *)malloc(sizeof(float) * (half + 1));
        if (!f) rc = QERR_NOMEM;
        else {
            qrope_inv_freq(w, f);
            if (cudaMalloc(&be->inv_freq, sizeof(float) * (half + 1)) ||
                cudaMemcpy(be->inv_freq, f, sizeof(float) * half, cudaMemcpyHostToDevice))
                rc = QERR_DEVICE;
            free(f);
        }
    }
    size_t total = be->block_floats * (size_t)opts->num_blocks * hp->n_layers * sizeof(float);
    if (!rc && (cudaMalloc(&be->kc, total) != cudaSuccess || cudaMalloc(&be->vc, total) != cudaSuccess))
        rc = QERR_DEVICE;
    if (rc) {
        cuda_destroy(&be->base);
        return qerr_set(err, errlen, rc, "cuda backend: cannot allocate or upload (%s)", qerr_str(rc));
    }
    *out = &be->base;
    return 0;
}
