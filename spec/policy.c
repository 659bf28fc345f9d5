/* policy.c - see policy.h. */
#include "policy.h"

enum { SP_ON, SP_OFF, SP_USE }; /* probing with drafts, without, using the faster */

int qspec_probe_allowed(qspec_probe *p, int always, uint64_t generated)
{
    p->gen0 = generated;
    if (always) return 1;
    if (p->left <= 0 && p->phase == SP_ON) p->left = QSPEC_PROBE_STEPS; /* the first step */
    return p->phase == SP_ON || (p->phase == SP_USE && p->use);
}

void qspec_probe_done(qspec_probe *p, int always, int decode_only, double secs, uint64_t generated)
{
    const int catching_up = p->catching_up;
    p->catching_up = 0;
    if (always || !decode_only) return; /* prompt chunks would weigh on either side */
    /* A draft model catching up after steps without drafts pays once for
     * them: not what a step with drafts costs (but a phase waits for at
     * most QSPEC_PROBE_STEPS such steps: new long prompts may keep coming). */
    if (catching_up && p->phase == SP_ON && p->skipped < QSPEC_PROBE_STEPS) {
        p->skipped++;
        return;
    }
    if (p->phase != SP_USE) {
        const int w = p->phase == SP_ON;
        p->tok[w] += (double)(generated - p->gen0);
        p->secs[w] += secs;
    }
    if (--p->left > 0) return;
    if (p->phase == SP_ON) {
        p->phase = SP_OFF, p->left = QSPEC_PROBE_STEPS;
    } else if (p->phase == SP_OFF) {
        const double with = p->secs[1] > 0 ? p->tok[1] / p->secs[1] : 0,
                     without = p->secs[0] > 0 ? p->tok[0] / p->secs[0] : 0;
        p->use = with > 1.05 * without; /* a clear gain: short steps' timings are noisy */
        p->probes++, p->won += (uint64_t)p->use;
        /* Each probe lost in a row doubles the steps until the next (a
         * probe's steps with drafts are a loss then), up to USE_MAX. */
        p->use_len = p->use                            ? QSPEC_USE_STEPS
                     : p->use_len < QSPEC_USE_STEPS    ? 2 * QSPEC_USE_STEPS
                     : p->use_len < QSPEC_USE_MAX      ? 2 * p->use_len
                                                       : QSPEC_USE_MAX;
        p->phase = SP_USE, p->left = p->use_len;
    } else {
        p->phase = SP_ON, p->left = QSPEC_PROBE_STEPS, p->skipped = 0;
        p->tok[0] = p->tok[1] = p->secs[0] = p->secs[1] = 0;
    }
}

#define REST_STEPS 16    /* steps a request with a low acceptance goes without drafts (the first time) */
#define MAX_RESTS 6      /* doublings of a rest: up to 1,024 steps */
#define LOW_RATE 0.1     /* below this share of drafts kept (after MIN_PASSES passes) it rests */
#define MIN_PASSES 4

int qspec_ctl_awake(qspec_ctl *c)
{
    if (c->k > 0) return 1;
    if (--c->rest > 0) return 0;
    /* One draft to start with, and a rate two passes of nothing kept bring
     * under LOW_RATE again. */
    c->k = 1, c->rate = 2 * LOW_RATE;
    return 1;
}

void qspec_ctl_passed(qspec_ctl *c, int drafted, int kept, int k_max)
{
    c->passes++;
    const double rate = (double)kept / drafted;
    c->rate = c->passes == 1 ? rate : 0.7 * c->rate + 0.3 * rate;
    if (kept == drafted) c->k = c->k < k_max ? c->k + 1 : k_max;
    else c->k = kept + 1 < k_max ? kept + 1 : k_max;
    /* A good pass ends the run of rests; each rest in a run lasts twice the
     * last (REST_STEPS up to REST_STEPS << MAX_RESTS). */
    if (rate >= 3 * LOW_RATE) c->rests = 0;
    if (c->passes >= MIN_PASSES && c->rate < LOW_RATE) {
        c->k = 0;
        c->rest = REST_STEPS << (c->rests < MAX_RESTS ? c->rests : MAX_RESTS);
        c->rests++;
    }
}
