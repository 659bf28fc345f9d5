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

/* Shard rank of n of w (whose tensors must be on the host): 0, or
 * QERR_INVAL with a message (n < 1, rank outside [0, n), heads, KV heads or
 * the MLP's width not divisible by n), QERR_NOMEM. */
int qshard_make(const qweights *w, int rank, int n, qshard *out, char *err, size_t errlen);
void qshard_free(qshard *s);

/* The all-reduce among n threads of one process, each driving one shard's
 * backend (the CPU's; NCCL will do it between GPUs): qtp_allreduce is a
 * qbackend_opts.allreduce whose ctx is the member's qtp_member.  Every
 * member adds the shards' buffers in rank order, so all get the same bits. */
typedef struct qtp_group qtp_group;
typedef struct {
    qtp_group *g;
    int rank;
} qtp_member;
/* n members summing up to cap floats at a time (longer buffers go in
 * pieces): NULL when out of memory or n, cap < 1. */
qtp_group *qtp_group_new(int n, size_t cap);
void qtp_group_free(qtp_group *g);
void qtp_allreduce(void *member, float *buf, size_t n);

#endif
