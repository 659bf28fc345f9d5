/* tok_json.c - tokenizer.json -> qtok.
 *
 * The file is parsed with jansson into a tree, then read section by section
 * in the order HF builds a tokenizer: model (vocabulary, merges, options),
 * normalizer, pre_tokenizer, post_processor, decoder, and last the
 * added_tokens, whose ids and normalized patterns depend on the model and
 * the normalizer.  Sequences of normalizers, pre-tokenizers and decoders are
 * flattened into one array each (applying a nested Sequence is the same as
 * applying its members in order).
 *
 * Everything in the file is checked before it is used: types ("model.vocab
 * must be an object"), id ranges (0 <= id < QTOK_MAX_VOCAB), merges naming
 * tokens that are not in the vocabulary, unknown or unsupported component
 * types (QERR_UNSUPPORTED, message naming the component), regexes PCRE2
 * rejects.  Strings may contain NUL (JSON_ALLOW_NUL); lengths are used
 * throughout.  truncation and padding are ignored: they describe batching for
 * training, not how text maps to ids.
 */
#include "tok_internal.h"

#include <jansson.h>
#include <string.h>

#include "qerr.h"
#include "util.h"

#define JSON_MAX_BYTES ((size_t)1 << 31)

typedef struct {
    qtok *t;
    char *err;
    size_t errlen;
} ld;

static const char *type_of(json_t *o)
{
    json_t *ty = json_object_get(o, "type");
    return json_is_string(ty) ? json_string_value(ty) : NULL;
}

static int get_bool(ld *L, json_t *o, const char *key, int dflt, int *out, const char *where)
{
    json_t *v = json_object_get(o, key);
    *out = dflt;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return qerr_set(L->err, L->errlen, QERR_FORMAT, "%s.%s must be a boolean", where, key);
    *out = json_is_true(v);
    return 0;
}

static int get_int(ld *L, json_t *o, const char *key, long long lo, long long hi, long long dflt, long long *out,
                   const char *where)
{
    json_t *v = json_object_get(o, key);
    *out = dflt;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return qerr_set(L->err, L->errlen, QERR_FORMAT, "%s.%s must be an integer in [%lld, %lld]", where, key, lo, hi);
    *out = json_integer_value(v);
    return 0;
}

/* Optional string field: *s NULL when absent or null. */
static int get_str(ld *L, json_t *o, const char *key, const char **s, size_t *n, const char *where)
{
    json_t *v = json_object_get(o, key);
    *s = NULL;
    *n = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return qerr_set(L->err, L->errlen, QERR_FORMAT, "%s.%s must be a string", where, key);
    *s = json_string_value(v);
    *n = json_string_length(v);
    return 0;
}

static int dup_str(ld *L, const char *s, size_t n, char **out)
{
    *out = q_strndup(s, n);
    return *out ? 0 : qerr_set(L->err, L->errlen, QERR_NOMEM, "out of memory");
}

/* A {"String": s} or {"Regex": r} pattern: literal copied, or regex compiled. */
static int get_pattern(ld *L, json_t *o, const char *where, char **lit, size_t *lit_len, pcre2_code **re)
{
    json_t *p = json_object_get(o, "pattern");
    *lit = NULL;
    *lit_len = 0;
    *re = NULL;
    json_t *s = json_is_object(p) ? json_object_get(p, "String") : NULL;
    json_t *r = json_is_object(p) ? json_object_get(p, "Regex") : NULL;
    if (json_is_string(s)) return dup_str(L, json_string_value(s), *lit_len = json_string_length(s), lit);
    if (json_is_string(r)) {
        *re = tok_regex_compile(json_string_value(r), json_string_length(r), L->err, L->errlen);
        return *re ? 0 : QERR_FORMAT;
    }
    return qerr_set(L->err, L->errlen, QERR_FORMAT, "%s.pattern must be {\"String\": ...} or {\"Regex\": ...}", where);
}

/* One character given as a string (Metaspace replacement, Strip content). */
static int get_char(ld *L, json_t *o, const char *key, uint32_t dflt, uint32_t *cp, const char *where)
{
    const char *s;
    size_t n;
    int rc = get_str(L, o, key, &s, &n, where);
    if (rc) return rc;
    if (!s) {
        *cp = dflt;
        return 0;
    }
    if (n == 0 || n > 4 || qutf8_valid_prefix(s, n) != n || qutf8_lead_len((unsigned char)s[0]) != (int)n)
        return qerr_set(L->err, L->errlen, QERR_FORMAT, "%s.%s must be one character", where, key);
    qutf8_decode_valid(s, cp);
    return 0;
}

static int get_prepend_scheme(ld *L, json_t *o, const char *where, int *scheme)
{
    const char *s;
    size_t n;
    int rc = get_str(L, o, "prepend_scheme", &s, &n, where);
    if (rc) return rc;
    if (s) {
        if (!strcmp(s, "first")) *scheme = TM_FIRST;
        else if (!strcmp(s, "always")) *scheme = TM_ALWAYS;
        else if (!strcmp(s, "never")) *scheme = TM_NEVER;
        else return qerr_set(L->err, L->errlen, QERR_FORMAT, "%s.prepend_scheme '%s' is not first/always/never", where, s);
        return 0;
    }
    int aps; /* the older add_prefix_space form */
    rc = get_bool(L, o, "add_prefix_space", 1, &aps, where);
    *scheme = aps ? TM_ALWAYS : TM_NEVER;
    return rc;
}

static void *grow(ld *L, void *arr, int n, size_t size, int *rc)
{
    if (n >= 4096) {
        *rc = qerr_set(L->err, L->errlen, QERR_LIMIT, "more than 4096 pipeline components");
        return NULL;
    }
    void *p = q_reallocn(arr, (size_t)n + 1, size);
    *rc = p ? 0 : qerr_set(L->err, L->errlen, QERR_NOMEM, "out of memory");
    if (p) memset((char *)p + (size_t)n * size, 0, size);
    return p;
}

/* ---- model ----------------------------------------------------------------------------- */

static int merge_side(ld *L, const char *s, size_t n, int32_t *id, long rank)
{
    *id = tok_strmap_get(&L->t->bpe.vocab, s, n);
    if (*id < 0)
        return qerr_set(L->err, L->errlen, QERR_FORMAT, "model.merges[%ld] names \"%.*s\", which is not in the vocabulary",
                        rank, (int)(n > 60 ? 60 : n), s);
    return 0;
}

static int add_merge(ld *L, const char *a, size_t an, const char *b, size_t bn, long idx, uint32_t rank)
{
    tok_bpe *bp = &L->t->bpe;
    int32_t ia, ib;
    int rc;
    if ((rc = merge_side(L, a, an, &ia, idx)) || (rc = merge_side(L, b, bn, &ib, idx))) return rc;
    size_t pl = bp->prefix_len;
    if (pl > bn || memcmp(b, bp->prefix ? bp->prefix : "", pl))
        return qerr_set(L->err, L->errlen, QERR_FORMAT, "model.merges[%ld]: \"%.*s\" lacks the continuing_subword_prefix",
                        idx, (int)(bn > 60 ? 60 : bn), b);
    qbuf cat = { 0 };
    if (qbuf_put(&cat, a, an) || qbuf_put(&cat, b + pl, bn - pl)) {
        qbuf_free(&cat);
        return qerr_set(L->err, L->errlen, QERR_NOMEM, "out of memory");
    }
    int32_t nid = tok_strmap_get(&bp->vocab, cat.p, cat.len);
    if (nid < 0) {
        rc = qerr_set(L->err, L->errlen, QERR_FORMAT,
                      "model.merges[%ld]: the merged token \"%.*s\" is not in the vocabulary", idx,
                      (int)(cat.len > 60 ? 60 : cat.len), cat.p);
        qbuf_free(&cat);
        return rc;
    }
    qbuf_free(&cat);
    if ((rc = tok_bpe_add_merge(bp, ia, ib, rank, nid))) return qerr_set(L->err, L->errlen, rc, "out of memory");
    return 0;
}

static int load_model(ld *L, json_t *m)
{
    tok_bpe *b = &L->t->bpe;
    int rc;
    if (!json_is_object(m)) return qerr_set(L->err, L->errlen, QERR_FORMAT, "model must be an object");
    const char *ty = type_of(m);
    if (ty && strcmp(ty, "BPE"))
        return qerr_set(L->err, L->errlen, QERR_UNSUPPORTED, "model type '%s' is not supported (only BPE)", ty);
    if (!ty && !json_object_get(m, "merges"))
        return qerr_set(L->err, L->errlen, QERR_UNSUPPORTED, "model without a type or merges is not supported (only BPE)");
    json_t *dropout = json_object_get(m, "dropout");
    if (dropout && !json_is_null(dropout) && (!json_is_number(dropout) || json_number_value(dropout) != 0.0))
        return qerr_set(L->err, L->errlen, QERR_UNSUPPORTED, "BPE dropout is not supported (it makes encoding random)");
    const char *s;
    size_t n;
    if ((rc = get_str(L, m, "continuing_subword_prefix", &s, &n, "model"))) return rc;
    if (s && n && (rc = dup_str(L, s, b->prefix_len = n, &b->prefix))) return rc;
    if ((rc = get_str(L, m, "end_of_word_suffix", &s, &n, "model"))) return rc;
    if (s && n && (rc = dup_str(L, s, b->suffix_len = n, &b->suffix))) return rc;
    if ((rc = get_bool(L, m, "byte_fallback", 0, &b->byte_fallback, "model")) ||
        (rc = get_bool(L, m, "fuse_unk", 0, &b->fuse_unk, "model")) ||
        (rc = get_bool(L, m, "ignore_merges", 0, &b->ignore_merges, "model")))
        return rc;

    json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab)) return qerr_set(L->err, L->errlen, QERR_FORMAT, "model.vocab must be an object");
    if (json_object_size(vocab) > QTOK_MAX_VOCAB)
        return qerr_set(L->err, L->errlen, QERR_LIMIT, "model.vocab has more than %d entries", QTOK_MAX_VOCAB);
    for (void *it = json_object_iter(vocab); it; it = json_object_iter_next(vocab, it)) {
        const char *k = json_object_iter_key(it);
        size_t kl = json_object_iter_key_len(it);
        json_t *v = json_object_iter_value(it);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= QTOK_MAX_VOCAB)
            return qerr_set(L->err, L->errlen, json_is_integer(v) ? QERR_RANGE : QERR_FORMAT,
                            "model.vocab[\"%.*s\"] must be an integer id in [0, %d)", (int)(kl > 60 ? 60 : kl), k,
                            QTOK_MAX_VOCAB);
        if (qutf8_valid_prefix(k, kl) != kl)
            return qerr_set(L->err, L->errlen, QERR_FORMAT, "model.vocab has a key that is not valid UTF-8");
        if ((rc = tok_strmap_put(&b->vocab, k, kl, (int32_t)json_integer_value(v), NULL)))
            return qerr_set(L->err, L->errlen, rc, "out of memory loading the vocabulary");
    }
    if ((rc = get_str(L, m, "unk_token", &s, &n, "model"))) return rc;
    if (s) {
        b->unk_id = tok_strmap_get(&b->vocab, s, n);
        if (b->unk_id < 0)
            return qerr_set(L->err, L->errlen, QERR_FORMAT, "model.unk_token \"%.*s\" is not in the vocabulary",
                            (int)(n > 60 ? 60 : n), s);
    }

    json_t *merges = json_object_get(m, "merges");
    if (merges && !json_is_null(merges) && !json_is_array(merges))
        return qerr_set(L->err, L->errlen, QERR_FORMAT, "model.merges must be an array");
    size_t nm = json_array_size(merges);
    if (nm > QTOK_MAX_VOCAB * (size_t)4)
        return qerr_set(L->err, L->errlen, QERR_LIMIT, "model.merges has too many entries");
    uint32_t rank = 0;
    int kind = 0; /* 1 strings, 2 pairs: HF takes one form or the other */
    for (size_t i = 0; i < nm; i++) {
        json_t *e = json_array_get(merges, i);
        if (json_is_string(e)) {
            if (kind == 2) return qerr_set(L->err, L->errlen, QERR_FORMAT, "model.merges mixes strings and pairs");
            kind = 1;
            const char *line = json_string_value(e);
            size_t ll = json_string_length(e);
            if (ll >= 8 && !memcmp(line, "#version", 8)) continue;
            const char *sp = memchr(line, ' ', ll);
            if (!sp || memchr(sp + 1, ' ', ll - (size_t)(sp - line) - 1))
                return qerr_set(L->err, L->errlen, QERR_FORMAT,
                                "model.merges[%zu] \"%.*s\" is not two tokens separated by one space", i,
                                (int)(ll > 60 ? 60 : ll), line);
            rc = add_merge(L, line, (size_t)(sp - line), sp + 1, ll - (size_t)(sp - line) - 1, (long)i, rank++);
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            if (kind == 1) return qerr_set(L->err, L->errlen, QERR_FORMAT, "model.merges mixes strings and pairs");
            kind = 2;
            json_t *a = json_array_get(e, 0), *c = json_array_get(e, 1);
            rc = add_merge(L, json_string_value(a), json_string_length(a), json_string_value(c), json_string_length(c),
                           (long)i, rank++);
        } else {
            return qerr_set(L->err, L->errlen, QERR_FORMAT, "model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", i);
        }
        if (rc) return rc;
    }
    return 0;
}

/* ---- normalizers, pre-tokenizers, decoders ------------------------------------------------ */

static int load_normalizer(ld *L, json_t *o, int depth)
{
    qtok *t = L->t;
    int rc;
    if (!o || json_is_null(o)) return 0;
    if (depth > 16) return qerr_set(L->err, L->errlen, QERR_LIMIT, "normalizer Sequences nested too deep");
    const char *ty = type_of(o);
    if (!json_is_object(o) || !ty) return qerr_set(L->err, L->errlen, QERR_FORMAT, "normalizer must be an object with a type");
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(o, "normalizers");
        if (!json_is_array(arr)) return qerr_set(L->err, L->errlen, QERR_FORMAT, "normalizer Sequence needs a normalizers array");
        for (size_t i = 0; i < json_array_size(arr); i++)
            if ((rc = load_normalizer(L, json_array_get(arr, i), depth + 1))) return rc;
        return 0;
    }
    tok_norm nm = { 0 };
    const char *s;
    size_t n;
    if (!strcmp(ty, "NFC")) nm.kind = TN_NFC;
    else if (!strcmp(ty, "NFD")) nm.kind = TN_NFD;
    else if (!strcmp(ty, "Lowercase")) nm.kind = TN_LOWER;
    else if (!strcmp(ty, "ByteLevel")) nm.kind = TN_BYTELEVEL;
    else if (!strcmp(ty, "Strip")) {
        nm.kind = TN_STRIP;
        if ((rc = get_bool(L, o, "strip_left", 1, &nm.left, "normalizer Strip")) ||
            (rc = get_bool(L, o, "strip_right", 1, &nm.right, "normalizer Strip")))
            return rc;
    } else if (!strcmp(ty, "Prepend")) {
        nm.kind = TN_PREPEND;
        if ((rc = get_str(L, o, "prepend", &s, &n, "normalizer Prepend"))) return rc;
        if (!s) return qerr_set(L->err, L->errlen, QERR_FORMAT, "normalizer Prepend needs a prepend string");
        if ((rc = dup_str(L, s, nm.pat_len = n, &nm.pat))) return rc;
    } else if (!strcmp(ty, "Replace")) {
        nm.kind = TN_REPLACE;
        if ((rc = get_str(L, o, "content", &s, &n, "normalizer Replace"))) return rc;
        if (!s) return qerr_set(L->err, L->errlen, QERR_FORMAT, "normalizer Replace needs a content string");
        if ((rc = dup_str(L, s, nm.rep_len = n, &nm.rep))) return rc;
        if ((rc = get_pattern(L, o, "normalizer Replace", &nm.pat, &nm.pat_len, &nm.re))) {
            tok_norm_free(&nm);
            return rc;
        }
    } else {
        return qerr_set(L->err, L->errlen, QERR_UNSUPPORTED, "normalizer '%s' is not supported", ty);
    }
    tok_norm *p = grow(L, t->norms, t->n_norms, sizeof *p, &rc);
    if (!p) {
        tok_norm_free(&nm);
        return rc;
    }
    t->norms = p;
    t->norms[t->n_norms++] = nm;
    return 0;
}

static int parse_behavior(ld *L, json_t *o, const char *where, int dflt, int *out)
{
    const char *s;
    size_t n;
    int rc = get_str(L, o, "behavior", &s, &n, where);
    if (rc) return rc;
    if (!s) *out = dflt;
    else if (!strcmp(s, "Removed")) *out = TB_REMOVED;
    else if (!strcmp(s, "Isolated")) *out = TB_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious")) *out = TB_MERGED_PREV;
    else if (!strcmp(s, "MergedWithNext")) *out = TB_MERGED_NEXT;
    else if (!strcmp(s, "Contiguous")) *out = TB_CONTIGUOUS;
    else return qerr_set(L->err, L->errlen, QERR_FORMAT, "%s.behavior '%s' is unknown", where, s);
    return 0;
}

/* GPT-2's pre-tokenizer regex, as HF's ByteLevel uses it. */
static const char gpt2_re[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_pretok(ld *L, json_t *o, int depth)
{
    qtok *t = L->t;
    int rc;
    if (!o || json_is_null(o)) return 0;
    if (depth > 16) return qerr_set(L->err, L->errlen, QERR_LIMIT, "pre_tokenizer Sequences nested too deep");
    const char *ty = type_of(o);
    if (!json_is_object(o) || !ty) return qerr_set(L->err, L->errlen, QERR_FORMAT, "pre_tokenizer must be an object with a type");
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(o, "pretokenizers");
        if (!json_is_array(arr)) return qerr_set(L->err, L->errlen, QERR_FORMAT, "pre_tokenizer Sequence needs a pretokenizers array");
        for (size_t i = 0; i < json_array_size(arr); i++)
            if ((rc = load_pretok(L, json_array_get(arr, i), depth + 1))) return rc;
        return 0;
    }
    tok_pre p = { 0 };
    if (!strcmp(ty, "ByteLevel")) {
        int use_regex;
        p.kind = TP_BYTELEVEL;
        if ((rc = get_bool(L, o, "add_prefix_space", 1, &p.add_prefix_space, "pre_tokenizer ByteLevel")) ||
            (rc = get_bool(L, o, "use_regex", 1, &use_regex, "pre_tokenizer ByteLevel")))
            return rc;
        if (use_regex && !(p.re = tok_regex_compile(gpt2_re, sizeof gpt2_re - 1, L->err, L->errlen))) return QERR_INTERNAL;
    } else if (!strcmp(ty, "Split")) {
        p.kind = TP_SPLIT;
        if ((rc = parse_behavior(L, o, "pre_tokenizer Split", -1, &p.behavior)) ||
            (rc = get_bool(L, o, "invert", 0, &p.invert, "pre_tokenizer Split")))
            return rc;
        if (p.behavior < 0) return qerr_set(L->err, L->errlen, QERR_FORMAT, "pre_tokenizer Split needs a behavior");
        if ((rc = get_pattern(L, o, "pre_tokenizer Split", &p.lit, &p.lit_len, &p.re))) return rc;
    } else if (!strcmp(ty, "Metaspace")) {
        uint32_t cp;
        p.kind = TP_METASPACE;
        if ((rc = get_char(L, o, "replacement", 0x2581, &cp, "pre_tokenizer Metaspace")) ||
            (rc = get_prepend_scheme(L, o, "pre_tokenizer Metaspace", &p.prepend)) ||
            (rc = get_bool(L, o, "split", 1, &p.split, "pre_tokenizer Metaspace")))
            return rc;
        p.repl_len = qutf8_encode(cp, p.repl);
    } else if (!strcmp(ty, "Digits")) {
        p.kind = TP_DIGITS;
        if ((rc = get_bool(L, o, "individual_digits", 0, &p.individual, "pre_tokenizer Digits"))) return rc;
    } else if (!strcmp(ty, "Whitespace")) {
        p.kind = TP_WHITESPACE;
    } else if (!strcmp(ty, "WhitespaceSplit")) {
        p.kind = TP_WSSPLIT;
    } else if (!strcmp(ty, "Punctuation")) {
        p.kind = TP_PUNCT;
        if ((rc = parse_behavior(L, o, "pre_tokenizer Punctuation", TB_ISOLATED, &p.behavior))) return rc;
    } else {
        return qerr_set(L->err, L->errlen, QERR_UNSUPPORTED, "pre_tokenizer '%s' is not supported", ty);
    }
    tok_pre *arr = grow(L, t->pres, t->n_pres, sizeof *arr, &rc);
    if (!arr) {
        tok_pre_free(&p);
        return rc;
    }
    t->pres = arr;
    t->pres[t->n_pres++] = p;
    return 0;
}

static int load_decoder(ld *L, json_t *o, int depth, int *fused)
{
    qtok *t = L->t;
    int rc;
    if (depth > 16) return qerr_set(L->err, L->errlen, QERR_LIMIT, "decoder Sequences nested too deep");
    const char *ty = type_of(o);
    if (!json_is_object(o) || !ty) return qerr_set(L->err, L->errlen, QERR_FORMAT, "decoder must be an object with a type");
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(o, "decoders");
        if (!json_is_array(arr)) return qerr_set(L->err, L->errlen, QERR_FORMAT, "decoder Sequence needs a decoders array");
        for (size_t i = 0; i < json_array_size(arr); i++)
            if ((rc = load_decoder(L, json_array_get(arr, i), depth + 1, fused))) return rc;
        return 0;
    }
    tok_dec d = { 0 };
    long long v;
    if (!strcmp(ty, "ByteLevel")) d.kind = TD_BYTELEVEL;
    else if (!strcmp(ty, "ByteFallback")) d.kind = TD_BYTEFALLBACK;
    else if (!strcmp(ty, "Fuse")) d.kind = TD_FUSE;
    else if (!strcmp(ty, "Replace")) {
        const char *s;
        size_t n;
        d.kind = TD_REPLACE;
        if ((rc = get_str(L, o, "content", &s, &n, "decoder Replace"))) return rc;
        if (!s) return qerr_set(L->err, L->errlen, QERR_FORMAT, "decoder Replace needs a content string");
        if ((rc = dup_str(L, s, d.rep_len = n, &d.rep))) return rc;
        if ((rc = get_pattern(L, o, "decoder Replace", &d.pat, &d.pat_len, &d.re))) {
            tok_dec_free(&d);
            return rc;
        }
    } else if (!strcmp(ty, "Strip")) {
        d.kind = TD_STRIP;
        if ((rc = get_char(L, o, "content", ' ', &d.ch, "decoder Strip")) ||
            (rc = get_int(L, o, "start", 0, 1 << 20, 0, &v, "decoder Strip")))
            return rc;
        d.start = (int)v;
        if ((rc = get_int(L, o, "stop", 0, 1 << 20, 0, &v, "decoder Strip"))) return rc;
        d.stop = (int)v;
    } else if (!strcmp(ty, "Metaspace")) {
        int scheme;
        d.kind = TD_METASPACE;
        if ((rc = get_char(L, o, "replacement", 0x2581, &d.ch, "decoder Metaspace")) ||
            (rc = get_prepend_scheme(L, o, "decoder Metaspace", &scheme)))
            return rc;
        d.drop_first = scheme != TM_NEVER;
    } else {
        return qerr_set(L->err, L->errlen, QERR_UNSUPPORTED, "decoder '%s' is not supported", ty);
    }
    /* After the text is fused into one string only per-character steps stream. */
    if (*fused && (d.kind == TD_BYTELEVEL || d.kind == TD_BYTEFALLBACK || (d.kind == TD_REPLACE && d.re))) {
        const char *how = d.kind == TD_REPLACE ? " with a Regex" : "";
        tok_dec_free(&d);
        return qerr_set(L->err, L->errlen, QERR_UNSUPPORTED, "decoder '%s'%s after Fuse/ByteLevel is not supported", ty,
                        how);
    }
    if (d.kind == TD_BYTELEVEL || d.kind == TD_FUSE) *fused = 1;
    tok_dec *arr = grow(L, t->decs, t->n_decs, sizeof *arr, &rc);
    if (!arr) {
        tok_dec_free(&d);
        return rc;
    }
    t->decs = arr;
    t->decs[t->n_decs++] = d;
    return 0;
}

/* ---- post-processor ------------------------------------------------------------------------ */

static int post_push(ld *L, int32_t **arr, int *n, int32_t v)
{
    if (*n >= 1024) return qerr_set(L->err, L->errlen, QERR_LIMIT, "post_processor template too long");
    int32_t *p = q_reallocn(*arr, (size_t)*n + 1, sizeof *p);
    if (!p) return qerr_set(L->err, L->errlen, QERR_NOMEM, "out of memory");
    p[(*n)++] = v;
    *arr = p;
    return 0;
}

/* Wraps the current template (t->post; "just the text" when empty) in tpl. */
static int post_compose(ld *L, const int32_t *tpl, int n)
{
    qtok *t = L->t;
    int32_t *out = NULL;
    int no = 0, rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        if (tpl[i] != TOK_POST_SEQ) {
            rc = post_push(L, &out, &no, tpl[i]);
        } else if (!t->n_post) {
            rc = post_push(L, &out, &no, TOK_POST_SEQ);
        } else {
            for (int j = 0; j < t->n_post && !rc; j++) rc = post_push(L, &out, &no, t->post[j]);
        }
    }
    if (rc) {
        free(out);
        return rc;
    }
    free(t->post);
    t->post = out;
    t->n_post = no;
    return 0;
}

static int special_pair(ld *L, json_t *o, const char *key, int32_t *id)
{
    json_t *p = json_object_get(o, key);
    json_t *v = json_array_get(p, 1);
    if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= QTOK_MAX_VOCAB)
        return qerr_set(L->err, L->errlen, QERR_FORMAT, "post_processor.%s must be [token, id]", key);
    *id = (int32_t)json_integer_value(v);
    return 0;
}

static int load_post(ld *L, json_t *o, int depth)
{
    int rc;
    if (!o || json_is_null(o)) return 0;
    if (depth > 16) return qerr_set(L->err, L->errlen, QERR_LIMIT, "post_processor Sequences nested too deep");
    const char *ty = type_of(o);
    if (!json_is_object(o) || !ty) return qerr_set(L->err, L->errlen, QERR_FORMAT, "post_processor must be an object with a type");
    if (!strcmp(ty, "Sequence")) {
        json_t *arr = json_object_get(o, "processors");
        if (!json_is_array(arr)) return qerr_set(L->err, L->errlen, QERR_FORMAT, "post_processor Sequence needs a processors array");
        for (size_t i = 0; i < json_array_size(arr); i++)
            if ((rc = load_post(L, json_array_get(arr, i), depth + 1))) return rc;
        return 0;
    }
    if (!strcmp(ty, "ByteLevel")) return 0; /* offsets only */
    int32_t *tpl = NULL;
    int n = 0;
    rc = 0;
    if (!strcmp(ty, "RobertaProcessing") || !strcmp(ty, "BertProcessing")) {
        int32_t cls, sep;
        if ((rc = special_pair(L, o, "cls", &cls)) || (rc = special_pair(L, o, "sep", &sep))) return rc;
        if (!(rc = post_push(L, &tpl, &n, cls)) && !(rc = post_push(L, &tpl, &n, TOK_POST_SEQ)))
            rc = post_push(L, &tpl, &n, sep);
    } else if (!strcmp(ty, "TemplateProcessing")) {
        json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens");
        if (!json_is_array(single)) return qerr_set(L->err, L->errlen, QERR_FORMAT, "TemplateProcessing.single must be an array");
        for (size_t i = 0; i < json_array_size(single) && !rc; i++) {
            json_t *it = json_array_get(single, i);
            json_t *sp = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
            json_t *sid = json_object_get(sp ? sp : sq, "id");
            if (!json_is_string(sid)) {
                rc = qerr_set(L->err, L->errlen, QERR_FORMAT, "TemplateProcessing.single[%zu] must be a SpecialToken or Sequence", i);
                break;
            }
            if (sq) {
                if (strcmp(json_string_value(sid), "A"))
                    rc = qerr_set(L->err, L->errlen, QERR_FORMAT, "TemplateProcessing.single names sequence '%s'",
                                  json_string_value(sid));
                else rc = post_push(L, &tpl, &n, TOK_POST_SEQ);
                continue;
            }
            json_t *def = json_object_getn(specials, json_string_value(sid), json_string_length(sid));
            json_t *ids = json_object_get(def, "ids");
            if (!json_is_array(ids)) {
                rc = qerr_set(L->err, L->errlen, QERR_FORMAT, "TemplateProcessing: special token '%s' has no ids",
                              json_string_value(sid));
                break;
            }
            for (size_t j = 0; j < json_array_size(ids) && !rc; j++) {
                json_t *v = json_array_get(ids, j);
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= QTOK_MAX_VOCAB)
                    rc = qerr_set(L->err, L->errlen, QERR_RANGE, "TemplateProcessing: special token '%s' has a bad id",
                                  json_string_value(sid));
                else rc = post_push(L, &tpl, &n, (int32_t)json_integer_value(v));
            }
        }
    } else {
        return qerr_set(L->err, L->errlen, QERR_UNSUPPORTED, "post_processor '%s' is not supported", ty);
    }
    if (!rc) rc = post_compose(L, tpl, n);
    free(tpl);
    return rc;
}

/* ---- added tokens and the whole file ---------------------------------------------------------- */

static int load_added(ld *L, json_t *arr)
{
    if (!arr || json_is_null(arr)) return 0;
    if (!json_is_array(arr)) return qerr_set(L->err, L->errlen, QERR_FORMAT, "added_tokens must be an array");
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *o = json_array_get(arr, i);
        json_t *c = json_object_get(o, "content");
        long long jid;
        int special, lstrip, rstrip, single, normalized, rc;
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if (!json_is_object(o) || !json_is_string(c))
            return qerr_set(L->err, L->errlen, QERR_FORMAT, "%s must be an object with a content string", where);
        if ((rc = get_int(L, o, "id", 0, UINT32_MAX, -1, &jid, where)) ||
            (rc = get_bool(L, o, "special", 0, &special, where)) || (rc = get_bool(L, o, "lstrip", 0, &lstrip, where)) ||
            (rc = get_bool(L, o, "rstrip", 0, &rstrip, where)) || (rc = get_bool(L, o, "single_word", 0, &single, where)) ||
            (rc = get_bool(L, o, "normalized", !special, &normalized, where)))
            return rc;
        rc = tok_add_token(L->t, json_string_value(c), json_string_length(c), special, lstrip, rstrip, single, normalized);
        if (rc == QERR_NOTFOUND) continue;
        if (rc < 0) return qerr_set(L->err, L->errlen, rc, "%s: %s", where, qerr_str(rc));
        if (jid >= 0 && jid != rc)
            QLOGW("tokenizer: added token \"%.40s\" has id %lld in the file but gets %d (as in HF tokenizers)",
                  json_string_value(c), jid, rc);
    }
    return 0;
}

int qtok_load_json_text(const char *json, size_t len, qtok **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!json) return qerr_set(err, errlen, QERR_INVAL, "no JSON text");
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &je);
    if (!root) return qerr_set(err, errlen, QERR_FORMAT, "tokenizer.json: line %d: %s", je.line, je.text);
    qtok *t = tok_new();
    if (!t) {
        json_decref(root);
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    }
    ld L = { t, err, errlen };
    int rc, fused = 0;
    json_t *dec = json_object_get(root, "decoder");
    if (!json_is_object(root)) rc = qerr_set(err, errlen, QERR_FORMAT, "tokenizer.json must be a JSON object");
    else if (!(rc = load_model(&L, json_object_get(root, "model"))) &&
             !(rc = load_normalizer(&L, json_object_get(root, "normalizer"), 0)) &&
             !(rc = load_pretok(&L, json_object_get(root, "pre_tokenizer"), 0)) &&
             !(rc = load_post(&L, json_object_get(root, "post_processor"), 0)) &&
             !(rc = (dec && !json_is_null(dec)) ? load_decoder(&L, dec, 0, &fused) : 0) &&
             !(rc = load_added(&L, json_object_get(root, "added_tokens"))))
        rc = tok_finish(t, err, errlen);
    if (!rc) t->dec_join_space = !dec || json_is_null(dec);
    json_decref(root);
    if (rc) {
        qtok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int qtok_load_json(const char *path, qtok **out, char *err, size_t errlen)
{
    char *buf;
    size_t len;
    *out = NULL;
    int rc = q_read_file(path, JSON_MAX_BYTES, &buf, &len, err, errlen);
    if (rc) return rc;
    rc = qtok_load_json_text(buf, len, out, err, errlen);
    free(buf);
    return rc;
}
