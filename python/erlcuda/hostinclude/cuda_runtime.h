// erlcuda: what CUDA's runtime header gives a kernel source, for the host build (the cpu
// backend): the prelude, which the source has already.
#include "erlcuda_host.h"
