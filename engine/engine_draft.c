/* engine_draft.c - a draft model's proposals (engine_int.h).
 *
 * The draft model has a backend of its own, created with as many blocks as
 * the target's, and keeps its K/V at the same block ids: a request's block
 * table serves both models.  The pool, the prefix cache and preemption know
 * only the target; the draft follows them through each block's generation
 * (kv_pool_block_gen), which changes exactly when the block is handed out
 * again.  For every block the engine keeps the generation the draft saw
 * when it last wrote there (dgen) and how many of its slots it filled
 * (dfill): a request's draft K/V are current through the leading blocks
 * whose generation stands, as far as they are filled.  So a prefix found in
 * the cache is the draft's too when the draft wrote it, a block copied,
 * swapped back or recomputed is not, and nothing needs telling.
 *
 * A step drafts for its scheduled decodes (each with its next token's slot
 * reserved): pass 0 feeds each request the tokens its draft K/V lack (the
 * newest token, one or two after a step, or a whole prompt, within
 * max_batch_tokens a step) and gives the first draft; pass j feeds draft
 * j - 1 and gives draft j.  Drafts are drawn as the request's sampler
 * draws (qsample_propose, from a stream of their own), masked by its
 * grammar; their distributions stay for the verification (qsample_verify_q).
 * Each draft is appended to the request's kv as it is drawn, from free
 * blocks only, as n-gram drafts are.  The target's pass then verifies
 * them like any drafts (engine_spec.c), and qe_draft_cut forgets what the
 * draft wrote past the tokens kept. */
#include <string.h>

#include "engine_int.h"
#include "qerr.h"

/* Positions of r whose draft K/V are current: through the leading blocks
 * the draft wrote since they were handed out, as far as it filled them;
 * never the newest token (it is fed with the first pass). */
static int draft_held(const qengine *e, const req *r)
{
    const int bs = e->o.block_size;
    int n = 0;
    for (int i = 0; i < r->kv.n_blocks; i++) {
        const int b = r->kv.blocks[i];
        if (b < 0 || e->dgen[b] != kv_pool_block_gen(e->pool, b)) break;
        n = i * bs + e->dfill[b];
        if (e->dfill[b] < bs) break;
    }
    return n < r->n_tokens - 1 ? n : r->n_tokens - 1;
}

/* The draft wrote r's positions [from, to). */
static void draft_wrote(qengine *e, const req *r, int from, int to)
{
    const int bs = e->o.block_size;
    for (int i = from / bs; i * bs < to && i < r->kv.n_blocks; i++) {
        const int b = r->kv.blocks[i];
        const uint32_t g = kv_pool_block_gen(e->pool, b);
        if (e->dgen[b] != g) e->dgen[b] = g, e->dfill[b] = 0;
        const int lo = from - i * bs, hi = to - i * bs < bs ? to - i * bs : bs;
        if (e->dfill[b] >= lo && e->dfill[b] < hi) e->dfill[b] = hi; /* contiguous with what it held */
    }
}

void qe_draft_cut(qengine *e, const req *r, int keep)
{
    const int bs = e->o.block_size, i = keep / bs;
    if (!e->dbe || i >= r->kv.n_blocks) return;
    const int b = r->kv.blocks[i];
    if (e->dgen[b] == kv_pool_block_gen(e->pool, b) && e->dfill[b] > keep - i * bs) e->dfill[b] = keep - i * bs;
}

/* Room for a pass over n sequences of n_tok tokens in all, with n_rows
 * logit rows. */
static int draft_scratch(qengine *e, int n_tok, int n, int n_rows)
{
    if (n_tok > e->cap_dtok) {
        if (GROW(e->d_tokens, n_tok)) return QERR_NOMEM;
        e->cap_dtok = n_tok;
    }
    if (n > e->cap_dseq) {
        if (GROW(e->d_seqs, n) || GROW(e->d_reqs, n) || GROW(e->d_srow, n)) return QERR_NOMEM;
        e->cap_dseq = n;
    }
    if (n_rows > e->cap_drow) {
        if (GROW(e->d_lidx, n_rows) || GROW(e->d_rowmode, n_rows) || GROW(e->d_rowtok, n_rows)) return QERR_NOMEM;
        /* Logits in memory the backend copies to fast (pinned on CUDA). */
        float *lg = qbackend_host_alloc(e->dbe, sizeof(float) * (size_t)n_rows * (size_t)e->m->hp.n_vocab);
        if (!lg) return QERR_NOMEM;
        if (e->d_logits) qbackend_host_free(e->dbe, e->d_logits);
        e->d_logits = lg;
        e->cap_drow = n_rows;
    }
    return 0;
}

/* Undoes r's drafts: out of its kv and its grammar (fed of them were fed). */
static void draft_drop(qengine *e, req *r, int fed)
{
    qe_draft_cut(e, r, r->n_tokens);
    kv_seq_truncate(e->pool, &r->kv, r->n_tokens);
    if (fed && gram_m_rollback(r->gm, fed)) r->gm_failed = 1;
    r->n_draft = 0;
}

void qe_draft_run(qengine *e, req **rs, int n, int *budget)
{
    const int V = e->m->hp.n_vocab;
    int catchup = e->o.max_batch_tokens, kmax = 0, n_tok = 0, n_q = 0;
    /* What each request feeds first and how many drafts it wants. */
    for (int i = 0; i < n; i++) {
        req *r = rs[i];
        r->n_draft = 0, r->dq = NULL, r->dk = r->dwant = r->dfeed = r->dfed = 0;
        const int k = qe_spec_want(e, r, *budget);
        if (k < 1 || (r->gm && !qe_spec_grammar_start(e, r))) continue;
        r->dpos = draft_held(e, r);
        const int lack = r->n_tokens - r->dpos;
        if (lack > e->o.spec_k + 1) e->sp.catching_up = 1;
        if (lack > catchup) { /* a long prompt: part now, drafts in a later step */
            r->dfeed = catchup;
            catchup = 0;
        } else {
            r->dfeed = lack, r->dk = r->dwant = k;
            catchup -= lack;
            *budget -= k;
            if (k > kmax) kmax = k;
            if (!qsampler_is_greedy(r->smp)) n_q += k;
        }
        n_tok += r->dfeed;
    }
    if (!n_tok) return;
    /* The drafts' distributions, for verification (sampling rows only). */
    if ((size_t)n_q * (size_t)V > e->cap_dq) {
        if (GROW(e->dq, (size_t)n_q * (size_t)V)) goto fail_all;
        e->cap_dq = (size_t)n_q * (size_t)V;
    }
    /* Rows: one a drafting request, or (all_rows_ok) one a token of the
     * first pass: where every request feeds few enough tokens for the pass
     * to run as a graph (QBE_GRAPH_SEQ_TOKENS) and every row is reduced to
     * its argmax (no vocabulary-wide rows come back for them). */
    int all_rows_ok = e->d_graphs;
    for (int i = 0; i < n && all_rows_ok; i++)
        if (rs[i]->dfeed && (rs[i]->dfeed > QBE_GRAPH_SEQ_TOKENS || (rs[i]->dk && (!qsampler_is_greedy(rs[i]->smp) || rs[i]->gm))))
            all_rows_ok = 0;
    if (draft_scratch(e, n_tok > n ? n_tok : n, n, all_rows_ok ? n_tok : n)) goto fail_all;
    size_t qoff = 0;
    for (int i = 0; i < n; i++)
        if (rs[i]->dk && !qsampler_is_greedy(rs[i]->smp)) rs[i]->dq = e->dq + qoff, qoff += (size_t)rs[i]->dk * (size_t)V;
    const size_t words = ((size_t)V + 31) / 32;
    for (int j = 0; j == 0 || j < kmax; j++) {
        /* The pass: what each request feeds at depth j, a row where it
         * drafts.  Where the first pass feeds a few tokens each, every token
         * gets a row (reduced to its argmax and never read) on a backend
         * that runs such passes as a captured graph. */
        const int all_rows = j == 0 && all_rows_ok;
        int ns = 0, nt = 0, nr = 0;
        for (int i = 0; i < n; i++) {
            req *r = rs[i];
            if (j == 0 ? !r->dfeed : r->n_draft < j || r->dk <= j) continue;
            const int pos0 = j == 0 ? r->dpos : r->n_tokens - 1 + j, cnt = j == 0 ? r->dfeed : 1;
            memcpy(e->d_tokens + nt, r->kv.tokens + pos0, sizeof(int32_t) * (size_t)cnt);
            e->d_seqs[ns] = (qbatch_seq){ nt, cnt, pos0, r->kv.blocks, r->kv.n_blocks };
            for (int t = 0; all_rows && t < cnt - (r->dk > j); t++) e->d_rowmode[nr] = QROW_ARGMAX, e->d_lidx[nr++] = nt + t;
            nt += cnt;
            e->d_srow[ns] = -1;
            if (r->dk > j) {
                e->d_rowmode[nr] = qsampler_is_greedy(r->smp) && !r->gm ? QROW_ARGMAX : QROW_LOGITS;
                e->d_srow[ns] = nr;
                e->d_lidx[nr++] = nt - 1;
            }
            e->d_reqs[ns++] = r;
        }
        if (!ns) break;
        qbatch b = { nt, e->d_tokens, ns, e->d_seqs, nr, e->d_lidx, e->d_rowmode, e->d_rowtok, NULL, NULL, NULL };
        const double t = q_now();
        const int rc = e->dbe->ops->forward(e->dbe, &b, e->d_logits);
        e->st.draft_s += q_now() - t;
        e->st.draft_passes++;
        e->st.draft_tokens += (uint64_t)nt;
        if (rc) {
            QLOGW("engine: the draft model's pass failed (%s): no drafts this step", qerr_str(rc));
            goto fail_all;
        }
        /* Each row's draft, masked and drawn as the request would draw it,
         * then appended to its kv (free blocks only). */
        for (int s = 0; s < ns; s++) {
            req *r = e->d_reqs[s];
            draft_wrote(e, r, e->d_seqs[s].pos0, e->d_seqs[s].pos0 + e->d_seqs[s].n_tokens);
            const int row = e->d_srow[s];
            if (row < 0) continue;
            const float *lg = e->d_logits + (size_t)row * (size_t)V;
            const int mode = e->d_rowmode[row], rtok = e->d_rowtok[row];
            const uint32_t *allowed = NULL;
            if (r->gm) {
                if (qe_spec_mask_row(e, r, j)) {
                    r->dk = j; /* no mask: the drafts end before this row */
                    continue;
                }
                allowed = r->smask + (size_t)j * words;
            }
            const int tok = mode == QROW_ARGMAX ? rtok : qsample_propose(r->smp, lg, allowed, r->dq ? r->dq + (size_t)j * V : NULL);
            const int need = tok < 0 ? -1 : kv_seq_blocks_needed(e->pool, &r->kv, 1);
            if (need < 0 || need > kv_pool_num_free(e->pool) || kv_seq_append(e->pool, &r->kv, (const int32_t *)&tok, 1)) {
                r->dk = j;
                continue;
            }
            if (r->gm) {
                const int frc = gram_m_feed_token(r->gm, r->gv, tok);
                if (frc) { /* its own mask allowed it: a refusal here is the matcher's limits, else memory */
                    kv_seq_truncate(e->pool, &r->kv, r->kv.n_tokens - 1);
                    if (frc != QERR_INVAL) r->gm_failed = 1;
                    r->dk = j;
                    continue;
                }
                r->dfed++;
            }
            r->draft[j] = tok;
            r->n_draft = j + 1;
        }
    }
    /* Under a grammar the row after the last draft needs its mask too (for
     * the target's own token); where there is none the last draft goes.
     * Then the matcher goes back to where it was. */
    for (int i = 0; i < n; i++) {
        req *r = rs[i];
        if (r->gm && r->n_draft && !r->gm_failed && qe_spec_mask_row(e, r, r->n_draft)) {
            qe_draft_cut(e, r, r->kv.n_tokens - 1);
            kv_seq_truncate(e->pool, &r->kv, r->kv.n_tokens - 1);
            r->n_draft--;
        }
        if (r->gm && r->n_draft) e->st.masks += (uint64_t)r->n_draft + 1;
        if (r->gm_failed || (r->dfed && gram_m_rollback(r->gm, r->dfed))) {
            r->gm_failed = 1; /* where the matcher stands is unknown: the request ends in error */
            draft_drop(e, r, 0);
        }
        r->dfed = 0;
        *budget += r->dwant - r->n_draft;
    }
    return;
fail_all:
    for (int i = 0; i < n; i++) {
        req *r = rs[i];
        *budget += r->dwant;
        if (r->n_draft || r->dfed) draft_drop(e, r, r->dfed);
        r->dk = r->dwant = r->dfed = 0, r->dq = NULL;
    }
}
