/* fuzz_oai.c - libFuzzer target for OpenAI-compatible request bodies
 * (server/oai.c): any bytes as a chat body and as a completions body, and
 * as POST /tokenize and /detokenize bodies (oai_tokenize.c), for
 * the bundled stories260K model (from $QUIRE_ROOT, else the current
 * directory: run from the repository root).  Every outcome must be a clean
 * request or a 4xx error with a message, and nothing may be left to free
 * after a failure (no crash, hang, leak or sanitizer report).
 *
 *   CC=clang cmake -B build-fuzz -DQUIRE_FUZZ=ON -DBUILD_TESTING=OFF
 *   cmake --build build-fuzz --target fuzz_oai
 *   cp -r tests/fuzz/corpus/oai /tmp/corpus && ./build-fuzz/fuzz_oai /tmp/corpus
 */
#include "model.h"
#include "oai.h"
#include "qerr.h"
#include "tokenizer.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static qmodel *g_model;
static qtok *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    q_set_alloc_limit((size_t)256 << 20);
    qlog_set_level(QLOG_OFF);
    char path[4096], err[256];
    const char *root = getenv("QUIRE_ROOT");
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", root ? root : ".");
    if (qmodel_load(path, &g_model, err, sizeof err) || qtok_for_model(g_model, &g_tok, err, sizeof err)) {
        fprintf(stderr, "fuzz_oai: %s (run from the repository root or set QUIRE_ROOT)\n", err);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const qoai_limits lim = { 256 };
    for (int kind = QOAI_CHAT; kind <= QOAI_COMPLETION; kind++) {
        qoai_req r;
        qoai_error e;
        const int rc = qoai_parse((const char *)data, size, (qoai_kind)kind, &lim, g_model, g_tok, &r, &e);
        if (rc) {
            /* A refusal says why, and owns nothing. */
            if (!e.message[0] || e.status < 400 || r.body || r.ids) abort();
            json_t *j = qoai_error_json(&e);
            json_decref(j);
            continue;
        }
        if (r.p.n_prompt < 1 || r.p.max_tokens < 1 || r.p.max_tokens > 256 ||
            r.p.n_prompt + r.p.max_tokens > g_model->hp.max_ctx || r.p.min_tokens > r.p.max_tokens ||
            (r.echo_len && !r.echo_text))
            abort();
        qoai_req_free(&r);
    }
    json_t *o = json_loadb((const char *)data, size, 0, NULL);
    if (o) {
        json_t *out = NULL;
        qoai_error e;
        for (int k = 0; k < 2; k++) {
            const int rc = k ? qoai_detokenize(o, &lim, g_model, g_tok, &out, &e)
                             : qoai_tokenize(o, &lim, g_model, g_tok, &out, &e);
            if ((rc != 0) != (out == NULL) || (rc && (!e.message[0] || e.status < 400))) abort();
            json_decref(out);
            out = NULL;
        }
        json_decref(o);
    }
    return 0;
}
