/* slots.h: llama-server's /slots routes: what each slot holds, and slot
 * files.
 *
 * Contract: cv_slots_json is GET /slots: [{"id", "n_ctx", "is_processing",
 * "n_tokens"}, ...], what each slot holds now (a running request's tokens
 * so far, or an idle slot's kept prompt). cv_slot_action_json is POST
 * /slots/ID?action=save|restore|erase with a body {"filename": NAME}
 * (erase takes none):
 *  - save writes the idle slot's kept tokens to DIR/NAME (atomically) as a
 *    slot file: {"id_slot", "filename", "n_saved", "n_written",
 *    "timings": {"save_ms"}};
 *  - restore reads DIR/NAME and runs its tokens into the slot (a prefill,
 *    reusing what the slot holds of them; the KV is recomputed, exact
 *    bits, not read from the file), so that the slot continues as the
 *    saved one would: {"id_slot", "filename", "n_restored", "n_read",
 *    "timings": {"restore_ms"}};
 *  - erase forgets the slot's kept tokens: {"id_slot", "n_erased"}.
 * NAME is refused unless it is 1 to 200 bytes of letters, digits, '.',
 * '_' and '-', does not start with '.' and holds no "..": never a path.
 * dir NULL (no --slot-save-path) refuses save and restore. A slot file is
 * "CVSL", u32 version 1, the model's id (convoy_model_id, 32 bytes), u32
 * n_tokens, u32 0, then n_tokens i32 token ids, little-endian; restore
 * refuses a file of another model, a malformed one (naming what is
 * wrong) and one longer than a slot's context. Failures return NULL with
 * e filled (400 for the client's mistakes, 404 for a missing file, 409
 * for a busy slot, 500 for the server's). */
#ifndef CONVOY_SERVE_SLOTS_H
#define CONVOY_SERVE_SLOTS_H

#include <stddef.h>
#include <stdint.h>

#include "serve/oai.h"
#include "serve/sched.h"

char *cv_slots_json(cv_sched *s);
char *cv_slot_action_json(cv_sched *s, const convoy_model *m, const char *dir, int32_t id, const char *action,
                          const char *body, size_t len, oai_error *e);

#endif
