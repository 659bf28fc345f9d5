/* cmd_generate.c - `quire generate`: load a model, run one prompt, stream the
 * generated text to stdout and the speed to stderr.
 *
 * --device picks the backend (engine/device.c); --random-weights CONFIG.json
 * stands in for -m with a model of that config's shapes and seeded random
 * weights (filled on the host for the CPU, on the device for CUDA).  Such a
 * model has no vocabulary: prompts are --prompt-ids and the output is token
 * ids, as with --ids.
 *
 * One sequence, its KV blocks allocated up front (the engine's block pool
 * and scheduler take over this job in the engine issue).  The prompt is
 * prefilled in chunks of --chunk tokens, then tokens are decoded one at a
 * time until -n tokens or an end-of-sequence token. */
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
#include "opts.h"
#include "sample.h"
#include "tokenizer.h"
#include "util.h"

typedef struct {
    const char *model;
    const char *random_weights;
    uint64_t weight_seed;
    const char *device;
    float gpu_mem_util;
    int tensor_parallel;
    const char *prompt_ids;
    const char *prompt;
    const char *system;
    int no_special;
    int chat;
    const char *batch;
    int kv_mem, max_batch_tokens, max_seqs, static_batching;
    const char *preempt;
    int swap_space;         /* MiB; -1 when not given */
    const char *spec;
    int spec_k;
    const char *draft;
    int n_predict;
    int threads;
    int block_size;
    int chunk;
    int ignore_eos;
    int print_ids;
    int help;
    qsample_params sp;
} gen_opts;

/* The one table of flags: parsing and --help both read it. */
#define F_(field) offsetof(gen_opts, field)
static const qopt gen_table[] = {
    { "-m", "--model", "PATH", OPT_STR, F_(model), "model: a .gguf file or a Hugging Face folder (required)" },
    { NULL, "--random-weights", "CONFIG", OPT_STR, F_(random_weights), "instead of -m: an HF config.json's shapes with random weights (needs --prompt-ids; prints ids)" },
    { NULL, "--weight-seed", "S", OPT_U64, F_(weight_seed), "--random-weights: seed of the weights (default 0)" },
    { NULL, "--device", "NAME", OPT_STR, F_(device), "auto, cpu or cuda (default auto: cuda when a device is visible)" },
    { NULL, "--gpu-mem-util", "F", OPT_FLOAT, F_(gpu_mem_util), "cuda: fraction of device memory to use, 0 < F <= 1 (default 0.9)" },
    { NULL, "--tensor-parallel", "N", OPT_INT, F_(tensor_parallel), "split the model among N GPUs, devices 0..N-1 (on the CPU: N groups of threads) (default 1)" },
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
    { NULL, "--kv-mem", "MB", OPT_INT, F_(kv_mem), "--batch: KV cache budget in MiB (default: 256 on the CPU; cuda: from --gpu-mem-util)" },
    { NULL, "--max-batch-tokens", "N", OPT_INT, F_(max_batch_tokens), "--batch: tokens per engine step (default 512)" },
    { NULL, "--max-seqs", "N", OPT_INT, F_(max_seqs), "--batch: sequences per engine step (default 64)" },
    { NULL, "--static-batching", NULL, OPT_FLAG, F_(static_batching), "--batch: admit a new batch only when the last has finished" },
    { NULL, "--preempt", "MODE", OPT_STR, F_(preempt), "--batch: when the KV pool runs out, recompute (default) or swap to host memory" },
    { NULL, "--swap-space", "MIB", OPT_INT, F_(swap_space), "--batch --preempt swap: host memory for swapped-out blocks (default 1024)" },
    { NULL, "--spec", "MODE", OPT_STR, F_(spec), "--batch: speculative decoding, none (default), ngram (drafts from n-gram lookup) or draft (--draft's), in every step" },
    { NULL, "--draft", "PATH", OPT_STR, F_(draft), "--batch: speculative decoding with this draft model (GGUF file or HF folder, the model's vocabulary)" },
    { NULL, "--spec-k", "K", OPT_INT, F_(spec_k), "--batch --spec: drafts a pass at most, 1 to 16 (default 4)" },
    { "-t", "--threads", "N", OPT_INT, F_(threads), "CPU threads (default: all cores)" },
    { NULL, "--block-size", "N", OPT_INT, F_(block_size), "tokens per KV-cache block (default 16)" },
    { NULL, "--chunk", "N", OPT_INT, F_(chunk), "prompt tokens per forward pass (default 512)" },
    { NULL, "--ignore-eos", NULL, OPT_FLAG, F_(ignore_eos), "do not stop at end-of-sequence tokens" },
    { NULL, "--ids", NULL, OPT_FLAG, F_(print_ids), "print the generated token ids as a JSON array instead of text" },
    { "-h", "--help", NULL, OPT_FLAG, F_(help), "show this help" },
};
#undef F_
#define N_GEN_OPTS (sizeof gen_table / sizeof gen_table[0])

static void gen_usage(FILE *f)
{
    fprintf(f, "usage: quire generate -m MODEL [options]\n\n"
               "Generates text from a prompt and prints it to stdout; prints prompt and\n"
               "generation speed (tokens/s) to stderr.\n\noptions:\n");
    qopt_usage(f, gen_table, N_GEN_OPTS);
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

static int is_eos(const qmodel *m, int id)
{
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos_ids[i] == id) return 1;
    return 0;
}

int cmd_generate(int argc, char **argv)
{
    gen_opts o = { .n_predict = 128, .threads = 0, .block_size = 16, .chunk = 512, .gpu_mem_util = 0.9f,
                   .swap_space = -1, .sp = qsample_defaults() };
    if (qopt_parse("generate", gen_table, N_GEN_OPTS, argc, argv, &o)) return 2;
    if (o.help) {
        gen_usage(stdout);
        return 0;
    }
    if (!o.model && !o.random_weights) {
        fprintf(stderr, "quire generate: -m MODEL is required (or --random-weights CONFIG.json)\n\n");
        gen_usage(stderr);
        return 2;
    }
    if (o.model && o.random_weights) {
        fprintf(stderr, "quire generate: give -m or --random-weights, not both\n");
        return 2;
    }
    int device = QDEVICE_AUTO;
    if (o.device && qdevice_parse(o.device, &device)) {
        fprintf(stderr, "quire generate: --device: '%s' is not auto, cpu or cuda\n", o.device);
        return 2;
    }
    int preempt = QPREEMPT_RECOMPUTE;
    if (o.preempt && qpreempt_parse(o.preempt, &preempt)) {
        fprintf(stderr, "quire generate: --preempt: '%s' is not recompute or swap\n", o.preempt);
        return 2;
    }
    if (o.swap_space != -1 && o.swap_space < 1) {
        fprintf(stderr, "quire generate: --swap-space: %d MiB is not a positive size\n", o.swap_space);
        return 2;
    }
    if (o.swap_space != -1 && preempt != QPREEMPT_SWAP) {
        fprintf(stderr, "quire generate: --swap-space needs --preempt swap\n");
        return 2;
    }
    int spec = o.draft ? QSPEC_DRAFT : QSPEC_NONE;
    if (o.spec && qspec_mode_parse(o.spec, &spec)) {
        fprintf(stderr, "quire generate: --spec: '%s' is not none, ngram or draft\n", o.spec);
        return 2;
    }
    if ((spec == QSPEC_DRAFT) != (o.draft != NULL)) {
        fprintf(stderr, o.draft ? "quire generate: --draft goes with --spec draft (or no --spec)\n"
                                : "quire generate: --spec draft needs --draft PATH\n");
        return 2;
    }
    if ((o.spec || o.spec_k || o.draft) && !o.batch) {
        fprintf(stderr, "quire generate: --spec, --spec-k and --draft need --batch\n");
        return 2;
    }
    if (o.spec_k < 0 || o.spec_k > QENGINE_MAX_SPEC_K) {
        fprintf(stderr, "quire generate: --spec-k: %d is not 1 to %d\n", o.spec_k, QENGINE_MAX_SPEC_K);
        return 2;
    }
    if (!(o.gpu_mem_util > 0 && o.gpu_mem_util <= 1)) {
        fprintf(stderr, "quire generate: --gpu-mem-util: %g is not in (0, 1]\n", (double)o.gpu_mem_util);
        return 2;
    }
    if (o.tensor_parallel < 0 || o.tensor_parallel > 16) {
        fprintf(stderr, "quire generate: --tensor-parallel: %d is not 1 to 16\n", o.tensor_parallel);
        return 2;
    }
    if (o.random_weights && !o.batch && (o.prompt || o.chat || !o.prompt_ids)) {
        fprintf(stderr, "quire generate: --random-weights has no vocabulary: give the prompt as --prompt-ids\n");
        return 2;
    }
    char err[512];
    if (qsample_check(&o.sp, err, sizeof err)) {
        fprintf(stderr, "quire generate: %s\n", err);
        return 2;
    }
    if (o.n_predict < 0 || o.block_size < 1 || o.block_size > 4096 || o.chunk < 1 || o.threads < 0) {
        fprintf(stderr, "quire generate: -n, --block-size, --chunk and --threads must be positive\n");
        return 2;
    }

    int status = 1;
    qmodel *m = NULL;
    qbackend *be = NULL;
    qsampler *smp = NULL;
    qtok *tok = NULL;
    qdetok *detok = NULL;
    char *chat_text = NULL;
    if (o.batch && (o.prompt || o.prompt_ids || o.chat)) {
        fprintf(stderr, "quire generate: --batch takes its prompts from the file\n");
        return 2;
    }
    if (o.kv_mem < 0 || o.max_batch_tokens < 0 || o.max_seqs < 0) {
        fprintf(stderr, "quire generate: --kv-mem, --max-batch-tokens and --max-seqs must be positive\n");
        return 2;
    }
    int32_t *prompt = NULL, *table = NULL, *out_ids = NULL;
    float *logits = NULL;
    qmodel *dm = NULL;

    double t0 = q_now();
    /* Resolved now: random weights are filled on the host only for the CPU. */
    device = qdevice_resolve(device);
    int rc = o.random_weights ? qmodel_random(o.random_weights, device == QDEVICE_CPU, o.weight_seed, &m, err, sizeof err)
                              : qmodel_load(o.model, &m, err, sizeof err);
    if (rc) {
        fprintf(stderr, "quire generate: cannot %s model: %s\n", o.random_weights ? "make the random" : "load", err);
        goto done;
    }
    qengine_opts eo;
    qengine_opts_default(&eo);
    eo.device = device;
    eo.gpu_mem_util = o.gpu_mem_util;
    eo.tensor_parallel = o.tensor_parallel;
    eo.n_threads = o.threads;
    eo.block_size = o.block_size;
    const qhparams *hp = &m->hp;
    QLOGI("model %s: %s, %d layers, dim %d, %d heads (%d KV), vocab %d, %s weights, fingerprint %s",
          m->name, qfamily_get(hp->family)->name, hp->n_layers, hp->dim, hp->n_heads,
          hp->n_kv_heads, hp->n_vocab, qdt_name(m->w.tok_embd.dtype), m->fingerprint_hex);

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

    if (o.batch) {
        if (o.kv_mem) eo.kv_mem_mb = (size_t)o.kv_mem;
        if (o.max_batch_tokens) eo.max_batch_tokens = o.max_batch_tokens;
        if (o.max_seqs) eo.max_seqs = o.max_seqs;
        eo.static_batching = o.static_batching;
        eo.preempt_mode = preempt;
        if (o.swap_space > 0) eo.swap_space_mb = (size_t)o.swap_space;
        /* Drafts in every step: a batch file is for comparing runs. */
        eo.spec_mode = spec, eo.spec_always = 1;
        if (o.spec_k) eo.spec_k = o.spec_k;
        if (o.draft) {
            if ((rc = qmodel_load(o.draft, &dm, err, sizeof err))) {
                fprintf(stderr, "quire generate: cannot load the draft model: %s\n", err);
                goto done;
            }
            QLOGI("draft model %s: %d layers, dim %d, vocab %d", dm->name, dm->hp.n_layers, dm->hp.dim, dm->hp.n_vocab);
            eo.draft = dm;
        }
        status = run_batch(m, tok, &eo, o.batch, o.n_predict);
        goto done;
    }
    int n_prompt;
    if (o.prompt && o.prompt_ids) {
        fprintf(stderr, "quire generate: give -p or --prompt-ids, not both\n");
        goto done;
    }
    if ((o.chat || o.system) && !o.prompt) {
        fprintf(stderr, "quire generate: --chat and --system need -p (the user message)\n");
        goto done;
    }
    if (o.chat) {
        if (!tok) {
            fprintf(stderr, "quire generate: --chat needs the model's tokenizer\n");
            goto done;
        }
        if ((rc = chat_prompt(m, tok, o.system, o.prompt, &chat_text, &prompt, &n_prompt, err, sizeof err))) {
            fprintf(stderr, "quire generate: %s\n", err);
            goto done;
        }
    } else if (o.prompt) {
        unsigned flags = QTOK_ADD_SPECIAL | (o.no_special ? 0 : QTOK_PARSE_SPECIAL);
        if ((rc = qtok_encode(tok, o.prompt, strlen(o.prompt), flags, &prompt, &n_prompt))) {
            fprintf(stderr, "quire generate: cannot tokenize the prompt: %s\n",
                    rc == QERR_INVAL ? "it is not valid UTF-8" : qerr_str(rc));
            goto done;
        }
        if (n_prompt == 0) {
            fprintf(stderr, "quire generate: the prompt is empty after tokenization\n");
            goto done;
        }
    } else if (o.prompt_ids) {
        n_prompt = parse_ids(o.prompt_ids, hp->n_vocab, &prompt);
        if (n_prompt < 0) goto done;
        if (n_prompt == 0) {
            fprintf(stderr, "quire generate: --prompt-ids is empty\n");
            goto done;
        }
    } else {
        if (m->bos_id < 0) {
            fprintf(stderr, "quire generate: the model has no BOS token; give -p or --prompt-ids\n");
            goto done;
        }
        prompt = malloc(sizeof *prompt);
        if (!prompt) goto oom;
        prompt[0] = m->bos_id;
        n_prompt = 1;
    }
    if (n_prompt > hp->max_ctx) {
        fprintf(stderr, "quire generate: the prompt has %d tokens; the model's context is %d\n", n_prompt, hp->max_ctx);
        goto done;
    }
    int n_predict = o.n_predict;
    if (n_prompt + n_predict > hp->max_ctx) {
        n_predict = hp->max_ctx - n_prompt;
        QLOGW("generating at most %d tokens: the model's context is %d", n_predict, hp->max_ctx);
    }

    const int total = n_prompt + n_predict, bs = o.block_size;
    const int n_blocks = (total + bs - 1) / bs;
    table = q_mallocn((size_t)n_blocks, sizeof *table);
    out_ids = q_mallocn((size_t)n_predict + 1, sizeof *out_ids);
    logits = q_mallocn((size_t)hp->n_vocab, sizeof *logits);
    if (!table || !out_ids || !logits) goto oom;
    for (int i = 0; i < n_blocks; i++) table[i] = i;

    if ((rc = qengine_backend_create(m, &eo, n_blocks, o.chunk, NULL, &be, err, sizeof err))) {
        fprintf(stderr, "quire generate: %s\n", err);
        goto done;
    }
    smp = qsampler_create(&o.sp, hp->n_vocab);
    if (!smp) goto oom;
    if (!strcmp(be->ops->name, "cpu"))
        QLOGI("loaded in %.3f s; cpu backend, %d threads", q_now() - t0, be->opts.n_threads);
    else
        QLOGI("loaded in %.3f s; %s backend", q_now() - t0, be->ops->name);

    /* Prefill, in chunks; logits only for the last prompt token. */
    double tp = q_now();
    for (int start = 0; start < n_prompt; start += o.chunk) {
        int n = n_prompt - start < o.chunk ? n_prompt - start : o.chunk;
        int last = start + n == n_prompt;
        int32_t li = n - 1;
        qbatch_seq seq = { .first = 0, .n_tokens = n, .pos0 = start, .block_table = table, .n_blocks = n_blocks };
        qbatch b = { .n_tokens = n, .tokens = prompt + start, .n_seqs = 1, .seqs = &seq,
                     .n_logits = last ? 1 : 0, .logits_idx = &li };
        if ((rc = be->ops->forward(be, &b, logits))) {
            fprintf(stderr, "quire generate: forward pass failed: %s\n", qerr_str(rc));
            goto done;
        }
    }
    double prefill_s = q_now() - tp;

    /* Decode. */
    double td = q_now();
    int n_gen = 0, prev = prompt[n_prompt - 1], pos = n_prompt;
    char piece[256];
    /* Text goes out through the streaming detokenizer: never half a UTF-8
     * character, SentencePiece's leading space handled as a full decode
     * would, special tokens (EOS/BOS with --ignore-eos) left out. */
    if (tok && !(detok = qdetok_new(tok, QTOK_SKIP_SPECIAL))) goto oom;
    /* The prompt goes through the detokenizer first (its text is not
     * printed), so that the output continues it with the right spacing. */
    for (int i = 0; detok && i < n_prompt; i++) {
        const char *text;
        size_t len;
        if (qdetok_push(detok, prompt[i], &text, &len)) goto oom;
    }
    if (o.print_ids) fputs("[", stdout);
    while (n_gen < n_predict) {
        int next = qsample(smp, logits);
        if (!o.ignore_eos && is_eos(m, next)) break;
        out_ids[n_gen++] = next;
        if (o.print_ids) {
            printf("%s%d", n_gen > 1 ? ", " : "", next);
        } else if (detok) {
            const char *text;
            size_t len;
            if (qdetok_push(detok, next, &text, &len)) goto oom;
            fwrite(text, 1, len, stdout);
        } else {
            int strip = prev == m->bos_id && m->vocab.kind == QVOCAB_SPM;
            int len = qvocab_decode_piece(&m->vocab, next, strip, piece, sizeof piece);
            if (len > 0) fwrite(piece, 1, (size_t)len, stdout);
        }
        fflush(stdout);
        prev = next;
        if (n_gen == n_predict) break;
        int32_t tk = next, li = 0;
        qbatch_seq seq = { .first = 0, .n_tokens = 1, .pos0 = pos, .block_table = table, .n_blocks = n_blocks };
        qbatch b = { .n_tokens = 1, .tokens = &tk, .n_seqs = 1, .seqs = &seq, .n_logits = 1, .logits_idx = &li };
        if ((rc = be->ops->forward(be, &b, logits))) {
            fprintf(stderr, "\nquire generate: forward pass failed: %s\n", qerr_str(rc));
            goto done;
        }
        pos++;
    }
    double decode_s = q_now() - td;
    if (detok) {
        const char *text;
        size_t len;
        if (!qdetok_flush(detok, &text, &len)) fwrite(text, 1, len, stdout);
    }
    if (o.print_ids) fputs("]", stdout);
    fputs("\n", stdout);
    fflush(stdout);
    /* The first generated token comes from the prefill's logits, so decode
     * speed counts the forward passes after it. */
    int decode_passes = n_gen > 0 ? n_gen - 1 : 0;
    fprintf(stderr, "prompt: %d tokens in %.3f s, %.2f tokens/s\n", n_prompt, prefill_s,
            prefill_s > 0 ? n_prompt / prefill_s : 0.0);
    fprintf(stderr, "generation: %d tokens in %.3f s, %.2f tokens/s\n", n_gen, decode_s,
            decode_s > 0 && decode_passes > 0 ? decode_passes / decode_s : 0.0);
    status = 0;
    goto done;
oom:
    fprintf(stderr, "quire generate: out of memory\n");
done:
    free(chat_text);
    qdetok_free(detok);
    qtok_free(tok);
    qsampler_destroy(smp);
    qbackend_destroy(be);
    qmodel_destroy(m);
    qmodel_destroy(dm);
    free(prompt);
    free(table);
    free(out_ids);
    free(logits);
    return status;
}
