// Empty stand-in used by astra.cuda_parse: clang's CUDA runtime wrapper includes texture_fetch_functions.h,
// which a CUDA toolkit may lack. Searched after the toolkit's own headers (-idirafter), so a real
// one always wins. Parsing only: nothing from these headers is ever needed to find kernels.
#pragma once
