/* engine.c - requests, the step and the public API (the scheduler is
 * sched.c's, guided decoding's masks engine_guided.c's, speculation
 * engine_spec.c's and engine_draft.c's; the types they share are in
 * engine_int.h).
 *
 * The engine thread owns every request; other threads talk to it only
 * through two mutex-protected queues: the inbox (submissions and
 * cancellations) and the outbox (events).  A request lives in one of the
 * scheduler's lists (waiting, running, swapped: sched.c) from its
 * submission to its end (qe_finish), which releases its blocks (full ones
 * stay in the prefix cache) and emits its last event.
 *
 * One step (qengine_step):
 *   1. drain the inbox; finish cancelled requests;
 *   2. the plan: sched_decodes gives every running request its next
 *      token's slot, the proposers add drafts from the budget left
 *      (propose_drafts), sched_admit resumes swapped requests and admits
 *      prompt chunks (sched.c's header has the rules and invariants);
 *   3. one forward pass over the plan's batch (batch_from_plan, plan_rows,
 *      run_pass): logits only for sequences that finish their prompt in
 *      this step or decode, reduced on the device where the backend can
 *      (an argmax, a draw, log-probabilities), guided rows' masks made on
 *      the guide thread meanwhile;
 *   4. newly full blocks are hashed into the prefix cache (kv_seq_commit);
 *      each row is drawn (in parallel where a pool exists, list_draws),
 *      then the draws are taken in order (apply_draws): drafts verified,
 *      parallel samples forked, each token checked against EOS, stop ids,
 *      max_tokens and the context length, detokenized and passed through
 *      the stop-string matcher, and made an event.
 */
#define _GNU_SOURCE
#include "engine.h"
#include "engine_int.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- events ---------------------------------------------------------------- */

static int push_event(qengine *e, const qevent *ev)
{
    pthread_mutex_lock(&e->mu);
    if (e->ev_n == e->ev_cap) {
        size_t cap = e->ev_cap ? e->ev_cap * 2 : 64;
        qevent *ne = q_mallocn(cap, sizeof *ne);
        if (!ne) {
            pthread_mutex_unlock(&e->mu);
            return QERR_NOMEM;
        }
        for (size_t i = 0; i < e->ev_n; i++) ne[i] = e->events[(e->ev_head + i) % e->ev_cap];
        free(e->events);
        e->events = ne;
        e->ev_cap = cap;
        e->ev_head = 0;
    }
    e->events[(e->ev_head + e->ev_n) % e->ev_cap] = *ev;
    e->ev_n++;
    pthread_mutex_unlock(&e->mu);
    return 0;
}

int qengine_poll(qengine *e, qevent *ev)
{
    pthread_mutex_lock(&e->mu);
    int got = e->ev_n > 0;
    if (got) {
        *ev = e->events[e->ev_head];
        e->ev_head = (e->ev_head + 1) % e->ev_cap;
        e->ev_n--;
    }
    pthread_mutex_unlock(&e->mu);
    return got;
}

/* ---- requests ---------------------------------------------------------------- */

static void req_free(req *r)
{
    if (!r) return;
    free(r->forks);
    free(r->slots);
    free(r->tokens);
    free(r->stop_ids);
    qsampler_destroy(r->smp);
    gram_m_free(r->gm);
    free(r->gmask);
    free(r->smask);
    qspec_index_free(r->sidx);
    qdetok_free(r->detok);
    qstop_free(r->stop);
    free(r);
}

/* Frees r's KV: its blocks (full ones stay cached) and its swap slots. */
void qe_release_kv(qengine *e, req *r)
{
    sched_slots_release(&e->s, r);
    kv_seq_free(e->pool, &r->kv);
}

/* Finishes r: frees its blocks (full ones stay cached) and swap slots, emits
 * the finish event with any held-back text, and releases it. */

void qe_finish(qengine *e, req *r, qfinish why)
{
    /* Samples still waiting for this one's prompt end with it. */
    for (int i = 0; i < r->n_forks; i++) qe_finish(e, r->forks[i], why == QFINISH_CANCELLED ? why : QFINISH_ERROR);
    r->n_forks = 0;
    qevent ev = { .id = r->id, .index = r->index, .token = -1, .finish = why, .prompt_tokens = r->n_prompt,
                  .completion_tokens = r->n_gen, .cached_tokens = r->cached_tokens,
                  .cached_disk_tokens = r->cached_disk < r->cached_tokens ? r->cached_disk : r->cached_tokens,
                  .spec_drafted = r->spec_drafted,
                  .spec_accepted = r->spec_accepted, .spec_passes = r->ctl.passes };
    /* Text still held (an incomplete character, a byte-fallback run, a
     * possible stop prefix) goes out, unless a stop string ended the text. */
    if (!(why == QFINISH_STOP && r->stop_string) && why != QFINISH_CANCELLED && why != QFINISH_ERROR) {
        const char *t = "";
        size_t tl = 0;
        if (r->detok) qdetok_flush(r->detok, &t, &tl);
        qstop_out so = { "", 0, 0, -1 };
        if (r->stop) {
            if (tl) qstop_feed(r->stop, t, tl, &so);
            char *acc = NULL;
            size_t al = 0;
            if (so.len && (acc = malloc(so.len))) memcpy(acc, so.text, al = so.len);
            qstop_out fl;
            qstop_flush(r->stop, &fl);
            if (fl.len) {
                char *na = realloc(acc, al + fl.len);
                if (na) {
                    memcpy(na + al, fl.text, fl.len);
                    acc = na;
                    al += fl.len;
                }
            }
            ev.text = acc;
            ev.text_len = acc ? al : 0;
        } else if (tl && (ev.text = malloc(tl))) {
            memcpy(ev.text, t, tl);
            ev.text_len = tl;
        }
    }
    double now = q_now();
    ev.ttft_s = r->t_first > 0 ? r->t_first - r->t_submit : now - r->t_submit;
    ev.total_s = now - r->t_submit;
    if (e->tier) qtier_persist(e->tier, &r->kv);
    qe_release_kv(e, r);
    if (push_event(e, &ev)) free(ev.text);
    e->st.finished++;
    pthread_mutex_lock(&e->mu);
    e->live--;
    pthread_mutex_unlock(&e->mu);
    req_free(r);
}

/* One sample's request state: tokens, sampler (seed + index), detokenizer
 * primed with the prompt, stop matcher. */
static int new_req(qengine *e, const qreq_params *p, int index, req **out, char *err, size_t errlen)
{
    const int V = e->m->hp.n_vocab;
    int rc;
    *out = NULL;
    req *r = calloc(1, sizeof *r);
    if (!r) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    kv_seq_init(&r->kv);
    r->index = index;
    r->cap_tokens = p->n_prompt + (p->max_tokens < 4096 ? p->max_tokens : 4096) + 1;
    r->tokens = q_mallocn((size_t)r->cap_tokens, sizeof *r->tokens);
    if (p->n_stop_ids) r->stop_ids = q_mallocn((size_t)p->n_stop_ids, sizeof *r->stop_ids);
    if (!r->tokens || (p->n_stop_ids && !r->stop_ids)) {
        req_free(r);
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    }
    memcpy(r->tokens, p->prompt, sizeof *r->tokens * (size_t)p->n_prompt);
    r->n_tokens = r->n_prompt = p->n_prompt;
    if (p->n_stop_ids) memcpy(r->stop_ids, p->stop_ids, sizeof *r->stop_ids * (size_t)p->n_stop_ids);
    r->n_stop_ids = p->n_stop_ids;
    r->max_tokens = p->max_tokens;
    r->ignore_eos = p->ignore_eos;
    r->want_logprobs = p->sp.logprobs;
    r->top_logprobs = p->sp.top_logprobs;
    qsample_params sp = p->sp;
    sp.seed += (uint64_t)index;
    /* min_tokens: EOS and the stop ids are banned until it is reached. */
    int32_t ban[QENGINE_MAX_MIN_IDS];
    if (p->min_tokens > 0) {
        int nb = 0;
        for (int i = 0; !p->ignore_eos && i < e->m->n_eos && nb < QENGINE_MAX_MIN_IDS; i++) ban[nb++] = e->m->eos_ids[i];
        for (int i = 0; i < p->n_stop_ids && nb < QENGINE_MAX_MIN_IDS; i++) ban[nb++] = p->stop_ids[i];
        sp.min_tokens = p->min_tokens, sp.min_ids = ban, sp.n_min_ids = nb;
    }
    r->min_tokens = p->min_tokens;
    if ((rc = qsampler_new(&sp, V, &r->smp, err, errlen)) ||
        (rc = qsampler_observe_prompt(r->smp, p->prompt, p->n_prompt))) {
        req_free(r);
        return rc;
    }
    if (e->tok && !(r->detok = qdetok_new(e->tok, p->keep_special ? 0 : QTOK_SKIP_SPECIAL))) {
        req_free(r);
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    }
    /* The detokenizer sees the prompt first, so that the output continues it
     * exactly (SentencePiece's leading space belongs to the prompt's start,
     * not to the first generated piece). */
    for (int i = 0; r->detok && i < p->n_prompt; i++) {
        const char *t;
        size_t tl;
        if (qdetok_push(r->detok, p->prompt[i], &t, &tl)) {
            req_free(r);
            return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        }
    }
    if (r->detok) qdetok_drop_held(r->detok); /* the prompt's tail is not output */
    if (e->tok && (rc = qstop_new(p->stop, NULL, p->n_stop, p->include_stop_str ? QSTOP_INCLUDE : 0, &r->stop, err,
                                  errlen))) {
        req_free(r);
        return rc;
    }
    if (r->stop && p->min_tokens > 1) qstop_arm(r->stop, 0);
    r->gjob = -1;
    r->gpend = -1;
    r->spec = e->o.spec_mode != QSPEC_NONE && !p->no_spec;
    r->ctl = qspec_ctl_start(e->o.spec_k);
    if (p->grammar) {
        r->gm = gram_m_new(p->grammar);
        r->gv = p->grammar_vocab;
        r->gmask = calloc(((size_t)V + 31) / 32, sizeof *r->gmask);
        if (!r->gm || !r->gmask) {
            req_free(r);
            return qerr_set(err, errlen, QERR_NOMEM, "out of memory for the grammar");
        }
    }
    *out = r;
    return 0;
}

int qengine_submit(qengine *e, const qreq_params *p, uint64_t *id, char *err, size_t errlen)
{
    const int V = e->m->hp.n_vocab;
    if (!p->prompt || p->n_prompt < 1) return qerr_set(err, errlen, QERR_INVAL, "the prompt is empty");
    if (p->n_prompt >= e->m->hp.max_ctx)
        return qerr_set(err, errlen, QERR_RANGE, "the prompt has %d tokens; the model's context is %d", p->n_prompt,
                        e->m->hp.max_ctx);
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= V)
            return qerr_set(err, errlen, QERR_RANGE, "prompt token %d is %d, outside the vocabulary (%d)", i,
                            p->prompt[i], V);
    if (p->max_tokens < 1) return qerr_set(err, errlen, QERR_RANGE, "max_tokens must be at least 1");
    if (p->min_tokens < 0 || p->min_tokens > p->max_tokens)
        return qerr_set(err, errlen, QERR_RANGE, "min_tokens (%d) must be in [0, max_tokens (%d)]", p->min_tokens,
                        p->max_tokens);
    if (p->n_stop_ids < 0 || p->n_stop_ids > QENGINE_MAX_STOP_IDS)
        return qerr_set(err, errlen, QERR_RANGE, "at most %d stop token ids", QENGINE_MAX_STOP_IDS);
    if (p->n_stop < 0 || p->n_stop > QENGINE_MAX_STOP)
        return qerr_set(err, errlen, QERR_RANGE, "at most %d stop strings", QENGINE_MAX_STOP);
    if (p->n_stop && !e->tok) return qerr_set(err, errlen, QERR_INVAL, "stop strings need the model's tokenizer");
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= V)
            return qerr_set(err, errlen, QERR_RANGE, "stop token id %d is outside the vocabulary", p->stop_ids[i]);
    if (p->grammar && (!p->grammar_vocab || gram_vocab_size(p->grammar_vocab) > V))
        return qerr_set(err, errlen, QERR_INVAL, "a grammar needs the model's vocabulary (no larger than %d tokens)", V);
    int n = p->n <= 0 ? 1 : p->n;
    if (n > QENGINE_MAX_N) return qerr_set(err, errlen, QERR_RANGE, "n must be at most %d", QENGINE_MAX_N);
    req *r = NULL;
    int rc = new_req(e, p, 0, &r, err, errlen);
    if (rc) return rc;
    if (n > 1) {
        if (!(r->forks = calloc((size_t)n - 1, sizeof *r->forks))) {
            req_free(r);
            return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        }
        for (int i = 1; i < n; i++) {
            if ((rc = new_req(e, p, i, &r->forks[i - 1], err, errlen))) {
                for (int k = 0; k < i - 1; k++) req_free(r->forks[k]);
                r->n_forks = 0;
                req_free(r);
                return rc;
            }
            r->n_forks = i;
        }
    }
    r->t_submit = q_now();
    pthread_mutex_lock(&e->mu);
    r->id = ++e->next_id;
    for (int i = 0; i < r->n_forks; i++) r->forks[i]->id = r->id, r->forks[i]->t_submit = r->t_submit;
    if (e->inbox_tail) e->inbox_tail->next = r;
    else e->inbox_head = r;
    e->inbox_tail = r;
    e->live += 1 + r->n_forks;
    pthread_mutex_unlock(&e->mu);
    if (id) *id = r->id;
    return 0;
}

int qengine_cancel(qengine *e, uint64_t id)
{
    pthread_mutex_lock(&e->mu);
    int rc = 0;
    if (id == 0 || id > e->next_id) {
        rc = QERR_NOTFOUND;
    } else if (e->n_cancels == e->cap_cancels) {
        int cap = e->cap_cancels ? e->cap_cancels * 2 : 16;
        uint64_t *nc = q_reallocn(e->cancels, (size_t)cap, sizeof *nc);
        if (!nc) rc = QERR_NOMEM;
        else e->cancels = nc, e->cap_cancels = cap;
    }
    if (!rc) e->cancels[e->n_cancels++] = id;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* Takes the prefix r has in the pool now, and when its chain goes on
 * past it, asks the persistent tier for the rest (r waits for the answer
 * while other requests run). */
static void tier_begin(qengine *e, req *r)
{
    if (!e->tier || e->o.no_prefix_cache || e->o.static_batching || r->n_computed || r->kv.n_tokens) return;
    int eligible = 0;
    const int hits = kv_prefix_probe(e->pool, r->tokens, r->n_tokens, &eligible);
    if (hits < 0 || hits >= eligible) return; /* all in the pool, or nothing to ask for */
    if (hits > 0) {
        const int reused = kv_seq_match_prefix(e->pool, &r->kv, r->tokens, r->n_tokens);
        if (reused < 0) return;
        r->n_computed = reused;
        r->cached_tokens = reused < r->n_prompt ? reused : r->n_prompt;
        e->st.tokens_reused += (uint64_t)reused;
    }
    r->tier_wait = qtier_lookup_if_faster(e->tier, r->id, r->tokens, r->n_tokens, r->kv.n_hashed, e->prefill_rate,
                                          e->o.tier_always_load);
}

/* The tier's answers: blocks found are imported into their requests. */
static void tier_answers(qengine *e)
{
    qstore_job *j;
    while ((j = qtier_poll(e->tier))) {
        req *r = e->s.waiting.head;
        while (r && !(r->id == j->tag && r->tier_wait)) r = r->next;
        if (!r) { /* cancelled meanwhile */
            qstore_job_free(j);
            continue;
        }
        r->tier_wait = 0;
        const int before = r->kv.n_tokens;
        const int got = qtier_import(e->tier, j, &r->kv);
        if (got < 0) {
            QLOGW("loading request %llu's prefix from disk failed (%s)", (unsigned long long)r->id, qerr_str(got));
            rl_remove(&e->s.waiting, r);
            qe_finish(e, r, QFINISH_ERROR);
            continue;
        }
        if (got == 0) continue;
        const int added = r->kv.n_tokens - before;
        r->n_computed = r->kv.n_tokens;
        r->cached_tokens = r->n_computed < r->n_prompt ? r->n_computed : r->n_prompt;
        r->cached_disk += added;
        e->st.tokens_reused += (uint64_t)added;
    }
}

static void drain_inbox(qengine *e)
{
    pthread_mutex_lock(&e->mu);
    req *r = e->inbox_head;
    e->inbox_head = e->inbox_tail = NULL;
    int nc = e->n_cancels;
    uint64_t *cancels = NULL;
    if (nc && (cancels = malloc(sizeof *cancels * (size_t)nc))) memcpy(cancels, e->cancels, sizeof *cancels * (size_t)nc);
    e->n_cancels = 0;
    pthread_mutex_unlock(&e->mu);
    while (r) {
        req *nx = r->next;
        e->st.prompt_tokens_total += (uint64_t)r->n_prompt;
        rl_push_back(&e->s.waiting, r);
        tier_begin(e, r);
        r = nx;
    }
    for (int i = 0; i < nc && cancels; i++) {
        rlist *lists[3] = { &e->s.waiting, &e->s.running, &e->s.swapped };
        for (int k = 0; k < 3; k++)
            for (req *q = lists[k]->head; q; q = q->next)
                if (q->id == cancels[i]) q->cancelled = 1;
    }
    free(cancels);
    rlist *lists[3] = { &e->s.waiting, &e->s.running, &e->s.swapped };
    for (int k = 0; k < 3; k++) {
        req *q = lists[k]->head;
        while (q) {
            req *nx = q->next;
            if (q->cancelled) {
                rl_remove(lists[k], q);
                qe_finish(e, q, QFINISH_CANCELLED);
            }
            q = nx;
        }
    }
}

/* ---- scheduling ---------------------------------------------------------------- */

/* Logit rows a step may ask for: one a sequence, and one a draft. */
static int rows_needed(const qengine *e)
{
    if (e->o.spec_mode == QSPEC_NONE) return e->o.max_seqs;
    /* Drafts only in steps of fewer than spec_max_batch decodes. */
    const int drafters = e->o.max_seqs < e->o.spec_max_batch - 1 ? e->o.max_seqs : e->o.spec_max_batch - 1;
    const int drafts = drafters * e->o.spec_k;
    return e->o.max_seqs + (drafts < e->o.max_batch_tokens ? drafts : e->o.max_batch_tokens);
}

static int ensure_scratch(qengine *e, int n_tokens, int n_seqs, int n_rows)
{
    if (n_tokens > e->cap_tokens) {
        if (GROW(e->b_tokens, n_tokens) || GROW(e->b_logits_idx, n_tokens)) return QERR_NOMEM;
        e->cap_tokens = n_tokens;
    }
    if (n_seqs > e->cap_seqs) {
        if (GROW(e->b_seqs, n_seqs) || GROW(e->b_reqs, n_seqs) || GROW(e->b_sample, n_seqs) || GROW(e->b_row0, n_seqs))
            return QERR_NOMEM;
        e->cap_seqs = n_seqs;
    }
    if (n_rows > e->cap_rows) {
        if (GROW(e->b_rowmode, n_rows) || GROW(e->b_rowtok, n_rows) || GROW(e->b_rsample, n_rows) ||
            GROW(e->b_rlp, n_rows) || GROW(e->b_rowmask, n_rows))
            return QERR_NOMEM;
        /* The logits come back from the backend every step: in memory it
         * transfers to fast (pinned, on CUDA).  Nothing in them outlives a step. */
        const size_t lbytes = (size_t)n_rows * (size_t)e->m->hp.n_vocab * sizeof(float);
        if (lbytes / sizeof(float) / (size_t)n_rows != (size_t)e->m->hp.n_vocab) return QERR_NOMEM;
        float *lg = qbackend_host_alloc(e->be, lbytes);
        if (!lg) return QERR_NOMEM;
        if (e->logits) qbackend_host_free(e->be, e->logits);
        e->logits = lg;
        e->cap_rows = n_rows;
    }
    return 0;
}

static int grow_tokens(req *r)
{
    if (r->n_tokens < r->cap_tokens) return 0;
    int cap = r->cap_tokens * 2;
    int32_t *t = q_reallocn(r->tokens, (size_t)cap, sizeof *t);
    if (!t) return QERR_NOMEM;
    r->tokens = t;
    r->cap_tokens = cap;
    return 0;
}

static int is_stop_token(const qengine *e, const req *r, int tok)
{
    if (!r->ignore_eos)
        for (int i = 0; i < e->m->n_eos; i++)
            if (e->m->eos_ids[i] == tok) return 1;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == tok) return 1;
    return 0;
}

/* Samples r's next token from logits (or takes tok >= 0, the backend's
 * argmax of a greedy row, whose logits were not copied) and emits it.
 * Returns why r is done, or QFINISH_NONE to go on (the caller removes r
 * from its list and calls finish). */

void qe_draw_one(qengine *e, sdraw *d)
{
    if (d->tok < 0) d->tok = d->u ? qsample_with_uniform(d->r->smp, d->lg, *d->u) : qsample(d->r->smp, d->lg);
    d->n_lp = 0;
    if (d->r->want_logprobs && d->blp && d->blp->n >= 0) {
        /* Computed where the logits are (n 0: none, as qsample_logprobs
         * refuses a row with no finite logit). */
        for (int i = 0; i < d->blp->n; i++) d->lp[i] = (qlogprob){ d->blp->id[i], d->blp->logprob[i] };
        d->n_lp = d->blp->n;
    } else if (d->r->want_logprobs) {
        /* vLLM v1's default: the model's own distribution (raw logits). */
        int got = qsample_logprobs(d->lg, e->m->hp.n_vocab, d->tok, d->r->top_logprobs, d->lp, NULL);
        if (got > 0) d->n_lp = got;
    }
}

static void draw_task(void *ctx, int task, int tid)
{
    (void)tid;
    qengine *e = ctx;
    qe_draw_one(e, &e->draws[task]);
}

qfinish qe_take_token(qengine *e, req *r, const sdraw *d)
{
    const int tok = d->tok;
    qevent ev = { .id = r->id, .index = r->index, .token = tok, .finish = QFINISH_NONE };
    if (d->n_lp > 0) {
        ev.logprob = d->lp[0].logprob;
        ev.n_top = d->n_lp - 1;
        memcpy(ev.top, d->lp + 1, sizeof(qlogprob) * (size_t)ev.n_top);
    }
    if (r->t_first == 0) r->t_first = q_now();
    if (r->gm_failed) return QFINISH_ERROR;
    if (r->gdone) return QFINISH_STOP; /* its grammar took the last token: complete, nothing more follows */
    e->st.generated++;
    if (is_stop_token(e, r, tok)) return QFINISH_STOP;
    /* The grammar takes the token (the mask allowed it) with the next
     * mask, on a guide thread while the pass runs; EOS, which the mask
     * allows only where the output is complete, ends it.  (Where the
     * grammar then allows nothing more, the next mask allows EOS alone: a
     * model without EOS ids has its grammar fed now.) */
    if (r->gm) {
        for (int k = 0; k < e->m->n_eos; k++)
            if (tok == e->m->eos_ids[k]) return QFINISH_STOP;
        r->gpend = tok;
        if (e->m->n_eos == 0 && qe_feed_now(e, r)) return QFINISH_ERROR;
    }
    qsampler_accept(r->smp, tok);
    if (grow_tokens(r)) return QFINISH_ERROR;
    r->tokens[r->n_tokens++] = tok;
    r->n_gen++;
    if (r->stop && r->min_tokens > 1 && r->n_gen == r->min_tokens) qstop_arm(r->stop, 1);
    int stopped = 0;
    if (r->detok) {
        const char *t;
        size_t tl;
        if (qdetok_push(r->detok, tok, &t, &tl) == 0) {
            qstop_out so;
            if (qstop_feed(r->stop, t, tl, &so) == 0) {
                if (so.len && (ev.text = malloc(so.len))) {
                    memcpy(ev.text, so.text, so.len);
                    ev.text_len = so.len;
                }
                stopped = so.stopped;
            }
        }
    }
    if (push_event(e, &ev)) free(ev.text);
    if (stopped) {
        r->stop_string = 1;
        return QFINISH_STOP;
    }
    if (r->gm && r->gpend < 0 && gram_m_done(r->gm)) return QFINISH_STOP; /* complete: nothing can follow */
    if (r->n_gen >= r->max_tokens || r->n_tokens >= e->m->hp.max_ctx) {
        /* Out of tokens: unless the output is complete right here. */
        if (r->gm && qe_feed_now(e, r)) return QFINISH_ERROR;
        if (r->gm && gram_m_done(r->gm)) return QFINISH_STOP;
        return QFINISH_LENGTH;
    }
    return QFINISH_NONE;
}

static int n_live(const qengine *e)
{
    return sched_live(&e->s);
}

int qengine_broken(const qengine *e)
{
    return e->be->ops->broken && e->be->ops->broken(e->be);
}

/* The scheduler gave r up (it can never fit, or its blocks could not be
 * restored): it ends in error. */
static void sched_failed(void *ctx, req *r)
{
    qe_finish(ctx, r, QFINISH_ERROR);
}

/* Drafts for the plan's decodes, from the budget sched_decodes left: the
 * draft model's, or the n-gram lookup's. */
static void propose_drafts(qengine *e, sched_plan *p)
{
    if (e->drafter) {
        qe_draft_run(e, p->dec, p->n_dec, &p->budget);
        return;
    }
    for (int i = 0; i < p->n_dec; i++) {
        qe_spec_draft(e, p->dec[i], p->budget);
        p->budget -= p->dec[i]->n_draft;
    }
}

/* The plan's sequences into the batch's arrays: b_reqs, b_sample, b_seqs,
 * b_tokens.  Returns the batch's token count. */
static int batch_from_plan(qengine *e, const sched_plan *p)
{
    int n_tok = 0;
    for (int i = 0; i < p->n_seqs; i++) {
        const sched_seq *sq = &p->seqs[i];
        req *q = sq->r;
        const int n = sq->decode ? 1 + q->n_draft : sq->n_tokens;
        e->b_reqs[i] = q;
        e->b_sample[i] = sq->sample;
        e->b_seqs[i] = (qbatch_seq){ n_tok, n, q->n_computed, q->kv.blocks, q->kv.n_blocks };
        if (sq->decode) {
            e->b_tokens[n_tok++] = q->tokens[q->n_tokens - 1];
            for (int j = 0; j < q->n_draft; j++) e->b_tokens[n_tok++] = q->draft[j];
        } else {
            memcpy(e->b_tokens + n_tok, q->tokens + q->n_computed, sizeof(int32_t) * (size_t)n);
            n_tok += n;
        }
    }
    return n_tok;
}

/* The logit rows of a decode with drafts: one for each position, verified
 * on the host; a greedy request needs only each row's argmax. */
static int draft_rows(qengine *e, int i, int n_logits)
{
    const req *q = e->b_reqs[i];
    const uint8_t mode = qsampler_is_greedy(q->smp) && !q->want_logprobs && !q->gm ? QROW_ARGMAX : QROW_LOGITS;
    for (int j = 0; j <= q->n_draft; j++) {
        memset(&e->b_rsample[n_logits], 0, sizeof e->b_rsample[n_logits]);
        e->b_rlp[n_logits].n = -1;
        e->b_rowmask[n_logits] = NULL;
        e->b_rowmode[n_logits] = mode;
        e->b_logits_idx[n_logits++] = e->b_seqs[i].first + j;
    }
    return n_logits;
}

/* Sequence i's one logit row.  A row without logprobs or parallel samples
 * needs only its token: the backend reduces it where the logits are - the
 * argmax of a greedy row, or a plain temperature draw (with the one random
 * number qsample would take, drawn here) where the backend can.  A guided
 * row's mask goes with it where the backend applies masks (into mrows, the
 * backend's memory for them, when it has some). */
static void sample_row(qengine *e, int i, int row, uint32_t *mrows)
{
    req *q = e->b_reqs[i];
    const size_t mwords = ((size_t)e->m->hp.n_vocab + 31) / 32;
    uint8_t mode = QROW_LOGITS;
    qrow_sample *rs = &e->b_rsample[row];
    memset(rs, 0, sizeof *rs);
    e->b_rlp[row].n = -1;
    const unsigned caps = e->be->ops->caps;
    const int dev_mask = q->gm && !q->gm_failed && (caps & QBE_CAP_ROW_MASK);
    q->gdst = dev_mask && mrows ? mrows + (size_t)row * mwords : q->gmask;
    e->b_rowmask[row] = dev_mask ? q->gdst : NULL;
    /* Log-probabilities too, where the backend computes them. */
    if (q->n_forks == 0 && (!q->gm || dev_mask) && (!q->want_logprobs || (caps & QBE_CAP_ROW_LOGPROBS))) {
        if (qsampler_is_greedy(q->smp)) mode = QROW_ARGMAX;
        else if ((caps & QBE_CAP_ROW_SAMPLE) &&
                 qsampler_row_params(q->smp, &rs->temperature, &rs->top_k, &rs->top_p, &rs->min_p)) {
            rs->u = qsampler_take_uniform(q->smp);
            mode = QROW_SAMPLE;
        }
        if (mode != QROW_LOGITS && q->want_logprobs) rs->n_logprobs = 1 + q->top_logprobs;
    }
    e->b_rowmode[row] = mode;
    e->b_logits_idx[row] = e->b_seqs[i].first + e->b_seqs[i].n_tokens - 1;
}

/* The step's logit rows (a sampled sequence's, and one a draft): modes,
 * masks, indices.  Returns how many. */
static int plan_rows(qengine *e, int n_seqs)
{
    int n_rows = 0;
    for (int i = 0; i < n_seqs; i++)
        if (e->b_sample[i]) n_rows += 1 + e->b_reqs[i]->n_draft;
    uint32_t *mrows = NULL;
    if (e->be->ops->mask_rows && (e->be->ops->caps & QBE_CAP_ROW_MASK))
        for (int i = 0; i < n_seqs; i++)
            if (e->b_sample[i] && e->b_reqs[i]->gm && !e->b_reqs[i]->gm_failed) {
                mrows = e->be->ops->mask_rows(e->be, n_rows); /* once: NULL falls back to the requests' own */
                break;
            }
    int n_logits = 0;
    for (int i = 0; i < n_seqs; i++) {
        if (!e->b_sample[i]) continue;
        e->b_row0[i] = n_logits;
        if (e->b_reqs[i]->n_draft) {
            n_logits = draft_rows(e, i, n_logits);
            continue;
        }
        sample_row(e, i, n_logits++, mrows);
    }
    return n_logits;
}

/* The forward pass over the batch, the guided rows' masks made meanwhile;
 * the prefill rate measured.  0, or the backend's error with every
 * sequence of the batch ended. */
static int run_pass(qengine *e, int n_seqs, int n_tok, int n_logits)
{
    /* The masks are made while the pass runs; a backend that applies them
     * waits for them once its layers are launched, others get them after. */
    const int n_masks = qe_start_masks(e, n_seqs);
    const int dev_masks = n_masks && (e->be->ops->caps & QBE_CAP_ROW_MASK);
    if (!n_masks)
        /* No guide thread (or no memory for the jobs): the masks are made
         * on the host after the pass, so guided rows come back whole. */
        for (int row = 0; row < n_logits; row++)
            if (e->b_rowmask[row]) e->b_rowmask[row] = NULL, e->b_rowmode[row] = QROW_LOGITS, e->b_rsample[row].n_logprobs = 0;
    const qrow_masks rm = { e->b_rowmask, qe_masks_ready, e };
    qbatch b = { n_tok, e->b_tokens, n_seqs, e->b_seqs, n_logits, e->b_logits_idx, e->b_rowmode, e->b_rowtok,
                 e->b_rsample, (e->be->ops->caps & QBE_CAP_ROW_LOGPROBS) ? e->b_rlp : NULL, dev_masks ? &rm : NULL };
    const double t_fwd = q_now();
    const int rc = e->be->ops->forward(e->be, &b, e->logits);
    if (n_masks) {
        qe_masks_ready(e); /* at once when the backend waited already: the matchers are the engine's again */
        e->st.masks_overlapped += (uint64_t)n_masks;
    }
    /* The prefill rate, against which loading a prefix is weighed. */
    int n_prefill = n_tok;
    for (int i = 0; i < n_seqs; i++)
        if (e->b_reqs[i]->n_computed >= e->b_reqs[i]->n_prompt) n_prefill -= e->b_seqs[i].n_tokens; /* a decode, drafts and all */
    const double dt = q_now() - t_fwd;
    e->st.forward_s += dt;
    if (!rc && n_prefill >= 128 && dt > 0) {
        const double rate = n_prefill / dt;
        e->prefill_rate = e->prefill_rate > 0 ? 0.7 * e->prefill_rate + 0.3 * rate : rate;
    }
    e->st.tokens_computed += (uint64_t)n_tok;
    if (rc)
        for (int i = 0; i < n_seqs; i++) {
            req *q = e->b_reqs[i];
            rl_remove(&e->s.waiting, q);
            rl_remove(&e->s.running, q);
            qe_finish(e, q, QFINISH_ERROR);
        }
    return rc;
}

/* The pass's tokens committed to the cache, and the step's draws listed
 * (forks first, as they are listed, then their parent), guided rows
 * masked first.  Returns how many draws, or QERR_NOMEM with the sampled
 * sequences ended. */
static int list_draws(qengine *e, int n_seqs)
{
    int n_draws = 0;
    for (int i = 0; i < n_seqs; i++) {
        req *q = e->b_reqs[i];
        if (q->n_draft) continue; /* qe_spec_take: as far as the drafts are kept */
        q->n_computed += e->b_seqs[i].n_tokens;
        kv_seq_commit(e->pool, &q->kv, q->n_computed);
        qe_window_drop(e, q);
        if (e->b_sample[i]) n_draws += 1 + q->n_forks;
    }
    if (n_draws > e->cap_draws) {
        if (GROW(e->draws, n_draws)) {
            for (int i = 0; i < n_seqs; i++) {
                req *q = e->b_reqs[i];
                if (!e->b_sample[i]) continue;
                rl_remove(&e->s.running, q);
                qe_finish(e, q, QFINISH_ERROR);
            }
            return QERR_NOMEM;
        }
        e->cap_draws = n_draws;
    }
    int dk = 0;
    for (int i = 0; i < n_seqs; i++) {
        if (!e->b_sample[i] || e->b_reqs[i]->n_draft) continue;
        req *q = e->b_reqs[i];
        const int row = e->b_row0[i];
        float *lg = e->logits + (size_t)row * e->m->hp.n_vocab;
        /* Guided decoding: what the grammar refuses gets no probability.
         * (Forks start where their parent does: one mask for the row.) */
        if (q->gm && !q->gm_failed && qe_apply_mask(e, q, lg, e->b_rowmask[row] != NULL)) {
            QLOGW("engine: request %llu: its grammar allows no token after %d (the output ends in error)",
                  (unsigned long long)q->id, q->n_gen);
            q->gm_failed = 1;
        }
        for (int f = 0; f < q->n_forks; f++) e->draws[dk++] = (sdraw){ .r = q->forks[f], .lg = lg, .tok = -1 };
        const int drawn = e->b_rowmode[row] == QROW_SAMPLE;
        e->draws[dk++] = (sdraw){ .r = q, .lg = lg, .tok = e->b_rowmode[row] ? e->b_rowtok[row] : -1,
                                  .u = drawn ? &e->b_rsample[row].u : NULL,
                                  .blp = (e->be->ops->caps & QBE_CAP_ROW_LOGPROBS) ? &e->b_rlp[row] : NULL };
    }
    return n_draws;
}

/* Request q, or its fork c, took draw d: it goes on or ends. */
static void take_or_end(qengine *e, req *q, const sdraw *d)
{
    const qfinish why = qe_take_token(e, q, d);
    if (why != QFINISH_NONE) {
        rl_remove(&e->s.running, q);
        qe_finish(e, q, why);
    }
}

/* The draws applied in order: drafts verified, parallel samples forked
 * (they take the prompt's blocks by reference and their first token from
 * the same logits), tokens taken. */
static void apply_draws(qengine *e, int n_seqs)
{
    int dk = 0;
    for (int i = 0; i < n_seqs; i++) {
        if (!e->b_sample[i]) continue;
        req *q = e->b_reqs[i];
        if (q->n_draft) { /* drafts: kept as far as the target agrees */
            const qfinish why = qe_spec_take(e, q, e->b_row0[i]);
            if (why != QFINISH_NONE) {
                rl_remove(&e->s.running, q);
                qe_finish(e, q, why);
            }
            continue;
        }
        for (int f = 0; f < q->n_forks; f++) {
            req *c = q->forks[f];
            const sdraw *d = &e->draws[dk++];
            if (kv_seq_fork(e->pool, &q->kv, &c->kv)) {
                qe_finish(e, c, QFINISH_ERROR);
                continue;
            }
            c->n_computed = q->n_computed;
            c->cached_tokens = q->cached_tokens;
            c->cached_disk = q->cached_disk;
            c->admitted_once = 1;
            c->admit_seq = ++e->s.admit_counter;
            rl_push_back(&e->s.running, c);
            take_or_end(e, c, d);
        }
        q->n_forks = 0;
        take_or_end(e, q, &e->draws[dk++]);
    }
}

/* One step: the scheduler's plan (with drafts where speculation may run
 * now), one forward pass over it, then the draws (in parallel where a pool
 * exists) taken in order.  See engine.c's header and sched.c's. */
int qengine_step(qengine *e)
{
    drain_inbox(e);
    if (e->tier) tier_answers(e);
    if (!n_live(e)) return 0;
    const double t_step = q_now();
    e->st.steps++;
    int rc = ensure_scratch(e, e->o.max_batch_tokens + e->o.max_seqs, e->o.max_seqs, rows_needed(e));
    if (rc) return rc;
    sched_plan p;
    if ((rc = sched_decodes(&e->s, &p))) return rc;
    /* Drafts only where the batch is small enough for the pass to be bound
     * by reading the weights (extra tokens then cost little); they never
     * take a decode's budget or block. */
    if (e->o.spec_mode != QSPEC_NONE && qe_spec_allowed(e) && p.n_run < e->o.spec_max_batch) propose_drafts(e, &p);
    if ((rc = sched_admit(&e->s, &p))) return rc;
    if (p.n_seqs == 0) {
        /* Nothing to run but prefixes being read: wait for them a little
         * (never while anything could run). */
        if (e->tier && qtier_pending(e->tier)) qtier_wait(e->tier, 0.01);
        return n_live(e);
    }
    kv_stats ks;
    kv_pool_stats(e->pool, &ks);
    e->st.util_sum += ks.utilisation;
    const int n_tok = batch_from_plan(e, &p), n_logits = plan_rows(e, p.n_seqs);
    if ((rc = run_pass(e, p.n_seqs, n_tok, n_logits))) return rc;
    const double t_after = q_now();
    const int n_draws = list_draws(e, p.n_seqs);
    if (n_draws < 0) return n_draws;
    if (e->spool && n_draws > 1) qpool_run(e->spool, n_draws, draw_task, e);
    else
        for (int d = 0; d < n_draws; d++) qe_draw_one(e, &e->draws[d]);
    apply_draws(e, p.n_seqs);
    e->st.step_s += q_now() - t_step;
    /* The probe weighs steps that could draft and hold no prompt chunk. */
    const int decode_only = p.n_dec + p.n_resumed == p.n_seqs;
    if (e->o.spec_mode != QSPEC_NONE) qe_spec_step_done(e, decode_only && p.n_run < e->o.spec_max_batch, q_now() - t_step);
    e->st.after_s += q_now() - t_after;
    return n_live(e);
}

/* ---- creation, statistics ---------------------------------------------------- */

/* A draft model must speak the target's vocabulary: the same number of
 * ids and, where both have a tokenizer, the same token at each id.  0 or
 * QERR_INVAL with a message. */
static int draft_vocab_check(const qmodel *m, const qtok *tok, const qmodel *dm, char *err, size_t errlen)
{
    if (dm->hp.n_vocab != m->hp.n_vocab)
        return qerr_set(err, errlen, QERR_INVAL, "the draft model's vocabulary has %d tokens, the model's %d: they must be the same",
                        dm->hp.n_vocab, m->hp.n_vocab);
    qtok *dt = NULL;
    char why[256];
    if (!tok || dm->random_fill) return 0; /* ids only */
    if (qtok_for_model(dm, &dt, why, sizeof why)) {
        QLOGW("engine: the draft model's tokenizer (%s): its vocabulary is taken on the number of its ids", why);
        return 0;
    }
    int rc = 0;
    const int n = qtok_vocab_size(tok);
    if (qtok_vocab_size(dt) != n) {
        rc = qerr_set(err, errlen, QERR_INVAL, "the draft model's tokenizer has %d ids, the model's %d: they must be the same",
                      qtok_vocab_size(dt), n);
    } else {
        for (int id = 0; id < n && !rc; id++) {
            size_t la = 0, lb = 0;
            const char *a = qtok_id_to_token(tok, id, &la), *b = qtok_id_to_token(dt, id, &lb);
            if ((a == NULL) != (b == NULL) || (a && (la != lb || memcmp(a, b, la))))
                rc = qerr_set(err, errlen, QERR_INVAL,
                              "the draft model's vocabulary is not the model's: token %d is '%.40s' there, '%.40s' here", id,
                              b ? b : "(none)", a ? a : "(none)");
        }
    }
    qtok_free(dt);
    return rc;
}

int qengine_create(const qmodel *m, const qtok *tok, const qengine_opts *o, qengine **out, char *err, size_t errlen)
{
    *out = NULL;
    qengine_opts d;
    qengine_opts_default(&d);
    if (!o) o = &d;
    qengine *e = calloc(1, sizeof *e);
    if (!e) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    e->m = m;
    e->tok = tok;
    e->o = *o;
    if (e->o.block_size <= 0) e->o.block_size = 16;
    if (e->o.max_batch_tokens <= 0) e->o.max_batch_tokens = 512;
    if (e->o.max_seqs <= 0) e->o.max_seqs = 64;
    if (e->o.max_seqs > e->o.max_batch_tokens) e->o.max_seqs = e->o.max_batch_tokens;
    if (e->o.spec_k <= 0) e->o.spec_k = 4;
    if (e->o.spec_k > QENGINE_MAX_SPEC_K) e->o.spec_k = QENGINE_MAX_SPEC_K;
    if (e->o.spec_ngram_min <= 0) e->o.spec_ngram_min = 1;
    if (e->o.spec_ngram_max < e->o.spec_ngram_min) e->o.spec_ngram_max = e->o.spec_ngram_min < 3 ? 3 : e->o.spec_ngram_min;
    if (e->o.spec_max_batch <= 0) e->o.spec_max_batch = 32;
    pthread_mutex_init(&e->mu, NULL);
    int rc, nb = 0;
    const qmodel *dm = e->o.draft;
    if (e->o.spec_mode != QSPEC_NONE && e->o.spec_mode != QSPEC_NGRAM && e->o.spec_mode != QSPEC_DRAFT) {
        rc = qerr_set(err, errlen, QERR_INVAL, "spec_mode %d is not none (%d), ngram (%d) or draft (%d)", e->o.spec_mode,
                      QSPEC_NONE, QSPEC_NGRAM, QSPEC_DRAFT);
    } else if ((e->o.spec_mode == QSPEC_DRAFT) != (dm != NULL)) {
        rc = qerr_set(err, errlen, QERR_INVAL, dm ? "a draft model is given but speculation is %s (not draft)"
                                                  : "speculation by a draft model (%s) needs the draft model",
                      qspec_mode_name(e->o.spec_mode));
    } else if (dm && (rc = draft_vocab_check(m, tok, dm, err, errlen))) {
        /* the message is set */
    } else if (e->o.preempt_mode != QPREEMPT_RECOMPUTE && e->o.preempt_mode != QPREEMPT_SWAP) {
        rc = qerr_set(err, errlen, QERR_INVAL, "preempt_mode %d is not recompute (%d) or swap (%d)", e->o.preempt_mode,
                      QPREEMPT_RECOMPUTE, QPREEMPT_SWAP);
    } else if (e->o.preempt_mode == QPREEMPT_SWAP && e->o.swap_space_mb > SIZE_MAX / 2 / 1048576) {
        rc = qerr_set(err, errlen, QERR_RANGE, "swap space of %zu MiB is too large", e->o.swap_space_mb);
    } else if (!(rc = qengine_backend_create(m, &e->o, e->o.num_blocks, e->o.max_batch_tokens + e->o.max_seqs, dm,
                                             &e->be, err, errlen))) {
        nb = e->be->opts.num_blocks;
        /* The draft's backend: as many blocks, on the same device (the
         * first, whole, under tensor parallelism). */
        qengine_opts dopt = e->o;
        dopt.tensor_parallel = 0;
        qbackend *dbe = NULL;
        if (dm && !(rc = qengine_backend_create(dm, &dopt, nb, e->o.max_batch_tokens + e->o.max_seqs, NULL, &dbe,
                                                err, errlen))) {
            if ((rc = qspec_draft_new(dbe, nb, e->o.block_size, m->hp.n_vocab, &e->drafter)))
                qerr_set(err, errlen, rc, "out of memory for the draft's block marks");
        } else if (dm) {
            char why[256];
            snprintf(why, sizeof why, "%s", err ? err : "");
            qerr_set(err, errlen, rc, "the draft model's backend: %s", why);
        }
    }
    if (!rc && !(rc = kv_pool_create(nb, e->o.block_size, m->fingerprint, &e->pool, err, errlen)) &&
        (rc = ensure_scratch(e, e->o.max_batch_tokens + e->o.max_seqs, e->o.max_seqs, rows_needed(e))))
        qerr_set(err, errlen, rc, "out of memory for the engine");
    if (!rc && e->o.preempt_mode == QPREEMPT_SWAP && !e->o.swap_space_mb) e->o.swap_space_mb = QENGINE_DEFAULT_SWAP_MB;
    if (!rc) rc = sched_init(&e->s, e->pool, e->be, &e->o, &e->st, sched_failed, e, err, errlen);
    if (!rc) e->kv_window = e->drafter ? 0 : qhp_all_local_window(&m->hp);
    if (!rc && e->o.store && !e->o.no_prefix_cache && qtier_create(e->o.store, m, e->be, e->pool, &e->tier))
        rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory for the persistent tier");
    /* With the model on a GPU the host's cores are free while it runs:
     * the draws of a step (up to a vocabulary-wide pass each) use them.  On
     * the CPU backend they stay with the backend's own pool. */
    if (!rc) {
        int nt = e->o.sample_threads;
        if (nt <= 0) nt = strcmp(e->be->ops->name, "cpu") != 0 ? (q_ncpus() > 16 ? 16 : q_ncpus()) : 1;
        if (nt > 64) nt = 64;
        if (nt > 1) e->spool = qpool_create(nt); /* NULL: the draws run on this thread */
    }
    if (rc) {
        qengine_destroy(e);
        return rc;
    }
    e->o.num_blocks = nb;
    *out = e;
    return 0;
}

const char *qengine_backend_name(const qengine *e)
{
    return e->be->ops->name;
}

int qengine_num_blocks(const qengine *e)
{
    return e->o.num_blocks;
}

void qengine_destroy(qengine *e)
{
    if (!e) return;
    rlist *lists[3] = { &e->s.waiting, &e->s.running, &e->s.swapped };
    for (int k = 0; k < 3; k++) {
        req *q = lists[k]->head;
        while (q) {
            req *nx = q->next;
            kv_seq_free(e->pool, &q->kv);
            req_free(q);
            q = nx;
        }
    }
    for (req *q = e->inbox_head; q;) {
        req *nx = q->next;
        req_free(q);
        q = nx;
    }
    for (size_t i = 0; i < e->ev_n; i++) free(e->events[(e->ev_head + i) % e->ev_cap].text);
    free(e->events);
    free(e->cancels);
    free(e->b_tokens);
    free(e->b_logits_idx);
    free(e->b_seqs);
    free(e->b_reqs);
    free(e->b_sample);
    free(e->b_rowmode);
    free(e->b_rowtok);
    free(e->b_rsample);
    free(e->b_rlp);
    free(e->b_rowmask);
    free(e->b_row0);
    free(e->draws);
    qguide_free(e->guide);
    free(e->gjobs);
    qpool_destroy(e->spool);
    if (e->logits) qbackend_host_free(e->be, e->logits);
    sched_free(&e->s);
    qtier_destroy(e->tier);
    kv_pool_destroy(e->pool);
    qspec_draft_free(e->drafter);
    free(e->d_dseq);
    free(e->dq);
    qbackend_destroy(e->be);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

void qengine_stats_get(qengine *e, qengine_stats *s)
{
    *s = e->st;
    s->running = e->s.running.n;
    s->waiting = e->s.waiting.n;
    s->swapped = e->s.swapped.n;
    s->swap_slots = e->s.n_slots;
    s->swap_slots_free = e->s.n_slot_free;
    kv_stats ks;
    kv_pool_stats(e->pool, &ks);
    s->kv_blocks = ks.num_blocks;
    s->kv_free = ks.free_blocks;
    s->kv_used = ks.used_blocks;
    s->kv_cached = ks.cached_blocks;
    s->kv_dropped = ks.dropped_blocks;
    s->kv_utilisation = ks.utilisation;
    s->prefix_hit_tokens = ks.hit_tokens;
    s->kv_util_avg = e->st.steps ? e->st.util_sum / (double)e->st.steps : 0;
    s->prefill_rate = e->prefill_rate;
    if (e->tier) {
        qtier_stats ts;
        qtier_stats_get(e->tier, &ts);
        s->disk_lookups = ts.lookups;
        s->disk_blocks_loaded = ts.blocks_loaded;
        s->disk_tokens_loaded = ts.tokens_loaded;
        s->disk_blocks_queued = ts.blocks_queued;
        s->disk_blocks_dropped = ts.blocks_dropped;
        s->disk_skipped_slower = ts.skipped_slower;
        s->disk_load_rate = ts.load_rate;
    }
}

/* Recounts every block's references over the requests' tables and every
 * swap slot's holder (sched.c's invariants 4 and 5, kv.c's invariant 3). */
static int check_tables(qengine *e, char *err, size_t errlen)
{
    const int nb = kv_pool_num_blocks(e->pool);
    int *refs = q_callocn((size_t)nb, sizeof *refs);
    uint8_t *slot_seen = q_callocn((size_t)e->s.n_slots + 1, 1);
    int rc = 0;
    if (!refs || !slot_seen) {
        rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory for the check");
        goto out;
    }
    const rlist *lists[3] = { &e->s.waiting, &e->s.running, &e->s.swapped };
    for (int k = 0; k < 3 && !rc; k++)
        for (const req *q = lists[k]->head; q && !rc; q = q->next) {
            int holes = 0;
            for (int i = 0; i < q->kv.n_blocks; i++) {
                int32_t b = q->kv.blocks[i];
                if (b == KV_SWAPPED_OUT) holes++;
                else if (b == KV_DROPPED && i < q->kv.n_dropped) continue;
                else if (b < 0 || b >= nb || i < q->kv.n_dropped) rc = QERR_INTERNAL;
                else refs[b]++;
            }
            if (rc) {
                rc = qerr_set(err, errlen, QERR_INTERNAL, "request %llu: bad block id", (unsigned long long)q->id);
                break;
            }
            if (holes != q->kv.n_swapped || holes != q->n_slots || (k == 2) != (holes > 0)) {
                rc = qerr_set(err, errlen, QERR_INTERNAL, "request %llu (%s): %d holes, n_swapped %d, %d slots",
                              (unsigned long long)q->id, k == 2 ? "swapped" : "not swapped", holes, q->kv.n_swapped,
                              q->n_slots);
                break;
            }
            for (int i = 0; i < q->n_slots && !rc; i++) {
                int32_t sl = q->slots[i];
                if (sl < 0 || sl >= e->s.n_slots || slot_seen[sl] || (i > 0 && sl <= q->slots[i - 1]))
                    rc = qerr_set(err, errlen, QERR_INTERNAL, "request %llu: swap slot %d bad, twice or out of order",
                                  (unsigned long long)q->id, sl);
                else slot_seen[sl] = 1;
            }
        }
    for (int i = 0; i < e->s.n_slot_free && !rc; i++) {
        int32_t sl = e->s.slot_free[i];
        if (sl < 0 || sl >= e->s.n_slots || slot_seen[sl])
            rc = qerr_set(err, errlen, QERR_INTERNAL, "free swap slot %d bad or also held", sl);
        else slot_seen[sl] = 1;
    }
    for (int sl = 0; sl < e->s.n_slots && !rc; sl++)
        if (!slot_seen[sl]) rc = qerr_set(err, errlen, QERR_INTERNAL, "swap slot %d leaked: neither free nor held", sl);
    for (int b = 0; b < nb && !rc; b++) {
        kv_block_info bi;
        kv_pool_block_info(e->pool, b, &bi);
        if (bi.refcount != refs[b])
            rc = qerr_set(err, errlen, QERR_INTERNAL, "block %d: refcount %d, held by %d table entries", b, bi.refcount,
                          refs[b]);
    }
out:
    free(refs);
    free(slot_seen);
    return rc;
}

int qengine_check(qengine *e, char *err, size_t errlen)
{
    int rc = kv_pool_check(e->pool, err, errlen);
    if (rc) return rc;
    if ((rc = check_tables(e, err, errlen))) return rc;
    if (!n_live(e) && kv_pool_num_used(e->pool) != 0)
        return qerr_set(err, errlen, QERR_INTERNAL, "%d blocks still used with no live request",
                        kv_pool_num_used(e->pool));
    if (!n_live(e) && e->s.n_slot_free != e->s.n_slots)
        return qerr_set(err, errlen, QERR_INTERNAL, "%d of %d swap slots still held with no live request",
                        e->s.n_slots - e->s.n_slot_free, e->s.n_slots);
    return 0;
}
