// MOK_HD marks plain functions that both host code and device code call, so
// that one definition of a rule (the schedule, the workspace layout) serves
// the CPU reference, the host planner and the kernels alike.
#pragma once

#if defined(__CUDACC__)
#define MOK_HD __host__ __device__ __forceinline__
#else
#define MOK_HD inline
#endif
