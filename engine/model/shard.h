/* shard.h - tensor parallelism's split of a model (issue 11), Megatron's:
 * shard r of n holds attention heads [r H/n, (r+1) H/n) with their KV heads
 * [r KV/n, (r+1) KV/n) (the Q/K/V rows and biases of those heads, the
 * output projection's columns that read them), and MLP columns
 * [r F/n, (r+1) F/n) (the gate and up rows, the down projection's columns).
 * Norms, embeddings and the output projection are the model's own (every
 * shard holds them).  Each shard's output and down projections give a
 * partial sum of the layer's; their sum over the shards (the all-reduce) is
 * the unsplit model's, so n shards in step reproduce it.  n = 1 is the
 * model itself. */
#ifndef QUIRE_SHARD_H
#define QUIRE_SHARD_H

#include <stddef.h>

#include "backend.h"

typedef struct {
    qweights w;      /* the shard: hp.n_heads, n_kv_heads and ffn_dim divided by n */
    int rank, n;
    qlayer *layers;  /* owned */
    void *mem;       /* owned: the sliced tensors' bytes */
} qshard;

/* Shard rank of n of w: 0, or
 * QERR_INVAL with a message (n < 1, rank outside [0, n), heads, KV heads or
 * the MLP's width not divisible by n), QERR_NOMEM.  A tensor without data
 * (random weights, which the backend fills) gives a view of the shard's
 * shape without data. */
int qshard_make(const qweights *w, int rank, int n, qshard *out, char *err, size_t errlen);
void qshard_free(qshard *s);

/* The all-reduce among n threads of one process, each driving one CPU
 * backend on a shard (NCCL does it between GPUs, kernels/cuda/cuda_tp.cu):
 * qtp_allreduce is a qbackend_opts.allreduce whose ctx is the member's
 * qtp_member.  Every member adds the shards' buffers in rank order, so all
 * get the same bits. */
typedef struct qtp_group qtp_group;
typedef struct {
    qtp_group *g;
    int rank;
} qtp_member;
/* n members summing up to cap floats at a time (longer buffers go in
 * pieces): NULL when out of memory or n, cap < 1. */
qtp_group *qtp_group_new(int n, size_t cap);
void qtp_group_free(qtp_group *g);
int qtp_allreduce(void *member, float *buf, size_t n, void *stream, void *copy, int copy_dt);
/* Wakes every member waiting in qtp_allreduce, and fails every later call,
 * with QERR_DEVICE: for a group one of whose members failed (its pass will
 * never reach the sum the others wait in). */
void qtp_group_abort(void *group);

/* A backend of n shards in step (tp.c): shard r runs on a backend of its
 * own, with CUDA (cuda 1) on device r, the sums by cuda_tp_allreduce (a
 * peer-access kernel of quire's own, or NCCL); on the CPU (cuda 0; the
 * cores shared among them) the sums by qtp_allreduce among threads.
 * It is a backend like any other: its passes give the whole model's
 * logits, its pool is the smallest of the ranks' (opts as for one backend;
 * reserve_bytes and extra_block_bytes concern device 0, where a draft
 * model runs), its blocks' bytes are laid out as the unsplit model's.  0, or
 * QERR_INVAL (a split the model does not allow), QERR_UNSUPPORTED (no NCCL,
 * no CUDA in this build), QERR_DEVICE, QERR_NOMEM, with a message. */
int qtp_backend_create(const qweights *w, const qbackend_opts *opts, int n, int cuda, qbackend **out, char *err,
                       size_t errlen);

#endif
