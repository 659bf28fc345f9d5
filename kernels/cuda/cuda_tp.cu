// cuda_tp.cu - tensor parallelism's all-reduce between the GPUs of one
// process: NCCL communicators, one a device (backend.h, cuda_tp_*).
//
// NCCL is loaded with dlopen when a group is first made, not linked: quire
// starts on machines without it, and a one-GPU run never loads it.  Its
// header gives the functions' types (the build needs nccl.h, from NCCL's
// development package or a CUDA toolkit that bundles it; without it a
// group is refused).
//
// NVLink multicast (NVLS) is left off unless the caller's environment says
// otherwise: on shared hosts a program using it can take the GPUs out of
// service, and one process's two-to-eight-GPU all-reduces of a few hundred
// KB do not need it.
//
// Sums of up to AR_CAP floats (a decode step's, up to 256 tokens of a
// 4096-wide model) take a kernel of quire's own where the GPUs reach each
// other's memory (peer access, NVLink): each rank copies its partial sums
// into an exchange buffer of its own, tells every other rank so through a
// flag in that rank's memory, waits for theirs, and adds all the ranks'
// buffers in rank order - one kernel, against NCCL's 8-17 us a sum at these
// sizes on the H200 pair (bench/RESULTS.md).  Two channels, each with its
// own buffers, flags and counts: one of 32 blocks for short sums, one of
// 128 for long ones (from AR_WIDE floats).  A channel's kernel always runs
// on its grid; block b of every rank handles the same slice, and its flags
// carry the count of the channel's sums so far (a counter per block in
// each rank's memory, the same on every rank, since every rank makes every
// sum): the value is read on the device, so a sum captured in a CUDA graph
// stays right when replayed.  The exchange buffers alternate with the
// count's parity: a rank writes the buffer that its peers last read two of
// the channel's sums ago, and it only gets there after each peer has
// entered the sum in between, which they do after finishing the one before
// (one stream: kernels run in order).  A block that waits over 10 s for a
// peer, or whose group is aborted, gives up and marks the group stopped (a
// host-visible flag): cuda_tp_ok then says so, the backend that owns the
// group fails the pass and every later one (engine/tp.c), and no later sum
// is enqueued.  QUIRE_TP_P2P=0 sends every sum through NCCL.
//
// An aborted group's communicators are revoked where NCCL has
// ncclCommRevoke (their operations end, later calls fail, nothing is freed
// under a thread about to use them or a graph that captured them) and freed
// when the group is destroyed, after its backends dropped their graphs.
// Without it they are aborted on a thread of their own: ncclCommAbort ends
// the operations at once but then waits until every graph that captured one
// is destroyed, which the backends do only when they are destroyed; the
// group's destruction, after theirs, joins that thread.
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.cuh"

#ifdef QUIRE_HAVE_NCCL_H
#include <nccl.h>

typedef struct {
    decltype(&ncclGetVersion) get_version;
    decltype(&ncclGetErrorString) error_string;
    decltype(&ncclCommInitAll) init_all;
    decltype(&ncclCommDestroy) destroy;
    decltype(&ncclCommAbort) abort;
    decltype(&ncclAllReduce) all_reduce;
    decltype(&ncclGroupStart) group_start;
    decltype(&ncclGroupEnd) group_end;
    decltype(&ncclCommRevoke) revoke; // NULL before NCCL 2.28
} nccl_api;

static nccl_api nc;
static pthread_mutex_t nc_mu = PTHREAD_MUTEX_INITIALIZER;
static int nc_loaded; // 1 loaded, -1 failed
static char nc_why[256];

// Loads libnccl once: 0, or QERR_UNSUPPORTED with the reason in nc_why.
static int nccl_load(void)
{
    pthread_mutex_lock(&nc_mu);
    if (!nc_loaded) {
        const char *env = getenv("QUIRE_NCCL_LIB");
        const char *names[] = { env && *env ? env : "libnccl.so.2", "libnccl.so" };
        void *h = NULL;
        size_t used = 0;
        for (size_t i = 0; i < (env && *env ? 1 : 2) && !h; i++)
            if ((h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL))) used = i;
        if (!h) {
            snprintf(nc_why, sizeof nc_why, "cannot load NCCL (%s; QUIRE_NCCL_LIB names the library)", dlerror());
        } else {
            struct {
                void **fn;
                const char *name;
            } syms[] = { { (void **)&nc.get_version, "ncclGetVersion" },
                         { (void **)&nc.error_string, "ncclGetErrorString" },
                         { (void **)&nc.init_all, "ncclCommInitAll" },
                         { (void **)&nc.destroy, "ncclCommDestroy" },
                         { (void **)&nc.abort, "ncclCommAbort" },
                         { (void **)&nc.all_reduce, "ncclAllReduce" },
                         { (void **)&nc.group_start, "ncclGroupStart" },
                         { (void **)&nc.group_end, "ncclGroupEnd" } };
            for (size_t i = 0; i < sizeof syms / sizeof syms[0] && !nc_why[0]; i++)
                if (!(*syms[i].fn = dlsym(h, syms[i].name)))
                    snprintf(nc_why, sizeof nc_why, "NCCL (%s) lacks %s", names[used], syms[i].name);
            nc.revoke = (decltype(&ncclCommRevoke))dlsym(h, "ncclCommRevoke");
            if (nc_why[0]) dlclose(h);
            else setenv("NCCL_NVLS_ENABLE", "0", 0); // see the top of the file; before any communicator
        }
        nc_loaded = nc_why[0] ? -1 : 1;
    }
    const int rc = nc_loaded == 1 ? 0 : QERR_UNSUPPORTED;
    pthread_mutex_unlock(&nc_mu);
    return rc;
}

typedef struct {
    cuda_tp *g;
    int rank;
} tp_member;

#define AR_CHANNELS 2
#define AR_MAX_BLOCKS 128
#define AR_THREADS 512
#define AR_CAP ((size_t)1 << 20)  // floats
#define AR_WIDE ((size_t)1 << 16) // floats from which a sum takes the wide channel
static const int ar_grid[AR_CHANNELS] = { 32, AR_MAX_BLOCKS };

typedef struct {
    float *x[CUDA_TP_MAX][2];    // each rank's exchange buffers (AR_CAP floats), by parity
    unsigned *flag[CUDA_TP_MAX]; // each rank's flags: [block][the rank that set it]
} ar_peers;

struct cuda_tp {
    int n;
    int aborted;
    int comms_freed;             // aborted by an NCCL without ncclCommRevoke
    int aborting;                // ... on abort_th, joined when the group is freed
    pthread_t abort_th;
    int want_p2p;                // QUIRE_TP_P2P when it was made (the idle cache matches it)
    cuda_tp *next_idle;
    ncclComm_t comm[CUDA_TP_MAX];
    tp_member member[CUDA_TP_MAX];
    int p2p;                     // quire's own sums (peer access on)
    ar_peers peers[AR_CHANNELS];
    unsigned *count[AR_CHANNELS][CUDA_TP_MAX]; // each rank's [AR_MAX_BLOCKS] sums so far, on its device
    volatile int *stop;          // host memory the devices see: set on abort or a timeout
};

__device__ __forceinline__ void st_release_sys(unsigned *p, unsigned v)
{
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire_sys(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ uint64_t global_ns()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The sum of the nr ranks' buf (n floats, n % 4 == 0) into every rank's
// buf, and its copy in C (NULL: none); see the top of the file.
template <typename C>
__global__ void __launch_bounds__(AR_THREADS)
    allreduce_kernel(float *buf, int n, int rank, int nr, ar_peers P, unsigned *count, C *copy, volatile int *stop)
{
    const int b = blockIdx.x, t = threadIdx.x;
    const unsigned sum_no = count[b] + 1;
    const int par = sum_no & 1;
    const int n4 = n / 4, per = (n4 + gridDim.x - 1) / gridDim.x, lo = b * per, hi = min(n4, lo + per);
    float4 *mine = (float4 *)P.x[rank][par];
    const float4 *in = (const float4 *)buf;
    for (int i = lo + t; i < hi; i += AR_THREADS) mine[i] = in[i];
    __syncthreads();
    if (t < nr && t != rank) {
        st_release_sys(P.flag[t] + b * CUDA_TP_MAX + rank, sum_no);
        const unsigned *f = P.flag[rank] + b * CUDA_TP_MAX + t;
        const uint64_t t0 = global_ns();
        for (unsigned k = 1; (int)(ld_acquire_sys(f) - sum_no) < 0; k++)
            if (!(k & 1023) && (*stop || global_ns() - t0 > 10000000000ull)) {
                *stop = 1;
                break;
            }
    }
    __syncthreads();
    for (int i = lo + t; i < hi; i += AR_THREADS) {
        float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int p = 0; p < nr; p++) {
            const float4 v = p == rank ? mine[i] : __ldcv((const float4 *)P.x[p][par] + i);
            s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
        }
        ((float4 *)buf)[i] = s;
        if (copy) {
            C *c = copy + 4 * (size_t)i;
            c[0] = fromf<C>(s.x), c[1] = fromf<C>(s.y), c[2] = fromf<C>(s.z), c[3] = fromf<C>(s.w);
        }
    }
    if (t == 0) count[b] = sum_no;
}

// Peer access between every pair, the exchange buffers, flags and counts:
// 0, or nonzero (then the sums go through NCCL).
static int p2p_setup(cuda_tp *g)
{
    const int n = g->n;
    for (int r = 0; r < n; r++)
        for (int p = 0; p < n; p++) {
            int ok = 0;
            if (p != r && (cudaDeviceCanAccessPeer(&ok, r, p) != cudaSuccess || !ok)) return 1;
        }
    for (int r = 0; r < n; r++) {
        if (cudaSetDevice(r) != cudaSuccess) return 1;
        for (int p = 0; p < n; p++) {
            if (p == r) continue;
            const cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
            else if (e != cudaSuccess) return 1;
        }
        const size_t flags = (size_t)AR_MAX_BLOCKS * CUDA_TP_MAX * sizeof(unsigned);
        for (int c = 0; c < AR_CHANNELS; c++) {
            ar_peers *P = &g->peers[c];
            if (cudaMalloc((void **)&P->x[r][0], 2 * AR_CAP * sizeof(float)) != cudaSuccess ||
                cudaMalloc((void **)&P->flag[r], flags) != cudaSuccess ||
                cudaMalloc((void **)&g->count[c][r], AR_MAX_BLOCKS * sizeof(unsigned)) != cudaSuccess ||
                cudaMemset(P->flag[r], 0, flags) != cudaSuccess ||
                cudaMemset(g->count[c][r], 0, AR_MAX_BLOCKS * sizeof(unsigned)) != cudaSuccess)
                return 1;
            P->x[r][1] = P->x[r][0] + AR_CAP;
        }
        if (cudaDeviceSynchronize() != cudaSuccess) return 1;
    }
    return 0;
}

// The exchange buffers, flags and counts (cudaFree(NULL) is a no-op).
static void p2p_free_buffers(cuda_tp *g)
{
    for (int r = 0; r < g->n; r++) {
        cudaSetDevice(r);
        for (int c = 0; c < AR_CHANNELS; c++) {
            cudaFree(g->peers[c].x[r][0]);
            cudaFree(g->peers[c].flag[r]);
            cudaFree(g->count[c][r]);
            g->peers[c].x[r][0] = g->peers[c].x[r][1] = NULL;
            g->peers[c].flag[r] = NULL;
            g->count[c][r] = NULL;
        }
    }
    cudaSetDevice(0);
}

// Frees g: its communicators (a collective over them: one group call), its
// buffers and flag.
static void group_free(cuda_tp *g)
{
    if (!g->comms_freed) {
        if (g->aborted) QLOGI("tensor parallelism: freeing an aborted group's communicators");
        nc.group_start();
        for (int r = 0; r < g->n; r++) g->aborted ? nc.abort(g->comm[r]) : nc.destroy(g->comm[r]);
        nc.group_end();
    }
    if (g->aborting) pthread_join(g->abort_th, NULL); // the backends' graphs are gone: it ends
    p2p_free_buffers(g);
    if (g->stop) cudaFreeHost((void *)g->stop);
    free(g);
}

// Groups whose backend is gone, kept for the next one of the same size:
// making communicators takes about half a second, and a process that
// makes engines one after another (tests, benchmarks) would pay it each
// time.  A group serves one backend at a time (two backends' sums on one
// group could pair with each other's).
static cuda_tp *idle_groups;

extern "C" int cuda_tp_create(int n, cuda_tp **out, char *err, size_t errlen)
{
    *out = NULL;
    const char *pe = getenv("QUIRE_TP_P2P");
    const int want_p2p = !(pe && *pe == '0');
    pthread_mutex_lock(&nc_mu);
    for (cuda_tp **p = &idle_groups; *p; p = &(*p)->next_idle)
        if ((*p)->n == n && (*p)->want_p2p == want_p2p) {
            *out = *p;
            *p = (*p)->next_idle;
            break;
        }
    pthread_mutex_unlock(&nc_mu);
    if (*out) return 0;
    int count = 0;
    if (n < 1 || n > CUDA_TP_MAX)
        return qerr_set(err, errlen, QERR_INVAL, "tensor parallelism: %d GPUs (1 to %d)", n, CUDA_TP_MAX);
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < n)
        return qerr_set(err, errlen, QERR_DEVICE, "tensor parallelism over %d GPUs: this machine has %d", n, count);
    if (nccl_load()) return qerr_set(err, errlen, QERR_UNSUPPORTED, "tensor parallelism: %s", nc_why);
    cuda_tp *g = (cuda_tp *)calloc(1, sizeof *g);
    if (!g) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    g->n = n;
    int devs[CUDA_TP_MAX];
    for (int r = 0; r < n; r++) devs[r] = r, g->member[r].g = g, g->member[r].rank = r;
    ncclResult_t nr = nc.init_all(g->comm, n, devs);
    if (nr != ncclSuccess) {
        free(g);
        return qerr_set(err, errlen, QERR_DEVICE, "tensor parallelism: ncclCommInitAll over %d GPUs: %s", n,
                        nc.error_string(nr));
    }
    // The flag that stops quire's own sums: host memory every device sees.
    int *stop = NULL;
    if (cudaHostAlloc((void **)&stop, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
        group_free(g);
        return qerr_set(err, errlen, QERR_DEVICE, "tensor parallelism: pinned memory for a flag");
    }
    *stop = 0;
    g->stop = stop;
    g->want_p2p = want_p2p;
    g->p2p = want_p2p && n > 1 && !p2p_setup(g);
    if (!g->p2p) p2p_free_buffers(g); // what a failed setup left
    cudaGetLastError();
    // One all-reduce now, outside any graph capture: NCCL connects its
    // ranks at the first one.
    float *buf[CUDA_TP_MAX] = { 0 };
    cudaStream_t st[CUDA_TP_MAX] = { 0 };
    int rc = 0;
    for (int r = 0; r < n && !rc; r++)
        if (cudaSetDevice(r) != cudaSuccess || cudaMalloc((void **)&buf[r], 256 * sizeof(float)) != cudaSuccess ||
            cudaMemset(buf[r], 0, 256 * sizeof(float)) != cudaSuccess || cudaStreamCreate(&st[r]) != cudaSuccess)
            rc = QERR_DEVICE;
    if (!rc) {
        nr = nc.group_start();
        for (int r = 0; r < n && nr == ncclSuccess; r++)
            nr = nc.all_reduce(buf[r], buf[r], 256, ncclFloat32, ncclSum, g->comm[r], st[r]);
        const ncclResult_t ne = nc.group_end();
        if (nr == ncclSuccess) nr = ne;
        for (int r = 0; r < n && nr == ncclSuccess && !rc; r++)
            if (cudaSetDevice(r) != cudaSuccess || cudaStreamSynchronize(st[r]) != cudaSuccess) rc = QERR_DEVICE;
        if (nr != ncclSuccess) rc = QERR_DEVICE;
    }
    for (int r = 0; r < n; r++) {
        cudaSetDevice(r);
        cudaFree(buf[r]);
        if (st[r]) cudaStreamDestroy(st[r]);
    }
    cudaSetDevice(0);
    if (rc) {
        g->aborted = 1;
        group_free(g);
        return qerr_set(err, errlen, QERR_DEVICE, "tensor parallelism: the first all-reduce over %d GPUs failed (%s)",
                        n, nr != ncclSuccess ? nc.error_string(nr) : "a CUDA call");
    }
    int ver = 0;
    nc.get_version(&ver);
    QLOGI("tensor parallelism: NCCL %d.%d.%d over %d GPUs; sums of up to %zu floats by %s", ver / 10000,
          ver / 100 % 100, ver % 100, n, AR_CAP, g->p2p ? "peer access (NVLink or PCIe)" : "NCCL too (no peer access)");
    *out = g;
    return 0;
}

extern "C" void *cuda_tp_member(cuda_tp *g, int rank)
{
    return g && rank >= 0 && rank < g->n ? &g->member[rank] : NULL;
}

extern "C" int cuda_tp_allreduce(void *member, float *buf, size_t n, void *stream, void *copy, int copy_dt)
{
    tp_member *m = (tp_member *)member;
    cuda_tp *g = m->g;
    cudaStream_t st = (cudaStream_t)stream;
    if (__atomic_load_n(&g->aborted, __ATOMIC_ACQUIRE) || *g->stop) return QERR_DEVICE;
    if (copy && copy_dt != QDT_BF16 && copy_dt != QDT_F16) return QERR_INVAL;
    if (g->p2p && n <= AR_CAP && n % 4 == 0) {
        const int c = n >= AR_WIDE, grid = ar_grid[c], r = m->rank;
        unsigned *cnt = g->count[c][r];
        if (!copy)
            allreduce_kernel<float><<<grid, AR_THREADS, 0, st>>>(buf, (int)n, r, g->n, g->peers[c], cnt, (float *)NULL,
                                                                 g->stop);
        else if (copy_dt == QDT_BF16)
            allreduce_kernel<bf16><<<grid, AR_THREADS, 0, st>>>(buf, (int)n, r, g->n, g->peers[c], cnt, (bf16 *)copy,
                                                                g->stop);
        else
            allreduce_kernel<__half><<<grid, AR_THREADS, 0, st>>>(buf, (int)n, r, g->n, g->peers[c], cnt,
                                                                  (__half *)copy, g->stop);
        CK_LAUNCH("allreduce");
        return 0;
    }
    const ncclResult_t nr = nc.all_reduce(buf, buf, n, ncclFloat32, ncclSum, g->comm[m->rank], st);
    if (nr != ncclSuccess) {
        QLOGE("cuda: all-reduce of %zu floats on rank %d: %s", n, m->rank, nc.error_string(nr));
        return QERR_DEVICE;
    }
    if (!copy) return 0;
    return copy_dt == QDT_BF16 ? qk_convert<bf16, float>(st, (bf16 *)copy, buf, n)
                               : qk_convert<__half, float>(st, (__half *)copy, buf, n);
}

typedef struct {
    int n;
    ncclComm_t comm[CUDA_TP_MAX];
} comm_set;

static void *abort_comms(void *arg)
{
    comm_set *c = (comm_set *)arg;
    nc.group_start();
    for (int r = 0; r < c->n; r++) nc.abort(c->comm[r]);
    nc.group_end();
    free(c);
    return NULL;
}

extern "C" void cuda_tp_abort(void *group)
{
    cuda_tp *g = (cuda_tp *)group;
    if (__atomic_exchange_n(&g->aborted, 1, __ATOMIC_ACQ_REL)) return;
    *g->stop = 1; // quire's own sums give up
    if (nc.revoke) {
        for (int r = 0; r < g->n; r++) nc.revoke(g->comm[r], 0);
        return;
    }
    // See the top of the file: the abort may wait for graphs to go.
    comm_set *c = (comm_set *)malloc(sizeof *c);
    g->comms_freed = 1;
    if (!c) { // no memory for the thread's copy: here, then
        nc.group_start();
        for (int r = 0; r < g->n; r++) nc.abort(g->comm[r]);
        nc.group_end();
        return;
    }
    c->n = g->n;
    memcpy(c->comm, g->comm, sizeof c->comm);
    g->aborting = !pthread_create(&g->abort_th, NULL, abort_comms, c);
    if (!g->aborting) abort_comms(c);
}

extern "C" int cuda_tp_ok(void *group)
{
    const cuda_tp *g = (const cuda_tp *)group;
    return !__atomic_load_n(&g->aborted, __ATOMIC_ACQUIRE) && !*g->stop;
}

extern "C" int cuda_tp_peer_sums(const cuda_tp *g) { return g && g->p2p; }

extern "C" void cuda_tp_destroy(cuda_tp *g)
{
    if (!g) return;
    if (!g->aborted && !*g->stop) { // kept for the next backend (a stopped one cannot serve again)
        pthread_mutex_lock(&nc_mu);
        g->next_idle = idle_groups;
        idle_groups = g;
        pthread_mutex_unlock(&nc_mu);
        return;
    }
    g->aborted = 1; // a stopped group's sums may have left NCCL's in flight too
    group_free(g);
}

#else // no nccl.h at build time

extern "C" int cuda_tp_create(int n, cuda_tp **out, char *err, size_t errlen)
{
    *out = NULL;
    return qerr_set(err, errlen, QERR_UNSUPPORTED,
                    "tensor parallelism over %d GPUs: quire was built without NCCL's header (nccl.h)", n);
}
extern "C" void *cuda_tp_member(cuda_tp *, int) { return NULL; }
extern "C" int cuda_tp_allreduce(void *, float *, size_t, void *, void *, int) { return QERR_UNSUPPORTED; }
extern "C" void cuda_tp_abort(void *) {}
extern "C" int cuda_tp_ok(void *) { return 0; }
extern "C" int cuda_tp_peer_sums(const cuda_tp *) { return 0; }
extern "C" void cuda_tp_destroy(cuda_tp *) {}

#endif
