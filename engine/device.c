/* device.c - which backend runs the forward passes, and how large its KV
 * pool is.
 *
 * qengine_backend_create() is the one place that turns engine options into a
 * backend, so the engine and the tools that drive a backend directly
 * (quire generate's single prompt) choose alike:
 *
 *   device  AUTO  -> CUDA when the build has it and cuda_device_count() > 0,
 *                    else the CPU, logging why once per creation;
 *           CPU   -> cpu_backend_create;
 *           CUDA  -> cuda_backend_create, or QERR_UNSUPPORTED in a build
 *                    without CUDA.
 *
 *   KV pool size, when the caller does not give num_blocks:
 *     CPU:  kv_mem_mb (0: 256 MiB) of float32 K and V, every layer;
 *     CUDA: kv_mem_mb of bf16 K and V (float32 with exact) when given, else
 *           0, which lets the backend size the pool from the device memory
 *           left after weights and scratch (gpu_mem_util).
 *   The backend writes the count it chose into its opts.num_blocks.
 *
 * tensor_parallel n > 1: the model's n shards on n backends in step
 * (qtp_backend_create: CUDA devices 0 .. n-1, or CPU threads), the pool
 * budget (kv_mem_mb) shared among them.
 *
 * Random weights: a model from qmodel_random(host_data = 0) has no bytes on
 * the host, so its backend must fill them: random_weights is turned on and
 * the model's own seed used (its fingerprint hashes that seed).
 */
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "model.h"
#include "shard.h"
#include "util.h"
#ifdef QUIRE_HAVE_CUDA
#include "cuda_info.h"
#endif

const char *qdevice_name(int device)
{
    switch (device) {
    case QDEVICE_AUTO: return "auto";
    case QDEVICE_CPU: return "cpu";
    case QDEVICE_CUDA: return "cuda";
    default: return "?";
    }
}

int qdevice_parse(const char *s, int *out)
{
    for (int d = QDEVICE_AUTO; d <= QDEVICE_CUDA; d++)
        if (s && !strcmp(s, qdevice_name(d))) {
            *out = d;
            return 0;
        }
    return QERR_INVAL;
}

int qdevice_resolve(int device)
{
    if (device != QDEVICE_AUTO) return device;
#ifdef QUIRE_HAVE_CUDA
    char why[256] = "";
    if (cuda_device_count(why, sizeof why) > 0) return QDEVICE_CUDA;
    QLOGI("no CUDA device: %s; running on the CPU", why[0] ? why : "none found");
#else
    QLOGI("no CUDA device: this build has no CUDA backend; running on the CPU");
#endif
    return QDEVICE_CPU;
}

/* Bytes of one block of block_size tokens at elem_bytes per K/V element,
 * K and V, every layer; 0 for no model. */
static double block_bytes(const qmodel *m, int block_size, double elem_bytes)
{
    const qhparams *hp = m ? &m->hp : NULL;
    return hp ? 2.0 * hp->n_layers * hp->n_kv_heads * hp->head_dim * elem_bytes * block_size : 0;
}

/* Blocks that fit in mb MiB, each block_bytes of m and of beside (NULL:
 * none): at least 1, at most 2^24. */
static int blocks_for_mb(const qmodel *m, const qmodel *beside, int block_size, double mb, double elem_bytes)
{
    double per_block = block_bytes(m, block_size, elem_bytes) + block_bytes(beside, block_size, elem_bytes);
    double n = mb * 1048576.0 / per_block;
    int nb = n > (1 << 24) ? (1 << 24) : (int)n;
    return nb < 1 ? 1 : nb;
}

int qengine_backend_create(const qmodel *m, const qengine_opts *o, int num_blocks, int max_tokens,
                           const qmodel *beside, qbackend **out, char *err, size_t errlen)
{
    *out = NULL;
    const int bs = o->block_size > 0 ? o->block_size : 16;
    int device = o->device;
    if (device != QDEVICE_AUTO && device != QDEVICE_CPU && device != QDEVICE_CUDA)
        return qerr_set(err, errlen, QERR_INVAL, "unknown device %d", device);
    if (o->tensor_parallel < 0 || o->tensor_parallel > 16)
        return qerr_set(err, errlen, QERR_RANGE, "tensor_parallel = %d (1 to 16)", o->tensor_parallel);
    if (!(o->gpu_mem_util >= 0 && o->gpu_mem_util <= 1))
        return qerr_set(err, errlen, QERR_RANGE, "gpu_mem_util = %g (0 < x <= 1, or 0 for the default)",
                        (double)o->gpu_mem_util);
    device = qdevice_resolve(device);
    qbackend_opts bo = {
        .n_threads = o->n_threads,
        .num_blocks = num_blocks,
        .block_size = bs,
        .exact = o->exact,
        .gpu_mem_util = o->gpu_mem_util,
        .random_weights = o->random_weights || m->random_fill == QMODEL_RANDOM_DEVICE,
        .seed = m->random_fill ? m->random_seed : o->seed,
        .random_residual = m->random_residual,
        .max_tokens = max_tokens,
    };
    if (device == QDEVICE_CPU) {
        if (bo.num_blocks <= 0)
            bo.num_blocks = blocks_for_mb(m, beside, bs, o->kv_mem_mb ? (double)o->kv_mem_mb : 256.0, 4.0);
        if (o->tensor_parallel > 1) return qtp_backend_create(&m->w, &bo, o->tensor_parallel, 0, out, err, errlen);
        return cpu_backend_create(&m->w, &bo, out, err, errlen);
    }
#ifdef QUIRE_HAVE_CUDA
    char why[256] = "";
    if (cuda_device_count(why, sizeof why) <= 0)
        return qerr_set(err, errlen, QERR_DEVICE, "device cuda: no usable CUDA device (%s)", why[0] ? why : "none found");
    if (bo.num_blocks <= 0 && o->kv_mem_mb)
        bo.num_blocks = blocks_for_mb(m, beside, bs, (double)o->kv_mem_mb, o->exact ? 4.0 : 2.0);
    if (beside) {
        /* What its backend will hold: weights at two bytes an element
         * (four when exact); scratch for max_tokens tokens (float residual,
         * projections and gate/up; the rest in the storage type) and 256
         * logit rows; 64 MiB for cuBLAS and the rest; and its blocks. */
        const double e = o->exact ? 4.0 : 2.0, D = beside->hp.dim, F = beside->hp.ffn_dim,
                     Q = (double)beside->hp.n_heads * beside->hp.head_dim,
                     KV = (double)beside->hp.n_kv_heads * beside->hp.head_dim;
        double wb = 0;
        for (int i = 0; i < beside->n_tensors; i++) wb += (double)qt_numel(&beside->tensors[i].t);
        const double tok = (max_tokens > 64 ? max_tokens : 64) * (4 * (D + Q + 2 * KV + 2 * F) + e * (D + 2 * Q + F));
        bo.reserve_bytes = (size_t)(wb * e + tok + 256.0 * 4 * beside->hp.n_vocab + 64.0 * 1048576.0);
        bo.extra_block_bytes = (size_t)block_bytes(beside, bs, e);
    }
    if (o->tensor_parallel > 1) return qtp_backend_create(&m->w, &bo, o->tensor_parallel, 1, out, err, errlen);
    return cuda_backend_create(&m->w, &bo, out, err, errlen);
#else
    return qerr_set(err, errlen, QERR_UNSUPPORTED, "device cuda: quire was built without CUDA");
#endif
}
