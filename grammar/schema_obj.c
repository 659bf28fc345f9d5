/* schema_obj.c - an object's members as a grammar (schema_int.h): which
 * listed properties may follow which, where the object may end (required,
 * dependencies, minProperties) and how many members it may hold
 * (maxProperties).
 *
 * Up to ANY_ORDER_MAX listed properties are taken in any order: a rule for
 * each set given so far.  More are taken in the schema's order: a rule for
 * each position, with only what the keywords need remembered (the count of
 * members, the properties that dependencies name).  Extra members (keys
 * none of the listed names) come after the listed ones in schema order, in
 * any place otherwise.  Two extra members may share a key, which a JSON
 * reader takes as one member, so an object's extra members count as at
 * most one towards minProperties and each towards maxProperties: what
 * quire generates holds either way. */
#include <stdlib.h>

#include "qerr.h"
#include "schema_int.h"
#include "util.h"

#define MAX_STATES 100000 /* rules an object's members may take */
#define MAX_DEP_BITS 12   /* properties that schema-order dependencies may name */
#define MAX_EXTRA_COUNT 64
#define MAX_LISTED 2000       /* listed properties an object may have */

#define UNSEEN (-2000)

typedef struct {
    sctx *c;
    const sc_obj *o;
    int lcap, ecap;          /* listed members counted up to; extra members counted up to */
    int nbits;               /* properties dependencies name (schema order) */
    int bit_of[64];          /* their bit, by index among the first 64 (-1: none) */
    gram_x *memo;            /* schema order: a state's rule, UNSEEN, or NONE (dead) */
    size_t nmemo;
    gram_x *ememo;           /* extras_from's, by (listed, extra, started) */
} mb;

static int popcount(unsigned x) { return __builtin_popcount(x); }

static gram_x comma(sctx *c, int started, gram_x x) { return started ? SEQ(LIT(","), x) : x; }

static gram_x alt_in(sctx *c, gram_x acc, gram_x x)
{
    if (x < 0 && x != NONE) return x;
    if (x == NONE) return acc;
    return acc == NONE ? x : ALT(acc, x);
}

/* Whether the dependencies hold when the properties in mask are given
 * (mask: bits of property indices, any order; of bit_of, schema order). */
static int deps_hold(const mb *m, unsigned mask, int by_bits)
{
    for (int d = 0; d < m->o->ndeps; d++) {
        const int a = m->o->deps[d][0], b = m->o->deps[d][1];
        const int ba = by_bits ? m->bit_of[a] : a, bb = by_bits ? m->bit_of[b] : b;
        if ((mask >> ba & 1) && !(mask >> bb & 1)) return 0;
    }
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
        ends[s] = !(req & ~mk) && deps_hold(m, mk, 0) && popcount(mk) + (e > 0) >= o->min;
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

/* ---- schema order ------------------------------------------------------------- */

static gram_x extras_body(mb *m, int l, int e, int started);

/* After the listed properties: extra members, with l listed ones given and
 * e extra ones (started: some member given).  NONE when it cannot end. */
static gram_x extras_from(mb *m, int l, int e, int started)
{
    const size_t key = ((size_t)l * (size_t)(m->ecap + 1) + (size_t)e) * 2 + (size_t)started;
    if (m->ememo[key] != UNSEEN) return m->ememo[key];
    const gram_x x = extras_body(m, l, e, started);
    if (x >= 0 || x == NONE) m->ememo[key] = x;
    return x;
}

static gram_x extras_body(mb *m, int l, int e, int started)
{
    sctx *c = m->c;
    const sc_obj *o = m->o;
    const int ends = l + (e > 0) >= o->min;
    /* Without maxProperties extras loop at the last count that matters;
     * with it they stop where it says. */
    int can = o->extra != NONE;
    int ne = e;
    if (o->max >= 0) can &= l + e + 1 <= o->max && e < m->ecap, ne = e + 1;
    else ne = e < m->ecap ? e + 1 : e;
    if (!can) return ends ? gram_b_empty(B) : NONE;
    if (ne == e && started) {
        /* A loop: this state again after each extra member. */
        if (!ends) return NONE;
        const int r = gram_b_rule(B, "extras");
        if (r < 0 || gram_b_define(B, r, ALT(gram_b_empty(B), sc_seq3(c, LIT(","), o->extra, gram_b_ref(B, r)))))
            return sc_fail(c, QERR_NOMEM, "out of memory");
        return gram_b_ref(B, r);
    }
    const gram_x next = extras_from(m, l, ne, 1);
    if (next < 0 && next != NONE) return next;
    gram_x acc = ends ? gram_b_empty(B) : NONE;
    if (next != NONE) acc = alt_in(c, acc, comma(c, started, SEQ(o->extra, next)));
    return acc;
}

/* From listed property i on, with l given (counted up to lcap), dm the
 * dependencies' properties given. */
static gram_x listed_from(mb *m, int i, int l, unsigned dm, int started)
{
    sctx *c = m->c;
    const sc_obj *o = m->o;
    if (c->rc) return c->rc;
    if (i == o->n) return deps_hold(m, dm, 1) ? extras_from(m, l, 0, started) : NONE;
    const size_t key = (((size_t)i * (size_t)(m->lcap + 1) + (size_t)l) << m->nbits | dm) * 2 + (size_t)started;
    if (m->memo[key] != UNSEEN) return m->memo[key];
    gram_x acc = NONE;
    if (o->prop[i] != NONE && (o->max < 0 || l + 1 <= o->max)) {
        const int b = i < 64 ? m->bit_of[i] : -1;
        const gram_x next = listed_from(m, i + 1, l < m->lcap ? l + 1 : l, b >= 0 ? dm | 1u << b : dm, 1);
        if (next < 0 && next != NONE) return next;
        if (next != NONE) acc = comma(c, started, SEQ(o->prop[i], next));
    }
    if (!o->required[i]) {
        const gram_x skip = listed_from(m, i + 1, l, dm, started);
        if (skip < 0 && skip != NONE) return skip;
        acc = alt_in(c, acc, skip);
    }
    if (acc != NONE && acc >= 0) {
        /* A rule, so that states reached along several paths are one. */
        const int r = gram_b_rule(B, "members");
        if (r < 0 || gram_b_define(B, r, acc)) return sc_fail(c, QERR_NOMEM, "out of memory");
        acc = gram_b_ref(B, r);
    }
    m->memo[key] = acc;
    return acc;
}

static gram_x schema_order(mb *m)
{
    sctx *c = m->c;
    const sc_obj *o = m->o;
    for (int i = 0; i < 64; i++) m->bit_of[i] = -1;
    for (int d = 0; d < o->ndeps; d++)
        for (int j = 0; j < 2; j++) {
            const int p = o->deps[d][j];
            if (p >= 64 || (m->bit_of[p] < 0 && m->nbits == MAX_DEP_BITS))
                return sc_fail(c, QERR_UNSUPPORTED, "dependencies naming more than %d properties of a large object",
                               MAX_DEP_BITS);
            if (m->bit_of[p] < 0) m->bit_of[p] = m->nbits++;
        }
    m->nmemo = (size_t)o->n * (size_t)(m->lcap + 1) * ((size_t)1 << m->nbits) * 2;
    if (m->nmemo > MAX_STATES)
        return sc_fail(c, QERR_LIMIT, "an object's members need more than %d rules (counts and dependencies)",
                       MAX_STATES);
    const size_t ne = (size_t)(m->lcap + 1) * (size_t)(m->ecap + 1) * 2;
    m->memo = q_callocn(m->nmemo, sizeof *m->memo);
    m->ememo = q_callocn(ne, sizeof *m->ememo);
    if (!m->memo || !m->ememo) return sc_fail(c, QERR_NOMEM, "out of memory");
    for (size_t k = 0; k < m->nmemo; k++) m->memo[k] = UNSEEN;
    for (size_t k = 0; k < ne; k++) m->ememo[k] = UNSEEN;
    return listed_from(m, 0, 0, 0, 0);
}

gram_x sc_members(sctx *c, const sc_obj *o)
{
    /* The schema-order rules recurse a property deep. */
    if (o->n > MAX_LISTED) return sc_fail(c, QERR_LIMIT, "an object listing more than %d properties", MAX_LISTED);
    mb m = { .c = c, .o = o };
    m.lcap = o->max >= 0 ? o->max : o->min;
    if (m.lcap > o->n) m.lcap = o->n;
    /* Extra members counted: for maxProperties each (up to a limit, past
     * which no more are given), else whether there is one. */
    m.ecap = o->extra == NONE ? 0 : o->max >= 0 ? (o->max < MAX_EXTRA_COUNT ? o->max : MAX_EXTRA_COUNT) : o->min > 0;
    gram_x out;
    if (o->n <= ANY_ORDER_MAX) {
        if ((size_t)(m.ecap + 1) << o->n > MAX_STATES)
            return sc_fail(c, QERR_LIMIT, "an object's members need more than %d rules", MAX_STATES);
        out = any_order(&m);
    } else {
        out = schema_order(&m);
    }
    free(m.memo);
    free(m.ememo);
    if (out == NONE && !c->rc) return sc_none(c, "no object satisfies the object keywords");
    return c->rc ? c->rc : out;
}
