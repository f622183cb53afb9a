// MOK_HD marks plain functions that both host code and device code call, so
// that one definition of a rule (the schedule, the workspace layout) serves
// the CPU reference, the host planner and the kernels alike.
#pragma once

#if defined(__CUDACC__)
#define MOK_HD __host__ __device__ __forceinline__
// Put before a MOK_HD template over a backend that is host-only or
// device-only (the protocol's Sync): only the side that instantiates it is checked.
#define MOK_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define MOK_HD inline
#define MOK_EXEC_CHECK_DISABLE
#endif
