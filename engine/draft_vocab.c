/* draft_vocab.c - a draft vocabulary: the LM head's rows of a few token ids,
 * which a drafter's steps read instead of the whole head (FR-Spec, SGLang's
 * speculative token maps). Shared by the model drafter
 * (tdm_model_set_draft_vocab) and the MTP head (tdm_mtp_set_vocab). */
#include "alloc.h"
#include "engine_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

tdm_status tdm_draft_vocab_load(tdm_model *m, const int32_t *ids, int n, tdm_draft_vocab *dv,
                                tdm_error *err)
{
    const int V = m->cfg.vocab_size;
    if (dv->n)
        return tdm_error_set(err, TDM_ERR_FAILED_PRECONDITION,
                             "the model already drafts from a vocabulary of %d tokens", dv->n);
    if (n < 1 || n > V)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "a draft vocabulary of %d tokens: the model's has %d", n, V);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "draft vocabulary entry %d: token %d is outside the model's "
                                 "vocabulary 0..%d",
                                 i, (int)ids[i], V - 1);
        if (i > 0 && ids[i] <= ids[i - 1])
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "draft vocabulary entry %d: token %d after %d (the ids must "
                                 "ascend, each once)",
                                 i, (int)ids[i], (int)ids[i - 1]);
    }
    tdm_backend *be = m->be;
    int32_t *map = be->alloc(be->ctx, (size_t)n * sizeof(int32_t));
    if (!map)
        return tdm_error_oom(err, (size_t)n * sizeof(int32_t), "a draft vocabulary's ids");
    /* The LM head's rows: those of the embedding when tied. */
    const bool tied = m->cfg.tie_word_embeddings;
    tdm_status rc = tdm_model_load_matrix_rows(m, tied ? "embed_tokens.weight" : "lm_head.weight",
                                               tied, V, m->cfg.hidden_size, ids, n, &dv->head, err);
    if (rc != TDM_OK) {
        be->free(be->ctx, map);
        return tdm_error_prefix(err, "draft vocabulary");
    }
    be->upload(be->ctx, map, ids, (size_t)n * sizeof(int32_t));
    be->sync(be->ctx);
    dv->ids = tdm_xmalloc((size_t)n * sizeof(int32_t));
    memcpy(dv->ids, ids, (size_t)n * sizeof(int32_t));
    dv->map = map;
    dv->n = n;
    return TDM_OK;
}

void tdm_draft_vocab_free(tdm_backend *be, tdm_draft_vocab *dv)
{
    if (dv->map)
        be->free(be->ctx, dv->map);
    free(dv->ids);
    *dv = (tdm_draft_vocab){0};
}

/* From the last id down, so an entry moves only up, onto a place already
 * read (ids ascend: ids[i] >= i). */
void tdm_draft_vocab_spread(const tdm_draft_vocab *dv, float *row, int V)
{
    int j = dv->n - 1;
    for (int p = V - 1; p >= 0; p--)
        row[p] = j >= 0 && dv->ids[j] == p ? row[j--] : -INFINITY;
}
