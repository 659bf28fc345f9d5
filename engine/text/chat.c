/* chat.c - the public face of the chat template interpreter (chat.h).
 *
 * qchat_compile: validate (size, UTF-8), lex, parse into a tree that lives
 * in the template's own arena.  qchat_render: make a fresh arena and context
 * on the heap, turn the JSON context into template values, execute, copy
 * the output into a malloc'd buffer, free the arena.
 *
 * Both entry points own a setjmp; every error below them longjmps back here
 * (see the rules in chat_int.h).  The context and arena are heap objects
 * whose pointers are fixed before setjmp, so they are valid after a jump.
 */
#include "chat.h"
#include "chat_int.h"
#include "qerr.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

struct qchat_tmpl {
    qcj_arena ar;
    qcj_node *body;
    qchat_limits lim;
    int64_t now;
};

/* ChatML (HF transformers' former default_chat_template), with tools as
 * Hermes and Qwen models take them (chat.h). */
const char QCHAT_DEFAULT_TEMPLATE[] =
    "{%- if tools %}{{ '<|im_start|>system\\n' }}{% if messages[0].role == 'system' %}{{ messages[0].content }}{{ '\\n\\n' }}{% endif %}{{ '# Tools\\n\\nThese functions are available, each described by a JSON object within <tools></tools>:\\n<tools>' }}{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n</tools>\\n\\nTo call functions, write each call as a JSON object with the function\\'s name and arguments within <tool_call></tool_call> tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}{% endif %}\n"
    "{%- for message in messages %}\n"
    "{%- if message.role == 'system' and tools and loop.first %}\n"
    "{%- elif message.role == 'assistant' and message.tool_calls %}{{ '<|im_start|>assistant\\n' }}{% if message.content %}{{ message.content + '\\n' }}{% endif %}\n"
    "{%- for tc in message.tool_calls %}{% if not loop.first %}{{ '\\n' }}{% endif %}{{ '<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' }}{% if tc.function.arguments is string %}{{ tc.function.arguments }}{% else %}{{ tc.function.arguments | tojson }}{% endif %}{{ '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}\n"
    "{%- elif message.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response><|im_end|>\\n' }}\n"
    "{%- else %}{{ '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

#define COMPILE_BUDGET ((size_t)256 << 20)
#define EVAL_DEPTH 600 /* eval/exec frames: about 150 KiB of stack at -O2, 600 KiB under ASan */

void qchat_limits_default(qchat_limits *l)
{
    l->max_output = (size_t)16 << 20;
    l->max_memory = (size_t)256 << 20;
    l->max_iterations = 10000000;
    l->max_call_depth = 64;
    l->max_seconds = 10;
}

int qchat_compile(const char *src, size_t len, qchat_tmpl **out, char *err, size_t errlen)
{
    if (!out) return qerr_set(err, errlen, QERR_INVAL, "qchat_compile: out is NULL");
    *out = NULL;
    if (!src && len) return qerr_set(err, errlen, QERR_INVAL, "qchat_compile: src is NULL");
    if (len > QCHAT_MAX_SOURCE)
        return qerr_set(err, errlen, QERR_LIMIT, "template too large (%zu bytes, limit %zu)", len, QCHAT_MAX_SOURCE);
    if (!qutf8_valid(src ? src : "", len)) return qerr_set(err, errlen, QERR_FORMAT, "template is not valid UTF-8");
    qchat_tmpl *t = q_callocn(1, sizeof *t);
    qcj_ctx *c = q_callocn(1, sizeof *c);
    if (!t || !c) {
        free(t);
        free(c);
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    }
    t->ar.budget = COMPILE_BUDGET;
    c->ar = &t->ar;
    c->max_output = COMPILE_BUDGET;
    if (setjmp(c->jb)) {
        int rc = qerr_set(err, errlen, c->rc, "%s", c->msg);
        qcj_arena_free(&t->ar);
        free(t);
        free(c);
        return rc;
    }
    qcj_tok *toks;
    size_t ntoks;
    qcj_lex(c, src ? src : "", len, &toks, &ntoks);
    t->body = qcj_parse(c, toks, ntoks);
    free(c);
    qchat_limits_default(&t->lim);
    t->now = QCHAT_TIME_NOW;
    *out = t;
    return 0;
}

void qchat_set_limits(qchat_tmpl *t, const qchat_limits *l)
{
    if (!t) return;
    qchat_limits d;
    qchat_limits_default(&d);
    if (l) {
        if (l->max_output) d.max_output = l->max_output;
        if (l->max_memory) d.max_memory = l->max_memory;
        if (l->max_iterations) d.max_iterations = l->max_iterations;
        if (l->max_call_depth > 0) d.max_call_depth = l->max_call_depth;
        if (l->max_seconds > 0) d.max_seconds = l->max_seconds;
    }
    t->lim = d;
}

void qchat_set_time(qchat_tmpl *t, int64_t epoch_seconds)
{
    if (t) t->now = epoch_seconds;
}

/* Builds the global and root scopes and runs the template (may fail). */
static void render_body(qcj_ctx *c, const qchat_tmpl *t, const json_t *context)
{
    qcj_scope *globals = qcj_alloc(c, sizeof *globals);
    memset(globals, 0, sizeof *globals);
    size_t ng;
    const qcj_builtin *g = qcj_globals(&ng);
    globals->vars = qcj_allocn(c, ng, sizeof *globals->vars);
    globals->cap = ng;
    for (size_t i = 0; i < ng; i++) {
        qcj_func *f = qcj_alloc(c, sizeof *f);
        memset(f, 0, sizeof *f);
        f->kind = QF_GLOBAL;
        f->b = &g[i];
        globals->vars[i].name = g[i].name;
        globals->vars[i].len = strlen(g[i].name);
        globals->vars[i].v.t = QV_FUNC;
        globals->vars[i].v.u.fn = f;
    }
    globals->n = ng;

    qcj_scope *root = qcj_alloc(c, sizeof *root);
    memset(root, 0, sizeof *root);
    root->parent = globals;
    if (context) {
        size_t n = json_object_size(context);
        root->vars = qcj_allocn(c, n ? n : 1, sizeof *root->vars);
        root->cap = n ? n : 1;
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)context, key, val) {
            size_t kl = strlen(key);
            if (!qutf8_valid(key, kl)) qcj_fail(c, QERR_INVAL, 0, "context key is not valid UTF-8");
            char *name = qcj_alloc(c, kl + 1);
            memcpy(name, key, kl + 1);
            root->vars[root->n].name = name;
            root->vars[root->n].len = kl;
            root->vars[root->n].v = qcj_from_json(c, val, 0);
            root->n++;
        }
    }
    qcj_exec_template(c, t->body, root);
}

int qchat_render(const qchat_tmpl *t, const json_t *context, char **out, size_t *out_len, char *err, size_t errlen)
{
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!t || !out) return qerr_set(err, errlen, QERR_INVAL, "qchat_render: template or out is NULL");
    if (context && !json_is_object(context)) return qerr_set(err, errlen, QERR_INVAL, "context must be a JSON object");
    qcj_ctx *c = q_callocn(1, sizeof *c);
    qcj_arena *ar = q_callocn(1, sizeof *ar);
    qcj_buf *buf = q_callocn(1, sizeof *buf);
    if (!c || !ar || !buf) {
        free(c);
        free(ar);
        free(buf);
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    }
    ar->budget = t->lim.max_memory;
    c->ar = ar;
    c->out = buf;
    c->max_output = t->lim.max_output;
    c->max_iters = t->lim.max_iterations;
    c->max_depth = EVAL_DEPTH;
    c->max_mdepth = t->lim.max_call_depth;
    c->deadline = t->lim.max_seconds > 0 ? q_now() + t->lim.max_seconds : 0;
    c->now = t->now;
    int rc = 0;
    if (setjmp(c->jb)) {
        rc = qerr_set(err, errlen, c->rc, "%s", c->msg);
    } else {
        render_body(c, t, context);
        char *res = q_malloc(buf->n + 1);
        if (!res) {
            rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        } else {
            if (buf->n) memcpy(res, buf->p, buf->n);
            res[buf->n] = 0;
            *out = res;
            if (out_len) *out_len = buf->n;
        }
    }
    qcj_arena_free(ar);
    free(ar);
    free(buf);
    free(c);
    return rc;
}

void qchat_free(qchat_tmpl *t)
{
    if (!t) return;
    qcj_arena_free(&t->ar);
    free(t);
}
