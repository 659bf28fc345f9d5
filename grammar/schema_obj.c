/* schema_obj.c - an object's members as a grammar (schema_int.h): which
 * listed properties may follow which, where the object may end (required,
 * dependencies, minProperties) and how many members it may hold
 * (maxProperties).
 *
 * Members come in any order.  Up to ANY_ORDER_MAX listed properties take a
 * rule for each set given so far (token masks know most of it without the
 * stack); more take a gram_b_perm, whose matcher keeps the set given
 * beside the stack.  Extra members (keys none of the listed names) may come
 * anywhere.  Two extra members may share a key, which a JSON
 * reader takes as one member, so an object's extra members count as at
 * most one towards minProperties and each towards maxProperties: what
 * quire generates holds either way. */
#include <stdlib.h>

#include "qerr.h"
#include "schema_int.h"
#include "util.h"

#define MAX_STATES 100000 /* rules an object's members may take */
#define MAX_EXTRA_COUNT 64
#define MAX_LISTED 2000 /* listed properties an object may have (each set given costs a bit each) */

typedef struct {
    sctx *c;
    const sc_obj *o;
    int ecap; /* extra members counted up to (any order) */
} mb;

static int popcount(unsigned x) { return __builtin_popcount(x); }

static gram_x alt_in(sctx *c, gram_x acc, gram_x x)
{
    if (x < 0 && x != NONE) return x;
    if (x == NONE) return acc;
    return acc == NONE ? x : ALT(acc, x);
}

/* Whether the dependencies hold when the properties in mask are given. */
static int deps_hold(const mb *m, unsigned mask)
{
    for (int d = 0; d < m->o->ndeps; d++)
        if ((mask >> m->o->deps[d][0] & 1) && !(mask >> m->o->deps[d][1] & 1)) return 0;
    return 1;
}

/* ---- any order ---------------------------------------------------------------- */

/* States (set given, extra members given): the rule after at least one member. */
static gram_x any_order(mb *m)
{
    sctx *c = m->c;
    const sc_obj *o = m->o;
    const int n = o->n, ne = m->ecap + 1, ns = (1 << n) * ne;
    unsigned req = 0;
    for (int i = 0; i < n; i++) req |= (unsigned)o->required[i] << i;
    int *rule = q_callocn((size_t)ns, sizeof *rule);
    uint8_t *live = calloc((size_t)ns, 1), *ends = calloc((size_t)ns, 1);
    gram_x out = NONE;
    if (!rule || !live || !ends) {
        out = sc_fail(c, QERR_NOMEM, "out of memory");
        goto done;
    }
#define CNT_MAX(mk, e) (popcount(mk) + (e))
#define CAN_ADD(mk, e) (o->max < 0 || CNT_MAX(mk, e) + 1 <= o->max)
#define NEXT_E(e) ((e) < m->ecap ? (e) + 1 : (e))
#define EXTRA_OK(mk, e) (o->extra != NONE && CAN_ADD(mk, e) && (o->max < 0 || (e) < m->ecap))
    for (int s = 0; s < ns; s++) {
        const unsigned mk = (unsigned)(s / ne);
        const int e = s % ne;
        ends[s] = !(req & ~mk) && deps_hold(m, mk) && popcount(mk) + (e > 0) >= o->min;
        live[s] = ends[s];
    }
    /* Live: may end, or leads to a state that is live (a fixpoint; the
     * loop on the last count of extras adds nothing). */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int s = ns - 1; s >= 0; s--) {
            if (live[s]) continue;
            const unsigned mk = (unsigned)(s / ne);
            const int e = s % ne;
            int l = 0;
            for (int i = 0; i < n && !l; i++)
                if (!(mk >> i & 1) && o->prop[i] != NONE && CAN_ADD(mk, e)) l = live[(int)(mk | 1u << i) * ne + e];
            if (!l && EXTRA_OK(mk, e)) l = live[(int)mk * ne + NEXT_E(e)];
            if (l) live[s] = 1, changed = 1;
        }
    }
    for (int s = 0; s < ns; s++) rule[s] = live[s] ? gram_b_rule(B, "props") : -1;
    for (int s = 0; s < ns && !c->rc; s++) {
        if (!live[s]) continue;
        const unsigned mk = (unsigned)(s / ne);
        const int e = s % ne;
        gram_x acc = ends[s] ? gram_b_empty(B) : NONE;
        for (int i = 0; i < n; i++) {
            const int t = (int)(mk | 1u << i) * ne + e;
            if (!(mk >> i & 1) && o->prop[i] != NONE && CAN_ADD(mk, e) && live[t])
                acc = alt_in(c, acc, sc_seq3(c, LIT(","), o->prop[i], gram_b_ref(B, rule[t])));
        }
        if (EXTRA_OK(mk, e) && live[(int)mk * ne + NEXT_E(e)])
            acc = alt_in(c, acc, sc_seq3(c, LIT(","), o->extra, gram_b_ref(B, rule[(int)mk * ne + NEXT_E(e)])));
        if (acc < 0 || gram_b_define(B, rule[s], acc)) sc_fail(c, QERR_NOMEM, "out of memory");
    }
    if (c->rc) goto done;
    /* The start: no member yet. */
    out = ends[0] ? gram_b_empty(B) : NONE;
    for (int i = 0; i < n; i++)
        if (o->prop[i] != NONE && CAN_ADD(0u, 0) && live[(1 << i) * ne])
            out = alt_in(c, out, SEQ(o->prop[i], gram_b_ref(B, rule[(1 << i) * ne])));
    if (EXTRA_OK(0u, 0) && live[NEXT_E(0)]) out = alt_in(c, out, SEQ(o->extra, gram_b_ref(B, rule[NEXT_E(0)])));
#undef CNT_MAX
#undef CAN_ADD
#undef NEXT_E
#undef EXTRA_OK
done:
    free(rule);
    free(live);
    free(ends);
    return out;
}

/* ---- any order, large ------------------------------------------------------------ */

/* The members as a gram_b_perm: the matcher keeps the set given. */
static gram_x perm_members(mb *m)
{
    sctx *c = m->c;
    const sc_obj *o = m->o;
    /* Properties that can be given: their value exists, and so does every
     * property they depend on. */
    int *idx = q_mallocn((size_t)o->n + 1, sizeof *idx);
    gram_x *member = q_mallocn((size_t)o->n + 1, sizeof *member);
    unsigned char *req = calloc((size_t)o->n + 1, 1);
    int (*deps)[2] = q_mallocn((size_t)o->ndeps + 1, sizeof *deps);
    gram_x out = NONE;
    if (!idx || !member || !req || !deps) {
        out = sc_fail(c, QERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < o->n; i++) idx[i] = o->prop[i] != NONE ? 0 : -1;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int d = 0; d < o->ndeps; d++)
            if (idx[o->deps[d][0]] >= 0 && idx[o->deps[d][1]] < 0) idx[o->deps[d][0]] = -1, changed = 1;
    }
    int n = 0, nreq = 0, nd = 0;
    for (int i = 0; i < o->n; i++) {
        if (idx[i] < 0) {
            if (o->required[i]) goto done; /* a required property that cannot be given */
            continue;
        }
        idx[i] = n;
        req[n] = o->required[i];
        nreq += o->required[i];
        member[n++] = o->prop[i];
    }
    for (int d = 0; d < o->ndeps; d++)
        if (idx[o->deps[d][0]] >= 0) deps[nd][0] = idx[o->deps[d][0]], deps[nd][1] = idx[o->deps[d][1]], nd++;
    /* Whether any object is left: enough properties for min; the required
     * ones, with what they depend on, under max. */
    if (n + (o->extra != NONE) < o->min || (o->max >= 0 && o->max < o->min)) goto done;
    if (o->max >= 0) {
        unsigned char *t = calloc((size_t)n + 1, 1);
        if (!t) {
            out = sc_fail(c, QERR_NOMEM, "out of memory");
            goto done;
        }
        memcpy(t, req, (size_t)n);
        int cnt = nreq;
        for (int changed = 1; changed;) {
            changed = 0;
            for (int d = 0; d < nd; d++)
                if (t[deps[d][0]] && !t[deps[d][1]]) t[deps[d][1]] = 1, cnt++, changed = 1;
        }
        free(t);
        if (cnt > o->max) goto done;
    }
    const gram_perm p = { n, member, req, (const int (*)[2])deps, nd, o->extra != NONE, o->extra, o->min, o->max, "," };
    out = gram_b_perm(B, &p);
done:
    free(idx);
    free(member);
    free(req);
    free(deps);
    return out;
}

gram_x sc_members(sctx *c, const sc_obj *o)
{
    if (o->n > MAX_LISTED) return sc_fail(c, QERR_LIMIT, "an object listing more than %d properties", MAX_LISTED);
    mb m = { .c = c, .o = o };
    /* Extra members counted: for maxProperties each (up to a limit, past
     * which no more are given), else whether there is one. */
    m.ecap = o->extra == NONE ? 0 : o->max >= 0 ? (o->max < MAX_EXTRA_COUNT ? o->max : MAX_EXTRA_COUNT) : o->min > 0;
    gram_x out;
    if (o->n <= ANY_ORDER_MAX) {
        if ((size_t)(m.ecap + 1) << o->n > MAX_STATES)
            return sc_fail(c, QERR_LIMIT, "an object's members need more than %d rules", MAX_STATES);
        out = any_order(&m);
    } else {
        out = perm_members(&m);
    }
    if (out == NONE && !c->rc) return sc_none(c, "no object satisfies the object keywords");
    return c->rc ? c->rc : out;
}
