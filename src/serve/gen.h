/* gen.h: the generation of an answer, from the request's body to its
 * last event (gen.c), for the HTTP front.
 *
 * Contract: cv_gen_answer answers cc's generation route (the OpenAI,
 * Responses, Ollama and llama-server completion routes; the body as
 * http.c gathered it): it parses the request (oai.h, after translating
 * an Ollama or llama-server body), submits it to the scheduler as the
 * peer's request, and queues the answer on c: one JSON body, or a
 * stream of server-sent events (Ollama: lines of JSON) with keep-alive
 * comments while it waits. n > 1 choices run as n requests admitted
 * together after the prompt ran alone once, their events merged into
 * one stream. A client that disconnects cancels its requests. Every
 * gen counts in h->n_gens until freed, for the drain. */
#ifndef CONVOY_SERVE_GEN_H
#define CONVOY_SERVE_GEN_H

#include "serve/http_impl.h"

enum MHD_Result cv_gen_answer(cv_http *h, struct MHD_Connection *c, conn *cc);

#endif
