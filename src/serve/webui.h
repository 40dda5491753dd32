/* webui.h: the chat page convoy serve answers at / (webui.html beside
 * this file: one self-contained page, no build step), built into the
 * binary by scripts/embed.cmake. */
#ifndef CONVOY_SERVE_WEBUI_H
#define CONVOY_SERVE_WEBUI_H

#include <stddef.h>

extern const char cv_webui_html[];  /* NUL-terminated */
extern const size_t cv_webui_html_len;

#endif
