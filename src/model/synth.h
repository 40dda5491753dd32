/* synth.h: deterministic pseudo-random Llama models for tests and benchmarks.
 *
 * Contract: cv_synth_write writes a GGUF with general.architecture "llama"
 * (a Gemma's: below), every llama.* hyperparameter key, general.name / file_type /
 * quantization_version, a synthetic SentencePiece vocabulary and llama.cpp's
 * tensor names and shapes:
 *   token_embd.weight [n_embd, n_vocab], output_norm.weight [n_embd],
 *   output.weight [n_embd, n_vocab] (absent when tied), and per layer N
 *   blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
 *   ffn_gate, ffn_up, ffn_down}.weight.
 * Norms are F32 and exactly 1.0. Every matrix has the type quantize's
 * policy gives it (cv_quant_policy_type: `type`, or with mix one of
 * llama.cpp's mixes, Q2_K to Q5_K_M), or the type cv_quant_fit_type picks
 * when its rows do not fit; general.file_type is cv_quant_policy_file_type's
 * (15 for Q4_K_M, 17 for Q5_K_M, ..., as llama.cpp). Each matrix is quantized row by
 * row from f32 values of std 1/sqrt(row length) (token_embd: std 1; output:
 * output_scale/sqrt(n_embd)).
 *
 * Values: element i (row-major) of tensor NAME is the f32 product
 *   (float)(h0 + h1 + h2 + h3 - 131070) * (float)(std / sqrt((65536^2-1)/3))
 * (the scale computed in double), where h0..h3 are the four 16-bit fields
 * of r_i = mix(key + (i + 1) * G), key = mix((seed ^ fnv1a64(NAME)) + G),
 * G = 0x9e3779b97f4a7c15 and mix is splitmix64's finalizer: a centred sum
 * of four uniforms (Irwin-Hall, near normal, bounded by 3.46 std). Only
 * integer and correctly rounded IEEE operations are involved, so the file
 * is byte-identical on every machine and for every thread count.
 *
 * Vocabulary ("llama" tokenizer): 0 <unk> (unknown), 1 <s>, 2 </s> (control),
 * 3..258 the byte tokens <0x00>..<0xFF>, then pieces: U+2581, letters,
 * digits, punctuation, U+2581 + letter/digit, every U+2581-prefixed prefix of
 * some common English words and every prefix of some suffixes (so SPM merges
 * can reach them), then fillers tok00000, tok00001, ... up to n_vocab.
 * Scores are 0 for ids 0..258 and -k for the k-th piece after them. bos 1,
 * eos 2, unk 0, add_bos_token true, add_eos_token false. A ChatML model
 * (chatml) has <|im_start|> and <|im_end|> (control) as its last two ids,
 * <|im_end|> as eos (as Qwen's models) and the ChatML chat template as
 * tokenizer.chat_template. A FIM model (fim) has <|fim_prefix|>,
 * <|fim_suffix|> and <|fim_middle|> (control) before those, named by the
 * tokenizer.ggml.fim_{pre,suf,mid}_token_id keys, as a code model. A
 * model with tool_marker has Mistral's [TOOL_CALLS] (control) after them.
 *
 * Memory: the tensors are generated into memory (the size of the output
 * file) and then written; no f32 copy of a whole tensor is made. */
#ifndef CONVOY_MODEL_SYNTH_H
#define CONVOY_MODEL_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/types.h"
#include "model/llama.h"
#include "model/quantize.h"

#define CV_SYNTH_MIN_VOCAB 259 /* <unk>, <s>, </s> and 256 byte tokens */

typedef struct cv_synth_params {
    char name[128];        /* general.name */
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab;
    int64_t n_ctx;
    float rope_theta;
    float rms_eps;
    float output_scale;
    bool tied;             /* no output.weight: the output reuses token_embd */
    bool chatml;           /* the vocabulary ends in ChatML's control tokens (above) */
    bool fim;              /* fill-in-the-middle control tokens before them (above) */
    bool tool_marker;      /* Mistral's [TOOL_CALLS] control token (above) */
    int64_t n_swa;         /* a Gemma's or gpt-oss's sliding window (> 0); 0 for the others */
    cv_arch arch;          /* llama, gemma2, gemma3, phi3, qwen2moe, qwen3moe or gpt-oss (below) */
    int64_t head_dim;      /* attention.key_length; 0: n_embd / n_head */
    int64_t n_expert, n_expert_used; /* a mixture of experts (below) when n_expert > 0 */
    int64_t n_ff_exp, n_ff_shexp;    /* an expert's hidden size; qwen2moe's shared expert's */
    int64_t n_ctx_orig;    /* a phi3's (below) original context, beyond which its long RoPE factors apply;
                            * a gpt-oss's, YaRN's (factor n_ctx / n_ctx_orig) */
    uint64_t seed;
    cv_type type;
    cv_quant_mix mix;      /* llama.cpp's mix of `type`, if any (see quantize.h) */
    int n_threads;         /* generation threads; the output does not depend on it */
} cv_synth_params;

/* A Gemma (arch gemma2 or gemma3) has general.architecture and keys of
 * its arch's name (attention.key_length and value_length n_embd / n_head,
 * attention.sliding_window n_swa, no rope.dimension_count), tied
 * embeddings, and per layer also blk.N.{post_attention_norm,
 * post_ffw_norm}.weight [n_embd]; a Gemma 3 also
 * blk.N.{attn_q_norm, attn_k_norm}.weight [head_dim] (norms 1.0). A
 * Gemma 2 has gemma2.final_logit_softcapping 30 (Gemma 2's) and
 * gemma2.attn_logit_softcapping CV_SYNTH_GEMMA2_ATTN_SOFTCAP, below Gemma
 * 2's 50 so that it bends the synthetic weights' attention scores (of std
 * about 1, where 50 would change nothing).
 *
 * A Phi-3 (arch phi3, 1 <= n_ctx_orig <= n_ctx, no sliding window, no
 * experts, head_dim a multiple of 8) has general.architecture "phi3" and
 * phi3.* keys with rope.dimension_count 3/4 of head_dim (partial RoPE),
 * rope.scaling.original_context_length n_ctx_orig,
 * rope.scaling.attn_factor sqrt(1 + ln(n_ctx / n_ctx_orig) / ln(n_ctx_orig))
 * (1 when n_ctx_orig == n_ctx), attention.sliding_window n_ctx_orig / 8
 * (which llama.cpp ignores); rope_factors_long.weight and
 * rope_factors_short.weight [n_rot / 2], element k 1 + 0.25 k^2 and
 * 1 + 0.002 k^2; per layer blk.N.attn_qkv.weight [n_embd, (n_head + 2 *
 * n_head_kv) * head_dim] (Q, K, V rows) in place of attn_q/k/v, and ffn_up.weight
 * [n_embd, 2 * n_ff] (gate rows, then up rows) in place of ffn_gate and
 * ffn_up. Its vocabulary ends in <|endoftext|> (control, the EOS; before
 * ChatML's tokens when chatml), which llama.cpp requires of a model whose
 * name says phi3. */
#define CV_SYNTH_GEMMA2_ATTN_SOFTCAP 5.0f
#define CV_SYNTH_GEMMA2_FINAL_SOFTCAP 30.0f

/* A mixture of experts has <arch>.expert_count, expert_used_count (and
 * for qwen2moe/qwen3moe expert_feed_forward_length, for qwen2moe
 * expert_shared_feed_forward_length), and per layer, in place of
 * ffn_gate/up/down, blk.N.ffn_gate_inp.weight [n_embd, n_expert] (F32,
 * as llama.cpp's quantizer leaves it) and blk.N.ffn_{gate,up}_exps.weight
 * [n_embd, n_ff_exp, n_expert], ffn_down_exps.weight [n_ff_exp, n_embd,
 * n_expert]; qwen2moe adds the shared expert
 * blk.N.ffn_{gate,up,down}_shexp.weight and its gate
 * blk.N.ffn_gate_inp_shexp.weight [n_embd] (F32, random) and the
 * attn_{q,k,v}.bias (random), qwen3moe the attn_{q,k}_norm.weight
 * [head_dim] (1.0). With head_dim set, attn_q is [n_embd, n_head *
 * head_dim] and attn_output its transpose, and attention.key_length and
 * value_length say head_dim. */

/* A gpt-oss (arch gpt-oss, with experts, a sliding window and 1 <= n_ctx_orig <=
 * n_ctx) has general.architecture "gpt-oss" and gpt-oss.* keys with
 * expert_feed_forward_length, attention.sliding_window n_swa (layers 0, 2,
 * 4... slide), rope.scaling.type "yarn", rope.scaling.factor n_ctx /
 * n_ctx_orig and rope.scaling.original_context_length n_ctx_orig, as
 * llama.cpp's converter writes them; per layer blk.N.post_attention_norm
 * in ffn_norm's place (llama.cpp's name for gpt-oss's FFN norm), and
 * random (std 0.5) blk.N.attn_{q,k,v,output}.bias, ffn_gate_inp.bias
 * [n_expert], ffn_{gate,up}_exps.bias [n_ff_exp, n_expert],
 * ffn_down_exps.bias [n_embd, n_expert], and blk.N.attn_sinks.weight
 * [n_head] of std 2 (about the attention scores' size). Its stacked
 * experts are MXFP4 whatever `type` (as gpt-oss ships them), and those of
 * gate and up have std 4 / sqrt(n_embd), so some of their products pass
 * the activation's clamp at 7. */

/* Defaults: ctx 2048, rope theta 10000, eps 1e-5, output_scale 1, untied,
 * seed 1234, F32, 1 thread; dims 0 (set them or apply a preset). */
void cv_synth_defaults(cv_synth_params *p);

/* Sets the dims, ctx, rope theta, output scale, arch and sliding window of a named
 * shape:
 *   tiny            64, 5 layers, 8 attention heads, 4 kv, ff 172, vocab 512, ctx 512
 *                   (llama2.c stories260K; rows of 172 do not fit 32-blocks)
 *   synth-mini      256, 4, 8, 2, 768, 2048, ctx 512, output_scale 4
 *   synth-hd128     512, 2, 4, 1, 1536, 2048, ctx 512, theta 500000, output_scale 4
 *   gemma2-mini     256, 4, 8, 4, 768, 2048, ctx 512, theta 100000, a Gemma 2
 *                   with sliding window 16 (layers 0 and 2 slide, 1 and 3 attend every position)
 *   gemma3-mini     256, 7, 8, 2, 768, 2048, ctx 512, a Gemma 3 with sliding window 16
 *                   (layers 0-4 and 6 slide, 5 attends every position)
 *   phi3-mini       256, 4, 8, 2, 768, 2048, ctx 1024, output_scale 4, a Phi-3
 *                   with original context 256 (24 of head_dim 32 rotate)
 *   llama-3.2-1b    2048, 16, 32, 8, 8192, 32000, ctx 4096, theta 500000
 *   llama-3.1-8b    4096, 32, 32, 8, 14336, 32000, ctx 8192, theta 500000
 *   llama-3.1-70b   8192, 80, 64, 8, 28672, 32000, ctx 8192, theta 500000
 *   qwen3moe-mini   128, 4, 4, 2, 384, 2048, ctx 512, theta 1000000,
 *                   output_scale 4, 8 experts of 64, 2 used
 *   qwen2moe-mini   the same as qwen2moe, with a shared expert of 192
 *   mixtral-mini    a llama of 128, 4, 4, 2, 64, 2048, ctx 512, theta
 *                   1000000, output_scale 4, 8 experts of 64 (n_ff), 2 used
 *   qwen3moe-30b-a3b  Qwen3-30B-A3B's dims: 2048, 48, 32, 4, 6144, 32000,
 *                   head_dim 128, ctx 4096, theta 1000000, 128 experts of
 *                   768, 8 used
 *   gpt-oss-mini    256, 4, 8, 2, 256, 2048, head_dim 64, ctx 512, theta
 *                   150000, output_scale 4, sliding window 16, 8 experts of 256,
 *                   4 used, YaRN factor 8 over an original context of 64
 *   gpt-oss-20b     gpt-oss-20b's dims: 2880, 24, 64, 8, 2880, 32000,
 *                   head_dim 64, ctx 4096, theta 150000, sliding window 128, 32
 *                   experts of 2880, 4 used, YaRN factor 32 (its own)
 *                   over an original context of 128 (its own is 4096 of
 *                   131072: the tables' cost is the same)
 * (synth-mini/hd128 have the shapes of ../shared/reference/models; the
 * llama-* ones those of llamacpp-speed.md, untied, vocab 32000.) */
int cv_synth_preset(cv_synth_params *p, const char *shape, char *err, size_t errlen);
/* Name of preset i, NULL past the last. */
const char *cv_synth_preset_name(int i);

/* Checks the params and writes the model to path. note (may be NULL) is
 * called for every tensor after it has been generated. */
int cv_synth_write(const cv_synth_params *p, const char *path, cv_tensor_note_fn note, void *note_ctx,
                   char *err, size_t errlen);

#endif
