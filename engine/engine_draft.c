/* engine_draft.c - the engine's side of a draft model's proposals (the
 * proposer, its passes and its marks of what it holds, are spec/draft.c's).
 *
 * A step drafts for its scheduled decodes (each with its next token's slot
 * reserved): what each request feeds first (the tokens the draft's K/V
 * lack, within max_batch_tokens a step) and how many drafts it may take are
 * decided here; each draft is drawn as the request's sampler draws
 * (qsample_propose, from a stream of its own), masked by its grammar, and
 * appended to its kv from free blocks only, as n-gram drafts are (host_take).
 * The drafts' distributions stay for the verification (qsample_verify_q).
 * The target's pass then verifies them like any drafts (engine_spec.c), and
 * qe_draft_cut forgets what the draft wrote past the tokens kept. */
#include <string.h>

#include "engine_int.h"
#include "qerr.h"

static uint32_t host_gen(void *ctx, int b)
{
    const qengine *e = ctx;
    return kv_pool_block_gen(e->pool, b);
}

static void host_seq(void *ctx, int s, const int32_t **tokens, const int32_t **blocks, int *n_blocks)
{
    const req *r = ((const qengine *)ctx)->d_reqs[s];
    *tokens = r->kv.tokens, *blocks = r->kv.blocks, *n_blocks = r->kv.n_blocks;
}

/* Draft j of the step's request s: masked by its grammar (no mask: its
 * drafts end), drawn (or the backend's argmax), appended to its kv from
 * free blocks only, fed to its grammar.  The token, or -1. */
static int host_take(void *ctx, int s, int j, const float *lg, int argmax, int rtok)
{
    qengine *e = ctx;
    req *r = e->d_reqs[s];
    const int V = e->m->hp.n_vocab;
    const uint32_t *allowed = NULL;
    if (r->gm) {
        if (qe_spec_mask_row(e, r, j)) return -1; /* no mask: the drafts end before this row */
        allowed = r->smask + (size_t)j * (((size_t)V + 31) / 32);
    }
    const int tok = argmax ? rtok : qsample_propose(r->smp, lg, allowed, r->dq ? r->dq + (size_t)j * V : NULL);
    const int need = tok < 0 ? -1 : kv_seq_blocks_needed(e->pool, &r->kv, 1);
    if (need < 0 || need > kv_pool_num_free(e->pool) || kv_seq_append(e->pool, &r->kv, (const int32_t *)&tok, 1))
        return -1;
    if (r->gm) {
        const int frc = gram_m_feed_token(r->gm, r->gv, tok);
        if (frc) { /* its own mask allowed it: a refusal here is the matcher's limits, else memory */
            kv_seq_truncate(e->pool, &r->kv, r->kv.n_tokens - 1);
            if (frc != QERR_INVAL) r->gm_failed = 1;
            return -1;
        }
        r->dfed++;
    }
    r->draft[j] = tok;
    r->n_draft = j + 1;
    return tok;
}

static qspec_host host_of(qengine *e)
{
    return (qspec_host){ e, host_gen, host_seq, host_take };
}

void qe_draft_cut(qengine *e, const req *r, int keep)
{
    if (!e->drafter) return;
    const qspec_host h = host_of(e);
    qspec_draft_cut(e->drafter, &h, r->kv.blocks, r->kv.n_blocks, keep);
}

/* Undoes r's drafts: out of its kv and its grammar (fed of them were fed). */
static void draft_drop(qengine *e, req *r, int fed)
{
    qe_draft_cut(e, r, r->n_tokens);
    kv_seq_truncate(e->pool, &r->kv, r->n_tokens);
    if (fed && gram_m_rollback(r->gm, fed)) r->gm_failed = 1;
    r->n_draft = 0;
}

/* What each of the n requests feeds first and how many drafts it wants,
 * into e->d_dseq, taking drafts' room from *budget.  Returns the most
 * drafts any wants; *n_q gets the sampled drafts (their distributions). */
static int plan(qengine *e, req **rs, int n, int *budget, int *n_q)
{
    const qspec_host h = host_of(e);
    int catchup = e->o.max_batch_tokens, kmax = 0;
    *n_q = 0;
    for (int i = 0; i < n; i++) {
        req *r = rs[i];
        qspec_dseq *q = &e->d_dseq[i];
        *q = (qspec_dseq){ .n_tokens = r->n_tokens };
        r->n_draft = 0, r->dq = NULL, r->dwant = r->dfed = 0;
        const int k = qe_spec_want(e, r, *budget);
        if (k < 1 || (r->gm && !qe_spec_grammar_start(e, r))) continue;
        q->pos0 = qspec_draft_held(e->drafter, &h, r->kv.blocks, r->kv.n_blocks, r->n_tokens);
        const int lack = r->n_tokens - q->pos0;
        if (lack > e->o.spec_k + 1) e->sp.catching_up = 1;
        if (lack > catchup) { /* a long prompt: part now, drafts in a later step */
            q->feed = catchup;
            catchup = 0;
        } else {
            q->feed = lack, q->k = r->dwant = k;
            q->argmax = qsampler_is_greedy(r->smp) && !r->gm;
            catchup -= lack;
            *budget -= k;
            if (k > kmax) kmax = k;
            if (!qsampler_is_greedy(r->smp)) *n_q += k;
        }
    }
    return kmax;
}

/* Under a grammar the row after the last draft needs its mask too (for the
 * target's own token); where there is none the last draft goes.  Then the
 * matcher goes back to where it was, and unused room returns to *budget. */
static void finish(qengine *e, req **rs, int n, int *budget)
{
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
}

void qe_draft_run(qengine *e, req **rs, int n, int *budget)
{
    const int V = e->m->hp.n_vocab;
    if (n > e->cap_dseq) {
        if (GROW(e->d_dseq, n)) return;
        e->cap_dseq = n;
    }
    int n_q;
    const int kmax = plan(e, rs, n, budget, &n_q);
    int n_tok = 0;
    for (int i = 0; i < n; i++) n_tok += e->d_dseq[i].feed;
    if (!n_tok) return;
    /* The drafts' distributions, for verification (sampling rows only). */
    if ((size_t)n_q * (size_t)V > e->cap_dq) {
        if (GROW(e->dq, (size_t)n_q * (size_t)V)) goto fail_all;
        e->cap_dq = (size_t)n_q * (size_t)V;
    }
    size_t qoff = 0;
    for (int i = 0; i < n; i++)
        if (e->d_dseq[i].k && !qsampler_is_greedy(rs[i]->smp)) rs[i]->dq = e->dq + qoff, qoff += (size_t)e->d_dseq[i].k * (size_t)V;
    /* Rows: one a drafting request, or (all_rows) one a token of the first
     * pass: where every request feeds few enough tokens for the pass to run
     * as a graph (QBE_GRAPH_SEQ_TOKENS) and every row is reduced to its
     * argmax (no vocabulary-wide rows come back for them). */
    int all_rows = qspec_draft_graphs(e->drafter);
    for (int i = 0; i < n && all_rows; i++) {
        const qspec_dseq *q = &e->d_dseq[i];
        if (q->feed && (q->feed > QBE_GRAPH_SEQ_TOKENS || (q->k && !q->argmax))) all_rows = 0;
    }
    const qspec_host h = host_of(e);
    e->d_reqs = rs;
    const int rc = qspec_draft_passes(e->drafter, &h, e->d_dseq, n, kmax, all_rows, &e->st.draft_passes,
                                      &e->st.draft_tokens, &e->st.draft_s);
    e->d_reqs = NULL;
    if (rc) {
        QLOGW("engine: the draft model's pass failed (%s): no drafts this step", qerr_str(rc));
        goto fail_all;
    }
    finish(e, rs, n, budget);
    return;
fail_all:
    for (int i = 0; i < n; i++) {
        req *r = rs[i];
        *budget += r->dwant;
        if (r->n_draft || r->dfed) draft_drop(e, r, r->dfed);
        r->dwant = r->dfed = 0, r->dq = NULL;
    }
}
