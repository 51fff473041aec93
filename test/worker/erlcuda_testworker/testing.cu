// The test double's fault kernel (erlcuda_testworker.fault loads it as user code): it stores to an address
// in the never-mapped first page, so the launch ends in a sticky illegal-address error
// (CUDA_ERROR_ILLEGAL_ADDRESS) that poisons the context, as a real kernel bug would.
#include <stdint.h>

extern "C" __global__ void erlcuda_fault(float* p) {
    volatile float* bad = reinterpret_cast<volatile float*>(static_cast<uintptr_t>(0x100));
    *bad = p[0];
}
