/* grammar_match.c: the matcher behind grammar.h's states and masks; the
 * grammar it runs is compiled by grammar_parse.c (grammar_impl.h).
 *
 * Matching: a position is a set of parse stacks kept as a forest of nodes
 * (element position, parent node), hash-consed so that equal stacks are the
 * same node and the forest is canonical: a function of the text matched.
 * Tops are stacks whose next element is a terminal. A step over a code
 * point copies the parent chains of the tops that match it into a new
 * forest and expands their next positions (pushing rule references, popping
 * finished alternatives), each (position, parent) expanded once per step.
 * All tables are preallocated in the state and cleared by generation
 * stamps, and every cap is checked against per-step quantities only, so a
 * step's result depends on the position and the code point alone.
 * Partial code points ride along in the position; a partial prefix is
 * allowed when some top's class meets the range of code points it starts.
 *
 * Masking walks the pieces sorted by their bytes (an implicit byte trie:
 * consecutive pieces share their longest common prefix), keeping the
 * position after each byte of the current piece in an arena, so a shared
 * prefix is matched once and a refused prefix masks every piece under it
 * at once. A step's result depends only on which tops matched, so siblings
 * whose code points match the same tops share one step, and a class that
 * loops in place (inside a JSON string) costs no step at all. Where the
 * arena is full or a piece is deeper than the levels kept, the rest of that
 * piece is matched as allows would (the same steps, hence the same answer). */
#include "infer/grammar_impl.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"

/* ------------------------------------------------------------- matching */

#define MAX_ITEMS (2 * CV_GRAMMAR_MAX_NODES) /* (position, parent) pairs met in one step */
#define TAB_SIZE (4 * MAX_ITEMS)             /* hash slots: a power of two, at most half full */
#define ARENA_NODES (4 * CV_GRAMMAR_MAX_NODES)
#define ARENA_TOPS (4 * CV_GRAMMAR_MAX_STACKS)
#define MAX_LEVELS 256 /* bytes of a piece kept level by level in mask */

enum { R_OK = 0, R_REJECT = 1, R_NOSPACE = 2 };

typedef struct gnode {
    uint32_t pos;   /* element: a terminal for a top, a rule reference for a frame */
    int32_t parent; /* -1: the bottom */
    uint32_t depth;
} gnode;

/* A matcher position: the forest of stacks and the pending UTF-8 bytes. */
typedef struct mpos {
    const gnode *nodes;
    const uint32_t *tops;
    uint32_t n_nodes, n_tops;
    bool accepting;
    uint8_t pb[4];
    uint8_t plen, need;
} mpos;

/* Where a step writes its forest. */
typedef struct outf {
    gnode *nodes;
    uint32_t *tops;
    uint32_t ncap, tcap;
    uint32_t n_nodes, n_tops;
    bool accepting;
} outf;

typedef struct hent {
    uint32_t gen, pos;
    int32_t parent, node;
    uint32_t expanded;
} hent;

typedef struct item {
    uint32_t pos;
    int32_t parent;
} item;

/* What mask remembers of the steps from a level. A step's result depends
 * only on which of the level's tops matched (a signature), so a sibling
 * byte whose code point matches the same tops takes the same forest: the
 * last one stays in the arena right after the level; and signatures whose
 * step gave the level's own forest back (a class looping in place) need no
 * step at all, at this level or at the levels below that share the forest. */
#define N_SELF 4
typedef struct stepcache {
    bool valid, accepting; /* the arena entry */
    int rc;
    uint64_t sig; /* the tops that matched (levels of at most 64 tops) */
    uint32_t n_nodes, n_tops;
    uint64_t self[N_SELF];
    uint32_t n_self;
} stepcache;

typedef struct level {
    mpos m;
    uint32_t an, at; /* arena used up to and including this level */
    stepcache c;
} level;

typedef struct scratch {
    hent *tab;
    uint32_t gen, n_ent;
    int32_t *memo;
    uint32_t *memo_gen;
    item *work;
    int32_t *path;
    gnode *nbuf[2];
    uint32_t *tbuf[2];
    gnode *anodes;
    uint32_t *atops;
    level *levels;
} scratch;

struct cv_grammar_state {
    const cv_grammar *g;
    gnode *nodes;
    uint32_t *tops;
    mpos cur;
    scratch *w;
};

static void new_gen(scratch *w)
{
    if (++w->gen == 0) {
        for (uint32_t i = 0; i < TAB_SIZE; i++)
            w->tab[i].gen = 0;
        for (uint32_t i = 0; i < CV_GRAMMAR_MAX_NODES; i++)
            w->memo_gen[i] = 0;
        w->gen = 1;
    }
    w->n_ent = 0;
}

/* The entry of (pos, parent) in this step's table, made when new; NULL past the cap. */
static hent *entry(scratch *w, uint32_t pos, int32_t parent)
{
    uint32_t h = pos * 0x9E3779B1u ^ (uint32_t)(parent + 1) * 0x85EBCA77u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    for (h &= TAB_SIZE - 1;; h = (h + 1) & (TAB_SIZE - 1)) {
        hent *e = &w->tab[h];
        if (e->gen != w->gen) {
            if (w->n_ent >= MAX_ITEMS)
                return NULL;
            w->n_ent++;
            *e = (hent){w->gen, pos, parent, -1, 0};
            return e;
        }
        if (e->pos == pos && e->parent == parent)
            return e;
    }
}

/* The node of entry e in o, made when new. */
static int node_of(hent *e, outf *o, int32_t *id)
{
    if (e->node < 0) {
        const uint32_t depth = e->parent < 0 ? 1 : o->nodes[e->parent].depth + 1;
        if (depth > CV_GRAMMAR_MAX_DEPTH)
            return R_REJECT;
        if (o->n_nodes >= o->ncap)
            return o->ncap < CV_GRAMMAR_MAX_NODES ? R_NOSPACE : R_REJECT;
        o->nodes[o->n_nodes] = (gnode){e->pos, e->parent, depth};
        e->node = (int32_t)o->n_nodes++;
    }
    *id = e->node;
    return R_OK;
}

/* Copies node id of the input forest (and its ancestors) into o. */
static int translate(scratch *w, const mpos *in, int32_t id, outf *o, int32_t *out)
{
    uint32_t n = 0;
    while (id >= 0 && w->memo_gen[id] != w->gen) {
        if (n > CV_GRAMMAR_MAX_DEPTH)
            return R_REJECT; /* cannot happen: input depths are within the cap */
        w->path[n++] = id;
        id = in->nodes[id].parent;
    }
    int32_t cur = id < 0 ? -1 : w->memo[id];
    while (n) {
        const int32_t k = w->path[--n];
        hent *e = entry(w, in->nodes[k].pos, cur);
        if (!e)
            return R_REJECT;
        const int rc = node_of(e, o, &cur);
        if (rc)
            return rc;
        w->memo[k] = cur;
        w->memo_gen[k] = w->gen;
    }
    *out = cur;
    return R_OK;
}

/* Expands the stack (pos, parent) into o: its tops, its end. */
static int expand(const cv_grammar *g, scratch *w, uint32_t pos, int32_t parent, outf *o)
{
    uint32_t sp = 0;
    w->work[sp++] = (item){pos, parent};
    while (sp) {
        const item it = w->work[--sp];
        hent *e = entry(w, it.pos, it.parent);
        if (!e)
            return R_REJECT;
        if (e->expanded)
            continue;
        e->expanded = 1;
        const gelem el = g->el[it.pos];
        int32_t id;
        int rc;
        switch (el.type) {
        case E_END:
        case E_ALT:
            if (it.parent < 0) {
                o->accepting = true;
            } else {
                const gnode pn = o->nodes[it.parent];
                if (sp >= MAX_ITEMS)
                    return R_REJECT;
                w->work[sp++] = (item){pn.pos + 1, pn.parent};
            }
            break;
        case E_REF: {
            /* a reference that ends its alternative returns where the
             * alternative would: no frame (x* does not deepen the stack) */
            const uint32_t nt = g->el[it.pos + 1].type;
            if (nt == E_ALT || nt == E_END)
                id = it.parent;
            else if ((rc = node_of(e, o, &id)) != 0)
                return rc;
            const uint32_t a0 = g->rule_alt[el.v], a1 = g->rule_alt[el.v + 1];
            if (a1 - a0 > MAX_ITEMS - sp)
                return R_REJECT;
            for (uint32_t a = a1; a > a0; a--)
                w->work[sp++] = (item){g->alt_start[a - 1], id};
            break;
        }
        default:
            if ((rc = node_of(e, o, &id)) != 0)
                return rc;
            if (o->n_tops >= o->tcap)
                return o->tcap < CV_GRAMMAR_MAX_STACKS ? R_NOSPACE : R_REJECT;
            o->tops[o->n_tops++] = (uint32_t)id;
            break;
        }
    }
    return R_OK;
}

static bool set_has(const cv_grammar *g, uint32_t si, uint32_t cp)
{
    const gset *st = &g->sets[si];
    const uint32_t *rg = g->ranges + 2 * (size_t)st->off;
    uint32_t lo = 0, hi = st->n; /* first range whose end is >= cp */
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (rg[2 * mid + 1] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    const bool in = lo < st->n && rg[2 * lo] <= cp;
    return in != (st->neg != 0);
}

static bool matches(const cv_grammar *g, gelem e, uint32_t cp)
{
    switch (e.type) {
    case E_CHAR: return e.v == cp;
    case E_ANY: return true;
    case E_SET: return set_has(g, e.v, cp);
    default: return false;
    }
}

/* Whether terminal e matches some code point in [lo, hi]. */
static bool meets(const cv_grammar *g, gelem e, uint32_t lo, uint32_t hi)
{
    switch (e.type) {
    case E_CHAR: return lo <= e.v && e.v <= hi;
    case E_ANY: return true;
    case E_SET: {
        const gset *st = &g->sets[e.v];
        const uint32_t *rg = g->ranges + 2 * (size_t)st->off;
        uint32_t a = 0, b = st->n; /* first range ending at or after lo */
        while (a < b) {
            const uint32_t mid = a + (b - a) / 2;
            if (rg[2 * mid + 1] < lo)
                a = mid + 1;
            else
                b = mid;
        }
        if (!st->neg)
            return a < st->n && rg[2 * a] <= hi;
        return !(a < st->n && rg[2 * a] <= lo && rg[2 * a + 1] >= hi);
    }
    default: return false;
    }
}

/* One code point from in into o. */
static int step(const cv_grammar *g, scratch *w, const mpos *in, uint32_t cp, outf *o)
{
    new_gen(w);
    o->n_nodes = o->n_tops = 0;
    o->accepting = false;
    bool matched = false;
    for (uint32_t t = 0; t < in->n_tops; t++) {
        const gnode *tn = &in->nodes[in->tops[t]];
        if (!matches(g, g->el[tn->pos], cp))
            continue;
        matched = true;
        int32_t par;
        int rc = translate(w, in, tn->parent, o, &par);
        if (rc == R_OK)
            rc = expand(g, w, tn->pos + 1, par, o);
        if (rc)
            return rc;
    }
    return matched ? R_OK : R_REJECT;
}

/* The start into o. */
static int start(const cv_grammar *g, scratch *w, outf *o)
{
    new_gen(w);
    o->n_nodes = o->n_tops = 0;
    o->accepting = false;
    for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++) {
        const int rc = expand(g, w, g->alt_start[a], -1, o);
        if (rc)
            return rc;
    }
    return R_OK;
}

/* Adds byte b to the pending UTF-8 of out (a copy of in): 1 when it
 * completes code point *cp (out has nothing pending then), 0 when the
 * code point goes on, -1 when b cannot come next. */
static int utf8_add(const mpos *in, uint8_t b, mpos *out, uint32_t *cp)
{
    if (in->plen == 0) {
        if (b < 0x80) {
            *cp = b;
            return 1;
        }
        const uint8_t need = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
        if (!need)
            return -1;
        out->pb[0] = b;
        out->plen = 1;
        out->need = need;
        return 0;
    }
    const uint8_t lead = in->pb[0];
    uint8_t lo = 0x80, hi = 0xBF;
    if (in->plen == 1) {
        if (lead == 0xE0)
            lo = 0xA0;
        else if (lead == 0xED)
            hi = 0x9F;
        else if (lead == 0xF0)
            lo = 0x90;
        else if (lead == 0xF4)
            hi = 0x8F;
    }
    if (b < lo || b > hi)
        return -1;
    out->pb[out->plen++] = b;
    if (out->plen != out->need)
        return 0;
    uint32_t v = out->need == 2 ? lead & 0x1Fu : out->need == 3 ? lead & 0x0Fu : lead & 0x07u;
    for (uint32_t k = 1; k < out->need; k++)
        v = v << 6 | (out->pb[k] & 0x3Fu);
    out->plen = 0;
    out->need = 0;
    *cp = v;
    return 1;
}

/* R_OK when some top of in meets a code point that out's pending bytes
 * may begin, else R_REJECT. */
static int partial_fits(const cv_grammar *g, const mpos *in, const mpos *out)
{
    const uint8_t lead = out->pb[0];
    uint32_t v = out->need == 2 ? lead & 0x1Fu : out->need == 3 ? lead & 0x0Fu : lead & 0x07u;
    for (uint32_t k = 1; k < out->plen; k++)
        v = v << 6 | (out->pb[k] & 0x3Fu);
    const uint32_t bits = 6u * (uint32_t)(out->need - out->plen);
    uint32_t lo = v << bits, hi = lo | ((1u << bits) - 1);
    if (out->plen == 1) {
        if (lead == 0xE0 && lo < 0x800)
            lo = 0x800;
        if (lead == 0xED && hi > 0xD7FF)
            hi = 0xD7FF;
        if (lead == 0xF0 && lo < 0x10000)
            lo = 0x10000;
        if (lead == 0xF4 && hi > 0x10FFFF)
            hi = 0x10FFFF;
    }
    for (uint32_t t = 0; t < in->n_tops; t++)
        if (meets(g, g->el[in->nodes[in->tops[t]].pos], lo, hi))
            return R_OK;
    return R_REJECT;
}

/* The tops of in (at most 64) that cp matches, a bit each. */
static uint64_t top_signature(const cv_grammar *g, const mpos *in, uint32_t cp)
{
    uint64_t sig = 0;
    for (uint32_t t = 0; t < in->n_tops; t++)
        if (matches(g, g->el[in->nodes[in->tops[t]].pos], cp))
            sig |= (uint64_t)1 << t;
    return sig;
}

static bool loops_in_place(const stepcache *c, uint64_t sig)
{
    for (uint32_t i = 0; i < c->n_self; i++)
        if (c->self[i] == sig)
            return true;
    return false;
}

/* Whether a step gave back in's own forest. */
static bool same_forest(const mpos *in, const outf *o)
{
    return o->n_nodes == in->n_nodes && o->n_tops == in->n_tops && o->accepting == in->accepting &&
           memcmp(o->nodes, in->nodes, (size_t)o->n_nodes * sizeof *o->nodes) == 0 &&
           memcmp(o->tops, in->tops, (size_t)o->n_tops * sizeof *o->tops) == 0;
}

/* Remembers the step of signature sig (result rc, forest in o). */
static void cache_step(stepcache *c, uint64_t sig, int rc, const outf *o)
{
    /* a step that ran out of arena leaves nothing to reuse */
    c->valid = rc != R_NOSPACE;
    c->accepting = o->accepting;
    c->rc = rc;
    c->sig = sig;
    c->n_nodes = o->n_nodes;
    c->n_tops = o->n_tops;
}

/* out takes o's forest. */
static void take_forest(mpos *out, const outf *o, bool *stepped)
{
    out->nodes = o->nodes;
    out->tops = o->tops;
    out->n_nodes = o->n_nodes;
    out->n_tops = o->n_tops;
    out->accepting = o->accepting;
    *stepped = true;
}

/* Code point cp from in: a step into o, unless the level's cache c (NULL:
 * none) knows the result, or knows the step gives in's forest back. */
static int feed_code_point(const cv_grammar *g, scratch *w, const mpos *in, uint32_t cp, mpos *out, outf *o,
                           bool *stepped, stepcache *c)
{
    const bool cached = c && in->n_tops <= 64;
    uint64_t sig = 0;
    if (cached) {
        sig = top_signature(g, in, cp);
        if (!sig)
            return R_REJECT;
        if (loops_in_place(c, sig)) {
            c->valid = false; /* what follows reuses the arena after the level */
            return R_OK;
        }
        if (c->valid && c->sig == sig) {
            if (c->rc)
                return c->rc;
            o->n_nodes = c->n_nodes;
            o->n_tops = c->n_tops;
            o->accepting = c->accepting;
            take_forest(out, o, stepped);
            return R_OK;
        }
    } else if (c) {
        c->valid = false;
    }
    const int rc = step(g, w, in, cp, o);
    if (cached) {
        if (rc == R_OK && same_forest(in, o)) {
            c->self[c->n_self < N_SELF ? c->n_self++ : sig % N_SELF] = sig;
            c->valid = false;
            return R_OK; /* the same forest: out keeps in's */
        }
        cache_step(c, sig, rc, o);
    }
    if (rc)
        return rc;
    take_forest(out, o, stepped);
    return R_OK;
}

/* One byte from in into out; a completed code point steps into o (then
 * *stepped is set and out's forest is o's). */
static int feed(const cv_grammar *g, scratch *w, const mpos *in, uint8_t b, mpos *out, outf *o, bool *stepped,
                stepcache *c)
{
    *out = *in;
    *stepped = false;
    uint32_t cp;
    const int u = utf8_add(in, b, out, &cp);
    if (u < 0)
        return R_REJECT;
    if (u > 0)
        return feed_code_point(g, w, in, cp, out, o, stepped, c);
    if (c) /* what follows a partial byte reuses the arena after the level */
        c->valid = false;
    return partial_fits(g, in, out); /* a partial code point: the code points it may begin */
}

/* Matches bytes from *m with the ping-pong buffers; *m is the result. */
static int run(const cv_grammar *g, scratch *w, mpos *m, const uint8_t *b, size_t n)
{
    int which = 0;
    for (size_t i = 0; i < n; i++) {
        outf o = {w->nbuf[which], w->tbuf[which], CV_GRAMMAR_MAX_NODES, CV_GRAMMAR_MAX_STACKS, 0, 0, false};
        mpos nx;
        bool stepped;
        if (feed(g, w, m, b[i], &nx, &o, &stepped, NULL) != R_OK)
            return -1;
        if (stepped)
            which ^= 1;
        *m = nx;
    }
    return 0;
}

static void scratch_free(scratch *w)
{
    if (!w)
        return;
    cv_free(w->tab);
    cv_free(w->memo);
    cv_free(w->memo_gen);
    cv_free(w->work);
    cv_free(w->path);
    for (int i = 0; i < 2; i++) {
        cv_free(w->nbuf[i]);
        cv_free(w->tbuf[i]);
    }
    cv_free(w->anodes);
    cv_free(w->atops);
    cv_free(w->levels);
    cv_free(w);
}

static scratch *scratch_new(bool for_mask)
{
    scratch *w = cv_calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->tab = cv_calloc(TAB_SIZE, sizeof *w->tab);
    w->memo = cv_calloc(CV_GRAMMAR_MAX_NODES, sizeof *w->memo);
    w->memo_gen = cv_calloc(CV_GRAMMAR_MAX_NODES, sizeof *w->memo_gen);
    w->work = cv_malloc(MAX_ITEMS * sizeof *w->work);
    w->path = cv_malloc((CV_GRAMMAR_MAX_DEPTH + 2) * sizeof *w->path);
    bool ok = w->tab && w->memo && w->memo_gen && w->work && w->path;
    for (int i = 0; i < 2 && for_mask; i++) {
        w->nbuf[i] = cv_malloc(CV_GRAMMAR_MAX_NODES * sizeof(gnode));
        w->tbuf[i] = cv_malloc(CV_GRAMMAR_MAX_STACKS * sizeof(uint32_t));
        ok = ok && w->nbuf[i] && w->tbuf[i];
    }
    if (for_mask) {
        w->anodes = cv_malloc(ARENA_NODES * sizeof(gnode));
        w->atops = cv_malloc(ARENA_TOPS * sizeof(uint32_t));
        w->levels = cv_malloc((MAX_LEVELS + 1) * sizeof(level));
        ok = ok && w->anodes && w->atops && w->levels;
    }
    if (!ok) {
        scratch_free(w);
        return NULL;
    }
    return w;
}

/* 0 when the start is within the caps, 1 when not, -1 out of memory. */
int cv_grammar_start_fits(const cv_grammar *g)
{
    scratch *w = scratch_new(false);
    gnode *nodes = cv_malloc(CV_GRAMMAR_MAX_NODES * sizeof *nodes);
    uint32_t *tops = cv_malloc(CV_GRAMMAR_MAX_STACKS * sizeof *tops);
    int rc = -1;
    if (w && nodes && tops) {
        outf o = {nodes, tops, CV_GRAMMAR_MAX_NODES, CV_GRAMMAR_MAX_STACKS, 0, 0, false};
        rc = start(g, w, &o) == R_OK ? 0 : 1;
    }
    scratch_free(w);
    cv_free(nodes);
    cv_free(tops);
    return rc;
}

void cv_grammar_state_reset(cv_grammar_state *s)
{
    outf o = {s->nodes, s->tops, CV_GRAMMAR_MAX_NODES, CV_GRAMMAR_MAX_STACKS, 0, 0, false};
    const int rc = start(s->g, s->w, &o); /* within the caps: checked at parse */
    s->cur = (mpos){.nodes = s->nodes, .tops = s->tops, .n_nodes = rc ? 0 : o.n_nodes, .n_tops = rc ? 0 : o.n_tops,
                    .accepting = rc ? false : o.accepting};
}

cv_grammar_state *cv_grammar_state_create(const cv_grammar *g)
{
    if (!g)
        return NULL;
    cv_grammar_state *s = cv_calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->g = g;
    s->nodes = cv_malloc(CV_GRAMMAR_MAX_NODES * sizeof *s->nodes);
    s->tops = cv_malloc(CV_GRAMMAR_MAX_STACKS * sizeof *s->tops);
    s->w = scratch_new(true);
    if (!s->nodes || !s->tops || !s->w) {
        cv_grammar_state_free(s);
        return NULL;
    }
    cv_grammar_state_reset(s);
    return s;
}

void cv_grammar_state_free(cv_grammar_state *s)
{
    if (!s)
        return;
    cv_free(s->nodes);
    cv_free(s->tops);
    scratch_free(s->w);
    cv_free(s);
}

bool cv_grammar_allows(const cv_grammar_state *s, const char *bytes, size_t n)
{
    if (n == 0)
        return true;
    mpos m = s->cur;
    return run(s->g, s->w, &m, (const uint8_t *)bytes, n) == 0;
}

int cv_grammar_accept(cv_grammar_state *s, const char *bytes, size_t n)
{
    if (n == 0)
        return 0;
    mpos m = s->cur;
    if (run(s->g, s->w, &m, (const uint8_t *)bytes, n) != 0)
        return -1;
    if (m.nodes != s->nodes) {
        memcpy(s->nodes, m.nodes, (size_t)m.n_nodes * sizeof *s->nodes);
        memcpy(s->tops, m.tops, (size_t)m.n_tops * sizeof *s->tops);
        m.nodes = s->nodes;
        m.tops = s->tops;
    }
    s->cur = m;
    return 0;
}

bool cv_grammar_complete(const cv_grammar_state *s)
{
    return s->cur.plen == 0 && s->cur.accepting;
}

/* --------------------------------------------------------------- pieces */

struct cv_grammar_pieces {
    int32_t n;
    uint8_t *data;
    size_t *off;
    uint32_t *len;
    int32_t *order; /* ids sorted by their bytes */
    uint32_t *lcp;  /* lcp[k]: common prefix of the pieces order[k-1] and order[k] */
};

/* Piece x before piece y: by bytes, a prefix first, equal pieces by id. */
static bool piece_before(const cv_grammar_pieces *p, int32_t x, int32_t y)
{
    const uint32_t lx = p->len[x], ly = p->len[y];
    const int c = memcmp(p->data + p->off[x], p->data + p->off[y], lx < ly ? lx : ly);
    if (c)
        return c < 0;
    if (lx != ly)
        return lx < ly;
    return x < y;
}

/* Sorts ids[0, n) by piece_before: a bottom-up merge sort (qsort has no
 * context argument, and this must be safe in concurrent loads). */
static void sort_pieces(const cv_grammar_pieces *p, int32_t *ids, int32_t *tmp, size_t n)
{
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            const size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = piece_before(p, ids[j], ids[i]) ? ids[j++] : ids[i++];
            while (i < mid)
                tmp[k++] = ids[i++];
            while (j < hi)
                tmp[k++] = ids[j++];
        }
        memcpy(ids, tmp, n * sizeof *ids);
    }
}

void cv_grammar_pieces_free(cv_grammar_pieces *p)
{
    if (!p)
        return;
    cv_free(p->data);
    cv_free(p->off);
    cv_free(p->len);
    cv_free(p->order);
    cv_free(p->lcp);
    cv_free(p);
}

cv_grammar_pieces *cv_grammar_pieces_create(int32_t n_tokens, const char *const *bytes, const uint32_t *len)
{
    if (n_tokens < 0 || (n_tokens > 0 && (!bytes || !len)))
        return NULL;
    cv_grammar_pieces *p = cv_calloc(1, sizeof *p);
    if (!p)
        return NULL;
    const size_t n = (size_t)n_tokens;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t l = bytes[i] ? len[i] : 0;
        if (total > SIZE_MAX - l - 1) {
            cv_free(p);
            return NULL;
        }
        total += l;
    }
    p->n = n_tokens;
    p->data = cv_malloc(total + 1);
    p->off = cv_malloc(n * sizeof *p->off + 1);
    p->len = cv_malloc(n * sizeof *p->len + 1);
    p->order = cv_malloc(n * sizeof *p->order + 1);
    p->lcp = cv_malloc(n * sizeof *p->lcp + 1);
    if (!p->data || !p->off || !p->len || !p->order || !p->lcp) {
        cv_grammar_pieces_free(p);
        return NULL;
    }
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        p->off[i] = at;
        p->len[i] = bytes[i] ? len[i] : 0;
        if (p->len[i])
            memcpy(p->data + at, bytes[i], p->len[i]);
        at += p->len[i];
        p->order[i] = (int32_t)i;
    }
    int32_t *tmp = cv_malloc(n * sizeof *tmp + 1);
    if (!tmp) {
        cv_grammar_pieces_free(p);
        return NULL;
    }
    sort_pieces(p, p->order, tmp, n);
    cv_free(tmp);
    for (size_t k = 0; k < n; k++) {
        uint32_t l = 0;
        if (k > 0) {
            const int32_t a = p->order[k - 1], b = p->order[k];
            const uint32_t m = p->len[a] < p->len[b] ? p->len[a] : p->len[b];
            while (l < m && p->data[p->off[a] + l] == p->data[p->off[b] + l])
                l++;
        }
        p->lcp[k] = l;
    }
    return p;
}

uint32_t cv_grammar_piece(const cv_grammar_pieces *p, int32_t id, const char **bytes)
{
    if (!p || id < 0 || id >= p->n) {
        *bytes = "";
        return 0;
    }
    *bytes = (const char *)p->data + p->off[id];
    return p->len[id];
}

void cv_grammar_mask(const cv_grammar_state *s, const cv_grammar_pieces *p, float *logits)
{
    const cv_grammar *g = s->g;
    scratch *w = s->w;
    level *lv = w->levels;
    lv[0] = (level){s->cur, 0, 0, {.valid = false}};
    uint32_t valid = 0; /* lv[0 .. valid] hold the prefixes of the last piece walked */
    for (int32_t k = 0; k < p->n; k++) {
        const int32_t id = p->order[k];
        const uint32_t len = p->len[id];
        const uint8_t *b = p->data + p->off[id];
        if (len == 0) {
            logits[id] = -INFINITY;
            continue;
        }
        uint32_t d = valid < p->lcp[k] ? valid : p->lcp[k];
        valid = d;
        while (d < len) {
            int rc = R_NOSPACE;
            bool stepped = false;
            if (d < MAX_LEVELS) {
                const level *in = &lv[d];
                const uint32_t fn = ARENA_NODES - in->an, ft = ARENA_TOPS - in->at;
                outf o = {w->anodes + in->an, w->atops + in->at, fn < CV_GRAMMAR_MAX_NODES ? fn : CV_GRAMMAR_MAX_NODES,
                          ft < CV_GRAMMAR_MAX_STACKS ? ft : CV_GRAMMAR_MAX_STACKS, 0, 0, false};
                rc = feed(g, w, &in->m, b[d], &lv[d + 1].m, &o, &stepped, &lv[d].c);
                if (rc == R_OK) {
                    /* a level with the forest of the one above keeps its loops */
                    lv[d + 1].c.valid = false;
                    lv[d + 1].c.n_self = stepped ? 0 : lv[d].c.n_self;
                    memcpy(lv[d + 1].c.self, lv[d].c.self, sizeof lv[d].c.self);
                    lv[d + 1].an = in->an + (stepped ? o.n_nodes : 0);
                    lv[d + 1].at = in->at + (stepped ? o.n_tops : 0);
                }
            }
            if (rc == R_NOSPACE) { /* the rest of this piece as allows matches it */
                mpos m = lv[d].m;
                if (run(g, w, &m, b + d, len - d) != 0)
                    logits[id] = -INFINITY;
                break;
            }
            if (rc == R_REJECT) { /* every piece with this prefix of d + 1 bytes */
                logits[id] = -INFINITY;
                while (k + 1 < p->n && p->lcp[k + 1] >= d + 1)
                    logits[p->order[++k]] = -INFINITY;
                break;
            }
            valid = ++d;
        }
    }
}
