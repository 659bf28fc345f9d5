/* tok_model.c - where a model's tokenizer comes from.
 *
 * An HF folder carries tokenizer.json, which is loaded as it is; a GGUF file
 * carries its vocabulary in metadata (tokenizer.ggml.*), from which
 * qtok_from_vocab builds the equivalent pipeline.  qtok_load_path serves the
 * tools that need only a tokenizer: a folder holding tokenizer.json, a
 * tokenizer.json file, or a GGUF file of any architecture, vocabulary-only
 * ones included (its tensors are never read).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "tokenizer.h"
#include "util.h"

static int from_vocab(const qmodel *m, qtok **out, char *err, size_t errlen)
{
    if (m->vocab.kind == QVOCAB_NONE || !m->vocab.tokens)
        return qerr_set(err, errlen, QERR_NOTFOUND, "%s has no tokenizer vocabulary", m->path ? m->path : "the model");
    return qtok_from_vocab(&m->vocab, m->bos_id, m->n_eos ? m->eos_ids[0] : -1, m->add_bos, out, err, errlen);
}

int qtok_for_model(const qmodel *m, qtok **out, char *err, size_t errlen)
{
    *out = NULL;
    if (m->vocab.tokenizer_json) {
        int rc = qtok_load_json(m->vocab.tokenizer_json, out, err, errlen);
        if (rc || (m->cfg_add_bos < 0 && m->cfg_add_eos < 0)) return rc;
        /* transformers' Llama-family tokenizers rebuild the template from
         * tokenizer_config.json's add_bos_token / add_eos_token. */
        int bos = m->cfg_add_bos > 0 ? (m->bos_id >= 0 ? m->bos_id : qtok_bos_id(*out)) : -1;
        int eos = m->cfg_add_eos > 0 ? (m->n_eos ? m->eos_ids[0] : qtok_eos_id(*out)) : -1;
        if ((rc = qtok_set_bos_eos(*out, bos, eos))) {
            qtok_free(*out);
            *out = NULL;
            return qerr_set(err, errlen, rc, "cannot apply tokenizer_config.json's add_bos_token/add_eos_token");
        }
        return 0;
    }
    if (m->format == QFMT_HF)
        return qerr_set(err, errlen, QERR_NOTFOUND, "%s: no tokenizer.json in the folder", m->path ? m->path : "model");
    return from_vocab(m, out, err, errlen);
}

int qtok_load_path(const char *path, qtok **out, char *err, size_t errlen)
{
    *out = NULL;
    struct stat st;
    if (stat(path, &st) < 0) return qerr_set(err, errlen, QERR_IO, "%s: no such file or folder", path);
    if (S_ISDIR(st.st_mode)) {
        /* A model folder or one with only tokenizer files: tokenizer.json,
         * with tokenizer_config.json's add_bos_token / add_eos_token. */
        qmodel *m = qmodel_new();
        if (!m || !(m->path = q_strdup(path))) {
            qmodel_destroy(m);
            return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        }
        int rc = hf_load_tokenizer_files(m, path, err, errlen);
        if (!rc && !m->vocab.tokenizer_json) rc = qerr_set(err, errlen, QERR_NOTFOUND, "%s: no tokenizer.json in the folder", path);
        if (!rc) rc = qtok_for_model(m, out, err, errlen);
        qmodel_destroy(m);
        return rc;
    }
    size_t n = strlen(path);
    if (n >= 5 && !strcmp(path + n - 5, ".json")) return qtok_load_json(path, out, err, errlen);
    qmodel *m = qmodel_new();
    if (!m || !(m->path = q_strdup(path))) {
        qmodel_destroy(m);
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    }
    const void *addr;
    size_t len;
    int rc = qmodel_map_file(m, path, 8, "a GGUF file", &addr, &len, err, errlen);
    if (!rc && memcmp(addr, "GGUF", 4))
        rc = qerr_set(err, errlen, QERR_FORMAT, "%s: neither a GGUF file, a tokenizer.json nor a folder", path);
    if (!rc) rc = gguf_parse_vocab(m, addr, len, err, errlen);
    if (!rc) rc = from_vocab(m, out, err, errlen);
    qmodel_destroy(m);
    return rc;
}
