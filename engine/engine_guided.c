/* engine_guided.c - guided decoding's masks in a step (engine_int.h): made
 * on the guide threads during the forward pass (guide.h), each job first
 * feeding its grammar the request's last token; applied by the backend or
 * on the host logits. */
#include <stdlib.h>
#include <string.h>

#include "engine_int.h"
#include "qerr.h"

/* r's mask for this step as a job (made on the guide thread or now); the
 * job feeds the grammar r's last token first. */
static qguide_job mask_job(const qengine *e, req *r, uint32_t *dst)
{
    const qguide_job j = { r->gm, r->gv, dst, e->m->hp.n_vocab, e->m->eos_ids, e->m->n_eos, r->gpend, 0, 0, 0, 0, 0 };
    r->gpend = -1;
    return j;
}

/* Feeds r's grammar its last token now (at the end of a request, where no
 * mask job follows): 0, or the matcher's refusal. */
int qe_feed_now(qengine *e, req *r)
{
    const int tok = r->gpend;
    if (tok < 0) return 0;
    const double t = q_now();
    const int rc = gram_m_feed_token(r->gm, r->gv, tok);
    e->st.feed_s += q_now() - t;
    r->gpend = -1;
    if (rc)
        QLOGW("engine: request %llu: its grammar refuses token %d, which its mask allowed", (unsigned long long)r->id,
              tok);
    return rc;
}

/* Sets the logits of the tokens r's grammar refuses to -inf (EOS allowed
 * only where the output may end), unless the backend did (on_device).  The
 * mask was made during the forward pass (its job's answer), or is made now.
 * 0, or an error (out of memory, or no token at all is allowed). */
int qe_apply_mask(qengine *e, req *r, float *lg, int on_device)
{
    qguide_job one;
    const qguide_job *j = &one;
    if (r->gjob >= 0) {
        j = &e->gjobs[r->gjob];
    } else {
        one = mask_job(e, r, r->gmask);
        qguide_job_run(&one);
    }
    const int rc = j->rc;
    if (j->feed_rc)
        QLOGW("engine: request %llu: its grammar refuses token %d, which its mask allowed", (unsigned long long)r->id,
              j->feed);
    r->gdone = !rc && j->done;
    r->gjob = -1;
    e->st.masks++;
    if (!rc && !on_device) qguide_mask_logits(r->gmask, lg, e->m->hp.n_vocab);
    return rc;
}

/* qrow_masks.ready: the step's masks are done (the backend is about to read them). */
int qe_masks_ready(void *ctx)
{
    qengine *e = ctx;
    const double t = q_now();
    qguide_wait(e->guide);
    e->st.mask_wait_s += q_now() - t;
    if (e->n_gjobs_out) { /* the round's timings, once */
        double last = e->t_gjobs, slowest = 0;
        for (int i = 0; i < e->n_gjobs_out; i++) {
            e->st.mask_work_s += e->gjobs[i].secs;
            if (e->gjobs[i].secs > slowest) slowest = e->gjobs[i].secs;
            if (e->gjobs[i].t_end > last) last = e->gjobs[i].t_end;
        }
        e->st.mask_slowest_s += slowest;
        e->st.mask_span_s += last - e->t_gjobs;
        e->n_gjobs_out = 0;
    }
    return 0;
}

/* Starts the masks of the step's grammar requests on the guide thread, to
 * be made while the forward pass runs: how many were started (0: none, or
 * no thread, and apply_mask makes them itself). */
int qe_start_masks(qengine *e, int n_seqs)
{
    int n = 0;
    for (int i = 0; i < n_seqs; i++) {
        req *q = e->b_reqs[i];
        q->gjob = -1;
        if (e->b_sample[i] && q->gm && !q->gm_failed && !q->n_draft) n++; /* drafts: their masks are made */
    }
    if (!n) return 0;
    const int gpu = strcmp(e->be->ops->name, "cpu") != 0;
    if (!e->guide && qguide_new(qguide_threads(gpu), &e->guide)) return 0;
    if (n > e->cap_gjobs) {
        qguide_job *j = q_reallocn(e->gjobs, (size_t)n, sizeof *j);
        if (!j) return 0;
        e->gjobs = j, e->cap_gjobs = n;
    }
    n = 0;
    for (int i = 0; i < n_seqs; i++) {
        req *q = e->b_reqs[i];
        if (!e->b_sample[i] || !q->gm || q->gm_failed || q->n_draft) continue;
        e->gjobs[n] = mask_job(e, q, q->gdst);
        q->gjob = n++;
    }
    e->t_gjobs = q_now();
    e->n_gjobs_out = n;
    qguide_start(e->guide, e->gjobs, n);
    return n;
}
