/* tokenizer.c - the tokenizer's public face: added tokens, the encode
 * pipeline, the post-processor, lookups.
 *
 * Encoding follows HF tokenizers' TokenizerImpl::encode step by step:
 *
 *   1. Added tokens whose normalized flag is false are found in the raw text
 *      (leftmost-longest over all of them, as HF's aho-corasick automaton
 *      does).  Special ones are skipped unless QTOK_PARSE_SPECIAL; a skipped
 *      match still consumes its text, so a non-special token inside it is not
 *      found either (HF's encode_special_tokens behaves the same way).
 *      single_word, lstrip and rstrip are applied as HF applies them.
 *   2. Each remaining piece is normalized on its own, and added tokens with
 *      normalized=true are found in the normalized text (their patterns were
 *      normalized once at load).
 *   3. The pre-tokenizers cut the text pieces (tok_pretok.c).
 *   4. The model turns each piece into ids (tok_bpe.c).
 *   5. With QTOK_ADD_SPECIAL the single-sequence template wraps the ids.
 *
 * Ids follow HF's AddedVocabulary: an added token whose text is in the model
 * vocabulary gets the model's id; any other gets model-vocabulary-size +
 * number of such tokens so far.  The "id" written in tokenizer.json is not
 * trusted (HF only warns when it differs; so does quire).
 *
 * Invariants once tok_finish has run: every id in the vocabulary, the merge
 * map, the added tokens and the template is in [0, n_ids); id_str[id] is the
 * text HF's id_to_token returns (the added token's for added ids); a qtok is
 * never written again except for its word cache, which is guarded by
 * cache_lock.
 */
#define _GNU_SOURCE
#include "tok_internal.h"

#include <string.h>

#include "qerr.h"
#include "util.h"

/* ---- lifetime ---------------------------------------------------------------------- */

qtok *tok_new(void)
{
    qtok *t = q_callocn(1, sizeof *t);
    if (!t) return NULL;
    t->bpe.unk_id = -1;
    t->bos_id = t->eos_id = -1;
    for (int i = 0; i < 256; i++) t->trie_raw.root[i] = t->trie_norm.root[i] = -1;
    t->trie_raw.empty = t->trie_norm.empty = 1;
    return t;
}

void qtok_free(qtok *t)
{
    if (!t) return;
    tok_bpe_free(&t->bpe);
    free(t->id_str);
    free(t->id_len);
    free(t->id_special);
    tok_strmap_free(&t->added_map);
    tok_strmap_free(&t->added_idx);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].pattern);
    }
    free(t->added);
    free(t->trie_raw.nodes);
    free(t->trie_norm.nodes);
    for (int i = 0; i < t->n_norms; i++) tok_norm_free(&t->norms[i]);
    free(t->norms);
    for (int i = 0; i < t->n_pres; i++) tok_pre_free(&t->pres[i]);
    free(t->pres);
    for (int i = 0; i < t->n_decs; i++) tok_dec_free(&t->decs[i]);
    free(t->decs);
    free(t->post);
    for (int i = 0; i < t->n_owned; i++) free(t->owned[i]);
    free(t->owned);
    if (t->cache) {
        tok_cache_free(t->cache);
        pthread_mutex_destroy(&t->cache_lock);
    }
    free(t);
}

void tok_work_free(tok_work *w)
{
    if (w->md) pcre2_match_data_free(w->md);
    for (int i = 0; i < 3; i++) qbuf_free(&w->nb[i]);
    qbuf_free(&w->u32);
    free(w->seg);
    free(w->sym);
    free(w->heap);
    memset(w, 0, sizeof *w);
}

/* ---- added tokens ----------------------------------------------------------------------- */

int tok_add_token(qtok *t, const char *content, size_t len, int special, int lstrip, int rstrip, int single_word,
                  int normalized)
{
    if (len == 0) return QERR_NOTFOUND; /* HF ignores empty added tokens */
    int32_t id = tok_strmap_get(&t->added_map, content, len);
    if (id < 0) id = tok_strmap_get(&t->bpe.vocab, content, len);
    if (id < 0) {
        size_t nid = (size_t)t->bpe.vocab.n + t->added_map.n;
        if (nid >= QTOK_MAX_VOCAB) return QERR_LIMIT;
        id = (int32_t)nid;
        int rc = tok_strmap_put(&t->added_map, content, len, id, NULL);
        if (rc) return rc;
    }
    int32_t at = tok_strmap_get(&t->added_idx, content, len);
    tok_added *a;
    if (at >= 0) {
        a = &t->added[at];
    } else {
        if (t->n_added >= QTOK_MAX_VOCAB) return QERR_LIMIT;
        tok_added *p = q_reallocn(t->added, (size_t)t->n_added + 1, sizeof *p);
        if (!p) return QERR_NOMEM;
        t->added = p;
        a = &t->added[t->n_added];
        memset(a, 0, sizeof *a);
        a->content = q_strndup(content, len);
        if (!a->content) return QERR_NOMEM;
        a->len = len;
        int rc = tok_strmap_put(&t->added_idx, content, len, t->n_added, NULL);
        if (rc) {
            free(a->content);
            return rc;
        }
        t->n_added++;
    }
    a->id = id;
    a->special |= (uint8_t)(special != 0);
    a->lstrip = (uint8_t)(lstrip != 0);
    a->rstrip = (uint8_t)(rstrip != 0);
    a->single_word = (uint8_t)(single_word != 0);
    a->normalized = (uint8_t)(normalized != 0);
    return id;
}

static int trie_insert(tok_trie *tr, const char *s, size_t n, int32_t term)
{
    if (n == 0) return 0;
    tr->empty = 0;
    int32_t *link = &tr->root[(unsigned char)s[0]];
    int32_t cur = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t c = *link;
        if (i > 0) { /* find the child of cur with byte s[i] */
            c = tr->nodes[cur].child;
            while (c >= 0 && tr->nodes[c].byte != (uint8_t)s[i]) c = tr->nodes[c].sibling;
        }
        if (c < 0) {
            if (tr->n == tr->cap) {
                size_t cap = tr->cap ? tr->cap * 2 : 256;
                if (cap > (size_t)INT32_MAX) return QERR_LIMIT;
                tok_tnode *p = q_reallocn(tr->nodes, cap, sizeof *p);
                if (!p) return QERR_NOMEM;
                tr->nodes = p;
                tr->cap = cap;
            }
            c = (int32_t)tr->n++;
            tr->nodes[c] = (tok_tnode){ .child = -1, .sibling = -1, .term = -1, .byte = (uint8_t)s[i] };
            if (i == 0) {
                tr->root[(unsigned char)s[0]] = c;
            } else {
                tr->nodes[c].sibling = tr->nodes[cur].child;
                tr->nodes[cur].child = c;
            }
        }
        cur = c;
    }
    if (tr->nodes[cur].term < 0) tr->nodes[cur].term = term; /* the first pattern wins, as in HF */
    return 0;
}

/* Leftmost-longest match in s[from..n); returns 1 and sets *ms, *me, *idx. */
static int trie_find(const tok_trie *tr, const char *s, size_t n, size_t from, size_t *ms, size_t *me, int32_t *idx)
{
    for (size_t i = from; i < n; i++) {
        int32_t c = tr->root[(unsigned char)s[i]];
        if (c < 0) continue;
        int32_t best = -1;
        size_t best_end = 0, j = i;
        for (;;) {
            j++;
            if (tr->nodes[c].term >= 0) {
                best = tr->nodes[c].term;
                best_end = j;
            }
            if (j >= n) break;
            int32_t k = tr->nodes[c].child;
            while (k >= 0 && tr->nodes[k].byte != (uint8_t)s[j]) k = tr->nodes[k].sibling;
            if (k < 0) break;
            c = k;
        }
        if (best >= 0) {
            *ms = i;
            *me = best_end;
            *idx = best;
            return 1;
        }
    }
    return 0;
}

static uint32_t last_cp(const char *s, size_t n)
{
    size_t p = n - 1;
    while (p > 0 && ((unsigned char)s[p] & 0xc0) == 0x80) p--;
    uint32_t cp;
    qutf8_decode_valid(s + p, &cp);
    return cp;
}

/* Splits s[0..n) (text at offset base of out->text) on the added tokens of
 * tr, appending text pieces and token pieces to out (HF's find_matches). */
/* 1 if [s, e) overlaps one of the plain spans. */
static int in_plain(const qtok_span *plain, int n_plain, size_t s, size_t e)
{
    for (int i = 0; i < n_plain; i++)
        if (s < plain[i].off + plain[i].len && plain[i].off < e) return 1;
    return 0;
}

static int split_added(const qtok *t, const tok_trie *tr, const char *s, size_t n, size_t base, uint32_t origin,
                       unsigned flags, const qtok_span *plain, int n_plain, tok_plist *out)
{
    size_t start_offset = 0, pos = 0, ms, me;
    int32_t idx;
    int rc;
    while (pos < n && trie_find(tr, s, n, pos, &ms, &me, &idx)) {
        pos = me;
        const tok_added *a = &t->added[idx];
        if (a->special && !(flags & QTOK_PARSE_SPECIAL)) continue;
        if (a->special && in_plain(plain, n_plain, base + ms, base + me)) continue;
        if (a->single_word) {
            uint32_t cp;
            int start_space = ms == 0 || !tok_uni_is_word(last_cp(s, ms));
            int stop_space = me == n || (qutf8_decode_valid(s + me, &cp), !tok_uni_is_word(cp));
            if (!start_space || !stop_space) continue;
        }
        size_t start = ms, stop = me;
        if (a->lstrip) {
            size_t ns = ms;
            while (ns > 0) {
                size_t p = ns - 1;
                while (p > 0 && ((unsigned char)s[p] & 0xc0) == 0x80) p--;
                uint32_t cp;
                qutf8_decode_valid(s + p, &cp);
                if (!tok_uni_is_space(cp)) break;
                ns = p;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                uint32_t cp;
                int cl = qutf8_decode_valid(s + stop, &cp);
                if (!tok_uni_is_space(cp)) break;
                stop += (size_t)cl;
            }
        }
        if (start_offset < start &&
            (rc = tok_plist_add(out, base + start_offset, start - start_offset, -1, origin && start_offset == 0)))
            return rc;
        if ((rc = tok_plist_add(out, 0, 0, a->id, 0))) return rc;
        start_offset = stop;
    }
    if (start_offset < n) return tok_plist_add(out, base + start_offset, n - start_offset, -1, origin && !start_offset);
    return 0;
}

/* ---- finishing a qtok ---------------------------------------------------------------------- */

/* The id of the first name that is an added token, or -1. */
static int find_named(const qtok *t, const char *const *names)
{
    for (int i = 0; names[i]; i++) {
        int32_t at = tok_strmap_get(&t->added_idx, names[i], strlen(names[i]));
        if (at >= 0) return t->added[at].id;
    }
    return -1;
}

int tok_finish(qtok *t, char *err, size_t errlen)
{
    int rc = tok_bpe_finish(&t->bpe);
    if (rc) return qerr_set(err, errlen, rc, "out of memory building the vocabulary");
    int32_t max = -1;
    for (uint32_t e = 0; e < t->bpe.vocab.n; e++)
        if (t->bpe.vocab.val[e] > max) max = t->bpe.vocab.val[e];
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id > max) max = t->added[i].id;
    t->n_ids = max + 1;
    for (int i = 0; i < t->n_post; i++)
        if (t->post[i] >= t->n_ids)
            return qerr_set(err, errlen, QERR_RANGE, "post_processor id %d is outside the vocabulary (%d ids)",
                            t->post[i], t->n_ids);
    size_t n = t->n_ids ? (size_t)t->n_ids : 1;
    t->id_str = q_callocn(n, sizeof *t->id_str);
    t->id_len = q_callocn(n, sizeof *t->id_len);
    t->id_special = q_callocn(n, 1);
    if (!t->id_str || !t->id_len || !t->id_special) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    for (uint32_t e = 0; e < t->bpe.vocab.n; e++) {
        int32_t id = t->bpe.vocab.val[e];
        if (!t->id_str[id]) {
            t->id_str[id] = t->bpe.vocab.pool.p + t->bpe.vocab.off[e];
            t->id_len[id] = t->bpe.vocab.len[e];
        }
    }
    tok_work w = { 0 };
    qbuf nb = { 0 };
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < t->n_added; i++) {
            tok_added *a = &t->added[i];
            if (a->special != (pass == 0)) continue;
            nb.len = 0;
            if (a->normalized) rc = tok_normalize(t, &w, a->content, a->len, &nb);
            else rc = qbuf_put(&nb, a->content, a->len);
            if (!rc) {
                free(a->pattern);
                a->pattern = q_strndup(nb.p ? nb.p : "", nb.len);
                a->pat_len = nb.len;
                if (!a->pattern) rc = QERR_NOMEM;
            }
            if (!rc) rc = trie_insert(a->normalized ? &t->trie_norm : &t->trie_raw, a->pattern, a->pat_len, i);
            if (rc) break;
            /* HF keeps a normalized token in its normalized form: that is what
             * id_to_token and decode give back */
            t->id_str[a->id] = a->normalized ? a->pattern : a->content;
            t->id_len[a->id] = (uint32_t)(a->normalized ? a->pat_len : a->len);
            t->id_special[a->id] |= a->special ? TOK_ID_SPECIAL : 0;
        }
        if (rc) break;
    }
    /* decode skips an id when its text is the content of a special token */
    for (int32_t id = 0; !rc && id < t->n_ids; id++) {
        int32_t at = t->id_str[id] ? tok_strmap_get(&t->added_idx, t->id_str[id], t->id_len[id]) : -1;
        if (at >= 0 && t->added[at].special) t->id_special[id] |= TOK_ID_SKIP;
    }
    qbuf_free(&nb);
    tok_work_free(&w);
    if (rc) return qerr_set(err, errlen, rc, "cannot prepare the added tokens: %s", qerr_str(rc));
    if (pthread_mutex_init(&t->cache_lock, NULL)) return qerr_set(err, errlen, QERR_INTERNAL, "mutex init failed");
    t->cache = tok_cache_new();
    if (!t->cache) {
        pthread_mutex_destroy(&t->cache_lock);
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    }
    /* BOS/EOS: the template's specials around the text, else common names. */
    int seq = -1;
    for (int i = 0; i < t->n_post; i++)
        if (t->post[i] == TOK_POST_SEQ) {
            seq = i;
            break;
        }
    if (t->bos_id < 0 && seq > 0) t->bos_id = t->post[seq - 1];
    if (t->eos_id < 0 && seq >= 0 && seq + 1 < t->n_post) t->eos_id = t->post[seq + 1];
    static const char *const bos_names[] = { "<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>",
                                             "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", NULL };
    static const char *const eos_names[] = { "</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>",
                                             "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", NULL };
    if (t->bos_id < 0) t->bos_id = find_named(t, bos_names);
    if (t->eos_id < 0) t->eos_id = find_named(t, eos_names);
    return 0;
}

/* ---- encode ---------------------------------------------------------------------------- */

static int encode_text(const qtok *t, tok_work *w, const char *text, size_t len, unsigned flags,
                       const qtok_span *plain, int n_plain, tok_ids *out)
{
    tok_plist a = { 0 }, b = { 0 };
    int rc;
    /* 1: added tokens in the raw text (pieces point into text itself). */
    if (t->trie_raw.empty) rc = len ? tok_plist_add(&a, 0, len, -1, 1) : 0;
    else rc = split_added(t, &t->trie_raw, text, len, 0, 1, flags, plain, n_plain, &a);
    /* 2: normalize each text piece, then added tokens in the normalized text. */
    for (size_t i = 0; !rc && i < a.n; i++) {
        const tok_piece *p = &a.p[i];
        if (p->id >= 0) {
            rc = tok_plist_add(&b, 0, 0, p->id, 0);
            continue;
        }
        size_t at = b.text.len;
        if ((rc = tok_normalize(t, w, text + p->off, p->len, &b.text))) break;
        size_t nl = b.text.len - at;
        if (t->trie_norm.empty) rc = nl ? tok_plist_add(&b, at, nl, -1, p->origin) : 0;
        /* Normalized added tokens: a piece that overlaps a plain span does
         * not recognise special tokens at all (offsets moved in normalizing). */
        else rc = split_added(t, &t->trie_norm, b.text.p + at, nl, at, p->origin,
                              in_plain(plain, n_plain, p->off, p->off + p->len) ? flags & ~QTOK_PARSE_SPECIAL : flags,
                              NULL, 0, &b);
    }
    /* 3: pre-tokenizers, alternating between the two lists. */
    tok_plist *cur = &b, *nxt = &a;
    for (int k = 0; !rc && k < t->n_pres; k++) {
        rc = tok_pretokenize(&t->pres[k], w, cur, nxt);
        tok_plist *x = cur;
        cur = nxt;
        nxt = x;
    }
    /* 4: the model. */
    for (size_t i = 0; !rc && i < cur->n; i++) {
        const tok_piece *p = &cur->p[i];
        if (p->id >= 0) rc = tok_ids_push(out, p->id);
        else rc = tok_bpe_word(&t->bpe, w, cur->text.p + p->off, p->len, out);
    }
    tok_plist_free(&a);
    tok_plist_free(&b);
    return rc;
}

int qtok_encode(const qtok *t, const char *text, size_t len, unsigned flags, int32_t **ids, int *n_ids)
{
    return qtok_encode_spans(t, text, len, flags, NULL, 0, ids, n_ids);
}

/* The first special token of trie tr in s[from..n). */
static int next_special_in(const qtok *t, const tok_trie *tr, const char *s, size_t n, size_t from, size_t *ms,
                           size_t *me)
{
    size_t pos = from, a, b;
    int32_t idx;
    if (tr->empty) return 0;
    while (pos < n && trie_find(tr, s, n, pos, &a, &b, &idx)) {
        if (t->added[idx].special) {
            *ms = a;
            *me = b;
            return 1;
        }
        pos = b;
    }
    return 0;
}

/* Raw special tokens through their trie; normalized ones (llama2's "<s>",
 * matched after normalization as "▁<s>") by their content, which is how a
 * user would write them. */
int qtok_next_special(const qtok *t, const char *s, size_t n, size_t from, size_t *ms, size_t *me)
{
    size_t best = n, best_end = n, a = 0, b = 0;
    if (!t || from >= n) return 0;
    if (next_special_in(t, &t->trie_raw, s, n, from, &a, &b)) best = a, best_end = b;
    for (int i = 0; i < t->n_added; i++) {
        const tok_added *ad = &t->added[i];
        if (!ad->special || !ad->normalized || !ad->len) continue;
        const char *p = memmem(s + from, n - from, ad->content, ad->len);
        if (p && ((size_t)(p - s) < best || ((size_t)(p - s) == best && (size_t)(p - s) + ad->len > best_end))) {
            best = (size_t)(p - s);
            best_end = best + ad->len;
        }
    }
    if (best >= n) return 0;
    *ms = best;
    *me = best_end;
    return 1;
}

int qtok_encode_spans(const qtok *t, const char *text, size_t len, unsigned flags, const qtok_span *plain,
                      int n_plain, int32_t **ids, int *n_ids)
{
    *ids = NULL;
    *n_ids = 0;
    if (!t || (!text && len)) return QERR_INVAL;
    if (len > QTOK_MAX_TEXT) return QERR_LIMIT;
    if (qutf8_valid_prefix(text, len) != len) return QERR_INVAL;
    tok_work w = { 0 };
    tok_ids seq = { 0 }, fin = { 0 };
    pthread_mutex_t *lock = (pthread_mutex_t *)&t->cache_lock;
    int locked = t->cache && pthread_mutex_trylock(lock) == 0;
    if (locked) w.cache = t->cache;
    int rc = encode_text(t, &w, text ? text : "", len, flags, plain, n_plain, &seq);
    if (locked) pthread_mutex_unlock(lock);
    tok_work_free(&w);
    if (!rc && (flags & QTOK_ADD_SPECIAL) && t->n_post) {
        for (int i = 0; !rc && i < t->n_post; i++) {
            if (t->post[i] != TOK_POST_SEQ) {
                rc = tok_ids_push(&fin, t->post[i]);
                continue;
            }
            for (size_t j = 0; !rc && j < seq.n; j++) rc = tok_ids_push(&fin, seq.v[j]);
        }
        free(seq.v);
        seq = fin;
    }
    if (!rc && seq.n > INT32_MAX) rc = QERR_LIMIT;
    if (rc) {
        free(seq.v);
        return rc;
    }
    *ids = seq.v;
    *n_ids = (int)seq.n;
    return 0;
}

/* ---- lookups --------------------------------------------------------------------------- */

int qtok_vocab_size(const qtok *t)
{
    return t->n_ids;
}

int qtok_token_to_id(const qtok *t, const char *token, size_t len)
{
    int32_t id = tok_strmap_get(&t->added_map, token, len);
    return id >= 0 ? id : tok_strmap_get(&t->bpe.vocab, token, len);
}

const char *qtok_id_to_token(const qtok *t, int id, size_t *len)
{
    if (id < 0 || id >= t->n_ids || !t->id_str[id]) return NULL;
    if (len) *len = t->id_len[id];
    return t->id_str[id];
}

int qtok_is_special(const qtok *t, int id)
{
    return id >= 0 && id < t->n_ids && (t->id_special[id] & TOK_ID_SPECIAL);
}

int qtok_set_bos_eos(qtok *t, int bos_id, int eos_id)
{
    if (bos_id >= t->n_ids || eos_id >= t->n_ids) return QERR_RANGE;
    int32_t *p = q_mallocn(3, sizeof *p);
    if (!p) return QERR_NOMEM;
    int n = 0;
    if (bos_id >= 0) p[n++] = bos_id;
    p[n++] = TOK_POST_SEQ;
    if (eos_id >= 0) p[n++] = eos_id;
    free(t->post);
    t->post = p;
    t->n_post = n;
    if (bos_id >= 0) t->bos_id = bos_id;
    if (eos_id >= 0) t->eos_id = eos_id;
    return 0;
}

int qtok_bos_id(const qtok *t)
{
    return t->bos_id;
}

int qtok_eos_id(const qtok *t)
{
    return t->eos_id;
}

/* ---- helpers on a bare qvocab (kept from the first decoder) ------------------------------ */

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int qvocab_decode_piece(const qvocab *v, int id, int strip_space, char *buf, size_t cap)
{
    if (id < 0 || id >= v->n || !v->tokens || !v->tokens[id]) return QERR_RANGE;
    const char *p = v->tokens[id];
    size_t n = strlen(p), o = 0;
    int type = v->types ? v->types[id] : QTOK_NORMAL;
    if (type == QTOK_CONTROL || type == QTOK_UNUSED) return 0;
    if (v->kind == QVOCAB_BPE) {
        if (type == QTOK_USER) { /* added tokens are stored as plain text */
            if (n > cap) n = cap;
            memcpy(buf, p, n);
            return (int)n;
        }
        for (size_t i = 0; i < n && o < cap;) {
            unsigned cp;
            i += qutf8_decode(p + i, n - i, &cp);
            int b = tok_cp_to_byte(cp);
            if (b >= 0) buf[o++] = (char)b;
        }
    } else {
        if (n == 6 && p[0] == '<' && p[1] == '0' && p[2] == 'x' && p[5] == '>' && hexval(p[3]) >= 0 &&
            hexval(p[4]) >= 0) {
            if (cap < 1) return 0;
            buf[0] = (char)(hexval(p[3]) * 16 + hexval(p[4]));
            return 1;
        }
        for (size_t i = 0; i < n && o < cap;) {
            if (i + 3 <= n && !memcmp(p + i, "\xe2\x96\x81", 3)) {
                buf[o++] = ' ';
                i += 3;
            } else {
                buf[o++] = p[i++];
            }
        }
    }
    if (strip_space && o > 0 && buf[0] == ' ') {
        memmove(buf, buf + 1, o - 1);
        o--;
    }
    return (int)o;
}

