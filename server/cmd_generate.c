/* cmd_generate.c - `quire generate`: load a model, run one prompt through the
 * engine, stream the generated text to stdout and the speed to stderr; or,
 * with --batch, every request of a JSONL file (cmd_batch.c).
 *
 * --device picks the backend (engine/device.c); --random-weights CONFIG.json
 * stands in for -m with a model of that config's shapes and seeded random
 * weights (filled on the host for the CPU, on the device for CUDA).  Such a
 * model has no vocabulary: prompts are --prompt-ids and the output is token
 * ids, as with --ids.
 *
 * The prompt is one request to the engine (submit, step, poll), as the
 * server's are: the same scheduler, prompt chunks (--max-batch-tokens, or
 * --chunk), sampling, stop conditions and speculative decoding.  The
 * engine's flags are the table serve uses too (engine_flags.h).  Raw
 * backend timing, without the engine, is bench/'s job. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "backend.h"
#include "chat.h"
#include "arch.h"
#include "cli.h"
#include "engine.h"
#include "model.h"
#include "engine_flags.h"
#include "opts.h"
#include "sample.h"
#include "tokenizer.h"
#include "util.h"

typedef struct {
    const char *model;
    const char *random_weights;
    uint64_t weight_seed;
    const char *prompt_ids;
    const char *prompt;
    const char *system;
    int no_special;
    int chat;
    const char *batch;
    int n_predict;
    int chunk;
    int ignore_eos;
    int print_ids;
    int help;
    qsample_params sp;
    qeflags ef;             /* the engine's flags, shared with serve */
} gen_opts;

/* The subcommand's own flags; the engine's follow (engine_flags.h). */
#define F_(field) offsetof(gen_opts, field)
static const qopt gen_table[] = {
    { "-m", "--model", "PATH", OPT_STR, F_(model), "model: a .gguf file or a Hugging Face folder (required)" },
    { NULL, "--random-weights", "CONFIG", OPT_STR, F_(random_weights), "instead of -m: an HF config.json's shapes with random weights (needs --prompt-ids; prints ids)" },
    { NULL, "--weight-seed", "S", OPT_U64, F_(weight_seed), "--random-weights: seed of the weights (default 0)" },
    { "-p", "--prompt", "TEXT", OPT_STR, F_(prompt), "prompt text, tokenized with the model's tokenizer (BOS as it says)" },
    { NULL, "--chat", NULL, OPT_FLAG, F_(chat), "-p is a user message: apply the model's chat template (ChatML if none)" },
    { NULL, "--system", "TEXT", OPT_STR, F_(system), "with --chat: a system message before the user's" },
    { NULL, "--no-special", NULL, OPT_FLAG, F_(no_special), "treat special-token text in -p (e.g. <|im_start|>) as plain text" },
    { NULL, "--prompt-ids", "LIST", OPT_STR, F_(prompt_ids), "prompt as comma-separated token ids (default: BOS alone)" },
    { "-n", "--n-predict", "N", OPT_INT, F_(n_predict), "tokens to generate (default 128)" },
    { NULL, "--temp", "T", OPT_FLOAT, F_(sp.temperature), "temperature; 0 is greedy (default 1.0)" },
    { NULL, "--top-k", "K", OPT_INT, F_(sp.top_k), "keep the K most probable tokens; 0 is off (default 0)" },
    { NULL, "--top-p", "P", OPT_FLOAT, F_(sp.top_p), "nucleus sampling mass; 1 is off (default 1.0)" },
    { NULL, "--min-p", "P", OPT_FLOAT, F_(sp.min_p), "drop tokens below P times the best one's probability (default 0)" },
    { NULL, "--seed", "S", OPT_U64, F_(sp.seed), "random seed; the same seed gives the same output (default 0)" },
    { NULL, "--batch", "FILE", OPT_STR, F_(batch), "run every request of a JSONL file through the engine at once (see README)" },
    { NULL, "--chunk", "N", OPT_INT, F_(chunk), "prompt tokens per forward pass: --max-batch-tokens's older name (default 512)" },
    { NULL, "--ignore-eos", NULL, OPT_FLAG, F_(ignore_eos), "do not stop at end-of-sequence tokens" },
    { NULL, "--ids", NULL, OPT_FLAG, F_(print_ids), "print the generated token ids as a JSON array instead of text" },
    { "-h", "--help", NULL, OPT_FLAG, F_(help), "show this help" },
};
#undef F_
#define N_GEN_OPTS (sizeof gen_table / sizeof gen_table[0])
static const qopt_set gen_sets[] = { { gen_table, N_GEN_OPTS, 0 }, QEFLAGS_SET(gen_opts, ef) };

static void gen_usage(FILE *f)
{
    fprintf(f, "usage: quire generate -m MODEL [options]\n\n"
               "Generates text from a prompt and prints it to stdout; prints prompt and\n"
               "generation speed (tokens/s) to stderr.  The prompt (or --batch's requests) runs\n"
               "on the engine that serve uses, with the same engine flags (the second list);\n"
               "with --spec or --draft every step drafts (--spec-always is implied).\n\noptions:\n");
    qopt_usage_sets(f, gen_sets, 2);
}

/* Parses "1,2,3" into a new array; returns the count or -1. */
static int parse_ids(const char *s, int n_vocab, int32_t **out)
{
    int cap = 16, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= n_vocab) {
            fprintf(stderr, "quire generate: --prompt-ids: '%s' is not a token id below %d\n", p, n_vocab);
            free(ids);
            return -1;
        }
        if (n == cap) {
            int32_t *ni = q_reallocn(ids, (size_t)cap * 2, sizeof *ids);
            if (!ni) { free(ids); return -1; }
            ids = ni;
            cap *= 2;
        }
        ids[n++] = (int32_t)v;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    *out = ids;
    return n;
}

/* The model's chat template applied to [system], user, tokenized: the
 * template's control tokens are recognised, the messages' text cannot inject
 * any.  *text is the prompt text, *ids its tokens. */
static int chat_prompt(const qmodel *m, const qtok *tok, const char *system, const char *user, char **text,
                       int32_t **ids, int *n_ids, char *err, size_t errlen)
{
    qchat_tmpl *t = NULL;
    int dflt, rc = qchat_for_model(m, &t, &dflt, err, errlen);
    if (rc) return rc;
    if (dflt) QLOGW("the model has no chat template: using ChatML");
    json_t *msgs = json_array(), *ctx = json_object();
    if (system) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", user));
    json_object_set_new(ctx, "messages", msgs);
    json_object_set_new(ctx, "add_generation_prompt", json_true());
    size_t len;
    rc = qchat_apply_tokens(t, m, tok, ctx, text, &len, ids, n_ids, err, errlen);
    if (!rc) QLOGD("chat prompt: %s", *text);
    json_decref(ctx);
    qchat_free(t);
    return rc;
}

/* The flags' checks that need no model: 0, or 2 (a usage error) with a
 * message.  *eo gets the engine's options. */
static int check_opts(gen_opts *o, qengine_opts *eo)
{
    char err[512];
    if (!o->model && !o->random_weights) {
        fprintf(stderr, "quire generate: -m MODEL is required (or --random-weights CONFIG.json)\n\n");
        gen_usage(stderr);
        return 2;
    }
    if (o->model && o->random_weights) {
        fprintf(stderr, "quire generate: give -m or --random-weights, not both\n");
        return 2;
    }
    if (o->chunk < 0 || (o->chunk && o->ef.max_batch_tokens && o->chunk != o->ef.max_batch_tokens)) {
        fprintf(stderr, "quire generate: --chunk is --max-batch-tokens's older name: a positive size, one of them\n");
        return 2;
    }
    if (o->chunk) o->ef.max_batch_tokens = o->chunk;
    if (qeflags_apply(&o->ef, eo, err, sizeof err)) {
        fprintf(stderr, "quire generate: %s\n", err);
        return 2;
    }
    /* Drafts in every step: generate is for comparing runs. */
    if (eo->spec_mode != QSPEC_NONE) eo->spec_always = 1;
    if (o->random_weights && !o->batch && (o->prompt || o->chat || !o->prompt_ids)) {
        fprintf(stderr, "quire generate: --random-weights has no vocabulary: give the prompt as --prompt-ids\n");
        return 2;
    }
    if (qsample_check(&o->sp, err, sizeof err)) {
        fprintf(stderr, "quire generate: %s\n", err);
        return 2;
    }
    if (o->n_predict < 0) {
        fprintf(stderr, "quire generate: -n must be positive\n");
        return 2;
    }
    if (o->batch && (o->prompt || o->prompt_ids || o->chat)) {
        fprintf(stderr, "quire generate: --batch takes its prompts from the file\n");
        return 2;
    }
    if (o->prompt && o->prompt_ids) {
        fprintf(stderr, "quire generate: give -p or --prompt-ids, not both\n");
        return 2;
    }
    if ((o->chat || o->system) && !o->prompt) {
        fprintf(stderr, "quire generate: --chat and --system need -p (the user message)\n");
        return 2;
    }
    return 0;
}

/* The prompt's token ids from -p (with --chat), --prompt-ids or BOS alone:
 * its length, or -1 after a message. */
static int make_prompt(const gen_opts *o, const qmodel *m, const qtok *tok, int32_t **prompt)
{
    char err[512];
    int n = 0, rc;
    if (o->chat) {
        char *text = NULL;
        if (!tok) {
            fprintf(stderr, "quire generate: --chat needs the model's tokenizer\n");
            return -1;
        }
        rc = chat_prompt(m, tok, o->system, o->prompt, &text, prompt, &n, err, sizeof err);
        free(text);
        if (rc) {
            fprintf(stderr, "quire generate: %s\n", err);
            return -1;
        }
    } else if (o->prompt) {
        const unsigned flags = QTOK_ADD_SPECIAL | (o->no_special ? 0 : QTOK_PARSE_SPECIAL);
        if ((rc = qtok_encode(tok, o->prompt, strlen(o->prompt), flags, prompt, &n))) {
            fprintf(stderr, "quire generate: cannot tokenize the prompt: %s\n",
                    rc == QERR_INVAL ? "it is not valid UTF-8" : qerr_str(rc));
            return -1;
        }
        if (n == 0) {
            fprintf(stderr, "quire generate: the prompt is empty after tokenization\n");
            return -1;
        }
    } else if (o->prompt_ids) {
        if ((n = parse_ids(o->prompt_ids, m->hp.n_vocab, prompt)) < 0) return -1;
        if (n == 0) {
            fprintf(stderr, "quire generate: --prompt-ids is empty\n");
            return -1;
        }
    } else {
        if (m->bos_id < 0) {
            fprintf(stderr, "quire generate: the model has no BOS token; give -p or --prompt-ids\n");
            return -1;
        }
        if (!(*prompt = malloc(sizeof **prompt))) {
            fprintf(stderr, "quire generate: out of memory\n");
            return -1;
        }
        (*prompt)[0] = m->bos_id;
        n = 1;
    }
    if (n > m->hp.max_ctx) {
        fprintf(stderr, "quire generate: the prompt has %d tokens; the model's context is %d\n", n, m->hp.max_ctx);
        return -1;
    }
    return n;
}

/* Writes token id's output: its id (--ids), else the event's text, else
 * (no tokenizer) the vocabulary's raw piece. */
static void print_token(const gen_opts *o, const qmodel *m, const qtok *tok, const qevent *ev, int n_gen, int *prev)
{
    if (o->print_ids) {
        printf("%s%d", n_gen > 1 ? ", " : "", ev->token);
    } else if (tok) {
        if (ev->text_len) fwrite(ev->text, 1, ev->text_len, stdout); /* text is NULL while output is held back */
    } else {
        char piece[256];
        const int strip = *prev == m->bos_id && m->vocab.kind == QVOCAB_SPM;
        const int len = qvocab_decode_piece(&m->vocab, ev->token, strip, piece, sizeof piece);
        if (len > 0) fwrite(piece, 1, (size_t)len, stdout);
    }
    *prev = ev->token;
    fflush(stdout);
}

/* One prompt through the engine, its tokens printed as they come; the
 * speeds on stderr (the first token comes from the prompt's pass, so the
 * generation speed counts the passes after it).  Returns the exit status. */
static int run_one(const gen_opts *o, const qmodel *m, const qtok *tok, const qengine_opts *eo, double t0)
{
    int32_t *prompt = NULL;
    const int n_prompt = make_prompt(o, m, tok, &prompt);
    if (n_prompt < 0) return 1;
    int n_predict = o->n_predict;
    if (n_prompt + n_predict > m->hp.max_ctx) {
        n_predict = m->hp.max_ctx - n_prompt;
        QLOGW("generating at most %d tokens: the model's context is %d", n_predict, m->hp.max_ctx);
    }
    char err[512];
    qengine *e = NULL;
    if (qengine_create(m, tok, eo, &e, err, sizeof err)) {
        fprintf(stderr, "quire generate: %s\n", err);
        free(prompt);
        return 1;
    }
    QLOGI("loaded in %.3f s; %s backend", q_now() - t0, qengine_backend_name(e));
    qreq_params p = { .prompt = prompt, .n_prompt = n_prompt, .sp = o->sp, .max_tokens = n_predict,
                      .ignore_eos = o->ignore_eos };
    uint64_t id;
    int status = 0, n_gen = 0, prev = prompt[n_prompt - 1];
    const double ts = q_now();
    double t_first = 0;
    if (o->print_ids) fputs("[", stdout);
    if (n_predict > 0 && qengine_submit(e, &p, &id, err, sizeof err)) {
        fprintf(stderr, "quire generate: %s\n", err);
        status = 1;
    }
    for (int live = n_predict > 0 && !status; live > 0;) {
        if ((live = qengine_step(e)) < 0) {
            fprintf(stderr, "\nquire generate: engine step failed: %s\n", qerr_str(live));
            status = 1;
        }
        qevent ev;
        while (qengine_poll(e, &ev)) {
            if (ev.finish == QFINISH_NONE) {
                if (!n_gen++) t_first = q_now();
                print_token(o, m, tok, &ev, n_gen, &prev);
            } else {
                if (!o->print_ids && ev.text_len) fwrite(ev.text, 1, ev.text_len, stdout);
                if (ev.finish == QFINISH_ERROR) status = 1;
            }
            qevent_free(&ev);
        }
    }
    const double t_end = q_now();
    if (o->print_ids) fputs("]", stdout);
    fputs("\n", stdout);
    fflush(stdout);
    if (status) fprintf(stderr, "quire generate: the request failed\n");
    const double prefill_s = t_first > 0 ? t_first - ts : t_end - ts, decode_s = t_first > 0 ? t_end - t_first : 0;
    const int decode_passes = n_gen > 0 ? n_gen - 1 : 0;
    fprintf(stderr, "prompt: %d tokens in %.3f s, %.2f tokens/s\n", n_prompt, prefill_s,
            prefill_s > 0 ? n_prompt / prefill_s : 0.0);
    fprintf(stderr, "generation: %d tokens in %.3f s, %.2f tokens/s\n", n_gen, decode_s,
            decode_s > 0 && decode_passes > 0 ? decode_passes / decode_s : 0.0);
    qengine_destroy(e);
    free(prompt);
    return status;
}

int cmd_generate(int argc, char **argv)
{
    gen_opts o = { .n_predict = 128, .sp = qsample_defaults() };
    qeflags_init(&o.ef);
    if (qopt_parse_sets("generate", gen_sets, 2, argc, argv, &o)) return 2;
    if (o.help) {
        gen_usage(stdout);
        return 0;
    }
    qengine_opts eo;
    int status = check_opts(&o, &eo);
    if (status) return status;
    status = 1;
    char err[512];
    qmodel *m = NULL, *dm = NULL;
    qtok *tok = NULL;
    const double t0 = q_now();
    /* Resolved now: random weights are filled on the host only for the CPU. */
    eo.device = qdevice_resolve(eo.device);
    int rc = o.random_weights ? qmodel_random(o.random_weights, eo.device == QDEVICE_CPU, o.weight_seed, &m, err, sizeof err)
                              : qmodel_load(o.model, &m, err, sizeof err);
    if (rc) {
        fprintf(stderr, "quire generate: cannot %s model: %s\n", o.random_weights ? "make the random" : "load", err);
        goto done;
    }
    const qhparams *hp = &m->hp;
    QLOGI("model %s: %s, %d layers, dim %d, %d heads (%d KV), vocab %d, %s weights, fingerprint %s",
          m->name, qfamily_get(hp->family)->name, hp->n_layers, hp->dim, hp->n_heads,
          hp->n_kv_heads, hp->n_vocab, qdt_name(m->w.tok_embd.dtype), m->fingerprint_hex);
    if (hp->window > 0) {
        int n_local = 0;
        for (int l = 0; l < hp->n_layers; l++) n_local += qhp_layer_local(hp, l);
        QLOGI("sliding window of %d positions on %d of %d layers", hp->window, n_local, hp->n_layers);
    }
    if (m->random_fill) {
        QLOGI("random weights (seed %llu): no vocabulary, prompts and output are token ids",
              (unsigned long long)m->random_seed);
        o.print_ids = 1;
    } else if ((rc = qtok_for_model(m, &tok, err, sizeof err))) {
        if (o.batch) {
            QLOGW("no tokenizer (%s): --batch takes only prompt_ids", err);
        } else if (o.prompt) {
            fprintf(stderr, "quire generate: -p needs the model's tokenizer: %s\n", err);
            goto done;
        }
        QLOGW("no tokenizer (%s): printing raw vocabulary pieces", err);
    }
    if (o.ef.draft) {
        if ((rc = qmodel_load(o.ef.draft, &dm, err, sizeof err))) {
            fprintf(stderr, "quire generate: cannot load the draft model: %s\n", err);
            goto done;
        }
        QLOGI("draft model %s: %d layers, dim %d, vocab %d", dm->name, dm->hp.n_layers, dm->hp.dim, dm->hp.n_vocab);
        eo.draft = dm;
    }
    status = o.batch ? run_batch(m, tok, &eo, o.batch, o.n_predict) : run_one(&o, m, tok, &eo, t0);
done:
    qtok_free(tok);
    qmodel_destroy(m);
    qmodel_destroy(dm);
    return status;
}
