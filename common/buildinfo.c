#include "buildinfo.h"
#include "revision.h" /* TANDEM_GIT_REVISION (revision.cmake) */

#include <grpc/grpc.h>

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "0.0.0"
#endif
#ifndef TANDEM_BUILD_TYPE
#define TANDEM_BUILD_TYPE ""
#endif
#ifndef TANDEM_CUDA_RUNTIME
#define TANDEM_CUDA_RUNTIME ""
#endif
#ifndef TANDEM_GPU_ARCHS
#define TANDEM_GPU_ARCHS ""
#endif

#define TDM_STR2(x) #x
#define TDM_STR(x) TDM_STR2(x)

const tdm_build_info *tdm_build_info_get(void)
{
    static tdm_build_info info;
    if (!info.version) {
        info.git_revision = TANDEM_GIT_REVISION;
#if defined(__clang__)
        info.compiler = "Clang " __clang_version__;
#elif defined(__GNUC__)
        info.compiler = "GCC " TDM_STR(__GNUC__) "." TDM_STR(__GNUC_MINOR__) "." TDM_STR(__GNUC_PATCHLEVEL__);
#else
        info.compiler = "unknown";
#endif
        info.build_type = TANDEM_BUILD_TYPE;
        info.cuda_runtime = TANDEM_CUDA_RUNTIME;
        info.gpu_archs = TANDEM_GPU_ARCHS;
        info.grpc_core = grpc_version_string();
        info.version = TANDEM_VERSION;
    }
    return &info;
}
