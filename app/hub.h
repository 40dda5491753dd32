/* hub.h: models from the Hugging Face hub into the local cache, for
 * `convoy pull` and -hf on run and serve.
 *
 * A reference names one file of a repository:
 *   hf://OWNER/REPO/PATH          that file (PATH may hold folders);
 *   OWNER/REPO[:QUANT]            llama.cpp's -hf: the repository's GGUF whose
 *                                 name holds QUANT (any case, default Q4_K_M;
 *                                 without one, its only GGUF), mmproj files aside.
 * The hub is https://huggingface.co or $HF_ENDPOINT; $HF_TOKEN goes with
 * every request to it as a bearer token (curl keeps it from hosts a
 * redirect leads to). Files land in $CONVOY_MODELS, else
 * $XDG_CACHE_HOME/convoy/models, else ~/.cache/convoy/models, as
 * OWNER/REPO/PATH.
 *
 * A download goes to PATH.part and resumes there (an HTTP range from its
 * size) after a cut, in the same run (up to HUB_ATTEMPTS tries) or the
 * next; once whole it must have the size and the SHA-256 the hub states
 * for the file (its X-Linked-Size and X-Linked-Etag), or it is deleted
 * with an error naming both hashes. Then it becomes PATH and PATH.sha256
 * records its hash, so that a later pull of the same revision downloads
 * nothing, and a pull without the network uses the cached file. */
#ifndef CONVOY_APP_HUB_H
#define CONVOY_APP_HUB_H

#include <stddef.h>

/* Where to put the file: out_path, or the cache when NULL. */
typedef struct hub_pull_params {
    const char *out_path;
    const char *cmd; /* names the messages: "pull" gives "convoy pull: " */
} hub_pull_params;

/* The file of ref, downloaded unless the cache holds it, its path into
 * path. Progress lines on stderr. Returns 0, or -1 with the reason in err
 * (the reference, the hub's answer or the transfer's failure named). */
int hub_pull(const char *ref, const hub_pull_params *p, char *path, size_t path_len, char *err, size_t errlen);

/* For run and serve: the model is -m's path, or -hf's reference pulled
 * (*model_path then points into buf). Returns 0, or the exit status after
 * a message: 2 when neither or both are given, 1 when the pull failed. */
int hub_model_option(const char *cmd, const char *hf, const char **model_path, char *buf, size_t n);

#endif
