/* engine_spec.c - the engine's side of speculative decoding in a step
 * (engine_int.h); the proposers, the verify loop and the policy are spec/'s.
 *
 * A running request that may speculate gets drafts (spec/ngram.c's lookup
 * in its own tokens here, or the draft model's: engine_draft.c) after its
 * next token, in the same pass: the batch holds [next, d1 .. dk] with a
 * logit row at each position.  qspec_verify walks the rows; each row's
 * token is the sampler's (verify_row: qsample_verify_q keeps a draft by
 * the target's own choice or by rejection sampling) and goes through the
 * grammar, the stop conditions and an event.  The refused drafts leave the
 * kv (kv_seq_truncate: their K/V were written but are never read), so
 * between steps a running request holds n_tokens - 1 computed tokens as
 * always.  Under a grammar, drafts are kept only as far as it allows them,
 * each row with its mask made ahead of time (grammar_drafts).
 *
 * How many drafts a request asks for, and whether a step drafts at all, is
 * spec/policy.c's to say (qspec_ctl, qspec_probe). */
#include <string.h>

#include "engine_int.h"
#include "qerr.h"

_Static_assert(QENGINE_MAX_SPEC_K == QSPEC_MAX_K, "engine.h's bound on spec_k is spec.h's");

int qe_spec_allowed(qengine *e)
{
    return qspec_probe_allowed(&e->sp, e->o.spec_always, e->st.generated);
}

void qe_spec_step_done(qengine *e, int decode_only, double secs)
{
    qspec_probe_done(&e->sp, e->o.spec_always, decode_only, secs, e->st.generated);
    e->st.spec_probes = e->sp.probes, e->st.spec_probes_won = e->sp.won;
}

int qe_spec_grammar_start(qengine *e, req *r)
{
    const size_t words = ((size_t)e->m->hp.n_vocab + 31) / 32;
    /* No room for the rows' masks: no drafts this step. */
    if (!r->smask && !(r->smask = q_mallocn((size_t)(QSPEC_MAX_K + 1) * words, sizeof *r->smask))) return 0;
    /* The grammar takes the last token now: the drafts start after it. */
    if (qe_feed_now(e, r)) {
        r->gm_failed = 1;
        return 0;
    }
    return 1;
}

int qe_spec_mask_row(qengine *e, req *r, int j)
{
    const size_t words = ((size_t)e->m->hp.n_vocab + 31) / 32;
    qguide_job job = { r->gm, r->gv, r->smask + (size_t)j * words, e->m->hp.n_vocab, e->m->eos_ids, e->m->n_eos,
                       -1, 0, 0, 0, 0, 0 };
    qguide_job_run(&job);
    return job.rc ? 1 : 0;
}

/* With a grammar: keeps the first d drafts it allows, making the mask of
 * each row (rows 0..kept) into r->smask on the way; the matcher ends where
 * it began.  Returns how many drafts are kept. */
static int grammar_drafts(qengine *e, req *r, int d)
{
    const size_t words = ((size_t)e->m->hp.n_vocab + 31) / 32;
    if (!qe_spec_grammar_start(e, r)) return 0;
    int fed = 0, kept = 0;
    for (int j = 0; j <= d; j++) {
        if (qe_spec_mask_row(e, r, j)) break; /* row j has no mask: the drafts end before it */
        kept = j;
        if (j == d) break;
        const int t = r->draft[j];
        if (!(r->smask[(size_t)j * words + (size_t)t / 32] >> (t % 32) & 1u)) break;
        const int rc = gram_m_feed_token(r->gm, r->gv, t);
        if (rc == QERR_INVAL) break; /* refused: the matcher is unchanged */
        if (rc) {                    /* out of memory mid-feed: where the matcher stands is unknown */
            r->gm_failed = 1;
            return 0;
        }
        fed++;
    }
    if (fed && gram_m_rollback(r->gm, fed)) {
        r->gm_failed = 1;
        return 0;
    }
    e->st.masks += (uint64_t)kept + 1;
    return kept;
}

int qe_spec_want(qengine *e, req *r, int room)
{
    if (!r->spec || r->n_forks || room < 1 || r->gm_failed || !qspec_ctl_awake(&r->ctl)) return 0;
    int k = r->ctl.k < room ? r->ctl.k : room;
    /* Not past max_tokens (the pass adds one token of its own), the
     * model's context, nor the draft model's. */
    int ctx = e->m->hp.max_ctx;
    if (e->o.draft && e->o.draft->hp.max_ctx < ctx) ctx = e->o.draft->hp.max_ctx;
    const int left = r->max_tokens - r->n_gen - 1, room_ctx = ctx - r->n_tokens - 1;
    if (k > left) k = left;
    if (k > room_ctx) k = room_ctx;
    return k > 0 ? k : 0;
}

void qe_spec_draft(qengine *e, req *r, int room)
{
    r->n_draft = 0;
    const int k = qe_spec_want(e, r, room);
    if (k < 1) return;
    /* The lookup, from the request's index of its n-grams where it has one
     * (kept up to date here: tokens are only ever appended). */
    if (!r->sidx) r->sidx = qspec_index_new(e->o.spec_ngram_min, e->o.spec_ngram_max);
    if (r->sidx && qspec_index_update(r->sidx, r->tokens, r->n_tokens)) qspec_index_free(r->sidx), r->sidx = NULL;
    int d = r->sidx ? qspec_index_propose(r->sidx, r->tokens, r->n_tokens, k, r->draft)
                    : qspec_ngram(r->tokens, r->n_tokens, e->o.spec_ngram_min, e->o.spec_ngram_max, k, r->draft);
    /* Under a grammar only drafts it allows, each row with its mask. */
    if (d >= 1 && r->gm) d = grammar_drafts(e, r, d);
    /* Their slots come after the next token's, in blocks r holds alone (a
     * fresh block when the next token filled the last one), from free
     * blocks only: drafts never preempt anyone nor evict cached prefixes. */
    if (d < 1) return;
    const int need = kv_seq_blocks_needed(e->pool, &r->kv, d);
    if (need < 0 || need > kv_pool_num_free(e->pool) || kv_seq_append(e->pool, &r->kv, r->draft, d)) return;
    r->n_draft = d;
}

/* The verify loop's view of one request's rows (qspec_verify). */
typedef struct {
    qengine *e;
    req *r;
    int row0;
    qfinish why;
} vrows;

/* Row j of the request's pass: its token taken (draft j when the sampler
 * keeps it), through the grammar, the stop conditions and an event.
 * Whether the request goes on. */
static int verify_row(void *ctx, int j, int *acc)
{
    vrows *v = ctx;
    qengine *e = v->e;
    req *r = v->r;
    const int d = r->n_draft, V = e->m->hp.n_vocab, row = v->row0 + j;
    sdraw dr = { .r = r, .lg = e->logits + (size_t)row * (size_t)V, .tok = -1 };
    /* With a grammar, the token before this one is its own now (the rows'
     * masks were made from the drafts ahead of time). */
    if (j && r->gm && qe_feed_now(e, r)) return v->why = QFINISH_ERROR, 0;
    const uint32_t *allowed = r->gm ? r->smask + (size_t)j * (((size_t)V + 31) / 32) : NULL;
    /* Log-probabilities are of the masked logits, as without drafts. */
    if (allowed && r->want_logprobs) qguide_mask_logits(allowed, (float *)dr.lg, V);
    if (e->b_rowmode[row] == QROW_ARGMAX) { /* greedy, reduced where the logits are */
        dr.tok = e->b_rowtok[row];
        *acc = j < d && dr.tok == r->draft[j];
    } else {
        /* A draft model's draft was drawn from its distribution q. */
        dr.tok = j < d ? qsample_verify_q(r->smp, dr.lg, allowed, r->dq ? r->dq + (size_t)j * (size_t)V : NULL,
                                          r->draft[j], acc)
                       : qsample_masked(r->smp, dr.lg, allowed);
    }
    if (dr.tok < 0) return *acc = 0, v->why = QFINISH_ERROR, 0;
    qe_draw_one(e, &dr); /* log-probabilities, when asked for */
    v->why = qe_take_token(e, r, &dr);
    return v->why == QFINISH_NONE;
}

qfinish qe_spec_take(qengine *e, req *r, int row0)
{
    const int d = r->n_draft, start = r->n_computed;
    vrows v = { e, r, row0, QFINISH_NONE };
    const int kept = qspec_verify(d, verify_row, &v);
    const qfinish why = v.why;
    /* The next token and the kept drafts are computed; the rest go. */
    r->n_computed = start + 1 + kept;
    qe_draft_cut(e, r, r->n_computed);
    kv_seq_truncate(e->pool, &r->kv, r->n_computed);
    kv_seq_commit(e->pool, &r->kv, r->n_computed);
    qe_window_drop(e, r);
    r->n_draft = 0, r->dq = NULL;
    /* Acceptance, and the next k. */
    r->spec_drafted += d, r->spec_accepted += kept;
    e->st.spec_drafted += (uint64_t)d, e->st.spec_accepted += (uint64_t)kept, e->st.spec_passes++;
    qspec_ctl_passed(&r->ctl, d, kept, e->o.spec_k);
    return why;
}
