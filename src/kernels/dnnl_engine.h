// The one oneDNN CPU engine the kernels built on oneDNN share (linear_kernel.cpp
// makes it); only for sources compiled with SD_HAVE_DNNL.
#pragma once
#include <oneapi/dnnl/dnnl.hpp>

namespace sd::kernels {

dnnl::engine& dnnl_cpu_engine();

}  // namespace sd::kernels
