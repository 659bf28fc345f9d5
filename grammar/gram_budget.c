/* gram_budget.c - this thread's compile budget (gram.h): the limits every
 * compile on the thread reads (gram_nfa.h gram_limits_now). */
#include "gram.h"
#include "gram_nfa.h"
#include "gram_re.h"
#include "util.h"

#define DEFAULT_RE_WORK 20000000LL
#define DEFAULT_STATES 1000000
#define DEFAULT_RE_NFA 100000
/* No deadline, the default limits (an unset budget). */
#define DEFAULTS { 0, 0, GRAM_RE_MAX_STATES, DEFAULT_RE_WORK, DEFAULT_RE_NFA, DEFAULT_STATES }

static _Thread_local gram_limits cur = DEFAULTS;

void gram_budget_set(const gram_budget *b)
{
    gram_limits l = DEFAULTS;
    if (b) {
        if (b->seconds > 0) l.seconds = b->seconds, l.deadline = q_now() + b->seconds;
        if (b->re_states > 0 && b->re_states < l.re_states) l.re_states = b->re_states;
        if (b->re_work > 0 && b->re_work < l.re_work) l.re_work = b->re_work;
        if (b->re_nfa > 0 && b->re_nfa < l.re_nfa) l.re_nfa = b->re_nfa;
        if (b->states > 0 && b->states < l.states) l.states = b->states;
    }
    cur = l;
}

const gram_limits *gram_limits_now(void) { return &cur; }

int gram_late(void) { return cur.deadline > 0 && q_now() > cur.deadline; }
