/* srv_console.h - the web console (issue 19): the single-page app of
 * console/, embedded in the binary at build time, served at /console with
 * a strict Content-Security-Policy.
 *
 * DESIGN
 *   tools/embed_files.py turns every file of console/ into one entry of
 *   srv_static_files (a generated .c, see server/meson.build), so a fresh
 *   clone builds the console with no network and the daemon needs no data
 *   directory. GET / redirects (302) to /console; GET /console is
 *   index.html; GET /console/<file> is that file or a 404. The routes are
 *   public: the page asks for the keys and keeps them in sessionStorage.
 *   Every console response, errors included, carries the CSP below,
 *   X-Content-Type-Options: nosniff and Referrer-Policy: no-referrer; the
 *   app has no inline script or style and calls only its own origin.
 *
 * Thread: loop thread (the table is immutable data).
 */
#ifndef SERVER_SRV_CONSOLE_H
#define SERVER_SRV_CONSOLE_H

#include <microhttpd.h>
#include <stddef.h>

#include "server/srv_req.h"

/* One embedded file. */
typedef struct srv_static_file {
    const char *path;         /* "/console/app.js" */
    const char *content_type; /* "text/javascript; charset=utf-8" */
    const char *data;         /* len bytes (and a NUL not counted) */
    size_t len;
} srv_static_file_t;

/* The embedded files, ended by a NULL path (generated). */
extern const srv_static_file_t srv_static_files[];

/* The policy of every console response. */
#define SRV_CONSOLE_CSP                                                                        \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "           \
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

/* The embedded file at path ("/console/app.js"), or NULL. Pure. */
const srv_static_file_t *srv_console_find(const char *path);

/* The endpoint of the console routes (the access handler's return value):
 * "/" answers 302 to /console; "/console" index.html;
 * "/console/<file>" the embedded file, or 404. */
enum MHD_Result srv_console_serve(srv_req_t *r);

/* Adds the console's security headers (CSP, nosniff, no-referrer,
 * Cache-Control: no-cache) to resp when ep is a console endpoint
 * (SRV_EP_CONSOLE, SRV_EP_CONSOLE_ROOT); nothing otherwise. */
void srv_console_add_headers(int ep, struct MHD_Response *resp);

#endif /* SERVER_SRV_CONSOLE_H */
