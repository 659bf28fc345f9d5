// cuda_tp.cu - tensor parallelism's all-reduce between the GPUs of one
// process: NCCL communicators, one a device (backend.h, cuda_tp_*).
//
// NCCL is loaded with dlopen when a group is first made, not linked: quire
// starts on machines without it, and a one-GPU run never loads it.  Its
// header gives the functions' types (the build needs nccl.h, which the CUDA
// toolkit's packages carry; without it a group is refused).
//
// NVLink multicast (NVLS) is left off unless the caller's environment says
// otherwise: on shared hosts a program using it can take the GPUs out of
// service, and one process's two-to-eight-GPU all-reduces of a few hundred
// KB do not need it.
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
        for (size_t i = 0; i < (env && *env ? 1 : 2) && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            snprintf(nc_why, sizeof nc_why, "cannot load NCCL (%s; QUIRE_NCCL_LIB names the library)", dlerror());
        } else {
            struct {
                void **fn;
                const char *name;
            } syms[] = { { (void **)&nc.get_version, "ncclGetVersion" },   { (void **)&nc.error_string, "ncclGetErrorString" },
                         { (void **)&nc.init_all, "ncclCommInitAll" },     { (void **)&nc.destroy, "ncclCommDestroy" },
                         { (void **)&nc.abort, "ncclCommAbort" },          { (void **)&nc.all_reduce, "ncclAllReduce" },
                         { (void **)&nc.group_start, "ncclGroupStart" },   { (void **)&nc.group_end, "ncclGroupEnd" } };
            for (size_t i = 0; i < sizeof syms / sizeof syms[0] && !nc_why[0]; i++)
                if (!(*syms[i].fn = dlsym(h, syms[i].name)))
                    snprintf(nc_why, sizeof nc_why, "NCCL (%s) lacks %s", names[0], syms[i].name);
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

struct cuda_tp {
    int n;
    int aborted;
    cuda_tp *next_idle;
    ncclComm_t comm[CUDA_TP_MAX];
    tp_member member[CUDA_TP_MAX];
};

// Groups whose backend is gone, kept for the next one of the same size:
// making communicators takes about half a second, and a process that
// makes engines one after another (tests, benchmarks) would pay it each
// time.  A group serves one backend at a time (two backends' sums on one
// group could pair with each other's).
static cuda_tp *idle_groups;

extern "C" int cuda_tp_create(int n, cuda_tp **out, char *err, size_t errlen)
{
    *out = NULL;
    pthread_mutex_lock(&nc_mu);
    for (cuda_tp **p = &idle_groups; *p; p = &(*p)->next_idle)
        if ((*p)->n == n) {
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
    setenv("NCCL_NVLS_ENABLE", "0", 0); // see the top of the file
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
        for (int r = 0; r < n; r++) nc.abort(g->comm[r]);
        free(g);
        return qerr_set(err, errlen, QERR_DEVICE, "tensor parallelism: the first all-reduce over %d GPUs failed (%s)", n,
                        nr != ncclSuccess ? nc.error_string(nr) : "a CUDA call");
    }
    int ver = 0;
    nc.get_version(&ver);
    QLOGI("tensor parallelism: NCCL %d.%d.%d over %d GPUs", ver / 10000, ver / 100 % 100, ver % 100, n);
    *out = g;
    return 0;
}

extern "C" void *cuda_tp_member(cuda_tp *g, int rank)
{
    return g && rank >= 0 && rank < g->n ? &g->member[rank] : NULL;
}

extern "C" int cuda_tp_allreduce(void *member, float *buf, size_t n, void *stream)
{
    tp_member *m = (tp_member *)member;
    if (__atomic_load_n(&m->g->aborted, __ATOMIC_ACQUIRE)) return QERR_DEVICE;
    const ncclResult_t nr = nc.all_reduce(buf, buf, n, ncclFloat32, ncclSum, m->g->comm[m->rank], (cudaStream_t)stream);
    if (nr == ncclSuccess) return 0;
    QLOGE("cuda: all-reduce of %zu floats on rank %d: %s", n, m->rank, nc.error_string(nr));
    return QERR_DEVICE;
}

extern "C" void cuda_tp_abort(void *group)
{
    cuda_tp *g = (cuda_tp *)group;
    if (__atomic_exchange_n(&g->aborted, 1, __ATOMIC_ACQ_REL)) return;
    for (int r = 0; r < g->n; r++) nc.abort(g->comm[r]);
}

extern "C" void cuda_tp_destroy(cuda_tp *g)
{
    if (!g) return;
    if (!g->aborted) { // kept for the next backend (an aborted one cannot serve again)
        pthread_mutex_lock(&nc_mu);
        g->next_idle = idle_groups;
        idle_groups = g;
        pthread_mutex_unlock(&nc_mu);
        return;
    }
    free(g);
}

#else // no nccl.h at build time

extern "C" int cuda_tp_create(int n, cuda_tp **out, char *err, size_t errlen)
{
    *out = NULL;
    return qerr_set(err, errlen, QERR_UNSUPPORTED,
                    "tensor parallelism over %d GPUs: quire was built without NCCL's header (nccl.h)", n);
}
extern "C" void *cuda_tp_member(cuda_tp *, int) { return NULL; }
extern "C" int cuda_tp_allreduce(void *, float *, size_t, void *) { return QERR_UNSUPPORTED; }
extern "C" void cuda_tp_abort(void *) {}
extern "C" void cuda_tp_destroy(cuda_tp *) {}

#endif
