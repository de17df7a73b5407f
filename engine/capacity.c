/*
 * capacity.c - sizes of sequence state, workspace and weights, and how many
 * sequences a budget holds (see capacity.h).
 */
#include "capacity.h"
#include "backend.h"

#include <stdio.h>
#include <string.h>

size_t tdm_capacity_conv_dim(const tdm_model_config *c)
{
    return 2 * (size_t)c->lin_k_heads * (size_t)c->lin_k_dim +
           (size_t)c->lin_v_heads * (size_t)c->lin_v_dim;
}

size_t tdm_capacity_kv_width(const tdm_model_config *c)
{
    return (size_t)c->num_kv_heads * (size_t)c->head_dim;
}

void tdm_capacity_state_floats(const tdm_model_config *c, tdm_state_strategy strategy,
                               int max_draft, tdm_state_floats *out)
{
    const size_t slots = (size_t)max_draft + 1;
    out->conv = (size_t)(c->conv_kernel - 1) * tdm_capacity_conv_dim(c);
    out->rec = (size_t)c->lin_v_heads * (size_t)c->lin_k_dim * (size_t)c->lin_v_dim;
    /* no_buffer keeps one checkpoint; the others a window per position. */
    out->conv_x = (strategy == TDM_STATE_NO_BUFFER ? 1 : slots) * out->conv;
    if (strategy == TDM_STATE_REPLAY)
        out->rec_x = slots * tdm_gdn_input_floats(c->lin_k_heads, c->lin_v_heads, c->lin_k_dim,
                                                  c->lin_v_dim);
    else
        out->rec_x = (strategy == TDM_STATE_EXTRA_BUFFER ? slots : 1) * out->rec;
}

size_t tdm_capacity_prefix_block_bytes(const tdm_model_config *c, int block)
{
    tdm_state_floats f;
    tdm_capacity_state_floats(c, TDM_STATE_NO_BUFFER, 0, &f);
    const size_t kv_row = tdm_capacity_kv_width(c);
    size_t floats = 0;
    for (int L = 0; L < c->num_layers; L++)
        floats += c->layer_types[L] == TDM_LAYER_LINEAR_ATTENTION ? f.conv + f.rec
                                                                  : 2 * kv_row * (size_t)block;
    return floats * sizeof(float);
}

void tdm_capacity_seq_bytes(const tdm_model_config *c, tdm_state_strategy strategy, int max_draft,
                            int positions, tdm_seq_bytes *out)
{
    memset(out, 0, sizeof(*out));
    tdm_state_floats f;
    tdm_capacity_state_floats(c, strategy, max_draft, &f);
    for (int L = 0; L < c->num_layers; L++) {
        if (c->layer_types[L] == TDM_LAYER_FULL_ATTENTION) {
            out->kv += 2 * (size_t)positions * tdm_capacity_kv_width(c) * sizeof(float);
        } else {
            out->conv += f.conv * sizeof(float);
            out->recurrent += f.rec * sizeof(float);
            out->strategy += (f.conv_x + f.rec_x) * sizeof(float);
        }
    }
}

size_t tdm_seq_bytes_total(const tdm_seq_bytes *b)
{
    return b->kv + b->recurrent + b->conv + b->strategy;
}

size_t tdm_capacity_workspace_bytes(const tdm_model_config *c, int rows, size_t *sizes)
{
    const size_t H = (size_t)c->hidden_size, C = tdm_capacity_conv_dim(c);
    const size_t VD = (size_t)c->lin_v_heads * (size_t)c->lin_v_dim;
    const size_t QD = (size_t)c->num_heads * (size_t)c->head_dim, KD = tdm_capacity_kv_width(c);
    const size_t Hv = (size_t)c->lin_v_heads, I = (size_t)c->intermediate_size;
    const size_t V = (size_t)c->vocab_size, OW = VD > QD ? VD : QD;
    /* A tensor-parallel rank gathers the ranks' LM head slices before
     * putting whole rows together (engine/shard.h). */
    const size_t G = c->tp_size > 1 ? V : 0;
    /* Per row, in tdm_workspace's order: x, xn, qkv, qkvc, z, a, b, o, o2,
     * qg, q, gate, k, v, h1, h2, logits, gathered. */
    const size_t per_row[TDM_WORKSPACE_PIECES] = {H,      H,  C,  C,  VD, Hv, Hv, OW, OW,
                                                  2 * QD, QD, QD, KD, KD, I,  I,  V,  G};
    size_t total = 0;
    for (int i = 0; i < TDM_WORKSPACE_PIECES; i++) {
        const size_t n = (per_row[i] * (size_t)rows + 15) & ~(size_t)15;
        if (sizes)
            sizes[i] = n;
        total += n;
    }
    return total * sizeof(float);
}

int tdm_capacity_step_rows(int nseq, int max_draft)
{
    const long rows = (long)nseq * (long)(max_draft + 1);
    return rows > TDM_PREFILL_ROWS ? (int)rows : TDM_PREFILL_ROWS;
}

size_t tdm_capacity_weight_bytes(const tdm_model_config *c, size_t matrix_elem_bytes)
{
    const size_t H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    const size_t V = (size_t)c->vocab_size, C = tdm_capacity_conv_dim(c);
    const size_t Hv = (size_t)c->lin_v_heads, VD = Hv * (size_t)c->lin_v_dim;
    const size_t D = (size_t)c->head_dim, QD = (size_t)c->num_heads * D;
    const size_t KD = tdm_capacity_kv_width(c);
    /* embedding and LM head (a tensor-parallel rank's: its slice of the
     * vocabulary) */
    const size_t Vr = V / (size_t)(c->tp_size > 1 ? c->tp_size : 1);
    size_t mat = Vr * H * (c->tie_word_embeddings ? 1 : 2);
    size_t vec = H; /* final norm */
    for (int L = 0; L < c->num_layers; L++) {
        mat += 3 * I * H; /* gate, up, down */
        vec += 2 * H;     /* input and post-attention norms */
        if (c->layer_types[L] == TDM_LAYER_LINEAR_ATTENTION) {
            mat += C * H + VD * H + 2 * Hv * H + H * VD; /* in_qkv, in_z, in_b, in_a, out */
            vec += C * (size_t)c->conv_kernel + 2 * Hv + (size_t)c->lin_v_dim;
        } else {
            mat += 2 * QD * H + 2 * KD * H + H * QD; /* q (with gate), k, v, o */
            vec += 2 * D;                            /* q and k norms */
        }
    }
    return mat * matrix_elem_bytes + vec * sizeof(float);
}

size_t tdm_capacity_mtp_weight_bytes(const tdm_model_config *c, size_t matrix_elem_bytes)
{
    const size_t H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    const size_t D = (size_t)c->head_dim, QD = (size_t)c->num_heads * D;
    const size_t KD = tdm_capacity_kv_width(c);
    const size_t mat = 2 * H * H + 3 * I * H + 2 * QD * H + 2 * KD * H + H * QD;
    const size_t vec = 3 * H + 2 * H + 2 * D; /* fc's two norms and the head's; the layer's */
    return mat * matrix_elem_bytes + vec * sizeof(float);
}

size_t tdm_capacity_mtp_seq_bytes(const tdm_model_config *c, int positions)
{
    return (2 * (size_t)positions * tdm_capacity_kv_width(c) + (size_t)c->hidden_size) *
           sizeof(float);
}

static size_t used_by(const tdm_capacity_params *p, const tdm_capacity *c, int n, size_t *ws)
{
    *ws = tdm_capacity_workspace_bytes(&p->cfg, tdm_capacity_step_rows(n, p->max_draft), NULL);
    return c->weights + *ws + (size_t)n * c->seq_total;
}

void tdm_capacity_compute(const tdm_capacity_params *p, tdm_capacity *out)
{
    memset(out, 0, sizeof(*out));
    tdm_capacity_seq_bytes(&p->cfg, p->strategy, p->max_draft, p->max_context, &out->seq);
    out->seq_total = tdm_seq_bytes_total(&out->seq);
    out->weights = tdm_capacity_weight_bytes(&p->cfg, p->matrix_elem_bytes);
    out->budget = p->budget;
    out->ws_per_seq =
        tdm_capacity_workspace_bytes(&p->cfg, p->max_draft + 1, NULL); /* one sequence's rows */
    /* used_by grows with n: the largest n that fits, by bisection. */
    int lo = 0, hi = TDM_CAPACITY_MAX_SEQUENCES;
    size_t ws = 0;
    if (used_by(p, out, hi, &ws) <= p->budget) {
        lo = hi;
        out->capped = 1;
    } else {
        while (hi - lo > 1) {
            int mid = lo + (hi - lo) / 2;
            if (used_by(p, out, mid, &ws) <= p->budget)
                lo = mid;
            else
                hi = mid;
        }
    }
    out->max_sequences = lo;
    /* With none fitting, the terms are those of one sequence. */
    out->used = used_by(p, out, lo > 0 ? lo : 1, &out->workspace);
}

const char *tdm_capacity_bytes_str(size_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%zu B", bytes);
    else
        snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

int tdm_capacity_format(const tdm_capacity_params *p, const tdm_capacity *c, const char *prefix,
                        char *buf, size_t len)
{
    char a[32], b[32], d[32], e[32], f[32], g[32], h[32], k[32], rank[96] = "";
    const int n = c->max_sequences > 0 ? c->max_sequences : 1;
    if (p->cfg.tp_size > 1) /* a tensor-parallel rank's: what each of its devices holds */
        snprintf(rank, sizeof(rank), "one rank of %d (tensor_parallel), ", p->cfg.tp_size);
    return snprintf(
        buf, len,
        "%s%sper sequence (%s, max_draft_tokens %d, max_context %d): kv %zu (%s) + recurrent %zu "
        "(%s) + conv %zu (%s) + strategy %zu (%s) = %zu bytes (%s)\n"
        "%sweights: %zu bytes (%s; matrices at %zu bytes an element)\n"
        "%sworkspace of the largest step (%d rows): %zu bytes (%s)\n"
        "%sbudget: %zu bytes (%s)\n"
        "%smax sequences: %d = the most n with weights + workspace(n) + n x %zu <= budget "
        "(%zu bytes used at n = %d)%s\n",
        prefix, rank, tdm_state_strategy_name(p->strategy), p->max_draft, p->max_context, c->seq.kv,
        tdm_capacity_bytes_str(c->seq.kv, a, sizeof(a)), c->seq.recurrent,
        tdm_capacity_bytes_str(c->seq.recurrent, b, sizeof(b)), c->seq.conv,
        tdm_capacity_bytes_str(c->seq.conv, d, sizeof(d)), c->seq.strategy,
        tdm_capacity_bytes_str(c->seq.strategy, e, sizeof(e)), c->seq_total,
        tdm_capacity_bytes_str(c->seq_total, f, sizeof(f)), prefix, c->weights,
        tdm_capacity_bytes_str(c->weights, g, sizeof(g)), p->matrix_elem_bytes, prefix,
        tdm_capacity_step_rows(n, p->max_draft), c->workspace,
        tdm_capacity_bytes_str(c->workspace, h, sizeof(h)), prefix, c->budget,
        tdm_capacity_bytes_str(c->budget, k, sizeof(k)), prefix, c->max_sequences, c->seq_total,
        c->used, n, c->capped ? " (the count stops there)" : "");
}
