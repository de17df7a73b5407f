/* backend.c - helpers shared by every backend (see backend.h). */
#include "backend.h"

size_t tdm_dtype_size(tdm_dtype dt)
{
    return dt == TDM_DTYPE_F32 ? 4 : 2;
}

const char *tdm_dtype_name(tdm_dtype dt)
{
    switch (dt) {
    case TDM_DTYPE_F32:
        return "f32";
    case TDM_DTYPE_BF16:
        return "bf16";
    case TDM_DTYPE_F16:
        return "f16";
    }
    return "?";
}
