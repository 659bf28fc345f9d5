/* tok_internal.h - what the tokenizer's files share (not a public header).
 *
 *   tokenizer.c   public API, added tokens, the encode pipeline, post-processor
 *   tok_json.c    tokenizer.json -> qtok
 *   tok_vocab.c   GGUF vocabulary (qvocab) -> qtok
 *   tok_pretok.c  normalizers, pre-tokenizers, PCRE2 regex helpers
 *   tok_bpe.c     string map, merge map, the BPE merge loop, the word cache
 *   tok_decode.c  decoders and the streaming detokenizer
 *   tok_unicode.c generated Unicode tables (scripts/gen_tok_unicode.py)
 *
 * Text moves through the encoder as a tok_plist: one byte buffer and a list
 * of pieces (offset, length, and the id when the piece is already an added
 * token).  Every stage reads one list and writes the next, so a whole text
 * needs a handful of growing buffers and no allocation per piece or per
 * character.  All text inside the encoder is valid UTF-8 (the input is
 * checked once at the door, and every stage writes whole characters), which
 * is why regex matching runs with PCRE2_NO_UTF_CHECK.
 */
#ifndef QUIRE_TOK_INTERNAL_H
#define QUIRE_TOK_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"
#include "buf.h"
#include "utf8.h"

/* First occurrence of nd[0..nn) in h[0..hn), or NULL (portable memmem). */
const char *tok_memmem(const char *h, size_t hn, const char *nd, size_t nn);

/* ---- UTF-8 --------------------------------------------------------------- */

/* Appends s[0..n) to out with invalid sequences replaced by U+FFFD exactly as
 * Rust's String::from_utf8_lossy does (one U+FFFD per maximal invalid
 * subpart).  With hold set, a trailing sequence that is incomplete but could
 * still become valid is not converted: its length is returned (0..3) so that
 * the caller keeps those bytes for later.  Returns -1 when out of memory. */
int tok_u8lossy(const char *s, size_t n, int hold, qbuf *out);

/* ---- Unicode tables (tok_unicode.c, generated) ---------------------------------- */

extern const char tok_unicode_version[];
int tok_uni_ccc(uint32_t cp);
/* bit 0: may change under NFC or interact with a neighbour; bit 1: same for NFD. */
int tok_uni_unsafe(uint32_t cp);
/* Full canonical decomposition (not Hangul): count, 0 when none. */
int tok_uni_decomp(uint32_t cp, const uint32_t **out);
/* Primary composite of a + b (not Hangul), or 0. */
uint32_t tok_uni_compose(uint32_t a, uint32_t b);
int tok_uni_is_space(uint32_t cp);   /* White_Space */
int tok_uni_is_numeric(uint32_t cp); /* general category N* */
int tok_uni_is_word(uint32_t cp);    /* Unicode \w as the Rust regex crate has it */
int tok_uni_is_punct(uint32_t cp);   /* general category P* */
/* Lowercase of one character: 1 or 2 code points in out. */
int tok_uni_lower(uint32_t cp, uint32_t out[2]);

/* ---- string -> int map ------------------------------------------------------ */

/* Keys are byte strings copied into one pool; open addressing on entry
 * indices.  Lookups never allocate. */
typedef struct {
    qbuf pool;
    uint32_t *off, *len;
    int32_t *val;
    uint32_t n, ecap;
    uint32_t *slots; /* entry index + 1; 0 = empty */
    uint32_t mask;
} tok_strmap;

uint64_t tok_hash(const void *s, size_t n);
/* Inserts or overwrites key -> val.  *existed (optional) tells which.  0 or QERR_NOMEM/QERR_LIMIT. */
int tok_strmap_put(tok_strmap *m, const char *s, size_t n, int32_t val, int *existed);
/* Entry index of key, or -1. */
long tok_strmap_find(const tok_strmap *m, const char *s, size_t n);
static inline int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t n)
{
    long e = tok_strmap_find(m, s, n);
    return e < 0 ? -1 : m->val[e];
}
void tok_strmap_free(tok_strmap *m);

/* ---- the BPE model ------------------------------------------------------------ */

typedef struct {
    uint64_t key; /* (a << 32) | b; UINT64_MAX = empty */
    uint32_t rank;
    int32_t id;   /* the merged token */
} tok_merge;

typedef struct {
    tok_strmap vocab;      /* model vocabulary: token -> id */
    tok_merge *merges;     /* open addressing, mask + 1 slots */
    size_t merge_mask, n_merges;
    int32_t byte_ids[256]; /* "<0xXX>" tokens, -1 where absent */
    /* One-character tokens by code point below 65536, in pages of 256
     * code points: page cp >> 8 is bmp_ids[(bmp_page[cp >> 8] - 1) * 256 ..],
     * bmp_page 0 for a page without such tokens (all absent); absent: -1.
     * NULL when characters are looked up with affixes. */
    int32_t *bmp_ids;
    uint16_t bmp_page[256];
    int byte_fallback, ignore_merges, fuse_unk;
    int split_meta;        /* no token has '▁' after another character: long words split there */
    int32_t unk_id;        /* -1: no unknown token (unknown characters are dropped) */
    char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix, or NULL */
    size_t prefix_len, suffix_len;
} tok_bpe;

/* Adds a merge (a, b) -> new_id; a later merge of the same pair replaces the
 * earlier one, as HF's map does.  0 or QERR_NOMEM/QERR_LIMIT. */
int tok_bpe_add_merge(tok_bpe *b, int32_t a, int32_t c, uint32_t rank, int32_t new_id);
/* Fills byte_ids and bmp_ids once vocab is complete.  0 or QERR_NOMEM. */
int tok_bpe_finish(tok_bpe *b);
void tok_bpe_free(tok_bpe *b);

/* ---- added tokens ----------------------------------------------------------- */

typedef struct {
    char *content;   /* the token text (owned) */
    size_t len;
    char *pattern;   /* what is matched in text: content, normalized for normalized tokens (owned) */
    size_t pat_len;
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tok_added;

/* A byte trie over the patterns of one set of added tokens; leftmost-longest. */
typedef struct {
    int32_t child, sibling; /* node indices, -1 = none */
    int32_t term;           /* index into qtok.added, -1 = not the end of a pattern */
    uint8_t byte;
} tok_tnode;

typedef struct {
    int32_t root[256];
    tok_tnode *nodes;
    size_t n, cap;
    int empty; /* no patterns */
} tok_trie;

/* ---- pipeline components --------------------------------------------------------- */

enum { TN_PREPEND, TN_REPLACE, TN_NFC, TN_NFD, TN_STRIP, TN_LOWER, TN_BYTELEVEL };

typedef struct {
    int kind;
    char *pat;       /* Prepend text, Replace string pattern */
    size_t pat_len;
    char *rep;       /* Replace content */
    size_t rep_len;
    pcre2_code *re;  /* Replace regex */
    int left, right; /* Strip */
} tok_norm;

enum { TP_BYTELEVEL, TP_SPLIT, TP_METASPACE, TP_DIGITS, TP_WHITESPACE, TP_WSSPLIT, TP_PUNCT };
enum { TB_REMOVED, TB_ISOLATED, TB_MERGED_PREV, TB_MERGED_NEXT, TB_CONTIGUOUS };
enum { TM_NEVER, TM_FIRST, TM_ALWAYS };

typedef struct {
    int kind;
    pcre2_code *re;        /* Split / ByteLevel regex (NULL: ByteLevel without use_regex) */
    char *lit;             /* Split with a String pattern */
    size_t lit_len;
    int behavior, invert;
    int add_prefix_space;  /* ByteLevel */
    char repl[5];          /* Metaspace replacement character, UTF-8 */
    int repl_len;
    int prepend, split;    /* Metaspace: TM_*, split on the replacement */
    int individual;        /* Digits */
} tok_pre;

enum { TD_BYTELEVEL, TD_BYTEFALLBACK, TD_FUSE, TD_REPLACE, TD_STRIP, TD_METASPACE };

typedef struct {
    int kind;
    char *pat, *rep;       /* Replace */
    size_t pat_len, rep_len;
    pcre2_code *re;
    uint32_t ch;           /* Strip content / Metaspace replacement */
    int start, stop;       /* Strip */
    int drop_first;        /* Metaspace: replacement dropped in the first token (prepend_scheme != never) */
} tok_dec;

/* qtok.id_special bits: a special added token; skipped by QTOK_SKIP_SPECIAL
 * (HF skips by text, and keeps a normalized special token's normalized text,
 * so the two can differ). */
#define TOK_ID_SPECIAL 1
#define TOK_ID_SKIP 2

/* Marker in qtok.post for "the encoded text". */
#define TOK_POST_SEQ (-1)

/* The word cache: model input string -> ids (tok_bpe.c). */
typedef struct tok_cache tok_cache;

struct qtok {
    tok_bpe bpe;
    int32_t n_ids;          /* largest id + 1 */
    const char **id_str;    /* (n_ids) token text by id (added tokens first), NULL where none */
    uint32_t *id_len;
    uint8_t *id_special;    /* (n_ids) TOK_ID_* bits */
    tok_strmap added_map;   /* added tokens that are not in the model vocabulary: content -> id */
    tok_strmap added_idx;   /* every added token: content -> index in added */
    tok_added *added;
    int n_added;
    tok_trie trie_raw, trie_norm; /* added tokens matched before / after normalization */
    tok_norm *norms;
    int n_norms;
    tok_pre *pres;
    int n_pres;
    tok_dec *decs;
    int n_decs;
    int dec_join_space;     /* no decoder: tokens are joined with " " */
    int32_t *post;          /* single template: ids and TOK_POST_SEQ */
    int n_post;
    int bos_id, eos_id;
    pthread_mutex_t cache_lock;
    tok_cache *cache;
    char **owned;           /* strings id_str points to outside the maps (GGUF duplicates) */
    int n_owned;
};

/* ---- the encoder's working lists ------------------------------------------------- */

typedef struct {
    size_t off, len;
    int32_t id;     /* an added token already, or -1 */
    uint32_t origin; /* starts at offset 0 of the original text (Metaspace "first") */
} tok_piece;

typedef struct {
    qbuf text;
    tok_piece *p;
    size_t n, cap;
} tok_plist;

int tok_plist_add(tok_plist *l, size_t off, size_t len, int32_t id, uint32_t origin);
void tok_plist_free(tok_plist *l);

typedef struct {
    int32_t *v;
    size_t n, cap;
} tok_ids;

int tok_ids_push(tok_ids *o, int32_t id);

/* Scratch space of one encode call. */
typedef struct {
    pcre2_match_data *md;
    qbuf nb[3];              /* normalizer ping-pong and temporaries */
    qbuf u32;                /* NFC/NFD code points */
    struct tok_seg *seg;        /* split segments */
    size_t seg_cap;
    void *sym;                  /* BPE symbols */
    size_t sym_cap;
    void *heap;                 /* BPE merge queue */
    size_t heap_cap;
    tok_cache *cache;           /* NULL when another call holds the cache */
} tok_work;

void tok_work_free(tok_work *w);

/* ---- functions across files --------------------------------------------------------- */

/* qtok allocation and release of its parts (tokenizer.c). */
qtok *tok_new(void);
/* Completes a qtok whose model, added tokens and pipeline are set: builds the
 * id tables, the tries and the cache lock (tokenizer.c).  0 or QERR_*. */
int tok_finish(qtok *t, char *err, size_t errlen);

/* Adds an added token the way HF's AddedVocabulary does (id from the added
 * map, then the model vocabulary, else the next free id).  Returns its id or
 * a negative QERR_*. */
int tok_add_token(qtok *t, const char *content, size_t len, int special, int lstrip, int rstrip,
                  int single_word, int normalized);

/* Compiles an HF (Oniguruma) regex with PCRE2 (UTF, UCP, JIT), rewriting
 * \s to the White_Space class (tok_pretok.c).  NULL with a message in err. */
pcre2_code *tok_regex_compile(const char *pat, size_t len, char *err, size_t errlen);

/* The GPT-2 byte <-> character tables (tok_pretok.c). */
extern const uint16_t tok_byte_to_cp[256];
int tok_cp_to_byte(uint32_t cp); /* -1 when cp is not one of the 256 */

/* Runs the normalizers over s[0..n) and appends the result to out. */
int tok_normalize(const qtok *t, tok_work *w, const char *s, size_t n, qbuf *out);

/* Runs pre-tokenizer p over the pieces of in, writing out (reset). */
int tok_pretokenize(const tok_pre *p, tok_work *w, const tok_plist *in, tok_plist *out);

/* Encodes one word (model input) and appends its ids (tok_bpe.c). */
int tok_bpe_word(const tok_bpe *b, tok_work *w, const char *s, size_t n, tok_ids *out);

tok_cache *tok_cache_new(void);
void tok_cache_free(tok_cache *c);

void tok_norm_free(tok_norm *n);
void tok_pre_free(tok_pre *p);
void tok_dec_free(tok_dec *d);

#endif
