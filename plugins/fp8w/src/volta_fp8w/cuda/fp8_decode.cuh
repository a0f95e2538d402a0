// The in-register e4m3fn decode every CUDA kernel of the plugin shares (the tensor-core GEMMs,
// the one-token GEMV): SM70 has no FP8 conversion instruction, so a code becomes the fp16 whose
// bits are ((c & 0x7F) << 7) | ((c & 0x80) << 8), exactly 2^-8 times its value for every
// non-NaN code, subnormals included (volta_fp8w.kernels.e4m3). The loader (volta_fp8w.cuda)
// puts this text after the host's SM70 prelude (u32) and before the kernels' own.

// A half's bits c << 8 (code c in the high byte over a zero one), two to a word, as the fp16
// pair 2^-8 times their values: exponent and mantissa move down one bit, the sign stays.
__device__ __forceinline__ u32 e4m3_pair(u32 a) {
  return ((a >> 1) & 0x3F803F80u) | (a & 0x80008000u);
}

// Codes 0..3 of w (byte i is code i) as fp16 pairs: lo = (code 0, code 1), hi = (code 2, code
// 3), the inputs' order, each half 2^-8 times its code's value. Selector nibble i names the
// source byte of result byte i (0-3: w, 4: a zero byte of the second operand): 0x1404 gives
// bytes (0, c0, 0, c1), 0x3424 gives (0, c2, 0, c3).
__device__ __forceinline__ void e4m3x4(u32 w, u32& lo, u32& hi) {
  lo = e4m3_pair(__byte_perm(w, 0u, 0x1404));
  hi = e4m3_pair(__byte_perm(w, 0u, 0x3424));
}

