// Launchers defined outside main.cu: one in another translation unit, one in a static library.
#pragma once

void scale_step(int* d, int n);    // scale.cu
void library_step(int* d, int n);  // library.cu, linked from libsteps.a
