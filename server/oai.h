/* oai.h - OpenAI-compatible request bodies: parsing, validation and the
 * error replies, for POST /v1/chat/completions and /v1/completions (and
 * the sampling fields of `quire generate --batch` lines).
 *
 * A body becomes an engine request: the prompt's token ids (a chat through
 * the model's template), qreq_params, and how the reply is shaped (stream,
 * usage in the stream, logprobs).  Anything wrong gets a qoai_error in
 * OpenAI's shape: the HTTP status, a type, the field at fault and a message
 * that says what was expected.
 *
 * Fields, with OpenAI's names and types: model (string; one the server
 * serves, else 404 model_not_found), messages (chat) or prompt
 * (completions: a string, one string in an array, or token ids),
 * max_tokens / max_completion_tokens (integer >= 1), temperature [0, 100],
 * top_p [0, 1], top_k (integer >= -1; -1 and 0 are off), min_p [0, 1],
 * seed (integer; absent: a fresh random seed for each request), frequency_penalty and presence_penalty
 * [-2, 2], repetition_penalty (0, 1e6], n [1, 64], stop (a string or up to
 * 16 non-empty strings), logprobs (chat: boolean, with top_logprobs [0,
 * 20]; completions: integer [0, 20]), stream (boolean), stream_options
 * ({"include_usage": boolean}, only with stream), user (string),
 * ignore_eos (boolean), speculative (boolean, quire's: false keeps this
 * request out of speculative decoding), tools (chat), response_format
 * ({"type": "text"}, {"type": "json_object"}, or {"type": "json_schema",
 * "json_schema": {"name", "schema", "strict"}}: the output is a JSON
 * object, or an instance of the schema, by guided decoding), and vLLM's
 * extensions guided_json (a schema), guided_regex (the whole output
 * matches), guided_choice (one of a list of strings), structured_outputs
 * ({"json" | "regex" | "choice" | "json_object"}: the same),
 * llama-server's json_schema (a schema).  oai_fields.c has the rest:
 * logit_bias, stop_token_ids, min_tokens, include_stop_str_in_output,
 * skip_special_tokens, echo, best_of (= n), truncate_prompt_tokens,
 * request_id, priority (0), cache_prompt (true), store (false), metadata,
 * service_tier; chat: chat_template_kwargs, add_generation_prompt,
 * continue_final_message, documents; completions: add_special_tokens.  A
 * field not named here is refused with a 400 that names it (as OpenAI
 * does: "Unrecognized request argument supplied"), never ignored; a named
 * field of the wrong type or out of range is an error, null is the same as
 * absent. */
#ifndef QUIRE_OAI_H
#define QUIRE_OAI_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "schema.h"

struct qmodel;
struct qtok;

typedef enum { QOAI_CHAT = 0, QOAI_COMPLETION = 1 } qoai_kind;

typedef struct {
    int status;        /* HTTP status: 400, 401, 404, 413, 429, 500, 503 */
    char type[32];     /* "invalid_request_error", "authentication_error", ... */
    char param[48];    /* the field at fault ("messages[2].content"), "" for none */
    char code[40];     /* OpenAI's code where it has one ("context_length_exceeded"), else "" */
    char message[320];
} qoai_error;

struct gram;
struct gram_vocab;

typedef struct {
    int max_tokens_cap; /* larger max_tokens are refused (0: only the context bounds them) */
    /* The model's grammar vocabulary (engine.h qengine_grammar_vocab), or
     * NULL: requests for structured output are refused. */
    const struct gram_vocab *gvocab;
    /* The vocabulary tool-call grammars use where the form's markers are
     * special tokens of the model (Mistral's [TOOL_CALLS]): gvocab with
     * those allowed, and the output keeps them for the reader; NULL: gvocab. */
    const struct gram_vocab *gvocab_tools;
    /* Compiled grammars shared by requests that ask for the same one, or NULL. */
    struct gram_cache *gcache;
    /* Grammars that failed to compile, with their errors, or NULL: a request
     * that repeats one is refused at once instead of compiling it again. */
    struct qoai_failcache *gfail;
    /* Seconds a request's grammar may take to compile (gram.h gram_budget;
     * 0: no limit): past it the request is refused with a 400, and the
     * refusal cached in gfail like any failed compile. */
    double grammar_seconds;
    /* The model ids a request may name (NULL-terminated; NULL: any). */
    const char *const *models;
    /* Fields besides the request's own that the body may carry (a WebSocket
     * message's type, id, ...; NULL-terminated; NULL: none). */
    const char *const *envelope;
    /* A chat template's source that replaces the model's (serve
     * --chat-template), or NULL. */
    const char *chat_template;
    /* GRAM_SCHEMA_FULL: schemas (response_format, guided_json, tools) with
     * JSON Schema's own meaning; 0: strict (schema.h). */
    unsigned schema_flags;
    /* The form tool calls are written in (schema.h; serve's
     * --tool-call-parser, else the one the chat template shows). */
    gram_tools_form tool_form;
    /* How chat replies are split into reasoning and content (serve's
     * --reasoning-parser, else the one the chat template shows). */
    int reasoning; /* qoai_reason_kind */
} qoai_limits;

/* A cache of structure requests that failed to compile: the SHA-256 of the
 * request's key, its param and message; least recently added out.  Safe
 * from several threads.  NULL when out of memory. */
typedef struct qoai_failcache qoai_failcache;
qoai_failcache *qoai_failcache_new(int cap);
void qoai_failcache_free(qoai_failcache *c);
/* The error a request with this key failed with before, into *e: 1, or 0
 * (c NULL: 0). */
int qoai_failcache_get(qoai_failcache *c, const char *key, qoai_error *e);
/* Keeps key's error (c NULL: nothing). */
void qoai_failcache_put(qoai_failcache *c, const char *key, const qoai_error *e);

typedef struct {
    qoai_kind kind;
    json_t *body;       /* the parsed body (owned): p.stop points into it */
    qreq_params p;      /* p.prompt = ids */
    int32_t *ids;       /* the prompt's token ids (owned) */
    int has_max_tokens; /* the body named max_tokens or max_completion_tokens */
    int stream;         /* reply as server-sent events */
    int include_usage;  /* stream_options.include_usage */
    int logprobs;       /* the reply carries logprobs (p.sp.logprobs) */
    const char *model;  /* the body's model, "" when absent (points into body) */
    struct gram *grammar; /* response_format / guided_* / tools: the output's grammar (owned), or NULL */
    int tool_mode;        /* qoai_tool_mode: how the output is read back */
    const char *tool_name; /* QOAI_TOOLS_NAMED: the function (points into body) */
    qlogit_bias *bias;    /* logit_bias (owned; p.sp points at it) */
    int32_t *stop_ids;    /* stop_token_ids (owned; p points at it) */
    int echo;             /* the reply starts with the prompt (completions) or the last message (chat) */
    char *echo_text;      /* that text (owned), echo_len bytes */
    size_t echo_len;
    int seeded;           /* the body gave a seed */
    int truncate;         /* truncate_prompt_tokens: keep the prompt's last this many (-1: the context; 0: off) */
    int no_special;       /* completions' add_special_tokens false: no BOS */
    const char *request_id; /* the body's request_id (points into body), or NULL */
    int reasoning;        /* chat: lim->reasoning (qoai_reason_kind): the reply is split */
    int in_think;         /* chat: the rendered prompt ends inside <think> (qoai_prompt_in_think) */
} qoai_req;

/* How tool_choice shapes the output (QOAI_TOOLS_OFF: plain text). */
typedef enum { QOAI_TOOLS_OFF = 0, QOAI_TOOLS_NAMED, QOAI_TOOLS_REQUIRED, QOAI_TOOLS_AUTO } qoai_tool_mode;

/* Parses body (len bytes, not NUL-terminated) as a request of kind for
 * model m (tokenizer tok) into *r: 0, or a QERR_* code with *e filled
 * (status 400 for anything about the body).  max_tokens defaults to the
 * rest of the model's context, capped by lim->max_tokens_cap; a prompt
 * that leaves no room, or a max_tokens that does not fit, is refused with
 * code "context_length_exceeded".  On success the caller frees *r with
 * qoai_req_free; on failure *r holds nothing. */
int qoai_parse(const char *body, size_t len, qoai_kind kind, const qoai_limits *lim, const struct qmodel *m,
               const struct qtok *tok, qoai_req *r, qoai_error *e);

/* A chat's messages checked and normalised into *out (a new array): each
 * a copy of the message with content a string (text parts joined by
 * newlines) or null, and the developer role as system.  0, or QERR_INVAL
 * / QERR_NOMEM with *e filled. */
int qoai_messages(json_t *msgs, json_t **out, qoai_error *e);

/* The sampling and reply fields of object o (everything but the model and
 * the prompt) into r->p and r's flags; r->p must hold the defaults
 * (qsample_defaults) beforehand.  0, or QERR_INVAL / QERR_RANGE with *e
 * filled.  Strings in r->p point into o. */
int qoai_params(json_t *o, qoai_kind kind, const qoai_limits *lim, qoai_req *r, qoai_error *e);

void qoai_req_free(qoai_req *r);

/* A chat body's prompt (messages, tools, documents, add_generation_prompt,
 * continue_final_message, chat_template_kwargs) through the template
 * (lim->chat_template, else the model's): the ids into r->ids, their count
 * in *n, and with r->echo the echoed text.  0 or an error in *e. */
int qoai_chat_ids(json_t *o, const qoai_limits *lim, const struct qmodel *m, const struct qtok *tok, qoai_req *r,
                  int *n, qoai_error *e);

/* vLLM's POST /tokenize body o ({"prompt"} or {"messages", ...}, with
 * add_special_tokens and return_token_strs) answered in *out: {"count",
 * "max_model_len", "tokens", "token_strs"}; and POST /detokenize ({"tokens"})
 * in *out: {"prompt"}.  0, or an error in *e (oai_tokenize.c). */
int qoai_tokenize(json_t *o, const qoai_limits *lim, const struct qmodel *m, const struct qtok *tok, json_t **out,
                  qoai_error *e);
int qoai_detokenize(json_t *o, const qoai_limits *lim, const struct qmodel *m, const struct qtok *tok, json_t **out,
                    qoai_error *e);

/* 0 when every field of body o is one a request of kind takes (or one of
 * envelope, NULL-terminated, may be NULL); else a 400 naming the first
 * that is not (oai_fields.c). */
int qoai_check_fields(json_t *o, qoai_kind kind, const char *const *envelope, qoai_error *e);

/* vLLM's output-shaping fields of o (oai_fields.c: logit_bias,
 * stop_token_ids, min_tokens, include_stop_str_in_output,
 * skip_special_tokens, echo, best_of, truncate_prompt_tokens, request_id,
 * priority, cache_prompt, store, metadata, service_tier, add_special_tokens)
 * into r; after the sampling fields (qoai_params calls it).  0 or an error
 * in *e. */
int qoai_extra_params(json_t *o, qoai_kind kind, qoai_req *r, qoai_error *e);

/* ---- tools ------------------------------------------------------------------
 *
 * tools: up to 128 {"type": "function", "function": {"name", "description",
 * "parameters"}} (names of 1 to 64 [A-Za-z0-9_.-], no two alike);
 * tool_choice: "none" (plain text), "auto" (the default with tools: text,
 * then calls or none), "required" (one call or more), or {"type":
 * "function", "function": {"name"}} (that call); parallel_tool_calls false:
 * at most one call.  The calls are guided decoding: the output's grammar
 * holds them in the Hermes / Qwen form (schema.h), each call's arguments
 * an instance of its function's parameters; a named call's output is its
 * arguments alone.  Not together with response_format or guided_*. */

/* tools / tool_choice / parallel_tool_calls of chat body o into r
 * (tool_mode, tool_name, grammar, p): 0, or an error in *e naming the
 * field (a parameters schema that cannot be enforced: the tool's
 * "tools[i].function.parameters" and the keyword). */
int qoai_tools(json_t *o, const qoai_limits *lim, qoai_req *r, qoai_error *e);

/* The form of tool calls chat template source tmpl shows (NULL: none):
 * mistral where it writes [TOOL_CALLS], hermes where it writes <tool_call>,
 * llama3_json where it writes "parameters": with an ipython role; hermes
 * otherwise, as the fallback. */
gram_tools_form qoai_tool_form_of(const char *tmpl);

/* The output of a request with tools read back, one per choice: fed the
 * text as it comes, it gives the chat deltas to stream ({"content"} and /
 * or {"tool_calls": [{"index", "id", "type", "function": {"name",
 * "arguments"}}]}, arguments in pieces); at the end the whole message.
 * Call ids are id_prefix followed by the call's index. */
typedef struct qoai_calls qoai_calls;
qoai_calls *qoai_calls_new(int mode, gram_tools_form form, const char *name, const char *id_prefix);
void qoai_calls_free(qoai_calls *p);
/* n more bytes of output (last: it ends with them): the delta to send, or
 * NULL when there is nothing to send yet (or no memory). */
json_t *qoai_calls_feed(qoai_calls *p, const char *s, size_t n, int last);
/* {"role": "assistant", "content": the text before the calls (null when
 * blank), "tool_calls": [...] (absent when none)}; NULL when out of memory. */
json_t *qoai_calls_message(qoai_calls *p);
int qoai_calls_count(const qoai_calls *p);
/* 1 when there is a call and the last one is whole (not cut off by a stop
 * string or max_tokens). */
int qoai_calls_complete(const qoai_calls *p);
/* 1 when memory ran out while reading (what it gives is then incomplete). */
int qoai_calls_failed(const qoai_calls *p);

/* ---- reasoning ---------------------------------------------------------------
 *
 * A reasoning model's output, <think>reasoning</think>content, read back as
 * vLLM's reasoning parsers read it: the reply's message (or each streamed
 * delta) carries the reasoning as "reasoning_content" (and "reasoning", the
 * name vLLM moved to) and the rest as "content".  qwen3: the output is
 * reasoning when it opens with <think> or the prompt ends inside one (the
 * template opened it), else content throughout (enable_thinking false
 * renders an empty think block into the prompt); deepseek_r1: reasoning
 * from the start, whatever the prompt.  Either way reasoning ends at
 * </think>, or with the output. */
typedef enum { QOAI_REASON_NONE = 0, QOAI_REASON_QWEN3 = 1, QOAI_REASON_DEEPSEEK_R1 = 2 } qoai_reason_kind;
/* The parser a --reasoning-parser name means ("none", "qwen3",
 * "deepseek_r1"; NULL: none), or -1. */
qoai_reason_kind qoai_reason_named(const char *name);
/* The parser a chat template shows (NULL: none): qwen3 where it writes
 * </think>, else none. */
qoai_reason_kind qoai_reason_of(const char *tmpl);
/* 1 when a rendered prompt (len bytes) ends with <think> and whitespace. */
int qoai_prompt_in_think(const char *text, size_t len);
typedef struct qoai_reason qoai_reason;
/* NULL for QOAI_REASON_NONE or when out of memory. */
qoai_reason *qoai_reason_new(qoai_reason_kind kind, int prompt_in_think);
void qoai_reason_free(qoai_reason *p);
/* n more bytes of output (last: it ends with them) split: afterwards
 * qoai_reason_part gives this piece's reasoning and content (either may be
 * empty; a tail that may be a tag is held until more comes).  0 or
 * QERR_NOMEM. */
int qoai_reason_feed(qoai_reason *p, const char *s, size_t n, int last);
/* The last feed's reasoning (content 0) or content (1): valid until the
 * next feed; "" with *len 0 when none. */
const char *qoai_reason_part(const qoai_reason *p, int content, size_t *len);

/* Fills *e: status, type, param (NULL: none), then the message.  Returns
 * QERR_INVAL for status 4xx (QERR_INTERNAL otherwise), for `return`. */
int qoai_fail(qoai_error *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* {"error": {"message", "type", "param", "code"}} (param and code null when
 * empty); NULL when out of memory. */
json_t *qoai_error_json(const qoai_error *e);

/* ---- replies ----------------------------------------------------------------
 *
 * OpenAI's reply objects for a request: chat.completion and
 * chat.completion.chunk, text_completion (streamed or whole), usage, and
 * logprobs in each endpoint's layout (chat: {"content": [{"token",
 * "logprob", "bytes", "top_logprobs"}]}; completions: {"tokens",
 * "token_logprobs", "top_logprobs", "text_offset"}).  A token's text is
 * what it adds to the text after another token (so the tokens of a
 * completion join into its text; U+FFFD where a token is part of a
 * character). */

typedef struct {
    qoai_kind kind;
    const char *id;    /* "chatcmpl-..." / "cmpl-..." */
    long long created; /* Unix seconds */
    const char *model;
} qoai_reply;

/* "stop", "length", or "abort" (cancelled, failed). */
const char *qoai_finish_reason(qfinish f);

/* {"prompt_tokens", "completion_tokens", "total_tokens",
 * "prompt_tokens_details": {"cached_tokens"}}; "disk_cached_tokens" beside
 * cached_tokens when some came from disk (disk_cached > 0); with spec
 * (drafted, kept, passes: speculative decoding on), its "speculative"
 * object too. */
json_t *qoai_usage(int prompt_tokens, int completion_tokens, int cached_tokens, int disk_cached, const int *spec);

/* Appends token event ev's logprobs to *acc (created on first use in the
 * kind's layout); text_offset is where the token's text starts in the
 * choice's text (completions).  0 or QERR_NOMEM. */
int qoai_logprobs_add(json_t **acc, qoai_kind kind, const struct qtok *tok, const qevent *ev, size_t text_offset);

/* One streamed chat chunk for choice index with delta (stolen; NULL: {}),
 * as qoai_chunk. */
json_t *qoai_chunk_delta(const qoai_reply *c, int index, json_t *delta, json_t *logprobs, const char *finish);

/* One streamed chunk for choice index: text (len bytes, may be empty),
 * logprobs (stolen; NULL: null), finish (NULL while running).  first adds
 * the assistant role to a chat delta.  NULL when out of memory. */
json_t *qoai_chunk(const qoai_reply *c, int index, const char *text, size_t len, json_t *logprobs, const char *finish,
                   int first);

/* The chunk after the last one when stream_options.include_usage: no
 * choices, the usage (stolen). */
json_t *qoai_usage_chunk(const qoai_reply *c, json_t *usage);

typedef struct {
    const char *text;
    size_t len;
    const char *finish; /* qoai_finish_reason */
    json_t *logprobs;   /* stolen; NULL: null */
    json_t *message;    /* chat: the message instead of text (stolen; NULL: none) */
    const char *reasoning; /* chat: the reasoning split from the text (rlen bytes), or NULL: no split */
    size_t rlen;
} qoai_choice;

/* The whole reply (stream false): n choices in index order and the usage
 * (stolen).  NULL when out of memory. */
json_t *qoai_response(const qoai_reply *c, qoai_choice *ch, int n, json_t *usage);

#endif
