/* tokenizer.h - text <-> token ids, as Hugging Face tokenizers does it.
 *
 * A qtok is built once, from a tokenizer.json (qtok_load_json) or from a GGUF
 * vocabulary (qtok_from_vocab), and is then read-only: any number of threads
 * may encode and decode with one qtok at the same time.  Encoding runs the
 * pipeline of the file, in HF's order:
 *
 *   added tokens split out of the raw text (those with normalized=false)
 *   -> normalizer on each remaining piece -> added tokens with normalized=true
 *   -> pre-tokenizer -> model (BPE) -> post-processor (only with QTOK_ADD_SPECIAL)
 *
 * Supported components: model BPE (merges as "a b" strings or [a, b] pairs,
 * byte_fallback, ignore_merges, unk_token, fuse_unk,
 * continuing_subword_prefix, end_of_word_suffix); normalizers Sequence,
 * Prepend, Replace, NFC, NFD, Strip, Lowercase, ByteLevel; pre-tokenizers
 * Sequence, ByteLevel, Split, Metaspace, Digits, Whitespace, WhitespaceSplit,
 * Punctuation; post-processors TemplateProcessing (single), RobertaProcessing,
 * BertProcessing, ByteLevel, Sequence; decoders Sequence, ByteLevel,
 * ByteFallback, Fuse, Replace, Strip, Metaspace (after the first Fuse or
 * ByteLevel only Replace with a string pattern, Strip, Metaspace and Fuse,
 * which is what streams).  Anything else is a load error (QERR_UNSUPPORTED)
 * whose message names the component.  truncation and padding are ignored.
 *
 * engine/text/ turns text into tokens and back (tokenizer*, tok_*) and
 * messages into prompts (chat*: a Jinja interpreter for chat templates).  It
 * may include model/ (a tokenizer or template comes from a model file), the
 * kernels' types that model.h brings, and base/.
 *
 * User text must not inject control tokens: special added tokens ("<s>",
 * "<|im_start|>") are recognised in the text only with QTOK_PARSE_SPECIAL.
 * Non-special added tokens are always recognised, as in HF.
 *
 * The older decoding helper qvocab_decode_piece works on a
 * bare qvocab (no qtok) and is kept for callers that have only that.
 */
#ifndef QUIRE_TOKENIZER_H
#define QUIRE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

typedef struct qtok qtok;
typedef struct qdetok qdetok;

/* Encode flags. */
#define QTOK_ADD_SPECIAL 1u   /* apply the post-processor (BOS/EOS as the file says) */
#define QTOK_PARSE_SPECIAL 2u /* recognise special added tokens in the text */
/* Decode flags. */
#define QTOK_SKIP_SPECIAL 1u  /* leave special added tokens out of the text */

/* Largest token id + 1 a tokenizer may have, and the largest text encode takes. */
#define QTOK_MAX_VOCAB (1 << 22)
#define QTOK_MAX_TEXT ((size_t)1 << 30)

/* Loads a tokenizer.json file.  On success returns 0 and *out (owned by the
 * caller, qtok_free).  On failure returns QERR_IO, QERR_FORMAT (malformed
 * JSON, wrong types, merges naming unknown tokens, ids out of range),
 * QERR_UNSUPPORTED (a component this tokenizer does not implement, named in
 * the message) or QERR_NOMEM, with one line in err, and *out is NULL. */
int qtok_load_json(const char *path, qtok **out, char *err, size_t errlen);

/* The same from tokenizer.json text in memory (need not be NUL-terminated). */
int qtok_load_json_text(const char *json, size_t len, qtok **out, char *err, size_t errlen);

/* Builds a tokenizer from a GGUF vocabulary (engine/model/gguf.c fills qvocab):
 * kind QVOCAB_SPM ("llama": SentencePiece pieces merged by score, byte
 * fallback, '▁' for spaces, a leading '▁') or QVOCAB_BPE ("gpt2": byte-level
 * BPE with merges and the pre-tokenizer regex that v->pre names).  Control and
 * unknown tokens become special added tokens, user-defined ones non-special
 * added tokens.  With add_bos, QTOK_ADD_SPECIAL prepends bos_id; eos_id is
 * what qtok_eos_id reports (-1: none).  Returns 0 or a QERR_* code with a
 * message (QERR_UNSUPPORTED for an unknown v->pre). */
int qtok_from_vocab(const qvocab *v, int bos_id, int eos_id, int add_bos, qtok **out, char *err,
                    size_t errlen);

/* Releases everything; NULL is a no-op. */
void qtok_free(qtok *t);

/* Replaces the post-processor's template with [bos_id] text [eos_id] (a
 * negative id: none), as transformers' Llama-family tokenizers do from
 * tokenizer_config.json's add_bos_token / add_eos_token.  Not thread-safe:
 * call before sharing t.  0, QERR_RANGE or QERR_NOMEM. */
int qtok_set_bos_eos(qtok *t, int bos_id, int eos_id);

/* The tokenizer of a loaded model: its tokenizer.json (HF folders) or its
 * GGUF vocabulary.  0, or a QERR_* code with a message. (tok_model.c) */
int qtok_for_model(const qmodel *m, qtok **out, char *err, size_t errlen);

/* A tokenizer alone from path: a folder holding tokenizer.json, a
 * tokenizer.json file, or a GGUF file (vocabulary only; any architecture). */
int qtok_load_path(const char *path, qtok **out, char *err, size_t errlen);

/* Encodes text[0..len) (UTF-8) with flags QTOK_ADD_SPECIAL / QTOK_PARSE_SPECIAL.
 * On success returns 0 and *ids (malloc'd, owned by the caller; may be NULL
 * when *n_ids is 0).  Returns QERR_INVAL for text that is not valid UTF-8,
 * QERR_LIMIT for text over QTOK_MAX_TEXT, QERR_NOMEM; *ids is then NULL and
 * *n_ids 0.  Thread-safe. */
int qtok_encode(const qtok *t, const char *text, size_t len, unsigned flags, int32_t **ids, int *n_ids);

/* A byte range of a text. */
typedef struct {
    size_t off, len;
} qtok_span;

/* Like qtok_encode, but special tokens that overlap one of the plain spans
 * are not recognised there (they are encoded as text) even with
 * QTOK_PARSE_SPECIAL: for prompts whose template parts carry control tokens
 * while user content must not inject them.  Special tokens matched after
 * normalization (llama2's "<s>") are not recognised anywhere in a stretch of
 * text (between raw special tokens) that overlaps a plain span: safe, and
 * exact for the raw control tokens chat models use. */
int qtok_encode_spans(const qtok *t, const char *text, size_t len, unsigned flags, const qtok_span *plain,
                      int n_plain, int32_t **ids, int *n_ids);

/* Finds the first special added token written in s[from..n) (by its
 * content): returns 1 and its byte range [*ms, *me), or 0. */
int qtok_next_special(const qtok *t, const char *s, size_t n, size_t from, size_t *ms, size_t *me);

/* Decodes ids to text with the file's decoder (QTOK_SKIP_SPECIAL drops special
 * added tokens; ids without a token are skipped, as HF does).  On success
 * returns 0 and *text (malloc'd, NUL-terminated, valid UTF-8, owned by the
 * caller) with its length in *len.  Fails only with QERR_NOMEM.
 * Thread-safe. */
int qtok_decode(const qtok *t, const int32_t *ids, int n, unsigned flags, char **text, size_t *len);

/* Number of ids: largest id of the model vocabulary or the added tokens + 1.
 * Cannot fail. */
int qtok_vocab_size(const qtok *t);

/* Returns the id of a token string (added tokens first, then the model's
 * vocabulary; the string as stored, e.g. "Ġthe" or "▁the"), or -1. */
int qtok_token_to_id(const qtok *t, const char *token, size_t len);

/* Returns the stored string of id (NUL-terminated, owned by t), or NULL for an
 * id without a token.  *len (if len) gets its length. */
const char *qtok_id_to_token(const qtok *t, int id, size_t *len);

/* The bytes token id adds to a text when it comes in the middle of one
 * (raw bytes: a byte-level or byte-fallback token may hold part of a UTF-8
 * character; SentencePiece's word marker is a space), at most cap of them
 * into buf.  Returns their count, or QERR_RANGE (no such id, or more than
 * cap bytes), QERR_NOMEM.  For grammars that mask tokens by their bytes. */
int qtok_token_bytes(const qtok *t, int id, char *buf, size_t cap);

/* 1 if id is a special added token (control token), else 0. */
int qtok_is_special(const qtok *t, int id);

/* Beginning/end of sequence ids: the special tokens the post-processor puts
 * before/after the text; failing that a conventionally named added token
 * ("<s>"/"</s>", "<|begin_of_text|>"/"<|end_of_text|>", "<|endoftext|>" for
 * EOS...); -1 when there is none.  A model's generation_config.json or GGUF
 * metadata is the better source when it exists. */
int qtok_bos_id(const qtok *t);
int qtok_eos_id(const qtok *t);

/* ---- streaming detokenizer ----------------------------------------------- */

/* A per-sequence incremental decoder: push ids one at a time and get the
 * text that can be shown now.  It never returns a split UTF-8 character
 * (bytes of a character are held until it is complete), and the
 * concatenation of everything qdetok_push and qdetok_flush return equals
 * qtok_decode of all pushed ids with the same flags (the SentencePiece
 * leading space included).  The qtok must outlive it.  NULL when out of
 * memory. */
qdetok *qdetok_new(const qtok *t, unsigned flags);

/* Pushes one id.  On success returns 0 and sets *text and *len to the text to
 * emit now (may be empty), valid until the next call on d.  Fails only with
 * QERR_NOMEM. */
int qdetok_push(qdetok *d, int32_t id, const char **text, size_t *len);

/* Ends the sequence: returns the text still held back (an incomplete UTF-8
 * sequence comes out as U+FFFD, as the full decode has it).  d can then be
 * reused for a new sequence.  Fails only with QERR_NOMEM. */
int qdetok_flush(qdetok *d, const char **text, size_t *len);

/* Drops the text held back that is made of complete characters (a
 * byte-fallback run not yet ended) and keeps the rest of the state: after
 * priming d with a prompt, so that the prompt's tail never shows up in the
 * output.  Cannot fail. */
void qdetok_drop_held(qdetok *d);

/* Starts a new sequence, dropping anything held.  Cannot fail. */
void qdetok_reset(qdetok *d);

/* Releases d; NULL is a no-op. */
void qdetok_free(qdetok *d);

/* ---- helpers on a bare qvocab -------------------------------------------- */

/* Writes the bytes of token id into buf (at most cap bytes) and returns the
 * count, or a negative QERR_* code for an id outside the vocabulary.  When
 * strip_space is set and the piece starts with a space, the space is dropped
 * (SentencePiece's rule for the first piece after BOS). */
int qvocab_decode_piece(const qvocab *v, int id, int strip_space, char *buf, size_t cap);


#endif
