/* cmd_template.c - `quire template`: render a chat template with a JSON
 * context read on stdin, as HF's apply_chat_template(tokenize=False) does.
 *
 * -m takes a model (its template; bos_token/eos_token from its tokenizer) or
 * a tokenizer folder; --template FILE a bare template.  The prompt goes to
 * stdout exactly; a template that raises prints its own message to stderr
 * and exits 1. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "chat.h"
#include "cli.h"
#include "model.h"
#include "opts.h"
#include "tokenizer.h"
#include "util.h"

typedef struct {
    const char *model, *template_file;
    uint64_t time;
    int has_time, tokens, help;
} tpl_opts;

#define F_(field) offsetof(tpl_opts, field)
static const qopt tpl_table[] = {
    { "-m", "--model", "PATH", OPT_STR, F_(model), "a model (GGUF or HF folder) or a tokenizer folder: its chat template" },
    { NULL, "--template", "FILE", OPT_STR, F_(template_file), "a bare Jinja chat template instead of a model's" },
    { NULL, "--time", "EPOCH", OPT_U64, F_(time), "the time strftime_now() sees (seconds since 1970, UTC)" },
    { NULL, "--tokens", NULL, OPT_FLAG, F_(tokens), "print the prompt's token ids (JSON) instead of its text (needs -m)" },
    { "-h", "--help", NULL, OPT_FLAG, F_(help), "show this help" },
};
#undef F_
#define N_TPL_OPTS (sizeof tpl_table / sizeof tpl_table[0])

static void tpl_usage(FILE *f)
{
    fprintf(f, "usage: quire template (-m MODEL | --template FILE) [options] < context.json\n\n"
               "Renders a chat template.  The context on stdin is a JSON object: messages,\n"
               "tools, add_generation_prompt, bos_token, eos_token and any other variable\n"
               "the template reads.  Models without a template get ChatML.\n\noptions:\n");
    qopt_usage(f, tpl_table, N_TPL_OPTS);
}

int cmd_template(int argc, char **argv)
{
    tpl_opts o = { 0 };
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--time")) o.has_time = 1;
    if (qopt_parse("template", tpl_table, N_TPL_OPTS, argc, argv, &o)) return 2;
    if (o.help) {
        tpl_usage(stdout);
        return 0;
    }
    if (!o.model == !o.template_file) {
        fprintf(stderr, "quire template: give -m MODEL or --template FILE (one of them)\n\n");
        tpl_usage(stderr);
        return 2;
    }
    if (o.tokens && !o.model) {
        fprintf(stderr, "quire template: --tokens needs -m (a tokenizer)\n");
        return 2;
    }
    char err[1024];
    int status = 1, rc;
    qmodel *m = NULL;
    qtok *tok = NULL;
    qchat_tmpl *t = NULL;
    char *src = NULL, *prompt = NULL;
    size_t len;
    int32_t *ids = NULL;
    json_t *ctx = NULL;

    if (o.template_file) {
        if ((rc = q_read_file(o.template_file, QCHAT_MAX_SOURCE, &src, &len, err, sizeof err))) {
            fprintf(stderr, "quire template: %s\n", err);
            goto done;
        }
        if ((rc = qchat_compile(src, len, &t, err, sizeof err))) {
            fprintf(stderr, "quire template: %s: %s\n", o.template_file, err);
            goto done;
        }
    } else {
        struct stat st;
        int is_dir = !stat(o.model, &st) && S_ISDIR(st.st_mode);
        /* A full model when it loads; a folder of tokenizer files otherwise. */
        rc = qmodel_load(o.model, &m, err, sizeof err);
        if (rc && is_dir) {
            m = qmodel_new();
            if (!m || !(m->path = q_strdup(o.model))) goto oom;
            rc = hf_load_tokenizer_files(m, o.model, err, sizeof err);
        }
        if (rc) {
            fprintf(stderr, "quire template: cannot load %s: %s\n", o.model, err);
            goto done;
        }
        if (qtok_for_model(m, &tok, err, sizeof err)) QLOGW("no tokenizer: %s", err);
        int dflt;
        if ((rc = qchat_for_model(m, &t, &dflt, err, sizeof err))) {
            fprintf(stderr, "quire template: %s\n", err);
            goto done;
        }
        if (dflt) QLOGI("%s has no chat template: using ChatML", o.model);
    }
    if (o.has_time) qchat_set_time(t, (int64_t)o.time);

    json_error_t je;
    ctx = json_loadf(stdin, 0, &je);
    if (!ctx || !json_is_object(ctx)) {
        fprintf(stderr, "quire template: stdin must be a JSON object (%s)\n", ctx ? "got another JSON value" : je.text);
        goto done;
    }
    if (o.tokens) {
        if (!tok) {
            fprintf(stderr, "quire template: --tokens: the model has no tokenizer\n");
            goto done;
        }
        /* The template's control tokens are recognised; special-token text
         * inside message content stays text. */
        int n;
        if ((rc = qchat_apply_tokens(t, m, tok, ctx, &prompt, &len, &ids, &n, err, sizeof err))) {
            fprintf(stderr, "quire template: %s\n", err);
            goto done;
        }
        putchar('[');
        for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
        puts("]");
    } else {
        if ((rc = qchat_apply(t, m, tok, ctx, &prompt, &len, err, sizeof err))) {
            fprintf(stderr, "quire template: %s\n", err);
            goto done;
        }
        fwrite(prompt, 1, len, stdout);
    }
    status = 0;
    goto done;
oom:
    fprintf(stderr, "quire template: out of memory\n");
done:
    free(ids);
    free(prompt);
    free(src);
    json_decref(ctx);
    qchat_free(t);
    qtok_free(tok);
    qmodel_destroy(m);
    return status;
}
