/* Empty stand-in for nvcc's crt/host_config.h (compiler checks); host-only parsing needs none.
 * Written for Chidori. */
