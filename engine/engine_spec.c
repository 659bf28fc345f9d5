/* engine_spec.c - speculative decoding in a step (engine_int.h).
 *
 * A running request that may speculate gets drafts (spec/: n-gram lookup in
 * its own tokens) after its next token, in the same pass: the batch holds
 * [next, d1 .. dk] with a logit row at each position.  The target's row j
 * says what follows d1 .. dj: d(j+1) is kept when the sampler verifies it
 * (qsample_verify: greedy, when it is the target's own choice; sampling,
 * by rejection sampling, so the output is distributed as without drafts),
 * and the first refused draft is replaced by the target's token; when all
 * are kept the last row gives one more.  The refused drafts leave the kv
 * (kv_seq_truncate: their K/V were written but are never read), so
 * between steps a running request holds n_tokens - 1 computed tokens as
 * always.
 *
 * Each request's k follows its acceptance: one more after a pass that kept
 * everything, the kept count plus one after one that did not; a request
 * whose drafts are mostly refused rests (no drafts) for a while.
 *
 * Whether drafts pay at all depends on the machine as much as on the text:
 * a pass with drafts carries more tokens, and on the GPU it runs without
 * the one-token decode graph.  So the engine measures it: PROBE_STEPS
 * decode-only steps with drafts, as many without, then USE_STEPS with
 * drafts only if they gave 5% more tokens a second, and again; after each
 * probe lost in a row the next comes twice as late (up to USE_MAX steps). */
#include <string.h>

#include "engine_int.h"
#include "qerr.h"

_Static_assert(QENGINE_MAX_SPEC_K == QSPEC_MAX_K, "engine.h's bound on spec_k is spec.h's");

#define PROBE_STEPS 8
#define USE_STEPS 64
#define USE_MAX 2048
enum { SP_ON, SP_OFF, SP_USE }; /* probing with drafts, without, using the faster */

int qe_spec_allowed(qengine *e)
{
    e->sp.gen0 = e->st.generated;
    if (e->o.spec_always) return 1;
    if (e->sp.left <= 0 && e->sp.phase == SP_ON) e->sp.left = PROBE_STEPS; /* the first step */
    return e->sp.phase == SP_ON || (e->sp.phase == SP_USE && e->sp.use);
}

void qe_spec_step_done(qengine *e, int decode_only, double secs)
{
    const int catching_up = e->sp.catching_up;
    e->sp.catching_up = 0;
    if (e->o.spec_always || !decode_only) return; /* prompt chunks would weigh on either side */
    /* A draft model catching up after steps without drafts pays once for
     * them: not what a step with drafts costs (but a phase waits for at
     * most PROBE_STEPS such steps: new long prompts may keep coming). */
    if (catching_up && e->sp.phase == SP_ON && e->sp.skipped < PROBE_STEPS) {
        e->sp.skipped++;
        return;
    }
    if (e->sp.phase != SP_USE) {
        const int w = e->sp.phase == SP_ON;
        e->sp.tok[w] += (double)(e->st.generated - e->sp.gen0);
        e->sp.secs[w] += secs;
    }
    if (--e->sp.left > 0) return;
    if (e->sp.phase == SP_ON) {
        e->sp.phase = SP_OFF, e->sp.left = PROBE_STEPS;
    } else if (e->sp.phase == SP_OFF) {
        const double with = e->sp.secs[1] > 0 ? e->sp.tok[1] / e->sp.secs[1] : 0,
                     without = e->sp.secs[0] > 0 ? e->sp.tok[0] / e->sp.secs[0] : 0;
        e->sp.use = with > 1.05 * without; /* a clear gain: short steps' timings are noisy */
        e->st.spec_probes++, e->st.spec_probes_won += (uint64_t)e->sp.use;
        /* Each probe lost in a row doubles the steps until the next (a
         * probe's steps with drafts are a loss then), up to USE_MAX. */
        e->sp.use_len = e->sp.use                ? USE_STEPS
                        : e->sp.use_len < USE_STEPS ? 2 * USE_STEPS
                        : e->sp.use_len < USE_MAX   ? 2 * e->sp.use_len
                                                    : USE_MAX;
        e->sp.phase = SP_USE, e->sp.left = e->sp.use_len;
    } else {
        e->sp.phase = SP_ON, e->sp.left = PROBE_STEPS, e->sp.skipped = 0;
        e->sp.tok[0] = e->sp.tok[1] = e->sp.secs[0] = e->sp.secs[1] = 0;
    }
}

#define REST_STEPS 16    /* steps a request with a low acceptance goes without drafts (the first time) */
#define MAX_RESTS 6      /* doublings of a rest: up to 1,024 steps */
#define LOW_RATE 0.1     /* below this share of drafts kept (after MIN_PASSES passes) it rests */
#define MIN_PASSES 4

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

int qe_spec_awake(req *r)
{
    if (r->spec_k > 0) return 1;
    if (--r->spec_rest > 0) return 0;
    /* One draft to start with, and a rate two passes of nothing kept
     * bring under LOW_RATE again. */
    r->spec_k = 1, r->spec_rate = 2 * LOW_RATE;
    return 1;
}

int qe_spec_want(qengine *e, req *r, int room)
{
    if (!r->spec || r->n_forks || room < 1 || r->gm_failed || !qe_spec_awake(r)) return 0;
    int k = r->spec_k < room ? r->spec_k : room;
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

qfinish qe_spec_take(qengine *e, req *r, int row0)
{
    const int d = r->n_draft, V = e->m->hp.n_vocab, start = r->n_computed;
    const size_t words = ((size_t)V + 31) / 32;
    int kept = 0;
    qfinish why = QFINISH_NONE;
    for (int j = 0; j <= d; j++) {
        sdraw dr = { .r = r, .lg = e->logits + (size_t)(row0 + j) * (size_t)V, .tok = -1 };
        int acc = 0;
        /* With a grammar, the token before this one is its own now (the
         * rows' masks were made from the drafts ahead of time). */
        if (j && r->gm && qe_feed_now(e, r)) {
            why = QFINISH_ERROR;
            break;
        }
        const uint32_t *allowed = r->gm ? r->smask + (size_t)j * words : NULL;
        /* Log-probabilities are of the masked logits, as without drafts. */
        if (allowed && r->want_logprobs) qguide_mask_logits(allowed, (float *)dr.lg, V);
        if (e->b_rowmode[row0 + j] == QROW_ARGMAX) { /* greedy, reduced where the logits are */
            dr.tok = e->b_rowtok[row0 + j];
            acc = j < d && dr.tok == r->draft[j];
        } else {
            /* A draft model's draft was drawn from its distribution q. */
            dr.tok = j < d ? qsample_verify_q(r->smp, dr.lg, allowed, r->dq ? r->dq + (size_t)j * (size_t)V : NULL,
                                              r->draft[j], &acc)
                           : qsample_masked(r->smp, dr.lg, allowed);
        }
        if (dr.tok < 0) {
            why = QFINISH_ERROR;
            break;
        }
        qe_draw_one(e, &dr); /* log-probabilities, when asked for */
        why = qe_take_token(e, r, &dr);
        kept += acc;
        if (why != QFINISH_NONE || !acc) break;
    }
    /* The next token and the kept drafts are computed; the rest go. */
    r->n_computed = start + 1 + kept;
    qe_draft_cut(e, r, r->n_computed);
    kv_seq_truncate(e->pool, &r->kv, r->n_computed);
    kv_seq_commit(e->pool, &r->kv, r->n_computed);
    r->n_draft = 0, r->dq = NULL;
    /* Acceptance, and the next k. */
    r->spec_drafted += d, r->spec_accepted += kept, r->spec_passes++;
    e->st.spec_drafted += (uint64_t)d, e->st.spec_accepted += (uint64_t)kept, e->st.spec_passes++;
    const double rate = (double)kept / d;
    r->spec_rate = r->spec_passes == 1 ? rate : 0.7 * r->spec_rate + 0.3 * rate;
    if (kept == d) r->spec_k = r->spec_k < e->o.spec_k ? r->spec_k + 1 : e->o.spec_k;
    else r->spec_k = kept + 1 < e->o.spec_k ? kept + 1 : e->o.spec_k;
    /* A good pass ends the run of rests; each rest in a run lasts twice the
     * last (REST_STEPS up to REST_STEPS << MAX_RESTS). */
    if (rate >= 3 * LOW_RATE) r->spec_rests = 0;
    if (r->spec_passes >= MIN_PASSES && r->spec_rate < LOW_RATE) {
        r->spec_k = 0;
        r->spec_rest = REST_STEPS << (r->spec_rests < MAX_RESTS ? r->spec_rests : MAX_RESTS);
        r->spec_rests++;
    }
    return why;
}
