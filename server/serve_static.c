/* serve_static.c - the web folder (the chat UI of web/, or --web's) served
 * at / for GET and HEAD of any path no route takes. */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "serve.h"

/* A file of the web folder for uri ("/" is index.html): 1 when answered.
 * Only regular files whose real path lies inside the folder are served,
 * up to 16 MiB. */
int serve_static_file(struct lws *wsi, pss *p, const char *uri)
{
    const serve_state *srv = p->srv;
    static const struct {
        const char *ext, *type;
    } types[] = { { ".html", "text/html; charset=utf-8" }, { ".js", "text/javascript; charset=utf-8" },
                  { ".css", "text/css; charset=utf-8" },   { ".json", "application/json" },
                  { ".svg", "image/svg+xml" },             { ".png", "image/png" },
                  { ".ico", "image/x-icon" },              { ".txt", "text/plain; charset=utf-8" } };
    if (!srv->web_root || uri[0] != '/' || strstr(uri, "..") || strchr(uri, '\\')) return 0;
    char path[4096], real[PATH_MAX];
    if (snprintf(path, sizeof path, "%s%s", srv->web_root, strcmp(uri, "/") ? uri : "/index.html") >= (int)sizeof path)
        return 0;
    const size_t rl = strlen(srv->web_root);
    struct stat st;
    if (!realpath(path, real) || strncmp(real, srv->web_root, rl) || real[rl] != '/' || stat(real, &st) ||
        !S_ISREG(st.st_mode) || st.st_size > (16 << 20))
        return 0;
    FILE *f = fopen(real, "rb");
    char *buf = f ? malloc((size_t)st.st_size + 1) : NULL;
    const size_t n = buf ? fread(buf, 1, (size_t)st.st_size, f) : 0;
    if (f) fclose(f);
    if (!buf || n != (size_t)st.st_size) {
        free(buf);
        return 0;
    }
    const char *type = "application/octet-stream";
    const size_t pl = strlen(real);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const size_t el = strlen(types[i].ext);
        if (pl > el && !strcmp(real + pl - el, types[i].ext)) type = types[i].type;
    }
    p->endpoint = "static";
    serve_reply(wsi, p, 200, type, buf, n);
    return 1;
}
