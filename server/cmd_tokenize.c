/* cmd_tokenize.c - `quire tokenize`: text on stdin to token ids, or back.
 *
 * Like llama.cpp's llama-tokenize, for users who debug prompts.  -m takes a
 * model (GGUF file or HF folder), a folder holding only tokenizer files, a
 * tokenizer.json, or a vocabulary-only GGUF.  With --jsonl each input line is
 * one JSON value (a string, or an array of ids with --decode) and each output
 * line the matching result, for batch use. */
#define _GNU_SOURCE
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "tokenizer.h"
#include "utf8.h"
#include "util.h"

typedef struct {
    const char *model;
    int special, no_add_special, decode, jsonl, pieces, skip_special, help;
    int bench, stream;
} tok_opts;

#define F_(field) offsetof(tok_opts, field)
static const qopt tok_table[] = {
    { "-m", "--model", "PATH", OPT_STR, F_(model), "GGUF file, HF folder, tokenizer folder or tokenizer.json (required)" },
    { NULL, "--special", NULL, OPT_FLAG, F_(special), "recognise special tokens written in the text (e.g. <|im_start|>)" },
    { NULL, "--no-add-special", NULL, OPT_FLAG, F_(no_add_special), "do not add BOS/EOS as the tokenizer's post-processor says" },
    { NULL, "--decode", NULL, OPT_FLAG, F_(decode), "read a JSON array of ids and print the text" },
    { NULL, "--skip-special", NULL, OPT_FLAG, F_(skip_special), "with --decode: leave special tokens out of the text" },
    { NULL, "--stream", NULL, OPT_FLAG, F_(stream), "with --decode: decode one id at a time (the streaming detokenizer); --jsonl prints the chunks" },
    { NULL, "--pieces", NULL, OPT_FLAG, F_(pieces), "print [id, \"piece\"] pairs instead of bare ids" },
    { NULL, "--jsonl", NULL, OPT_FLAG, F_(jsonl), "one JSON input per line (string, or id array with --decode), one result per line" },
    { NULL, "--bench", "N", OPT_INT, F_(bench), "encode the input N times and print the best MB/s to stderr" },
    { "-h", "--help", NULL, OPT_FLAG, F_(help), "show this help" },
};
#undef F_
#define N_TOK_OPTS (sizeof tok_table / sizeof tok_table[0])

static void tok_usage(FILE *f)
{
    fprintf(f, "usage: quire tokenize -m MODEL [options] < text\n\n"
               "Prints the token ids of the text on stdin (all of it, byte for byte) as a\n"
               "JSON array; --decode reads an id array and prints the text.\n\noptions:\n");
    qopt_usage(f, tok_table, N_TOK_OPTS);
}

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        if (!r) break;
        n += r;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* A JSON string of s, with invalid UTF-8 replaced by U+FFFD. */
static json_t *json_text(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (j) return j;
    char *fixed = q_mallocn(n + 1, 3), *o = fixed;
    if (!fixed) return NULL;
    for (size_t i = 0; i < n;) {
        const size_t len = qutf8_char(s + i, n - i);
        if (len) {
            memcpy(o, s + i, len);
            o += len;
            i += len;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    j = json_stringn(fixed, (size_t)(o - fixed));
    free(fixed);
    return j;
}

static json_t *encode_one(const qtok *t, const tok_opts *o, const char *text, size_t len, char *err, size_t errlen)
{
    unsigned flags = (o->special ? QTOK_PARSE_SPECIAL : 0) | (o->no_add_special ? 0 : QTOK_ADD_SPECIAL);
    int32_t *ids = NULL;
    int n = 0;
    int rc = qtok_encode(t, text, len, flags, &ids, &n);
    if (rc) {
        qerr_set(err, errlen, rc, "%s", rc == QERR_INVAL ? "the text is not valid UTF-8" : qerr_str(rc));
        return NULL;
    }
    json_t *a = json_array();
    for (int i = 0; i < n && a; i++) {
        if (o->pieces) {
            size_t pl = 0;
            const char *p = qtok_id_to_token(t, ids[i], &pl);
            json_array_append_new(a, json_pack("[io]", (int)ids[i], json_text(p ? p : "", p ? pl : 0)));
        } else {
            json_array_append_new(a, json_integer(ids[i]));
        }
    }
    free(ids);
    return a;
}

static json_t *decode_one(const qtok *t, const tok_opts *o, json_t *arr, char *err, size_t errlen)
{
    if (!json_is_array(arr)) {
        qerr_set(err, errlen, QERR_INVAL, "--decode wants a JSON array of token ids");
        return NULL;
    }
    size_t n = json_array_size(arr);
    int32_t *ids = q_mallocn(n + 1, sizeof *ids);
    if (!ids) {
        qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= qtok_vocab_size(t)) {
            qerr_set(err, errlen, QERR_RANGE, "element %zu is not a token id below %d", i, qtok_vocab_size(t));
            free(ids);
            return NULL;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    if (o->stream) {
        /* The streaming detokenizer, one id at a time: with --jsonl the
         * chunks come out as an array, so that a test can check each one. */
        qdetok *d = qdetok_new(t, o->skip_special ? QTOK_SKIP_SPECIAL : 0);
        json_t *chunks = json_array();
        int rc = d && chunks ? 0 : QERR_NOMEM;
        for (size_t i = 0; i <= n && !rc; i++) {
            const char *s;
            size_t sl;
            rc = i < n ? qdetok_push(d, ids[i], &s, &sl) : qdetok_flush(d, &s, &sl);
            if (!rc && sl) json_array_append_new(chunks, json_text(s, sl));
        }
        qdetok_free(d);
        free(ids);
        if (rc) {
            json_decref(chunks);
            qerr_set(err, errlen, rc, "decode failed: %s", qerr_str(rc));
            return NULL;
        }
        return chunks;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = qtok_decode(t, ids, (int)n, o->skip_special ? QTOK_SKIP_SPECIAL : 0, &text, &len);
    free(ids);
    if (rc) {
        qerr_set(err, errlen, rc, "decode failed: %s", qerr_str(rc));
        return NULL;
    }
    json_t *s = json_text(text, len);
    free(text);
    return s;
}

int cmd_tokenize(int argc, char **argv)
{
    tok_opts o = { 0 };
    if (qopt_parse("tokenize", tok_table, N_TOK_OPTS, argc, argv, &o)) return 2;
    if (o.help) {
        tok_usage(stdout);
        return 0;
    }
    if (!o.model) {
        fprintf(stderr, "quire tokenize: -m MODEL is required\n\n");
        tok_usage(stderr);
        return 2;
    }
    char err[512];
    qtok *t = NULL;
    if (qtok_load_path(o.model, &t, err, sizeof err)) {
        fprintf(stderr, "quire tokenize: cannot load a tokenizer: %s\n", err);
        return 1;
    }
    size_t len;
    char *in = read_all(stdin, &len);
    if (!in) {
        qtok_free(t);
        fprintf(stderr, "quire tokenize: out of memory reading stdin\n");
        return 1;
    }
    int status = 0;
    if (o.bench > 0 && !o.decode && !o.jsonl) {
        unsigned flags = (o.special ? QTOK_PARSE_SPECIAL : 0) | (o.no_add_special ? 0 : QTOK_ADD_SPECIAL);
        double best = 1e30;
        int n = 0;
        for (int r = 0; r < o.bench; r++) {
            int32_t *ids = NULL;
            double t0 = q_now();
            int rc = qtok_encode(t, in, len, flags, &ids, &n);
            double dt = q_now() - t0;
            free(ids);
            if (rc) break;
            if (dt < best) best = dt;
        }
        fprintf(stderr, "encode: %zu bytes -> %d tokens, best of %d: %.4f s, %.2f MB/s\n", len, n, o.bench, best,
                best > 0 ? len / best / 1e6 : 0.0);
    }
    if (!o.jsonl) {
        json_t *r;
        if (o.decode) {
            json_error_t je;
            json_t *arr = json_loadb(in, len, JSON_DECODE_ANY, &je);
            if (!arr) {
                snprintf(err, sizeof err, "stdin is not JSON: %s", je.text);
                r = NULL;
            } else {
                r = decode_one(t, &o, arr, err, sizeof err);
                json_decref(arr);
            }
            if (r && json_is_array(r)) { /* --stream: the chunks, one after another */
                size_t i;
                json_t *c;
                json_array_foreach(r, i, c) fwrite(json_string_value(c), 1, json_string_length(c), stdout);
            } else if (r) {
                /* Plain text out, exactly as decoded. */
                fwrite(json_string_value(r), 1, json_string_length(r), stdout);
            }
        } else {
            r = encode_one(t, &o, in, len, err, sizeof err);
            if (r) {
                char *s = json_dumps(r, JSON_COMPACT);
                if (s) {
                    /* "[1, 2, 3]" reads better than jansson's compact "[1,2,3]". */
                    for (char *p = s; *p; p++) {
                        putchar(*p);
                        if (*p == ',') putchar(' ');
                    }
                    putchar('\n');
                }
                free(s);
            }
        }
        if (!r) {
            fprintf(stderr, "quire tokenize: %s\n", err);
            status = 1;
        }
        json_decref(r);
    } else {
        char *line = in, *end = in + len;
        long lineno = 0;
        while (line < end && !status) {
            char *nl = memchr(line, '\n', (size_t)(end - line));
            size_t n = nl ? (size_t)(nl - line) : (size_t)(end - line);
            lineno++;
            json_error_t je;
            json_t *v = json_loadb(line, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je), *r = NULL;
            if (!v) {
                snprintf(err, sizeof err, "line %ld is not JSON: %s", lineno, je.text);
            } else if (o.decode) {
                r = decode_one(t, &o, v, err, sizeof err);
            } else if (!json_is_string(v)) {
                snprintf(err, sizeof err, "line %ld: expected a JSON string", lineno);
            } else {
                r = encode_one(t, &o, json_string_value(v), json_string_length(v), err, sizeof err);
            }
            if (r) {
                char *s = json_dumps(r, JSON_COMPACT | JSON_ENCODE_ANY);
                if (s) puts(s);
                free(s);
            } else {
                fprintf(stderr, "quire tokenize: line %ld: %s\n", lineno, err);
                status = 1;
            }
            json_decref(v);
            json_decref(r);
            line = nl ? nl + 1 : end;
        }
    }
    free(in);
    qtok_free(t);
    return status;
}
