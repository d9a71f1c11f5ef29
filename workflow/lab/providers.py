"""Provider values several kernels' tables share, so that a comparison across kernels (what fusion buys,
what each improvement bought) reads one name. A unit declares what each of its providers is
(its ``PROVIDERS``), and a value only its own tables take beside it."""
WRITEUP = "triton_writeup"  # the writeup's kernel as printed
TRITON = "triton"  # the writeup's kernel with a fix (vector_add's 64-bit offsets, attention's head-dim mask)
FUSED = "triton_fused"  # the project's improved kernel (relu+dropout, softmax)
FLASH = "triton_flash"  # kernels.flash_attention
TORCH = "torch"  # the torch operation that computes the same thing
