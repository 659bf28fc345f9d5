/* guide.c - the tokenizer's side of guided decoding: a grammar vocabulary
 * (grammar/gram.h) from a qtok (engine.h). */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "gram.h"
#include "qerr.h"
#include "tokenizer.h"
#include "util.h"

int qengine_grammar_vocab(const qtok *tok, gram_vocab **out)
{
    *out = NULL;
    const int n = qtok_vocab_size(tok);
    uint8_t **bytes = q_callocn((size_t)n + 1, sizeof *bytes), *skip = calloc((size_t)n + 1, 1);
    size_t *lens = q_callocn((size_t)n + 1, sizeof *lens);
    int rc = bytes && skip && lens ? 0 : QERR_NOMEM;
    char buf[1024];
    for (int i = 0; i < n && !rc; i++) {
        const int l = qtok_token_bytes(tok, i, buf, sizeof buf);
        skip[i] = l <= 0 || qtok_is_special(tok, i);
        if (l > 0) {
            if (!(bytes[i] = malloc((size_t)l))) rc = QERR_NOMEM;
            else memcpy(bytes[i], buf, (size_t)l), lens[i] = (size_t)l;
        }
    }
    if (!rc) rc = gram_vocab_new(n, (const uint8_t *const *)bytes, lens, skip, out);
    for (int i = 0; bytes && i < n; i++) free(bytes[i]);
    free(bytes);
    free(skip);
    free(lens);
    return rc;
}
