/* chat.h - chat templates: renders a model's chat_template (Jinja2) to the
 * prompt text, byte for byte as HF transformers does.
 *
 * HF renders chat templates with jinja2 3.1 in an ImmutableSandboxedEnvironment
 * (trim_blocks, lstrip_blocks, the loopcontrols extension), a `tojson` filter
 * that is json.dumps(x, ensure_ascii=False, indent=None, separators=None,
 * sort_keys=False), and two globals: raise_exception(msg) and
 * strftime_now(fmt).  This module interprets the same language subset real
 * templates use (see chat_int.h for the map of the implementation) and gives
 * the same output: Python's str()/repr() of values, Python's number
 * formatting, jinja2's whitespace rules and undefined-value semantics.
 *
 * Usage:
 *     qchat_tmpl *t;
 *     if (qchat_compile(src, strlen(src), &t, err, sizeof err)) ...;
 *     char *prompt; size_t n;
 *     rc = qchat_render(t, ctx, &prompt, &n, err, sizeof err);
 *     ... free(prompt); qchat_free(t);
 *
 * The context is a JSON object whose members become template variables:
 * messages, tools, add_generation_prompt, bos_token, eos_token, anything
 * else the template reads.  Object member order is kept (jansson iterates in
 * insertion order), which matters for `tools | tojson`.
 *
 * A compiled template is read-only while rendering: several threads may
 * render the same template at once.  qchat_set_limits and qchat_set_time
 * must not race with renders.  Nesting is bounded, so compiling and
 * rendering need at most about 200 KiB of stack (about 1 MiB under ASan).
 */
#ifndef QUIRE_CHAT_H
#define QUIRE_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef struct qchat_tmpl qchat_tmpl;

/* Bounds on one render, so that a hostile template or context fails with a
 * clear error (QERR_LIMIT) instead of exhausting the process.  A zero field
 * means "the default". */
typedef struct {
    size_t max_output;       /* bytes of rendered text; default 16 MiB */
    size_t max_memory;       /* working memory of one render; default 256 MiB */
    uint64_t max_iterations; /* loop iterations + macro calls; default 10,000,000 */
    int max_call_depth;      /* nested macro calls and recursive loops; default 64 */
    double max_seconds;      /* wall-clock time; default 10 */
} qchat_limits;

/* strftime_now() reads the real local clock (qchat_set_time's default). */
#define QCHAT_TIME_NOW INT64_MIN

/* Largest template source accepted by qchat_compile. */
#define QCHAT_MAX_SOURCE ((size_t)1 << 20)

/* The template used for models that ship none: ChatML, as HF transformers'
 * former default_chat_template and llama.cpp/vLLM's fallback:
 *   <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
 * and with tools as Hermes and Qwen models take them: the functions listed
 * in the system message within <tools></tools>, an assistant's tool_calls
 * as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>, a tool's
 * result as a user message within <tool_response></tool_response>. */
extern const char QCHAT_DEFAULT_TEMPLATE[];

/* Fills *l with the defaults listed above.  Cannot fail. */
void qchat_limits_default(qchat_limits *l);

/* Compiles a template.  Returns 0 and a template owned by the caller (free
 * with qchat_free), or QERR_FORMAT with "line L, col C: message" in err for
 * syntax errors (jinja2's wording: "Encountered unknown tag 'x'.",
 * "No filter named 'x'.", "unexpected end of template, expected 'endif'."),
 * QERR_LIMIT for sources over QCHAT_MAX_SOURCE or nested too deeply,
 * QERR_NOMEM.  src need not be NUL-terminated; it must be UTF-8. */
int qchat_compile(const char *src, size_t len, qchat_tmpl **out, char *err, size_t errlen);

/* Replaces the template's render limits (zero fields take defaults).
 * Cannot fail. */
void qchat_set_limits(qchat_tmpl *t, const qchat_limits *l);

/* Pins strftime_now() to a fixed time (Unix seconds, formatted in UTC), or
 * back to the local clock with QCHAT_TIME_NOW.  For reproducible tests.
 * Cannot fail. */
void qchat_set_time(qchat_tmpl *t, int64_t epoch_seconds);

/* Renders t with the variables of `context` (a JSON object, or NULL for
 * none).  On success returns 0 and *out, a NUL-terminated malloc'd buffer of
 * *out_len bytes (out_len may be NULL) that the caller frees.  On failure
 * *out is NULL and err holds the message:
 *   QERR_INVAL   the template raised: raise_exception(msg) leaves exactly
 *                msg in err; other runtime errors read "line N: message"
 *                with jinja2/Python's message ("'x' is undefined",
 *                "can only concatenate str (not \"NoneType\") to str").
 *   QERR_UNSUPPORTED  a jinja2 feature this module lacks was executed
 *                (include/import/extends, a filter such as groupby).
 *   QERR_LIMIT   a qchat_limits bound was hit.
 *   QERR_NOMEM   out of memory.
 * Nothing is rendered on failure. */
int qchat_render(const qchat_tmpl *t, const json_t *context, char **out, size_t *out_len, char *err, size_t errlen);

/* Frees a template; NULL is a no-op. */
void qchat_free(qchat_tmpl *t);

/* ---- a model's template (chat_model.c) ---------------------------------- */

struct qmodel;
struct qtok;

/* Compiles the model's chat template, or QCHAT_DEFAULT_TEMPLATE when it has
 * none (m may be NULL); *is_default (if given) says which.  0 or a QERR_*
 * code with a message. */
int qchat_for_model(const struct qmodel *m, qchat_tmpl **out, int *is_default, char *err, size_t errlen);

/* Renders t with ctx (a JSON object: messages, tools, add_generation_prompt,
 * ...), adding bos_token / eos_token from the model and tokenizer when ctx
 * lacks them (ctx is modified).  m and tok may be NULL.  On success *out is
 * the prompt (free it); on failure a QERR_* code and the template's own
 * message in err. */
int qchat_apply(const qchat_tmpl *t, const struct qmodel *m, const struct qtok *tok, json_t *ctx, char **out,
                size_t *len, char *err, size_t errlen);

/* Renders ctx (not modified) like qchat_apply and tokenizes the prompt:
 * control tokens the template writes are recognised, while special-token
 * text inside message content stays text (content cannot inject control
 * tokens).  On success *text is the prompt text and *ids its tokens (free
 * both); nothing is added around it (the template places BOS itself).
 * 0, or a QERR_* code with a message. */
int qchat_apply_tokens(const qchat_tmpl *t, const struct qmodel *m, const struct qtok *tok, const json_t *ctx,
                       char **text, size_t *text_len, int32_t **ids, int *n_ids, char *err, size_t errlen);

/* qchat_apply_tokens with flags: QCHAT_CONTINUE_FINAL ends the prompt right
 * after the final message's content, as HF's continue_final_message (the
 * model continues that message instead of starting a new one; QERR_INVAL
 * when the content does not appear in the rendered chat). */
#define QCHAT_CONTINUE_FINAL 1u
int qchat_apply_tokens_ex(const qchat_tmpl *t, const struct qmodel *m, const struct qtok *tok, const json_t *ctx,
                          unsigned flags, char **text, size_t *text_len, int32_t **ids, int *n_ids, char *err,
                          size_t errlen);

#endif
