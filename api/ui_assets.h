/*
 * The dashboard's files, compiled into the binary (tools/ui_embed.sh
 * generates $(BUILD)/gen/ui_assets.c from ui/ at build time). Immutable;
 * any thread.
 */
#ifndef JD_API_UI_ASSETS_H
#define JD_API_UI_ASSETS_H

#include <stddef.h>

struct jd_ui_asset {
    const char *name;          /* path below /ui/, e.g. "app.js" */
    const char *ctype;         /* Content-Type */
    const char *etag;          /* quoted strong ETag: a hash of the bytes */
    const unsigned char *data; /* the bytes (NUL-terminated, not counted in len) */
    size_t len;
};

extern const struct jd_ui_asset jd_ui_assets[];
extern const size_t jd_ui_nassets;

#endif
