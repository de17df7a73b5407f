/*
 * buildinfo.h - what this binary is: version, git revision, compiler, CUDA
 * runtime and GPU architectures it was built for. Travels in every service's
 * Descriptor so that a mismatched replica is refused at registration, and is
 * what `tandem doctor` compares against the machine.
 */
#ifndef TANDEM_COMMON_BUILDINFO_H
#define TANDEM_COMMON_BUILDINFO_H

typedef struct tdm_build_info {
    const char *version;      /* "0.1.0" */
    const char *git_revision; /* short hash or "unknown" */
    const char *compiler;     /* "GCC 12.2.0" */
    const char *build_type;   /* "RelWithDebInfo", "+asan+ubsan" appended when sanitized */
    const char *cuda_runtime; /* "13.0" or "" when built without CUDA */
    const char *gpu_archs;    /* comma-separated, "sm_90"; "" without CUDA */
    const char *grpc_core;    /* version string of the linked gRPC core */
} tdm_build_info;

const tdm_build_info *tdm_build_info_get(void);

/* Protocol version spoken by this build (Descriptor.protocol). */
#define TDM_PROTOCOL_MAJOR 1
#define TDM_PROTOCOL_MINOR 4
/* Layout version of state snapshots this build reads and writes. */
#define TDM_SNAPSHOT_LAYOUT_VERSION 1

#endif
