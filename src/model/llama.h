/* llama.h: a Llama-family model's hyperparameters and weights, bound for a
 * range of layers.
 *
 * Contract: cv_llama_load opens a GGUF, reads and checks the architecture's
 * hyperparameters, and binds the tensors that layers [l0, l1) need, plus
 * token_embd when l0 == 0 and output_norm / output (or the tied token_embd)
 * when l1 == n_layer. A shard (model/shard.h) binds only the layers it
 * holds (held_l0, held_l1), and [0, 0) binds token_embd only when the
 * file has the embeddings (a first shard or a whole model); its n_vocab
 * comes from its shard keys when it has no token_embd. Every bound tensor is checked for presence, type
 * (one convoy computes with) and shape before use; the first problem is
 * reported naming the tensor. The bound weight matrices (but a mixture of
 * experts' stacked experts, which model/experts.h reads as chosen) are read
 * into one block of private memory in huge pages: decode streams them, and the file
 * mapping's 4 KiB pages held it at 15 tokens/s where huge pages give 21
 * (1B Q4_K, one core). token_embd stays in the mapping, where a token
 * touches one row. Norm vectors are F32 (converted
 * once at load if stored otherwise). cv_llama_free releases everything. */
#ifndef CONVOY_MODEL_LLAMA_H
#define CONVOY_MODEL_LLAMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "kernels/types.h"
#include "model/gguf.h"

/* Architectures of the Llama family that convoy runs. */
typedef enum cv_arch {
    CV_ARCH_LLAMA, /* Llama 1-3, Mistral, TinyLlama: optional rope_freqs (Llama 3.1 scaling) */
    CV_ARCH_QWEN2, /* Q/K/V biases, NeoX RoPE */
    CV_ARCH_QWEN3, /* RMSNorm of Q and K per attention head, NeoX RoPE */
    CV_ARCH_GEMMA2, /* post-attention and post-FFN norms, GeGLU, embeddings scaled by
                     * sqrt(n_embd), every other layer sliding, attention and final
                     * logit soft-capping, tied output */
    CV_ARCH_GEMMA3, /* gemma2's layout (no attention soft-cap) with Q/K norms, 5 of
                     * every 6 layers sliding with their own RoPE base */
    CV_ARCH_QWEN2MOE, /* qwen2's attention; experts plus a shared expert behind a sigmoid gate */
    CV_ARCH_QWEN3MOE, /* qwen3's attention; experts */
    CV_ARCH_PHI3,   /* fused Q/K/V and gate/up matrices, NeoX RoPE (often partial),
                     * LongRoPE factors and attention factor */
    CV_ARCH_GPTOSS, /* "gpt-oss": biases on Q/K/V/O, attention sinks, every other layer
                     * sliding, YaRN, experts (with biases) routed by the softmax of
                     * the chosen router logits, a clamped SwiGLU */
} cv_arch;

/* The feed-forward's gated activation. */
typedef enum cv_glu {
    CV_GLU_SILU, /* SwiGLU: silu(gate) * up */
    CV_GLU_GELU, /* GeGLU (gemma): gelu(gate) * up, tanh approximation */
    CV_GLU_OAI,  /* gpt-oss's: x = min(gate, 7), y = clamp(up, -7, 7), x * sigmoid(1.702 x) * (y + 1) */
} cv_glu;

/* The architecture's GGUF name ("llama", "gemma3"...). */
const char *cv_llama_arch_name(cv_arch a);
/* The architecture of GGUF name `name` (n bytes) into *a; -1 if unknown. */
int cv_llama_arch_of(const char *name, size_t n, cv_arch *a);

/* How an embedding pools a sequence's final hidden states: llama.cpp's
 * pooling_type values. */
enum { CV_POOL_NONE = 0, CV_POOL_MEAN = 1, CV_POOL_CLS = 2, CV_POOL_LAST = 3 };

typedef struct cv_llama_hparams {
    cv_arch arch;
    int32_t n_vocab;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;   /* attention.key_length, else n_embd / n_head */
    int32_t n_ff;       /* the dense FFN's hidden size (qwen2moe: its shared expert's) */
    int32_t n_ctx_train; /* context_length, at most CV_LLAMA_MAX_CTX */
    int32_t n_rot;      /* rotary dimensions per attention head (head_dim unless the GGUF says less) */
    float rms_eps;
    float rope_theta;
    bool rope_neox;     /* rotate pairs (i, i + n_rot/2) instead of (2i, 2i+1) */
    float attn_scale;   /* multiplies each attention score: 1/sqrt(head_dim), as a rule */
    float embd_scale;   /* multiplies token embeddings (gemma: sqrt(n_embd)), else 1 */
    float rope_scale;   /* multiplies positions on full-attention layers (linear RoPE scaling, YaRN's
                         * interpolation), else 1 */
    float rope_scale_swa; /* the same on sliding layers (gpt-oss: rope_scale), else 1 */
    float yarn_ext;     /* YaRN's ext_factor: 1 mixes interpolated and extrapolated angles, 0 off */
    float yarn_beta_fast, yarn_beta_slow; /* YaRN's ramp ends, in rotations (32 and 1) */
    int32_t n_swa;      /* sliding window: a token at p attends (p - n_swa, p] on sliding layers; 0: none */
    int32_t swa_pattern;/* layer l slides unless l % swa_pattern == swa_pattern - 1 (gemma2: 2, gemma3: 6) */
    float rope_theta_swa; /* RoPE base of the sliding layers (gemma2: rope_theta, gemma3: 10000) */
    float logit_softcap;  /* final logits become c * tanh(logit / c); 0: none */
    float attn_softcap;   /* attention scores become c * tanh(score / c); 0: none (gemma2: 50) */
    cv_glu glu;           /* the feed-forward's (and the experts') activation */
    int32_t n_expert;     /* experts per layer (a mixture of experts), else 0 */
    int32_t n_expert_used;/* experts each token is routed to */
    int32_t n_ff_exp;     /* an expert's hidden size */
    bool expert_norm;     /* the chosen experts' weights are scaled to sum to 1 (qwen3moe, Mixtral) */
    bool expert_softmax_chosen; /* top-k of the router logits, weights the softmax of those k
                                 * (gpt-oss), instead of top-k of the softmax of all */
    float rope_mscale;    /* multiplies RoPE's cos and sin (rope.scaling.attn_factor, times YaRN's
                           * 1 + 0.1 ln(factor)), else 1 */
    int32_t n_ctx_orig;   /* rope.scaling.original_context_length: a longer context takes rope_long */
    int32_t pooling;      /* pooling_type (CV_POOL_*; another value as the file has it), CV_POOL_MEAN when absent */
} cv_llama_hparams;

/* Whether layer l attends a sliding window rather than every position. */
static inline bool cv_llama_layer_slides(const cv_llama_hparams *hp, int32_t l)
{
    return hp->n_swa > 0 && l % hp->swa_pattern != hp->swa_pattern - 1;
}

/* A weight matrix: n_out rows of n_in elements of `type`, row-major. */
typedef struct cv_weight {
    cv_type type;
    const void *data;
    int32_t n_in;
    int32_t n_out;
    bool interleaved; /* rows in groups of 8, cv_interleave's layout (kernels.h) */
} cv_weight;

/* The bytes of w's rows. */
static inline size_t cv_weight_bytes(const cv_weight *w)
{
    return cv_row_bytes(w->type, w->n_in) * (size_t)w->n_out;
}

/* Expert e of a stacked expert tensor [n_in, rows, n_expert], bound as one
 * matrix of n_expert * rows rows: its rows [e * rows, (e + 1) * rows). A
 * stack stays in the file mapping as the file holds it: never interleaved. */
static inline cv_weight cv_llama_expert(const cv_weight *stack, int32_t n_expert, int32_t e)
{
    const int32_t rows = stack->n_out / n_expert;
    return (cv_weight){.type = stack->type,
                       .data = (const uint8_t *)stack->data + (size_t)e * rows * cv_row_bytes(stack->type, stack->n_in),
                       .n_in = stack->n_in,
                       .n_out = rows,
                       .interleaved = false};
}

/* A phi3 layer's fused attn_qkv (Q, K, V rows) and ffn_up (gate rows, then
 * up rows) are bound as row views: wq, wk, wv and w_gate, w_up point into
 * them, and one matmul pass computes all their rows. */
typedef struct cv_llama_layer {
    const float *attn_norm; /* [n_embd] */
    cv_weight wq;           /* n_embd -> n_head * head_dim */
    cv_weight wk;           /* n_embd -> n_head_kv * head_dim */
    cv_weight wv;           /* n_embd -> n_head_kv * head_dim */
    const float *bq, *bk, *bv; /* [n_head * head_dim], [n_head_kv * head_dim] x2 (qwen2), else NULL */
    const float *q_norm, *k_norm; /* [head_dim] RMSNorm weights of each attention head (qwen3, gemma3), else NULL */
    cv_weight wo;           /* n_head * head_dim -> n_embd */
    const float *bo;        /* [n_embd] output bias (gpt-oss), else NULL */
    const float *sinks;     /* [n_head] attention sink logits (gpt-oss), else NULL */
    const float *post_attn_norm; /* [n_embd] RMSNorm of the attention output (gemma), else NULL */
    const float *ffn_norm;  /* [n_embd] (gpt-oss: its post_attention_norm, which takes this place) */
    cv_weight w_gate;       /* n_embd -> n_ff (qwen2moe: its shared expert's, n_ff_shexp) */
    cv_weight w_up;         /* n_embd -> n_ff (qwen2moe: shared expert) */
    cv_weight w_down;       /* n_ff -> n_embd (qwen2moe: shared expert) */
    cv_weight router;       /* ffn_gate_inp: n_embd -> n_expert (a mixture of experts), else unbound */
    cv_weight gate_exps;    /* n_embd -> n_ff_exp per expert, stacked (cv_llama_expert) */
    cv_weight up_exps;      /* n_embd -> n_ff_exp per expert, stacked */
    cv_weight down_exps;    /* n_ff_exp -> n_embd per expert, stacked */
    const float *router_b;  /* [n_expert] router bias (gpt-oss), else NULL */
    const float *gate_exps_b, *up_exps_b; /* [n_expert][n_ff_exp] experts' biases (gpt-oss), else NULL */
    const float *down_exps_b;             /* [n_expert][n_embd] */
    cv_weight shexp_gate;   /* n_embd -> 1, F32: the shared expert's sigmoid gate (qwen2moe) */
    const float *post_ffn_norm;  /* [n_embd] RMSNorm of the FFN output (gemma), else NULL */
} cv_llama_layer;

typedef struct cv_llama {
    gguf_file gguf;
    cv_llama_hparams hp;
    int32_t l0, l1;          /* bound layer range [l0, l1) */
    int32_t held_l0, held_l1;/* the layers the file holds: [0, n_layer), or a shard's */
    cv_weight tok_embd;      /* n_vocab rows of n_embd (when l0 == 0) */
    const float *output_norm;/* [n_embd] (when l1 == n_layer) */
    cv_weight output;        /* n_embd -> n_vocab (when l1 == n_layer) */
    const float *rope_freqs; /* [n_rot / 2] divisors of the rotation angles (Llama 3.1), or NULL */
    const float *rope_long, *rope_short; /* [n_rot / 2] LongRoPE's divisors (phi3), or NULL */
    cv_llama_layer *layers;  /* [n_layer], only [l0, l1) bound */
    float *vec_copies;       /* owned F32 copies of the 1-D tensors (bind_vec) */
    uint8_t *resident;       /* the bound matrices (cv_huge_alloc), resident_bytes long */
    size_t resident_bytes;
} cv_llama;

/* l1 < 0 means n_layer. [0, 0) binds only the embeddings (a head that
 * holds no layers). */
int cv_llama_load(cv_llama *m, const char *path, int32_t l0, int32_t l1, char *err, size_t errlen);
void cv_llama_free(cv_llama *m);

/* The divisors of the rotation angles for n_ctx positions per sequence, as
 * llama.cpp picks them: rope_freqs, else rope_long when n_ctx exceeds
 * n_ctx_orig, else rope_short; NULL when the model has none. (llama.cpp
 * rounds its context up to a multiple of 256 first, which picks the same
 * when n_ctx_orig is one, as Phi-3's 4096.) */
const float *cv_llama_rope_factors(const cv_llama *m, int32_t n_ctx);

static inline bool cv_llama_has_embd(const cv_llama *m) { return m->l0 == 0 && m->tok_embd.data; }
/* Whether the range ends at the last layer: it holds the output norm and matrix (the last span's). */
static inline bool cv_llama_has_output(const cv_llama *m) { return m->l1 == m->hp.n_layer; }

/* How much of token_embd a range starting at layer 0 reads: all of it (it
 * embeds token ids), one row (what one decoded token reads), or none (it
 * reads hidden states from a previous stage). */
typedef enum cv_embd_use { CV_EMBD_ALL, CV_EMBD_ROW, CV_EMBD_NONE } cv_embd_use;

/* Bytes of the weights layers [l0, l1) use, read from the tensor directory
 * (any binding): every layer tensor, plus token_embd as `embd` says when
 * l0 == 0, plus output_norm and the output matrix when l1 == n_layer. */
uint64_t cv_llama_weight_bytes(const cv_llama *m, int32_t l0, int32_t l1, cv_embd_use embd);
/* Bytes of layer l's tensors; of output_norm + output (+ the RoPE factors). */
uint64_t cv_llama_layer_bytes(const cv_llama *m, int32_t l);
uint64_t cv_llama_output_bytes(const cv_llama *m);
/* A mixture of experts' routed experts (model/experts.h): layer l's, all
 * of them; one slot of the cache (the largest expert of any layer, its
 * gate, up and down rows each 64-byte aligned); the largest single
 * expert matrix. 0 for a dense model. */
uint64_t cv_llama_layer_expert_bytes(const cv_llama *m, int32_t l);
uint64_t cv_llama_expert_slot_bytes(const cv_llama *m);
uint64_t cv_llama_expert_matrix_bytes(const cv_llama *m);
/* Reads matrix w, bound in the file mapping, with pread into dst
 * (64-byte aligned, w's bytes long), its rows interleaved when the kernels
 * allow (cv_interleave_supported), and describes it there in *out. With a
 * staging buffer of w's bytes it reads there first and allocates nothing;
 * without, it interleaves in place. */
int cv_llama_read_matrix(const cv_llama *m, const cv_weight *w, void *staging, void *dst, cv_weight *out, char *err,
                         size_t errlen);

/* The tensors a pipeline stage serving layers [l0, l1) reads, as indices
 * into m->gguf.tensors in a fixed order: the RoPE factors present (rope_freqs,
 * rope_factors_long, rope_factors_short), each
 * layer's tensors (those of the architecture's list the file has), then,
 * when l1 == n_layer, output_norm and the output matrix (token_embd when
 * tied). Never token_embd for input: a stage reads hidden states. idx has
 * room for cv_llama_span_tensors_max(l1 - l0); returns the count. */
/* The most positions a model may claim: --ctx's and a stage's limit too. */
#define CV_LLAMA_MAX_CTX (1 << 24)
#define CV_LLAMA_MAX_EXPERTS 512 /* experts per layer, as llama.cpp's LLAMA_MAX_EXPERTS */
#define CV_LLAMA_LAYER_TENSORS_MAX 31
#define CV_LLAMA_SPAN_EXTRA_MAX 5 /* rope_freqs, rope_factors_long and _short, output_norm, output */
static inline uint64_t cv_llama_span_tensors_max(int64_t n_layers)
{
    return (uint64_t)n_layers * CV_LLAMA_LAYER_TENSORS_MAX + CV_LLAMA_SPAN_EXTRA_MAX;
}
size_t cv_llama_span_tensors(const cv_llama *m, int32_t l0, int32_t l1, uint64_t *idx);

#endif
