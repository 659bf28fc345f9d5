/* schema_merge.c - allOf's schemas merged into one (schema_int.h), and
 * the forms said another way through merges: not (of not, anyOf, allOf,
 * required, an enum / const / pattern, an object's properties), a
 * dependency on a schema, if / then / else.  Merges are shallow where they
 * can be (subschemas shared, so that recursion meets the same schema and
 * its rule again), remembered by their inputs, and nest at most
 * MERGE_DEPTH deep. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qerr.h"
#include "schema_int.h"
#include "util.h"

static int merge_addl(sctx *c, json_t *m, const json_t *a, const json_t *bb);

/* The intersection of two "type" values (a string or a list), or NULL for
 * none in common; "number" and "integer" give "integer". */
static json_t *merge_types(const json_t *x, const json_t *y)
{
    json_t *out = json_array();
    for (size_t i = 0; i < (json_is_array(x) ? json_array_size(x) : 1); i++) {
        const char *tx = json_string_value(json_is_array(x) ? json_array_get(x, i) : x);
        for (size_t j = 0; tx && j < (json_is_array(y) ? json_array_size(y) : 1); j++) {
            const char *ty = json_string_value(json_is_array(y) ? json_array_get(y, j) : y);
            if (!ty) continue;
            const char *t = !strcmp(tx, ty)                                  ? tx
                            : !strcmp(tx, "number") && !strcmp(ty, "integer") ? ty
                            : !strcmp(ty, "number") && !strcmp(tx, "integer") ? tx
                                                                              : NULL;
            if (t) json_array_append_new(out, json_string(t));
        }
    }
    return out;
}

/* additionalProperties in a merge: each side's holds for the other side's
 * properties it does not list (merged into them; false: never given), and
 * for keys neither lists (both hold).  0, or an error (c->rc set). */
static int merge_addl(sctx *c, json_t *m, const json_t *a, const json_t *bb)
{
    const json_t *side[2][2] = { { a, bb }, { bb, a } };
    /* m's properties may still be a's or bb's own object (m is a shallow
     * copy): it is copied before the first change, so that no input is
     * changed (and none made to hold itself, a cycle no reference count
     * frees). */
    json_t *props = json_object_get(m, "properties");
    int own = 0;
    for (int i = 0; i < 2; i++) {
        const json_t *x = side[i][0], *y = side[i][1], *ax = json_object_get(x, "additionalProperties");
        if (!ax || json_is_true(ax)) continue;
        const json_t *yp = json_object_get(y, "properties");
        if (!json_object_size(yp)) continue;
        const json_t *xpp = json_object_get(x, "patternProperties");
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)yp, k, v)
        {
            if (json_object_get(json_object_get(x, "properties"), k)) continue;
            /* x's patterns that match k hold for it (merged in), else x's
             * additionalProperties. */
            json_t *cur = json_incref(json_object_get(props, k));
            int matched = 0;
            const char *pk;
            json_t *pv;
            json_object_foreach((json_t *)xpp, pk, pv)
            {
                const int r = sc_search(pk, strlen(pk), k, strlen(k));
                if (r < 0) {
                    json_decref(cur);
                    sc_fail(c, QERR_UNSUPPORTED, "allOf: patternProperties '%s' cannot be tried on '%s'", pk, k);
                    return -1;
                }
                if (!r || !cur) continue;
                matched = 1;
                json_t *t = sc_merge(c, cur, pv);
                json_decref(cur);
                cur = t;
            }
            json_t *nv = !cur ? NULL : matched ? cur : json_is_false(ax) || json_is_false(cur) ? json_false() : sc_merge(c, cur, ax);
            if (!matched) json_decref(cur);
            if (!nv) return -1;
            if (!own) {
                json_t *mine = json_copy(props);
                if (!mine || json_object_set_new(m, "properties", mine)) {
                    json_decref(nv);
                    sc_fail(c, QERR_NOMEM, "out of memory");
                    return -1;
                }
                props = mine, own = 1;
            }
            json_object_set_new(props, k, nv);
        }
    }
    const json_t *xa = json_object_get(a, "additionalProperties"), *xb = json_object_get(bb, "additionalProperties");
    if (!xa || !xb) return 0; /* the one there was copied */
    json_t *both = json_is_false(xa) || json_is_false(xb) ? json_false()
                   : json_is_true(xa)                    ? json_incref((json_t *)xb)
                   : json_is_true(xb)                    ? json_incref((json_t *)xa)
                                                         : sc_merge(c, xa, xb);
    if (!both) return -1;
    json_object_set_new(m, "additionalProperties", both);
    return 0;
}

/* Side s's tuple (prefixItems, or an "items" list) and the schema of the
 * items past it (NULL: any); additionalItems beside no tuple means
 * nothing. */
static void items_of(const json_t *s, const json_t **tuple, const json_t **rest)
{
    const json_t *pre = json_object_get(s, "prefixItems"), *it = json_object_get(s, "items");
    *tuple = json_is_array(pre) ? pre : json_is_array(it) ? it : NULL;
    *rest = json_is_array(pre) ? it : json_is_array(it) ? json_object_get(s, "additionalItems") : it;
}

/* Both of two item schemas (NULL: any): a new reference, NULL with
 * *none set for any, NULL on errors (c->rc set). */
static json_t *both_items(sctx *c, const json_t *x, const json_t *y, int *any)
{
    *any = 0;
    if ((!x || json_is_true(x)) && (!y || json_is_true(y))) return *any = 1, NULL;
    if (!x || json_is_true(x) || json_is_false(y)) return json_incref((json_t *)y);
    if (!y || json_is_true(y) || json_is_false(x)) return json_incref((json_t *)x);
    return sc_merge(c, x, y);
}

/* The items of a merge: position by position, each side's tuple schema
 * there or its rest, so that one side's rest holds for the other side's
 * tuple (an allOf's {"items": [...]} and the additionalItems beside the
 * allOf do not meet: additionalItems speaks of its own schema's tuple).
 * Written as prefixItems and items.  0, or -1 on errors (c->rc set). */
static int merge_items(sctx *c, json_t *m, const json_t *a, const json_t *bb)
{
    static const char *const K[] = { "prefixItems", "items", "additionalItems" };
    int ina = 0, inb = 0;
    for (int i = 0; i < 3; i++) ina |= json_object_get(a, K[i]) != NULL, inb |= json_object_get(bb, K[i]) != NULL;
    if (!ina || !inb) return 0; /* one side's, as it was (the loop copied it) */
    const json_t *ta, *ra, *tb, *rb;
    items_of(a, &ta, &ra);
    items_of(bb, &tb, &rb);
    const size_t na = json_array_size(ta), nb = json_array_size(tb), n = na > nb ? na : nb;
    json_t *tuple = json_array();
    int any, gone = 0;
    for (size_t i = 0; tuple && i < n && !gone; i++) {
        json_t *x = both_items(c, i < na ? json_array_get(ta, i) : ra, i < nb ? json_array_get(tb, i) : rb, &any);
        if (!x && !any) {
            json_decref(tuple);
            return -1;
        }
        gone = json_is_false(x); /* no item here: the array ends before it */
        if (!gone) json_array_append_new(tuple, any ? json_true() : x);
        else json_decref(x);
    }
    json_t *rest = gone ? json_false() : both_items(c, ra, rb, &any);
    if (!tuple || (!rest && !any)) {
        json_decref(tuple);
        return c->rc ? -1 : (sc_fail(c, QERR_NOMEM, "out of memory"), -1);
    }
    for (int i = 0; i < 3; i++) json_object_del(m, K[i]);
    if (json_array_size(tuple)) json_object_set(m, "prefixItems", tuple);
    if (rest) json_object_set(m, "items", rest);
    json_decref(tuple);
    json_decref(rest);
    return 0;
}

/* The merge of two schemas that must both hold (allOf); merges nest
 * (properties, items) at most MERGE_DEPTH deep (recursive schemas). */
#define MERGE_DEPTH 48
static json_t *merge_in(sctx *c, const json_t *a, const json_t *bb);
/* Merges already made, by their two inputs (held, so that their
 * addresses stay theirs): the same pair merges to the same schema, which
 * compiles to the same rule (recursion through merges ends there). */
static size_t mm_slot(const sctx *c, const json_t *a, const json_t *b)
{
    uint64_t h = ((uint64_t)(uintptr_t)a * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)(uintptr_t)b * 0xc2b2ae3d27d4eb4fULL);
    size_t i = (size_t)(h >> 17) & (c->cap_mm - 1);
    while (c->mm[i].m && (c->mm[i].a != a || c->mm[i].b != b)) i = (i + 1) & (c->cap_mm - 1);
    return i;
}

static void mm_put(sctx *c, const json_t *a, const json_t *b, json_t *m)
{
    if ((c->n_mm + 1) * 2 > c->cap_mm) {
        const size_t cap = c->cap_mm ? c->cap_mm * 2 : 64;
        struct mmemo *old = c->mm;
        const size_t ocap = c->cap_mm;
        struct mmemo *nm = q_callocn(cap, sizeof *nm);
        if (!nm) return; /* no memo: merges are right all the same */
        c->mm = nm, c->cap_mm = cap;
        for (size_t i = 0; i < ocap; i++)
            if (old[i].m) c->mm[mm_slot(c, old[i].a, old[i].b)] = old[i];
        free(old);
    }
    const size_t i = mm_slot(c, a, b);
    c->mm[i] = (struct mmemo){ json_incref((json_t *)a), json_incref((json_t *)b), json_incref(m) };
    c->n_mm++;
}

json_t *sc_merge(sctx *c, const json_t *a, const json_t *bb)
{
    if (c->rc) return NULL;
    if (c->cap_mm) {
        const size_t i = mm_slot(c, a, bb);
        if (c->mm[i].m) return json_incref(c->mm[i].m);
    }
    if (c->merge_depth >= MERGE_DEPTH) {
        sc_fail(c, QERR_LIMIT, "allOf: merges nested more than %d deep (recursive schemas)", MERGE_DEPTH);
        return NULL;
    }
    c->merge_depth++;
    json_t *m = merge_in(c, a, bb);
    c->merge_depth--;
    if (m) mm_put(c, a, bb, m);
    return m;
}

static json_t *merge_in(sctx *c, const json_t *a, const json_t *bb)
{
    a = sc_deref(c, a);
    bb = sc_deref(c, bb);
    if (json_is_true(a)) return json_copy((json_t *)bb);
    if (json_is_true(bb)) return json_copy((json_t *)a);
    if (!json_is_object(a) || !json_is_object(bb)) {
        sc_fail(c, QERR_UNSUPPORTED, "allOf with a false schema");
        return NULL;
    }
    /* Shallow: subschemas are shared, so that a schema met again (through
     * recursion) is the same object and compiles to the same rule. */
    json_t *m = json_copy((json_t *)a);
    if (json_object_get(a, "if") && json_object_get(bb, "if")) {
        /* Two conditions: the other one's becomes one more allOf member. */
        json_t *cond = json_object(), *rest = json_copy((json_t *)bb);
        static const char *const IF[] = { "if", "then", "else" };
        for (int i = 0; i < 3; i++) {
            const json_t *x = json_object_get(bb, IF[i]);
            if (x) json_object_set(cond, IF[i], (json_t *)x);
            json_object_del(rest, IF[i]);
        }
        json_t *all = json_object_get(m, "allOf");
        all = json_is_array(all) ? json_copy(all) : json_array();
        json_array_append_new(all, cond);
        json_object_set_new(m, "allOf", all);
        json_t *out = sc_merge(c, m, rest);
        json_decref(m);
        json_decref(rest);
        return out;
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)bb, k, v)
    {
        json_t *mine = json_object_get(m, k);
        if (!mine || sc_is_annotation(k)) {
            if (!mine) json_object_set(m, k, v);
            continue;
        }
        if (!strcmp(k, "type")) {
            json_object_set_new(m, k, merge_types(mine, v));
        } else if (!strcmp(k, "required")) {
            json_t *r = json_copy(mine);
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) json_array_append(r, x);
            json_object_set_new(m, k, r);
        } else if (!strcmp(k, "properties")) {
            json_t *p = json_copy(mine);
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv)
            {
                json_t *old = json_object_get(p, pk);
                /* A property that may not appear stays so. */
                json_t *nv = json_is_false(old)  ? json_incref(old)
                             : json_is_false(pv) ? json_incref(pv)
                             : old               ? sc_merge(c, old, pv)
                                                 : json_incref(pv);
                if (!nv) {
                    json_decref(p);
                    json_decref(m);
                    return NULL;
                }
                json_object_set_new(p, pk, nv);
            }
            json_object_set_new(m, k, p);
        } else if (!strcmp(k, "allOf") || !strcmp(k, "anyOf") || !strcmp(k, "oneOf") || !strcmp(k, "not")) {
            /* Both: keep one here, the other as one more allOf member. */
            json_t *all = json_object_get(m, "allOf");
            all = all ? json_copy(all) : json_array();
            json_array_append_new(all, json_pack("{s:O}", k, v));
            json_object_set_new(m, "allOf", all);
        } else if (!strcmp(k, "minimum") || !strcmp(k, "minLength") || !strcmp(k, "minItems") ||
                   !strcmp(k, "minProperties")) {
            if (json_number_value(v) > json_number_value(mine)) json_object_set(m, k, v);
        } else if (!strcmp(k, "maximum") || !strcmp(k, "maxLength") || !strcmp(k, "maxItems") ||
                   !strcmp(k, "maxProperties")) {
            if (json_number_value(v) < json_number_value(mine)) json_object_set(m, k, v);
        } else if (!strcmp(k, "additionalProperties") || !strcmp(k, "items") || !strcmp(k, "prefixItems") ||
                   !strcmp(k, "additionalItems")) {
            /* after the loop */
        } else if (json_equal(mine, (json_t *)v)) {
            /* the same on both sides */
        } else if (!strcmp(k, NOT_KEY) && json_is_array(mine) && json_is_array(v)) {
            json_t *both = json_copy(mine);
            if (!both || json_array_extend(both, v)) {
                json_decref(both);
                json_decref(m);
                sc_fail(c, QERR_NOMEM, "out of memory");
                return NULL;
            }
            json_object_set_new(m, k, both);
        } else if (!strcmp(k, "enum") && json_is_array(mine) && json_is_array(v)) {
            /* The values in both (none: no instance; said when compiled). */
            json_t *both = json_array();
            if (!both) {
                json_decref(m);
                sc_fail(c, QERR_NOMEM, "out of memory");
                return NULL;
            }
            size_t i, j;
            json_t *x, *y;
            json_array_foreach(mine, i, x) json_array_foreach(v, j, y) if (json_equal(x, y))
            {
                json_array_append(both, x);
                break;
            }
            json_object_set_new(m, k, both);
        } else if (!strcmp(k, "const") && json_is_object(m)) {
            /* Two different values: no instance (an empty enum says so). */
            json_object_set_new(m, "enum", json_array());
        } else if (sc_is_keyword(k)) {
            sc_fail(c, QERR_UNSUPPORTED, "allOf: cannot merge two different '%s'", k);
            json_decref(m);
            return NULL;
        }
    }
    if (merge_addl(c, m, a, bb) || merge_items(c, m, a, bb)) {
        json_decref(m);
        return NULL;
    }
    return m;
}

/* Keeps a made schema alive until the end; returns it. */
const json_t *sc_keep(sctx *c, json_t *s)
{
    if (s) json_array_append_new(c->keep, s);
    return s;
}

/* s without the keys k1, k2 (kept alive). */
const json_t *sc_without(sctx *c, const json_t *s, const char *k1, const char *k2)
{
    json_t *w = json_copy((json_t *)s);
    if (!w) return NULL;
    json_object_del(w, k1);
    if (k2) json_object_del(w, k2);
    return sc_keep(c, w);
}

/* w (s without its "not") and not nt, where nt holds only an object's
 * keywords (properties, required, type "object"; properties among them): a
 * value that is not an object where nt wants one, an object without one of
 * the required names, or one with a listed property whose value fails its
 * schema.  NULL for other forms. */
static json_t *not_object(sctx *c, const json_t *w, const json_t *nt)
{
    const char *k;
    json_t *v;
    int props = 0, obj = 0;
    json_object_foreach((json_t *)nt, k, v)
    {
        if (sc_is_annotation(k)) continue;
        if (!strcmp(k, "properties") && json_is_object(v)) props = 1;
        else if (!strcmp(k, "type") && json_is_string(v) && !strcmp(json_string_value(v), "object")) obj = 1;
        else if (strcmp(k, "required") || !json_is_array(v)) return NULL;
    }
    if (!props) return NULL;
    json_t *alts = json_array();
    if (obj) json_array_append_new(alts, json_pack("{s:[sssss]}", "type", "null", "boolean", "array", "string", "number"));
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(nt, "required"), i, x) if (json_is_string(x))
        json_array_append_new(alts, json_pack("{s:s,s:{s:b}}", "type", "object", "properties", json_string_value(x), 0));
    json_object_foreach(json_object_get(nt, "properties"), k, v)
    {
        if (json_is_true(v) || (json_is_object(v) && !sc_constrains(v, NULL, NULL))) continue; /* never fails */
        json_array_append_new(alts, json_pack("{s:s,s:[s],s:{s:{s:O}}}", "type", "object", "required", k, "properties",
                                              k, "not", v));
    }
    json_t *out = NULL;
    if (json_array_size(alts)) {
        json_t *any = json_pack("{s:o}", "anyOf", alts);
        out = any ? sc_merge(c, w, any) : NULL;
        json_decref(any);
    } else {
        json_decref(alts);
    }
    return out;
}

/* s with its "not" said another way, for the forms that have one:
 *   not {not X}               X, merged with the rest (allOf);
 *   not {anyOf [A, B, ...]}   allOf [{not A}, {not B}, ...];
 *   not {allOf [A]}           not A;
 *   not {required [k, ...]}   an object without k or without ... (each
 *                             absence a property that may not appear);
 *   not {properties ...}      not_object's alternatives.
 * NULL for other forms (c->rc set only when out of memory). */
const json_t *sc_not_rewrite(sctx *c, const json_t *s, const json_t *nt)
{
    if (json_is_object(nt) && json_object_get(nt, "properties")) {
        json_t *w = json_copy((json_t *)s);
        if (!w) return sc_fail(c, QERR_NOMEM, "out of memory"), NULL;
        json_object_del(w, "not");
        json_t *out = not_object(c, w, nt);
        json_decref(w);
        return out ? sc_keep(c, out) : NULL;
    }
    if (!json_is_object(nt) || json_object_size(nt) != 1) return NULL;
    const char *k = json_object_iter_key(json_object_iter((json_t *)nt));
    const json_t *v = json_object_get(nt, k);
    json_t *w = json_copy((json_t *)s);
    if (!w) return sc_fail(c, QERR_NOMEM, "out of memory"), NULL;
    json_object_del(w, "not");
    json_t *out = NULL;
    if (!strcmp(k, "not")) {
        out = sc_merge(c, w, v);
    } else if (!strcmp(k, "anyOf") && json_is_array(v) && json_array_size(v)) {
        json_t *all = json_object_get(w, "allOf");
        all = json_is_array(all) ? json_copy(all) : json_array();
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) json_array_append_new(all, json_pack("{s:O}", "not", x));
        json_object_set_new(w, "allOf", all);
        out = json_incref(w);
    } else if (!strcmp(k, "allOf") && json_is_array(v) && json_array_size(v) == 1) {
        json_object_set(w, "not", json_array_get(v, 0));
        out = json_incref(w);
    } else if ((!strcmp(k, "enum") && json_is_array(v)) || !strcmp(k, "const") ||
               (!strcmp(k, "pattern") && json_is_string(v))) {
        /* Kept for the alternatives they touch: a value other than these
         * strings / true / false / null (numbers, arrays and objects would
         * need equality by value); a string that does not match. */
        json_t *vals = !strcmp(k, "const") ? json_pack("[O]", v) : json_incref((json_t *)v);
        int ok = vals != NULL;
        size_t i;
        json_t *x;
        json_array_foreach(vals, i, x) ok &= json_is_string(x) || json_is_boolean(x) || json_is_null(x);
        if (!strcmp(k, "pattern")) ok = 1;
        if (ok) {
            json_t *neg = !strcmp(k, "pattern") ? json_pack("{s:O}", "pattern", v) : json_pack("{s:O}", "enum", vals);
            json_t *add = json_pack("{s:[o]}", NOT_KEY, neg);
            /* not {pattern}: only strings can fail a pattern. */
            if (add && !strcmp(k, "pattern")) json_object_set_new(add, "type", json_string("string"));
            if (add) out = sc_merge(c, w, add);
            json_decref(add);
        }
        json_decref(vals);
    } else if (!strcmp(k, "required") && json_is_array(v) && json_array_size(v)) {
        /* An object (required holds for any other value) lacking one of them. */
        json_t *alts = json_array();
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x)
        {
            if (!json_is_string(x)) break;
            json_array_append_new(alts, json_pack("{s:{s:b}}", "properties", json_string_value(x), 0));
        }
        if (i == json_array_size(v)) {
            json_t *obj = json_pack("{s:s}", "type", "object");
            json_t *m = sc_merge(c, w, obj);
            json_decref(obj);
            if (m && json_array_size(alts) == 1) {
                out = sc_merge(c, m, json_array_get(alts, 0));
                json_decref(m);
            } else if (m) {
                json_t *any = json_pack("{s:O}", "anyOf", alts);
                out = sc_merge(c, m, any);
                json_decref(any);
                json_decref(m);
            }
        }
        json_decref(alts);
    }
    json_decref(w);
    return out ? sc_keep(c, out) : NULL;
}

/* s with its first dependency on a schema (dependentSchemas, or a schema
 * in dependencies) said another way: an object without that property, or
 * with it and the schema holding too.  NULL when it has none (c->rc set
 * only on errors). */
const json_t *sc_dep_rewrite(sctx *c, const json_t *s)
{
    static const char *const KEYS[] = { "dependentSchemas", "dependencies" };
    for (int k = 0; k < 2; k++) {
        const json_t *deps = json_object_get(s, KEYS[k]);
        const char *dk;
        json_t *dv;
        json_object_foreach((json_t *)deps, dk, dv)
        {
            if (json_is_array(dv)) continue;
            json_t *w = json_copy((json_t *)s), *rest = json_copy((json_t *)deps);
            json_object_del(rest, dk);
            if (json_object_size(rest)) json_object_set(w, KEYS[k], rest);
            else json_object_del(w, KEYS[k]);
            json_decref(rest);
            json_t *gone = json_pack("{s:{s:b}}", "properties", dk, 0), *has = json_pack("{s:[s]}", "required", dk);
            json_t *without_k = sc_merge(c, w, gone), *with_k = NULL;
            /* With it: only where it may appear at all. */
            const json_t *props = json_object_get(w, "properties");
            const int may = !json_is_false(dv) && !json_is_false(json_object_get(props, dk)) &&
                            (json_object_get(props, dk) || !json_is_false(json_object_get(w, "additionalProperties")) ||
                             json_object_get(w, "patternProperties"));
            if (without_k && may) {
                json_t *req = sc_merge(c, w, has);
                with_k = req ? sc_merge(c, req, dv) : NULL;
                json_decref(req);
            }
            json_decref(gone);
            json_decref(has);
            json_decref(w);
            if (!without_k || (may && !with_k)) {
                json_decref(without_k);
                json_decref(with_k);
                if (!c->rc) sc_fail(c, QERR_NOMEM, "out of memory");
                return NULL;
            }
            return sc_keep(c, with_k ? json_pack("{s:[oo]}", "anyOf", without_k, with_k) : without_k);
        }
    }
    return NULL;
}


/* s with its if / then / else said another way: (if and then) or (not if
 * and else), as two alternatives.  NULL when it has no "if" (c->rc set
 * only on errors). */
const json_t *sc_if_rewrite(sctx *c, const json_t *s)
{
    const json_t *cond = json_object_get(s, "if");
    if (!cond) return NULL;
    json_t *w = json_copy((json_t *)s), *nc = json_pack("{s:O}", "not", cond);
    json_object_del(w, "if");
    json_object_del(w, "then");
    json_object_del(w, "else");
    json_t *yes = sc_merge(c, w, cond), *no = sc_merge(c, w, nc);
    const json_t *th = json_object_get(s, "then"), *el = json_object_get(s, "else");
    json_t *t;
    if (yes && th) t = sc_merge(c, yes, th), json_decref(yes), yes = t;
    if (no && el) t = sc_merge(c, no, el), json_decref(no), no = t;
    json_decref(w);
    json_decref(nc);
    if (!yes || !no) {
        json_decref(yes);
        json_decref(no);
        if (!c->rc) sc_fail(c, QERR_NOMEM, "out of memory");
        return NULL;
    }
    return sc_keep(c, json_pack("{s:[oo]}", "anyOf", yes, no));
}

void sc_merges_free(sctx *c)
{
    for (size_t i = 0; i < c->cap_mm; i++)
        if (c->mm[i].m) json_decref((json_t *)c->mm[i].a), json_decref((json_t *)c->mm[i].b), json_decref(c->mm[i].m);
    free(c->mm);
    c->mm = NULL, c->cap_mm = c->n_mm = 0;
}
