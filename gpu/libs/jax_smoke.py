#!/usr/bin/env python3
"""JAX on the GPU: the platform it chose, then jit, grad, a convolution, FFTs and linear algebra.

Prints one line per result with values rounded to 4 significant digits (XLA picks its
algorithms by timing them, so the last bits may differ from run to run); run natively and
through `chidori run`, the two outputs must be equal. A silent fall back to the CPU shows in
the first line. The linear algebra (cuSOLVER through XLA's custom calls) shows only what
does not depend on a sign the library may choose: eigenvalues, singular values, a Cholesky
factor, the absolute diagonal of QR's R, a solve.
"""

import jax
import jax.numpy as jnp


def show(label: str, value: jax.Array) -> None:
    """One result line: shape and the first and last values, and the sum, rounded."""
    flat = jnp.ravel(value)
    picks = [flat[0], flat[-1], jnp.sum(flat)]
    print(label, tuple(value.shape), " ".join(f"{complex(v):.4g}" for v in picks))


def main() -> None:
    device = jax.devices()[0]
    print("platform", device.platform, "devices", len(jax.devices()))
    key = jax.random.PRNGKey(0)
    a = jax.random.normal(key, (256, 256), dtype=jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (256, 256), dtype=jnp.float32)
    show("matmul", jax.jit(lambda x, y: jnp.tanh(x @ y))(a, b))

    def loss(w: jax.Array) -> jax.Array:
        return jnp.mean((a @ w - b) ** 2)

    show("grad", jax.jit(jax.grad(loss))(b))
    image = jax.random.normal(key, (2, 3, 32, 32), dtype=jnp.float32)
    kernel = jax.random.normal(key, (8, 3, 3, 3), dtype=jnp.float32)
    show("conv", jax.lax.conv(image, kernel, (1, 1), "SAME"))
    show("fft", jnp.fft.fft(a))
    show("rfft2", jnp.fft.rfft2(a))
    show("irfft", jnp.fft.irfft(jnp.fft.rfft(a)))
    spd = a @ a.T + 256.0 * jnp.eye(256, dtype=jnp.float32)
    show("cholesky", jnp.linalg.cholesky(spd))
    show("eigvalsh", jnp.linalg.eigvalsh(spd))
    show("svdvals", jnp.linalg.svd(a, compute_uv=False))
    show("qr |diag R|", jnp.abs(jnp.diag(jnp.linalg.qr(a)[1])))
    show("solve", jnp.linalg.solve(spd, b))


if __name__ == "__main__":
    main()
