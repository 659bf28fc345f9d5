/* cmd_serve.c - `quire serve`: its options, the start (database, names,
 * origins, the web folder, the lws context), the service loop until a
 * signal, and the stop.  The server's parts: serve_http.c (HTTP routes),
 * serve_ws.c (the WebSocket protocol), serve_static.c (the web folder),
 * serve_engine.c (the engine thread), serve_prep.c (requests prepared off
 * the socket thread), serve_sessions.c (sessions).
 *
 * Threads (DESIGN.md): the lws service thread (this one) owns every socket;
 * the engine thread steps the engine whenever a request is live, moves its
 * events into the requests' output under the server's mutex, and wakes the
 * lws thread with lws_cancel_service(), which then asks for a writable
 * callback on each connection with output.  Nothing else is shared.
 *
 * Endpoints: POST /v1/chat/completions and /v1/completions (whole JSON, or
 * server-sent events with stream true), GET /v1/models, GET /health,
 * GET /metrics, and the WebSocket protocol at /v1/ws (README.md: several
 * requests a socket under client ids; chat and cancel in, start, delta,
 * done and error out).  A closed connection cancels its requests at the
 * next engine step.  Errors are OpenAI's error JSON (oai.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <libwebsockets.h>
#include <netdb.h>
#include <pthread.h>
#include <dirent.h>
#include <sys/socket.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "chat.h"
#include "arch.h"
#include "cli.h"
#include "gram.h"
#include "schema.h"
#include "serve.h"
#include "engine.h"
#include "metrics.h"
#include "model.h"
#include "oai.h"
#include "opts.h"
#include "qerr.h"
#include "tokenizer.h"
#include "buf.h"
#include "util.h"


#define F_(field) offsetof(serve_opts, field)
static const qopt serve_table[] = {
    { "-m", "--model", "PATH", OPT_STR, F_(model), "model: a .gguf file or a Hugging Face folder (required)" },
    { NULL, "--host", "ADDR", OPT_STR, F_(host), "address to listen on (default 127.0.0.1)" },
    { NULL, "--port", "N", OPT_INT, F_(port), "port for HTTP (default 8080)" },
    { NULL, "--served-model-name", "NAME", OPT_STR, F_(name), "the model's id in the API; NAME,ALIAS,... for names a request may use too (default: the file's name, and the -m path as given)" },
    { NULL, "--api-key", "KEY", OPT_STR, F_(api_key), "require 'Authorization: Bearer KEY' on /v1 (default: none)" },
    { NULL, "--api-key-file", "PATH", OPT_STR, F_(api_key_file), "API keys from a file, one a line (kept out of ps); each key owns its sessions" },
    { NULL, "--db", "PATH", OPT_STR, F_(db), "the database: sessions and the persistent prefix cache (default quire.db)" },
    { NULL, "--no-persist", NULL, OPT_FLAG, F_(no_persist), "no database: no sessions, no prefix cache on disk" },
    { NULL, "--cache-disk-load", "WHEN", OPT_STR, F_(disk_load), "auto: load a prefix from disk while that is measured faster than computing it; always (default auto)" },
    { NULL, "--cache-disk-max", "MB", OPT_INT, F_(cache_disk_max), "disk for the persistent prefix cache, least recently used blocks evicted (default 4096 MiB)" },
    { NULL, "--web", "DIR", OPT_STR, F_(web), "static files served at / (default: the project's web/)" },
    { NULL, "--allowed-origins", "LIST", OPT_STR, F_(allow_origin), "pages from these origins may call the API (CORS, preflight answered) and open the WebSocket: a JSON list or commas, scheme://host:port each, or * for any (default: only the server's own pages)" },
    { NULL, "--allow-origin", "LIST", OPT_STR, F_(allow_origin), "the same as --allowed-origins" },
    { NULL, "--chat-template", "FILE", OPT_STR, F_(chat_template_path), "a Jinja chat template to use instead of the model's" },
    { NULL, "--json-schema-mode", "MODE", OPT_STR, F_(schema_mode), "strict: properties a schema does not list are not generated unless additionalProperties allows them (as XGrammar and llama.cpp); full: JSON Schema's own meaning (default strict)" },
    { NULL, "--reasoning-parser", "NAME", OPT_STR, F_(reasoning_parser), "how chat replies are split into reasoning_content and content: qwen3 or deepseek_r1 (<think>...</think>), none, or auto: qwen3 when the chat template writes </think>, else none (default auto)" },
    { NULL, "--tool-call-parser", "NAME", OPT_STR, F_(tool_parser), "the form tool calls are written and read in: hermes (<tool_call>), llama3_json ({\"name\", \"parameters\"}), mistral ([TOOL_CALLS]), or auto: the one the chat template shows, hermes when it shows none (default auto)" },
    { NULL, "--log-level", "LEVEL", OPT_STR, F_(log_level), "debug, info, warn, error or off (default info)" },
    { NULL, "--shutdown-grace", "S", OPT_FLOAT, F_(grace), "on SIGINT/SIGTERM, seconds running requests may finish before they are cancelled (default 5)" },
    { NULL, "--max-tokens", "N", OPT_INT, F_(max_tokens), "largest max_tokens a request may ask for (default 4096)" },
    { NULL, "--max-body", "KB", OPT_INT, F_(max_body_kb), "largest request body (default 1024 KiB)" },
    { NULL, "--max-requests", "N", OPT_INT, F_(max_requests), "requests in flight at most; more get 429 (default 256)" },
    { NULL, "--max-header", "KB", OPT_INT, F_(max_header_kb), "largest request line and headers; more get 431 (default 16 KiB; targets past 8 KiB get 414)" },
    { NULL, "--max-connections", "N", OPT_INT, F_(max_connections), "connections open at once; more are closed at once (default 1024)" },
    { NULL, "--max-pending", "MB", OPT_INT, F_(max_pending_mb), "output a connection's client has not read, at most; past it its requests are cancelled and the connection closed (default 8 MiB)" },
    { NULL, "--prep-threads", "N", OPT_INT, F_(prep_threads), "threads that parse, template, tokenize and compile requests, off the socket thread (default 2)" },
    { NULL, "--grammar-timeout", "S", OPT_FLOAT, F_(grammar_timeout), "seconds a request's schema, regex, choice or tools may take to compile, else 400 (default 10)" },
    { NULL, "--idle-timeout", "S", OPT_FLOAT, F_(idle_timeout), "seconds a kept-alive connection may wait for its next request (default 10)" },
    { NULL, "--request-timeout", "S", OPT_FLOAT, F_(request_timeout), "seconds a request may take to arrive whole, else 408 (default 30)" },
    { NULL, "--max-model-len", "N", OPT_INT, F_(max_model_len), "the context a request gets, prompt and output (default: the model's, lowered to what the KV cache holds)" },
    { "-c", "--ctx-size", "N", OPT_INT, F_(max_model_len), "the same as --max-model-len (llama-server's name)" },
    { "-h", "--help", NULL, OPT_FLAG, F_(help), "show this help" },
};
#undef F_
#define N_SERVE_OPTS (sizeof serve_table / sizeof serve_table[0])


/* Every connection is a raw socket read by serve_http.c (HTTP/1.1, and
 * WebSocket after an upgrade). */
static const struct lws_protocols protocols[] = {
    { "quire", serve_conn_callback, sizeof(pss), 0, 0, NULL, 0 },
    { NULL, NULL, 0, 0, 0, NULL, 0 },
};

static void stop_tick_cb(lws_sorted_usec_list_t *sul) { (void)sul; }

/* The model's size on disk: a file, or a folder's files. */
static double model_bytes(const char *path)
{
    struct stat st;
    if (stat(path, &st)) return 0;
    if (!S_ISDIR(st.st_mode)) return (double)st.st_size;
    double total = 0;
    DIR *d = opendir(path);
    for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
        char p[PATH_MAX + 256];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        if (e->d_name[0] != '.' && !stat(p, &st) && S_ISREG(st.st_mode)) total += (double)st.st_size;
    }
    if (d) closedir(d);
    return total;
}

/* Every 5 s while the model loads: a line that says so. */
static void load_tick_cb(lws_sorted_usec_list_t *sul)
{
    serve_state *srv = lws_container_of(sul, serve_state, load_tick);
    pthread_mutex_lock(&srv->mu);
    const int waiting = !srv->ready && !srv->load_failed;
    pthread_mutex_unlock(&srv->mu);
    if (!waiting || srv->stop || quire_stop) return;
    QLOGI("serve: still loading %s (%.2f GB), %.0f s so far", srv->o.model, srv->load_bytes / 1e9, q_now() - srv->load_t0);
    lws_sul_schedule(srv->ctx, 0, &srv->load_tick, load_tick_cb, 5 * LWS_US_PER_SEC);
}

static void on_signal(int sig)
{
    (void)sig;
    quire_stop = 1;
    if (quire_stop_ctx) lws_cancel_service(quire_stop_ctx);
}

/* Splits list (a JSON array of strings, or names separated by commas) into
 * out (at most max, NULL-terminated), the strings copied into buf: the
 * count, or -1 when it does not fit or is malformed. */
static int split_list(const char *list, const char **out, int max, char *buf, size_t cap)
{
    json_t *a = list[0] == '[' ? json_loads(list, 0, NULL) : NULL;
    if (list[0] == '[' && !json_is_array(a)) {
        json_decref(a);
        return -1;
    }
    int n = 0;
    size_t used = 0;
    const char *at = list;
    for (size_t i = 0; n >= 0; i++) {
        const char *s;
        size_t l;
        if (a) {
            if (i == json_array_size(a)) break;
            s = json_string_value(json_array_get(a, i));
            l = s ? strlen(s) : 0;
        } else {
            if (!at) break;
            const char *comma = strchr(at, ',');
            s = at, l = comma ? (size_t)(comma - at) : strlen(at);
            at = comma ? comma + 1 : NULL;
            while (l && *s == ' ') s++, l--;
            while (l && s[l - 1] == ' ') l--;
        }
        if (!s || !l || n == max || used + l + 1 > cap) {
            n = -1;
            break;
        }
        memcpy(buf + used, s, l);
        buf[used + l] = 0;
        out[n++] = buf + used;
        used += l + 1;
    }
    json_decref(a);
    if (n >= 0) out[n] = NULL;
    return n;
}

/* The ids a request may name: --served-model-name's (the first is the id in
 * replies), else the file's name and the -m path as given (vLLM's id). */
static int serve_names(serve_state *srv)
{
    const serve_opts *o = &srv->o;
    if (o->name) {
        if (split_list(o->name, srv->models, 8, srv->names_buf, sizeof srv->names_buf) < 1) {
            fprintf(stderr, "quire serve: --served-model-name: 1 to 8 names, separated by commas\n");
            return 1;
        }
    } else {
        const char *b = strrchr(o->model, '/');
        while (b && !b[1] && b > o->model) { /* a folder given with a trailing slash */
            const char *c = b - 1;
            while (c > o->model && *c != '/') c--;
            b = *c == '/' ? c : NULL;
        }
        /* The file's name, the same without its extension, and the path. */
        const char *base = b ? b + 1 : o->model;
        size_t bl = strcspn(base, "/");
        if (bl > 200) bl = 200;
        const char *dot = memrchr(base, '.', bl);
        const int n = snprintf(srv->names_buf, sizeof srv->names_buf, "%.*s%c%.*s", (int)bl, base, 0,
                               (int)(dot && dot > base ? (size_t)(dot - base) : bl), base);
        int k = 0;
        srv->models[k++] = srv->names_buf;
        if (n > 0 && strcmp(srv->names_buf, srv->names_buf + bl + 1)) srv->models[k++] = srv->names_buf + bl + 1;
        if (strcmp(o->model, srv->names_buf)) srv->models[k++] = o->model;
        srv->models[k] = NULL;
    }
    srv->name = srv->models[0];
    return 0;
}

static int serve_origins(serve_state *srv)
{
    const serve_opts *o = &srv->o;
    if (!o->allow_origin) return 0;
    if (split_list(o->allow_origin, srv->origins, 16, srv->origins_buf, sizeof srv->origins_buf) < 1) {
        fprintf(stderr, "quire serve: --allowed-origins: 1 to 16 origins (scheme://host:port or *), as a JSON list "
                        "or separated by commas\n");
        return 1;
    }
    return 0;
}

/* --chat-template FILE: read and compiled once, so that a bad one stops the start. */
static int serve_template(serve_state *srv)
{
    const serve_opts *o = &srv->o;
    if (!o->chat_template_path) return 0;
    char err[512];
    size_t len = 0;
    qchat_tmpl *t = NULL;
    if (q_read_file(o->chat_template_path, QCHAT_MAX_SOURCE, &srv->chat_template, &len, err, sizeof err) ||
        qchat_compile(srv->chat_template, len, &t, err, sizeof err)) {
        fprintf(stderr, "quire serve: --chat-template %s: %s\n", o->chat_template_path, err);
        return 1;
    }
    qchat_free(t);
    return 0;
}

/* Whether --host:--port can be bound, before lws tries (it would go on
 * without a listening socket): 0, or 1 after saying why. */
static int serve_can_bind(const serve_opts *o)
{
    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    const int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai) {
        fprintf(stderr, "quire serve: --host %s: %s\n", o->host, gai_strerror(gai));
        return 1;
    }
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol), one = 1;
    int rc = fd < 0 ? -1 : setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (!rc) rc = bind(fd, ai->ai_addr, ai->ai_addrlen);
    const int err = errno;
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    if (rc) {
        fprintf(stderr, "quire serve: cannot listen on %s:%d: %s\n", o->host, o->port,
                err == EADDRINUSE ? "address already in use" : strerror(err));
        return 1;
    }
    return 0;
}

/* --api-key and the keys of --api-key-file (every non-empty line).  0, or
 * 2 after a message. */
static int load_keys(serve_state *srv)
{
    serve_opts *o = &srv->o;
    if (o->api_key) srv->keys[srv->n_keys++] = o->api_key;
    if (o->api_key_file) {
        /* Every non-empty line is a key. */
        FILE *f = fopen(o->api_key_file, "r");
        size_t used = 0;
        char line[1024];
        const int before = srv->n_keys;
        while (f && fgets(line, sizeof line, f)) {
            line[strcspn(line, "\r\n")] = 0;
            const size_t l = strlen(line);
            if (!l) continue;
            if (used + l + 1 > sizeof srv->key_buf || srv->n_keys == (int)(sizeof srv->keys / sizeof srv->keys[0])) {
                fprintf(stderr, "quire serve: --api-key-file %s: too many keys\n", o->api_key_file);
                fclose(f);
                return 2;
            }
            memcpy(srv->key_buf + used, line, l + 1);
            srv->keys[srv->n_keys++] = srv->key_buf + used;
            used += l + 1;
        }
        if (f) fclose(f);
        if (srv->n_keys == before) {
            fprintf(stderr, "quire serve: --api-key-file %s: cannot read a key\n", o->api_key_file);
            return 2;
        }
    }
    return 0;
}

/* The server's own flags' ranges.  0, or 2 after a message. */
static int check_serve_opts(const serve_opts *o)
{
    if (o->disk_load && strcmp(o->disk_load, "auto") && strcmp(o->disk_load, "always")) {
        fprintf(stderr, "quire serve: --cache-disk-load must be auto or always\n");
        return 2;
    }
    if (o->cache_disk_max < 0) {
        fprintf(stderr, "quire serve: --cache-disk-max must be at least 0\n");
        return 2;
    }
    if (o->port < 0 || o->port > 65535 || o->max_tokens < 1 || o->max_body_kb < 1 || o->max_requests < 1 ||
        o->max_body_kb > (1 << 20) || o->max_header_kb < 1 || o->max_header_kb > 1024 || o->max_connections < 1 ||
        o->max_pending_mb < 1 || o->max_pending_mb > 4096 || o->prep_threads < 1 || o->prep_threads > 16) {
        fprintf(stderr, "quire serve: --port, --max-tokens, --max-body (at most 1048576), --max-header (at most 1024), "
                        "--max-connections, --max-pending (at most 4096), --prep-threads (at most 16) and "
                        "--max-requests must be positive\n");
        return 2;
    }
    if (o->max_model_len < 0 || o->cache_disk_max < 0 || o->grace < 0) {
        fprintf(stderr, "quire serve: sizes and counts cannot be negative (--max-model-len, --cache-disk-max, "
                        "--shutdown-grace)\n");
        return 2;
    }
    if (!(o->idle_timeout > 0) || !(o->request_timeout > 0) || !(o->grammar_timeout > 0) || o->idle_timeout > 86400 ||
        o->request_timeout > 86400 || o->grammar_timeout > 86400) {
        fprintf(stderr, "quire serve: --idle-timeout, --request-timeout and --grammar-timeout are seconds, more than 0 "
                        "(at most 86400)\n");
        return 2;
    }
    if (o->schema_mode && strcmp(o->schema_mode, "strict") && strcmp(o->schema_mode, "full")) {
        fprintf(stderr, "quire serve: --json-schema-mode must be strict or full\n");
        return 2;
    }
    if (o->reasoning_parser && strcmp(o->reasoning_parser, "auto") && (int)qoai_reason_named(o->reasoning_parser) < 0) {
        fprintf(stderr, "quire serve: --reasoning-parser must be auto, none, qwen3 or deepseek_r1\n");
        return 2;
    }
    if (o->tool_parser && strcmp(o->tool_parser, "auto") && gram_tools_form_named(o->tool_parser) < 0) {
        fprintf(stderr, "quire serve: --tool-call-parser must be auto, hermes, llama3_json or mistral\n");
        return 2;
    }
    return 0;
}

/* The web folder: --web, else web/ beside the build folder or here.  0, or
 * 2 after a message. */
static int find_web(serve_state *srv)
{
    const serve_opts *o = &srv->o;
    char exe[PATH_MAX], cand[PATH_MAX + 16];
    const ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (o->web) {
        if (!(srv->web_root = realpath(o->web, NULL))) {
            fprintf(stderr, "quire serve: --web %s: no such folder\n", o->web);
            return 2;
        }
    } else {
        if (el > 0) {
            exe[el] = 0;
            char *slash = strrchr(exe, '/');
            if (slash) *slash = 0;
            snprintf(cand, sizeof cand, "%s/../web", exe);
            srv->web_root = realpath(cand, NULL);
        }
        if (!srv->web_root) srv->web_root = realpath("web", NULL);
    }
    return 0;
}

/* The lws loop until a signal; then new requests get 503, running ones
 * have --shutdown-grace seconds to finish before they are cancelled, and
 * the loop goes on until every connection has had its final event (at most
 * 5 s more). */
static void service(serve_state *srv)
{
    const serve_opts *o = &srv->o;
    double deadline = 0;
    int cancelled = 0;
    while (lws_service(srv->ctx, 0) >= 0) {
        if (!srv->stop && !quire_stop) continue;
        /* lws waits in poll until its next timer: a tick every 50 ms
         * keeps this loop checking its deadlines while it drains. */
        lws_sul_schedule(srv->ctx, 0, &srv->stop_tick, stop_tick_cb, 50 * LWS_US_PER_MS);
        const double now = q_now();
        pthread_mutex_lock(&srv->mu);
        if (!srv->draining) {
            srv->draining = 1;
            deadline = now + (o->grace >= 0 ? o->grace : 0);
            fprintf(stderr, "quire serve: stopping (%d requests running)\n", srv->live);
        }
        if (!cancelled && now >= deadline) {
            for (sreq *r = srv->reqs; r; r = r->next)
                if (!r->finished) qengine_cancel(srv->eng, r->id);
            cancelled = 1;
            deadline = now + 5;
        }
        int busy = 0;
        for (sreq *r = srv->reqs; r; r = r->next) busy |= r->wsi != NULL;
        pthread_mutex_unlock(&srv->mu);
        if (!busy || (cancelled && now >= deadline)) break;
    }
}

/* Frees what the server made, whether it ran or not. */
static void serve_cleanup(serve_state *srv)
{
    serve_prep_stop(srv);
    sess_drop_all(srv);
    quire_stop_ctx = NULL;
    if (srv->ctx) lws_context_destroy(srv->ctx);
    while (srv->reqs) {
        sreq *r = srv->reqs;
        srv->reqs = r->next;
        serve_sreq_free(r);
    }
    qengine_destroy(srv->eng);
    gram_vocab_free(srv->gvocab);
    gram_vocab_free(srv->gvocab_tools);
    gram_cache_free(srv->gcache);
    qoai_failcache_free(srv->gfail);
    qstore_stop(srv->store);
    qmetrics_free(srv->metrics);
    free(srv->web_root);
    free(srv->chat_template);
    qtok_free(srv->tok);
    qmodel_destroy(srv->model);
    qmodel_destroy(srv->draft);
}

static int serve_main(serve_state *srv, int argc, char **argv)
{
    serve_opts *o = &srv->o;
    o->port = 8080, o->max_tokens = 4096, o->max_body_kb = 1024, o->max_requests = 256;
    qeflags_init(&o->ef);
    o->grace = 5;
    o->max_header_kb = 16, o->max_connections = 1024, o->idle_timeout = 10, o->request_timeout = 30;
    o->max_pending_mb = 8, o->prep_threads = 2, o->grammar_timeout = 10;
    o->host = "127.0.0.1";
    const qopt_set sets[] = { { serve_table, N_SERVE_OPTS, 0 }, QEFLAGS_SET(serve_opts, ef) };
    if (qopt_parse_sets("serve", sets, 2, argc, argv, o)) return 2;
    if (o->help) {
        printf("usage: quire serve -m MODEL [options]\n\nServes the model over HTTP: the OpenAI-compatible API\n"
               "(/v1/chat/completions, /v1/completions, /v1/models), /health and /metrics.\n\noptions:\n");
        qopt_usage_sets(stdout, sets, 2);
        return 0;
    }
    if (!o->model) {
        fprintf(stderr, "quire serve: -m MODEL is required (see quire serve --help)\n");
        return 2;
    }
    if (o->log_level) {
        static const char *const names[] = { "debug", "info", "warn", "error", "off" };
        int lv = -1;
        for (int i = 0; i < 5; i++)
            if (!strcmp(o->log_level, names[i])) lv = i;
        if (lv < 0) {
            fprintf(stderr, "quire serve: --log-level must be debug, info, warn, error or off\n");
            return 2;
        }
        qlog_set_level((qlog_level)lv);
    }
    if (load_keys(srv)) return 2;
    if (check_serve_opts(o)) return 2;
    qengine_opts eo;
    char ferr[256];
    if (qeflags_apply(&o->ef, &eo, ferr, sizeof ferr)) {
        fprintf(stderr, "quire serve: %s\n", ferr);
        return 2;
    }

    /* The database opens before the port: a database the program cannot use
     * (corrupt, newer) stops the start with its message. */
    if (!o->no_persist) {
        char err[512];
        qstore_opts so = { .disk_max = (int64_t)(o->cache_disk_max ? o->cache_disk_max : 4096) << 20 };
        if (qstore_start(o->db ? o->db : "quire.db", &so, &srv->store, err, sizeof err)) {
            fprintf(stderr, "quire serve: %s\n", err);
            return 1;
        }
        eo.store = srv->store;
        eo.tier_always_load = o->disk_load && !strcmp(o->disk_load, "always");
    }
    srv->eo = eo;
    srv->lim.max_tokens_cap = o->max_tokens;
    srv->lim.grammar_seconds = o->grammar_timeout;
    srv->lim.models = srv->models;
    srv->lim.schema_flags = o->schema_mode && !strcmp(o->schema_mode, "full") ? GRAM_SCHEMA_FULL : 0;
    if (serve_names(srv) || serve_origins(srv) || serve_template(srv)) return 2;
    if (serve_can_bind(o)) return 1;
    if (find_web(srv)) return 2;
    srv->lim.chat_template = srv->chat_template;
    srv->lim_ws = srv->lim;
    static const char *const ws_fields[] = { "type", "id", "token_ids", "session", "new_session", "keep_messages", "title", NULL };
    srv->lim_ws.envelope = ws_fields;
    srv->metrics = qmetrics_new();
    srv->gcache = gram_cache_new(64);
    srv->gfail = qoai_failcache_new(64);
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->cv, NULL);

    lws_set_log_level(LLL_ERR, NULL);
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.port = o->port;
    info.iface = o->host;
    info.protocols = protocols;
    info.user = srv; /* every callback reaches the server through its context (serve_of) */
    /* Raw sockets: serve_http.c reads HTTP/1.1 and WebSocket itself, with
     * the limits above (lws's own HTTP server cannot take pipelined
     * requests, nor say 413 before a body arrives). */
    info.options = LWS_SERVER_OPTION_DISABLE_IPV6 | LWS_SERVER_OPTION_ADOPT_APPLY_LISTEN_ACCEPT_CONFIG;
    info.listen_accept_role = "raw-skt";
    info.listen_accept_protocol = "quire";
    info.fd_limit_per_thread = (unsigned)o->max_connections + 64;
    srv->load_t0 = q_now();
    srv->load_bytes = model_bytes(o->model);
    srv->ctx = srv->metrics ? lws_create_context(&info) : NULL;
    quire_stop_ctx = srv->ctx;
    pthread_t th;
    int status = 0;
    if (!srv->ctx || serve_prep_start(srv, o->prep_threads) || pthread_create(&th, NULL, serve_engine_main, srv)) {
        fprintf(stderr, "quire serve: cannot listen on %s:%d\n", o->host, o->port);
        status = 1;
    } else {
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        signal(SIGPIPE, SIG_IGN);
        printf("quire serve: %s (%s), listening on http://%s:%d (loading the model)\n", srv->name, o->model, o->host,
               o->port);
        fflush(stdout);
        QLOGI("serve: loading %s (%.2f GB)", o->model, srv->load_bytes / 1e9);
        lws_sul_schedule(srv->ctx, 0, &srv->load_tick, load_tick_cb, 5 * LWS_US_PER_SEC);
        service(srv);
        /* Stop: cancel what runs, let the engine finish it, then leave. */
        pthread_mutex_lock(&srv->mu);
        for (sreq *r = srv->reqs; r; r = r->next)
            if (!r->finished) qengine_cancel(srv->eng, r->id);
        srv->engine_stop = 1;
        pthread_cond_signal(&srv->cv);
        pthread_mutex_unlock(&srv->mu);
        pthread_join(th, NULL);
        serve_prep_stop(srv);
        /* The store finishes what is queued (replies, blocks) before the
         * process goes. */
        qstore_stop(srv->store);
        srv->store = NULL;
    }
    serve_cleanup(srv);
    if (srv->load_failed) status = 1;
    fprintf(stderr, "quire serve: stopped\n");
    return status;
}

int cmd_serve(int argc, char **argv)
{
    serve_state *srv = calloc(1, sizeof *srv);
    if (!srv) {
        fprintf(stderr, "quire serve: out of memory\n");
        return 1;
    }
    const int status = serve_main(srv, argc, argv);
    free(srv);
    return status;
}
