// Kernels of the graph_build program, as the function pointers graph nodes take; the host
// code (main.cpp) is plain C++.
#pragma once

// scale(float* x, float a, int n): x[i] *= a.
const void* scale_kernel();
// add(float* y, const float* x, int n): y[i] += x[i].
const void* add_kernel();
// bump(unsigned long long* counter): ++*counter (one thread).
const void* bump_kernel();
// fill(int* p, int value, int n): p[i] = value + i.
const void* fill_kernel();
