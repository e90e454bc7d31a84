"""Compiles every launched Triton kernel for a CUDA target (sm_90, an H100/H200) on a
machine with no GPU, and prints each variant's name as it compiles. Run in its own
process without TRITON_INTERPRET: under the interpreter ``@triton.jit`` makes plain
Python functions, which run constructs the compiler refuses (a list comprehension, a
runtime scalar's ``int()``), so only a compile finds those before a GPU does.

The signatures are the launches' (pp1q_kernels/triton_*.py): pointers to int64 for ids,
counts, rows, seeds and sums, float p (float32, float64: half precision is widened
first), runtime ints as i32 (Triton's type for an int below 2^31)."""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from pp1q_kernels import triton_common, triton_counts, triton_residual, triton_verify

TARGET = GPUTarget("cuda", 90, 32)
I64 = "*i64"


def build(name: str, fn, signature: dict, constexprs: dict) -> None:
    for key in constexprs:
        signature[key] = "constexpr"
    triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                   target=TARGET)
    print(name, flush=True)


def main() -> int:
    build("_philox_words_kernel", triton_common._philox_words_kernel,
          dict(ctr_ptr=I64, seed_ptr=I64, out_ptr=I64, n="i32"), dict(BLOCK=64))
    for nt, block in ((3, 16), (127, 1024)):  # a test's tiny vocabulary, the seed's 129280
        build("_allocate", triton_counts._allocate,
              dict(w_ptr="*fp64", out_ptr=I64, status_ptr="*i32", V="i32"),
              dict(NT=nt, BLOCK=block))
    for p in ("*fp32", "*fp64"):
        for dense_q in (False, True):
            build("_tile_sums", triton_residual._tile_sums,
                  dict(p_ptr=p, p_row_ptr=I64, q_ptr=I64, q_row_ptr=I64, s_ptr=I64,
                       out_ptr=I64, V="i32", NT="i32"), dict(DENSE_Q=dense_q, BLOCK=1024))
        for mode in (triton_residual.Q_NONE, triton_residual.Q_DENSE, triton_residual.Q_SPARSE):
            build("_pick", triton_residual._pick,
                  dict(p_ptr=p, p_row_ptr=I64, q_ptr=I64, qid_ptr=I64, q_row_ptr=I64,
                       psum_ptr=I64, rsum_ptr=I64, u_ptr=I64, tok_ptr=I64, flag_ptr="*i32",
                       V="i32", NT="i32", K="i32"),
                  dict(Q_MODE=mode, BLOCK=1024, NT_P2=128, K_P2=32))
        for sparse in (False, True):
            build("_decide", triton_verify._decide,
                  dict(p_ptr=p, psum_ptr=I64, q_ptr=I64, qid_ptr=I64, draft_ptr=I64,
                       seed_ptr=I64, gen_ptr=I64, rnd_ptr=I64, first_ptr=I64, acc_ptr=I64,
                       prow_ptr=I64, qrow_ptr=I64, u_ptr=I64, bad_ptr=I64, V="i32",
                       NT="i32", K="i32"),
                  dict(D=5, SPARSE=sparse, NT_P2=128, K_P2=32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
