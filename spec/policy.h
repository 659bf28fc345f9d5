/* policy.h - when speculative decoding drafts, and how much: the engine
 * asks, the policy decides from what was measured.  Nothing here knows a
 * model or a request, only counts and seconds.
 *
 * The probe (whether drafts pay at all, engine-wide).  That depends on the
 * machine as much as on the text: a pass with drafts carries more tokens,
 * and on the GPU it runs without the one-token decode graph.  So it is
 * measured: QSPEC_PROBE_STEPS decode-only steps with drafts, as many
 * without, then QSPEC_USE_STEPS steps with drafts only if they gave 5% more
 * tokens a second, and again; after each probe lost in a row the next comes
 * twice as late (up to QSPEC_USE_MAX steps).
 *
 * The control (how many drafts one request asks for).  Its k follows its
 * acceptance: one more after a pass that kept everything, the kept count
 * plus one after one that did not; a request whose drafts are mostly
 * refused rests (no drafts) for a while, each rest in a run twice the last. */
#ifndef QUIRE_SPEC_POLICY_H
#define QUIRE_SPEC_POLICY_H

#include <stdint.h>

#define QSPEC_PROBE_STEPS 8
#define QSPEC_USE_STEPS 64
#define QSPEC_USE_MAX 2048

typedef struct {
    int phase, left;         /* probing with drafts, without, or using the faster; steps left of it */
    double tok[2], secs[2];  /* tokens and seconds of decode-only steps, without [0] and with [1] drafts */
    int use;                 /* drafts allowed while exploiting */
    int use_len;             /* steps of exploiting: QSPEC_USE_STEPS, doubled by each probe lost in a row */
    int catching_up;         /* the step's draft passes fed a request more tokens than a step gives */
    int skipped;             /* such steps left out of this probe (at most QSPEC_PROBE_STEPS) */
    uint64_t gen0;           /* tokens generated when the step began */
    uint64_t probes, won;    /* probes finished, and those the drafts won */
} qspec_probe;

/* Whether this step may draft, as it begins (generated: the engine's count
 * of generated tokens so far).  always: drafts in every step, no probe.
 * A zeroed probe starts probing with drafts.  Cannot fail. */
int qspec_probe_allowed(qspec_probe *p, int always, uint64_t generated);
/* The step's outcome: decode_only (no prompt tokens in it, which would
 * weigh on either side), its seconds, the generated count now.  Cannot fail. */
void qspec_probe_done(qspec_probe *p, int always, int decode_only, double secs, uint64_t generated);

typedef struct {
    int k;                   /* drafts it asks for now (0: resting) */
    int rest;                /* steps left before it tries again once k fell to 0 */
    int rests;               /* rests in a row (each twice the last) */
    int passes;              /* passes that verified its drafts */
    double rate;             /* share of drafts kept, a moving average */
} qspec_ctl;

/* A request's control, starting at k drafts. */
static inline qspec_ctl qspec_ctl_start(int k) { return (qspec_ctl){ .k = k }; }
/* Whether it may draft now: 1, or 0 while it rests (the step counted).
 * Cannot fail. */
int qspec_ctl_awake(qspec_ctl *c);
/* A pass verified drafted drafts and kept kept of them (k_max: the
 * engine's bound on k).  Cannot fail. */
void qspec_ctl_passed(qspec_ctl *c, int drafted, int kept, int k_max);

#endif
