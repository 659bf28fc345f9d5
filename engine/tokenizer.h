/* tokenizer.h - turning token ids back into text.
 *
 * This is the decoding half for the two vocabulary kinds quire loads:
 * SentencePiece-style pieces ('▁' for a space, <0xXX> byte-fallback tokens)
 * and GPT-2 byte-level BPE (each byte shown as one printable code point).
 * Control tokens decode to nothing.  A piece may end inside a multi-byte
 * UTF-8 character (byte-fallback tokens do); callers that stream text must
 * hold such bytes back until the character is complete (qutf8_complete). */
#ifndef QUIRE_TOKENIZER_H
#define QUIRE_TOKENIZER_H

#include <stddef.h>

#include "model.h"

/* Writes the bytes of token id into buf (at most cap bytes) and returns the
 * count, or a negative QERR_* code for an id outside the vocabulary.  When
 * strip_space is set and the piece starts with a space, the space is dropped
 * (SentencePiece's rule for the first piece after BOS). */
int qvocab_decode_piece(const qvocab *v, int id, int strip_space, char *buf, size_t cap);

/* Returns how many leading bytes of s[0..n) form complete UTF-8 characters
 * (invalid bytes count as complete, so they are never held forever). */
size_t qutf8_complete(const char *s, size_t n);

#endif
