/* draft.c - see draft.h. */
#include "draft.h"

#include <stdlib.h>
#include <string.h>

#include "qerr.h"
#include "util.h"

struct qspec_draft {
    qbackend *be;
    int block_size, n_vocab;
    int graphs;             /* its backend runs passes where every token has a row as graphs (not the CPU's) */
    uint32_t *gen;          /* (num_blocks) the generation each block had when the draft last wrote there */
    int32_t *fill;          /* (num_blocks) slots of it the draft filled */
    int32_t *tokens;        /* (cap_tok) a pass's tokens */
    qbatch_seq *seqs;       /* (cap_seq) its sequences */
    int *who, *srow;        /* (cap_seq) each one's index in the step, and the row it drafts from (-1) */
    int32_t *lidx, *rowtok; /* (cap_row) its logit rows */
    uint8_t *rowmode;       /* (cap_row) */
    float *logits;          /* (cap_row, n_vocab) */
    int cap_tok, cap_seq, cap_row;
};

int qspec_draft_new(qbackend *be, int num_blocks, int block_size, int n_vocab, qspec_draft **out)
{
    *out = NULL;
    qspec_draft *d = calloc(1, sizeof *d);
    if (d) {
        d->be = be, d->block_size = block_size, d->n_vocab = n_vocab;
        d->graphs = strcmp(be->ops->name, "cpu") != 0;
        d->gen = q_callocn((size_t)num_blocks, sizeof *d->gen);
        d->fill = q_callocn((size_t)num_blocks, sizeof *d->fill);
    }
    if (!d || !d->gen || !d->fill) {
        if (!d) qbackend_destroy(be);
        qspec_draft_free(d);
        return QERR_NOMEM;
    }
    *out = d;
    return 0;
}

void qspec_draft_free(qspec_draft *d)
{
    if (!d) return;
    if (d->logits) qbackend_host_free(d->be, d->logits);
    qbackend_destroy(d->be);
    free(d->gen);
    free(d->fill);
    free(d->tokens);
    free(d->seqs);
    free(d->who);
    free(d->srow);
    free(d->lidx);
    free(d->rowtok);
    free(d->rowmode);
    free(d);
}

int qspec_draft_graphs(const qspec_draft *d) { return d->graphs; }

int qspec_draft_held(const qspec_draft *d, const qspec_host *h, const int32_t *blocks, int n_blocks, int n_tokens)
{
    const int bs = d->block_size;
    int n = 0;
    for (int i = 0; i < n_blocks; i++) {
        const int b = blocks[i];
        if (b < 0 || d->gen[b] != h->block_gen(h->ctx, b)) break;
        n = i * bs + d->fill[b];
        if (d->fill[b] < bs) break;
    }
    return n < n_tokens - 1 ? n : n_tokens - 1;
}

/* The draft wrote positions [from, to) of the sequence on blocks. */
static void wrote(qspec_draft *d, const qspec_host *h, const int32_t *blocks, int n_blocks, int from, int to)
{
    const int bs = d->block_size;
    for (int i = from / bs; i * bs < to && i < n_blocks; i++) {
        const int b = blocks[i];
        const uint32_t g = h->block_gen(h->ctx, b);
        if (d->gen[b] != g) d->gen[b] = g, d->fill[b] = 0;
        const int lo = from - i * bs, hi = to - i * bs < bs ? to - i * bs : bs;
        if (d->fill[b] >= lo && d->fill[b] < hi) d->fill[b] = hi; /* contiguous with what it held */
    }
}

void qspec_draft_cut(qspec_draft *d, const qspec_host *h, const int32_t *blocks, int n_blocks, int keep)
{
    const int bs = d->block_size, i = keep / bs;
    if (i >= n_blocks) return;
    const int b = blocks[i];
    if (d->gen[b] == h->block_gen(h->ctx, b) && d->fill[b] > keep - i * bs) d->fill[b] = keep - i * bs;
}

static int grow(void **pp, size_t n, size_t size)
{
    void *p = q_reallocn(*pp, n, size);
    if (!p) return QERR_NOMEM;
    *pp = p;
    return 0;
}
#define GROW(arr, n) grow((void **)&(arr), (size_t)(n), sizeof *(arr))

/* Room for a pass over n sequences of n_tok tokens in all, with n_rows
 * logit rows. */
static int scratch(qspec_draft *d, int n_tok, int n, int n_rows)
{
    if (n_tok > d->cap_tok) {
        if (GROW(d->tokens, n_tok)) return QERR_NOMEM;
        d->cap_tok = n_tok;
    }
    if (n > d->cap_seq) {
        if (GROW(d->seqs, n) || GROW(d->who, n) || GROW(d->srow, n)) return QERR_NOMEM;
        d->cap_seq = n;
    }
    if (n_rows > d->cap_row) {
        if (GROW(d->lidx, n_rows) || GROW(d->rowmode, n_rows) || GROW(d->rowtok, n_rows)) return QERR_NOMEM;
        /* Logits in memory the backend copies to fast (pinned on CUDA). */
        float *lg = qbackend_host_alloc(d->be, sizeof(float) * (size_t)n_rows * (size_t)d->n_vocab);
        if (!lg) return QERR_NOMEM;
        if (d->logits) qbackend_host_free(d->be, d->logits);
        d->logits = lg;
        d->cap_row = n_rows;
    }
    return 0;
}

/* Pass j's batch: what each sequence feeds at depth j, a row where it
 * drafts (all_rows: every token a row, reduced to its argmax and never
 * read).  Returns the sequences in it; *n_tok and *n_rows get its sizes. */
static int build_pass(qspec_draft *d, const qspec_host *h, const qspec_dseq *seqs, int n, int j, int all_rows,
                      int *n_tok, int *n_rows)
{
    int ns = 0, nt = 0, nr = 0;
    for (int i = 0; i < n; i++) {
        const qspec_dseq *q = &seqs[i];
        if (j == 0 ? !q->feed : q->n_draft < j || q->k <= j) continue;
        const int32_t *tokens, *blocks;
        int n_blocks;
        h->seq(h->ctx, i, &tokens, &blocks, &n_blocks);
        const int pos0 = j == 0 ? q->pos0 : q->n_tokens - 1 + j, cnt = j == 0 ? q->feed : 1;
        memcpy(d->tokens + nt, tokens + pos0, sizeof(int32_t) * (size_t)cnt);
        d->seqs[ns] = (qbatch_seq){ nt, cnt, pos0, blocks, n_blocks };
        for (int t = 0; all_rows && t < cnt - (q->k > j); t++) d->rowmode[nr] = QROW_ARGMAX, d->lidx[nr++] = nt + t;
        nt += cnt;
        d->srow[ns] = -1;
        if (q->k > j) {
            d->rowmode[nr] = q->argmax ? QROW_ARGMAX : QROW_LOGITS;
            d->srow[ns] = nr;
            d->lidx[nr++] = nt - 1;
        }
        d->who[ns++] = i;
    }
    *n_tok = nt, *n_rows = nr;
    return ns;
}

int qspec_draft_passes(qspec_draft *d, const qspec_host *h, qspec_dseq *seqs, int n, int kmax, int all_rows,
                       uint64_t *passes, uint64_t *tokens, double *seconds)
{
    int n_tok = 0;
    for (int i = 0; i < n; i++) n_tok += seqs[i].feed, seqs[i].n_draft = 0;
    if (!n_tok) return 0;
    if (scratch(d, n_tok > n ? n_tok : n, n, all_rows ? n_tok : n)) return QERR_NOMEM;
    for (int j = 0; j == 0 || j < kmax; j++) {
        int nt, nr;
        const int ns = build_pass(d, h, seqs, n, j, j == 0 && all_rows, &nt, &nr);
        if (!ns) break;
        qbatch b = { nt, d->tokens, ns, d->seqs, nr, d->lidx, d->rowmode, d->rowtok, NULL, NULL, NULL };
        const double t = q_now();
        const int rc = d->be->ops->forward(d->be, &b, d->logits);
        *seconds += q_now() - t;
        ++*passes;
        *tokens += (uint64_t)nt;
        if (rc) return rc;
        /* Each row's draft, drawn by the host and appended to its sequence. */
        for (int s = 0; s < ns; s++) {
            qspec_dseq *q = &seqs[d->who[s]];
            wrote(d, h, d->seqs[s].block_table, d->seqs[s].n_blocks, d->seqs[s].pos0,
                  d->seqs[s].pos0 + d->seqs[s].n_tokens);
            const int row = d->srow[s];
            if (row < 0) continue;
            const int tok = h->take(h->ctx, d->who[s], j, d->logits + (size_t)row * (size_t)d->n_vocab,
                                    d->rowmode[row] == QROW_ARGMAX, d->rowtok[row]);
            if (tok < 0) {
                q->k = j; /* its drafts end before this row */
                continue;
            }
            q->n_draft = j + 1;
        }
    }
    return 0;
}
