#include "request_check.h"

tdm_status tdm_req_check_sampling(const Tandem__V1__SamplingParams *sp, tdm_error *err)
{
    if (!sp)
        return TDM_OK;
    if (!(sp->temperature >= 0.0f) || sp->temperature > 100.0f)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                             "sampling.temperature %g is outside 0..100", sp->temperature);
    if (!(sp->top_p >= 0.0f) || sp->top_p > 1.0f)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "sampling.top_p %g is outside 0..1",
                             sp->top_p);
    return TDM_OK;
}

tdm_status tdm_req_check_max_tokens(uint32_t max_tokens, tdm_error *err)
{
    if (max_tokens > TDM_REQ_MAX_TOKENS)
        return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT, "max_tokens %u is above %u",
                             max_tokens, TDM_REQ_MAX_TOKENS);
    return TDM_OK;
}

tdm_sampling tdm_req_sampling(const Tandem__V1__SamplingParams *sp)
{
    tdm_sampling s = {0};
    if (sp) {
        s.temperature = sp->temperature;
        s.top_p = sp->top_p;
        s.top_k = sp->top_k;
    }
    return s;
}
