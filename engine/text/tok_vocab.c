/* tok_vocab.c - a qtok from a GGUF vocabulary (qvocab, filled by gguf.c).
 *
 * llama.cpp's two common vocabulary kinds are expressed as the tokenizer.json
 * pipelines HF uses for the same models, so that one encoder serves both:
 *
 *  - "llama" (QVOCAB_SPM): SentencePiece BPE.  llama.cpp prefixes each run of
 *    text with a space, turns spaces into '▁', and then repeatedly merges the
 *    adjacent pair whose concatenation is the vocabulary token with the
 *    highest score (leftmost on a tie); characters left over become <0xXX>
 *    byte tokens.  That is BPE with a merge (A, B) -> T for every token T that
 *    splits into two tokens A + B, ranked by T's score (equal scores share a
 *    rank, so ties fall to the leftmost pair as in llama.cpp), with
 *    normalizers Prepend("▁") + Replace(" ", "▁") and byte fallback.
 *  - "gpt2" (QVOCAB_BPE): byte-level BPE with the file's merges and the
 *    pre-tokenizer regex that tokenizer.ggml.pre names (the same regexes HF's
 *    tokenizer.json files for those models use).
 *
 * Control and unknown tokens become special added tokens (recognised in
 * text only with QTOK_PARSE_SPECIAL), user-defined tokens non-special added
 * tokens, as llama.cpp treats them.
 */
#include "tok_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qerr.h"
#include "util.h"

/* Pre-tokenizer regexes by tokenizer.ggml.pre. */
static const char re_gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char re_llama3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_qwen2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                               "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const re_deepseek_coder[] = { "[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+",
                                                 "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+" };

typedef struct {
    const char *name;
    int kind; /* 0 gpt2 regex, 1 llama3, 2 qwen2, 3 deepseek-coder, 4 digits + gpt2 */
} pre_def;

static const pre_def pre_defs[] = {
    { "gpt-2", 0 },          { "gpt2", 0 },      { "mpt", 0 },       { "olmo", 0 },
    { "llama-bpe", 1 },      { "llama3", 1 },    { "llama-v3", 1 },  { "smaug-bpe", 1 },
    { "qwen2", 2 },          { "deepseek-r1-qwen", 2 },              { "deepseek-coder", 3 },
    { "starcoder", 4 },      { "refact", 4 },    { "smollm", 4 },
};

static int add_pre(qtok *t, tok_pre p, char *err, size_t errlen)
{
    tok_pre *arr = q_reallocn(t->pres, (size_t)t->n_pres + 1, sizeof *arr);
    if (!arr) {
        tok_pre_free(&p);
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    }
    t->pres = arr;
    t->pres[t->n_pres++] = p;
    return 0;
}

static int add_split(qtok *t, const char *re, char *err, size_t errlen)
{
    tok_pre p = { .kind = TP_SPLIT, .behavior = TB_ISOLATED };
    if (!(p.re = tok_regex_compile(re, strlen(re), err, errlen))) return QERR_INTERNAL;
    return add_pre(t, p, err, errlen);
}

static int setup_bpe_pre(qtok *t, const char *pre, char *err, size_t errlen)
{
    int kind = -1, rc;
    if (!pre) {
        QLOGW("tokenizer: GGUF vocabulary without tokenizer.ggml.pre; using GPT-2's pre-tokenizer");
        kind = 0;
    }
    for (size_t i = 0; pre && i < sizeof pre_defs / sizeof pre_defs[0]; i++)
        if (!strcmp(pre, pre_defs[i].name)) kind = pre_defs[i].kind;
    if (kind < 0) return qerr_set(err, errlen, QERR_UNSUPPORTED, "GGUF pre-tokenizer '%.60s' is not supported", pre);
    switch (kind) {
    case 0: rc = add_split(t, re_gpt2, err, errlen); break;
    case 1: rc = add_split(t, re_llama3, err, errlen); break;
    case 2: rc = add_split(t, re_qwen2, err, errlen); break;
    case 3:
        rc = 0;
        for (size_t i = 0; i < 4 && !rc; i++) rc = add_split(t, re_deepseek_coder[i], err, errlen);
        if (!rc) rc = add_pre(t, (tok_pre){ .kind = TP_DIGITS, .individual = 1 }, err, errlen);
        break;
    default:
        rc = add_pre(t, (tok_pre){ .kind = TP_DIGITS, .individual = 1 }, err, errlen);
        if (!rc) rc = add_split(t, re_gpt2, err, errlen);
        break;
    }
    if (rc) return rc;
    return add_pre(t, (tok_pre){ .kind = TP_BYTELEVEL }, err, errlen);
}

static int add_dec(qtok *t, tok_dec d)
{
    tok_dec *arr = q_reallocn(t->decs, (size_t)t->n_decs + 1, sizeof *arr);
    if (!arr) {
        tok_dec_free(&d);
        return QERR_NOMEM;
    }
    t->decs = arr;
    t->decs[t->n_decs++] = d;
    return 0;
}

static int add_norm(qtok *t, tok_norm nm)
{
    tok_norm *arr = q_reallocn(t->norms, (size_t)t->n_norms + 1, sizeof *arr);
    if (!arr) {
        tok_norm_free(&nm);
        return QERR_NOMEM;
    }
    t->norms = arr;
    t->norms[t->n_norms++] = nm;
    return 0;
}

typedef struct {
    float score;
    int32_t id;
} scored;

static int by_score_desc(const void *a, const void *b)
{
    float x = ((const scored *)a)->score, y = ((const scored *)b)->score;
    return x > y ? -1 : x < y ? 1 : 0;
}

/* Merges (A, B) -> T for every token T = A + B, ranked by T's score. */
static int spm_merges(qtok *t, const qvocab *v, char *err, size_t errlen)
{
    scored *s = q_mallocn((size_t)v->n, sizeof *s);
    if (!s) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    int n = 0;
    for (int i = 0; i < v->n; i++) {
        if (!v->tokens[i]) continue;
        float f = v->scores ? v->scores[i] : 0.0f;
        s[n++] = (scored){ isnan(f) ? -INFINITY : f, i };
    }
    qsort(s, (size_t)n, sizeof *s, by_score_desc);
    uint32_t rank = 0;
    int rc = 0;
    for (int k = 0; k < n && !rc; k++) {
        if (k > 0 && s[k].score != s[k - 1].score) rank++;
        const char *tok = v->tokens[s[k].id];
        size_t len = strlen(tok);
        if (tok_strmap_get(&t->bpe.vocab, tok, len) != s[k].id) continue; /* a duplicate string */
        for (size_t cut = 1; cut < len && !rc; cut++) {
            if (((unsigned char)tok[cut] & 0xc0) == 0x80) continue;
            int32_t a = tok_strmap_get(&t->bpe.vocab, tok, cut);
            int32_t b = a >= 0 ? tok_strmap_get(&t->bpe.vocab, tok + cut, len - cut) : -1;
            if (b >= 0) rc = tok_bpe_add_merge(&t->bpe, a, b, rank, s[k].id);
        }
    }
    free(s);
    return rc ? qerr_set(err, errlen, rc, "out of memory building merges") : 0;
}

static int bpe_merges(qtok *t, const qvocab *v, char *err, size_t errlen)
{
    for (int i = 0; i < v->n_merges; i++) {
        const char *m = v->merges[i];
        const char *sp = m ? strchr(m, ' ') : NULL;
        if (!sp || strchr(sp + 1, ' '))
            return qerr_set(err, errlen, QERR_FORMAT, "tokenizer.ggml.merges[%d] is not two tokens separated by a space", i);
        size_t al = (size_t)(sp - m), bl = strlen(sp + 1);
        int32_t a = tok_strmap_get(&t->bpe.vocab, m, al), b = tok_strmap_get(&t->bpe.vocab, sp + 1, bl);
        char *cat = q_malloc(al + bl + 1);
        if (!cat) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        memcpy(cat, m, al);
        memcpy(cat + al, sp + 1, bl);
        int32_t c = tok_strmap_get(&t->bpe.vocab, cat, al + bl);
        free(cat);
        if (a < 0 || b < 0 || c < 0)
            return qerr_set(err, errlen, QERR_FORMAT, "tokenizer.ggml.merges[%d] \"%.60s\" names a token not in the vocabulary",
                            i, m);
        int rc = tok_bpe_add_merge(&t->bpe, a, b, (uint32_t)i, c);
        if (rc) return qerr_set(err, errlen, rc, "out of memory building merges");
    }
    return 0;
}

int qtok_from_vocab(const qvocab *v, int bos_id, int eos_id, int add_bos, qtok **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!v || (v->kind != QVOCAB_SPM && v->kind != QVOCAB_BPE))
        return qerr_set(err, errlen, QERR_UNSUPPORTED, "vocabulary kind is not llama (SentencePiece) or gpt2 (BPE)");
    if (v->n <= 0 || v->n > QTOK_MAX_VOCAB || !v->tokens)
        return qerr_set(err, errlen, QERR_FORMAT, "vocabulary has %d tokens", v->n);
    qtok *t = tok_new();
    if (!t) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    int rc = 0;
    for (int i = 0; i < v->n && !rc; i++) {
        if (!v->tokens[i]) continue;
        size_t len = strlen(v->tokens[i]);
        if (qutf8_valid_prefix(v->tokens[i], len) != len)
            rc = qerr_set(err, errlen, QERR_FORMAT, "token %d is not valid UTF-8", i);
        else if (tok_strmap_put(&t->bpe.vocab, v->tokens[i], len, i, NULL))
            rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    }
    if (!rc && v->kind == QVOCAB_SPM) {
        t->bpe.byte_fallback = 1;
        t->bpe.fuse_unk = 1;
        for (int i = 0; i < v->n && v->types; i++)
            if (v->types[i] == QTOK_UNKNOWN && v->tokens[i]) {
                t->bpe.unk_id = i;
                break;
            }
        tok_norm pre = { .kind = TN_PREPEND }, rep = { .kind = TN_REPLACE };
        pre.pat = q_strdup("\xe2\x96\x81");
        pre.pat_len = 3;
        rep.pat = q_strdup(" ");
        rep.pat_len = 1;
        rep.rep = q_strdup("\xe2\x96\x81");
        rep.rep_len = 3;
        if (!pre.pat || !rep.pat || !rep.rep) {
            tok_norm_free(&pre);
            tok_norm_free(&rep);
            rc = QERR_NOMEM;
        } else if (!(rc = add_norm(t, pre))) {
            rc = add_norm(t, rep);
        }
        tok_dec r = { .kind = TD_REPLACE, .pat = q_strdup("\xe2\x96\x81"), .pat_len = 3, .rep = q_strdup(" "), .rep_len = 1 };
        if (!rc && (!r.pat || !r.rep)) rc = QERR_NOMEM;
        if (!rc) rc = add_dec(t, r);
        else tok_dec_free(&r);
        if (!rc) rc = add_dec(t, (tok_dec){ .kind = TD_BYTEFALLBACK });
        if (!rc) rc = add_dec(t, (tok_dec){ .kind = TD_FUSE });
        if (!rc) rc = add_dec(t, (tok_dec){ .kind = TD_STRIP, .ch = ' ', .start = 1 });
        if (rc) rc = qerr_set(err, errlen, rc, "out of memory");
        if (!rc) rc = spm_merges(t, v, err, errlen);
    } else if (!rc) {
        if (!(rc = bpe_merges(t, v, err, errlen)) && !(rc = setup_bpe_pre(t, v->pre, err, errlen)) &&
            (rc = add_dec(t, (tok_dec){ .kind = TD_BYTELEVEL })))
            rc = qerr_set(err, errlen, rc, "out of memory");
    }
    for (int i = 0; i < v->n && !rc && v->types; i++) {
        int ty = v->types[i];
        if (!v->tokens[i] || (ty != QTOK_CONTROL && ty != QTOK_USER && ty != QTOK_UNKNOWN)) continue;
        int id = tok_add_token(t, v->tokens[i], strlen(v->tokens[i]), ty != QTOK_USER, 0, 0, 0, 0);
        if (id < 0 && id != QERR_NOTFOUND) rc = qerr_set(err, errlen, id, "added token %d: %s", i, qerr_str(id));
    }
    if (!rc && add_bos && bos_id >= 0) {
        if (bos_id >= v->n) rc = qerr_set(err, errlen, QERR_RANGE, "bos id %d is outside the vocabulary", bos_id);
        else if (!(t->post = q_mallocn(2, sizeof *t->post))) rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        else {
            t->post[0] = bos_id;
            t->post[1] = TOK_POST_SEQ;
            t->n_post = 2;
        }
    }
    if (!rc) {
        t->bos_id = bos_id >= 0 && bos_id < v->n ? bos_id : -1;
        t->eos_id = eos_id >= 0 && eos_id < v->n ? eos_id : -1;
        rc = tok_finish(t, err, errlen);
    }
    /* ids whose string is also another id's keep their text for decoding */
    for (int i = 0; i < v->n && !rc; i++)
        if (v->tokens[i] && !t->id_str[i]) {
            char *s = q_strdup(v->tokens[i]);
            char **o = s ? q_reallocn(t->owned, (size_t)t->n_owned + 1, sizeof *o) : NULL;
            if (!o) {
                free(s);
                rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
                break;
            }
            t->owned = o;
            t->owned[t->n_owned++] = s;
            t->id_str[i] = s;
            t->id_len[i] = (uint32_t)strlen(s);
        }
    if (rc) {
        qtok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}
