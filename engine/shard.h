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

#endif
