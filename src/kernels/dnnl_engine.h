// The one oneDNN CPU engine the kernels built on oneDNN share (linear_kernel.cpp
// makes it); only for sources compiled with SD_HAVE_DNNL. Each of them keeps its
// primitives in a PrimitiveCache.
#pragma once
#include <oneapi/dnnl/dnnl.hpp>

#include "kernels/primitive_cache.h"

namespace sd::kernels {

dnnl::engine& dnnl_cpu_engine();

}  // namespace sd::kernels
