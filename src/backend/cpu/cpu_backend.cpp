// The cpu backend's GEMMs and copies; its other kernels are in the op-family files beside.
// oneDNN's Debian build uses OpenMP too, so there is one thread pool.
#include "backend/cpu/cpu_backend.h"

#include <fmt/format.h>

#include <cstring>

#include "backend/cpu_backend.h"
#include "backend/dnnl_gemm.h"

namespace bottle {
namespace cpu {
namespace {

// oneDNN's bf16 matmul on this CPU ("" where it has none), asked once.
const std::string& bf16_matmul() {
  static const std::string impl = dnnl_bf16_matmul();
  return impl;
}

// Whether oneDNN runs g's product as it is: fp32 operands, or two bf16 factors where it has a
// bf16 matmul on this CPU. The other products are widened (widened_gemm).
bool runs_as_is(const GemmArgs& g) {
  return !g.any_bf16() ||
         (!bf16_matmul().empty() && g.a_dtype == DType::bf16 && g.b_dtype == DType::bf16);
}

// g's three operands as stored, and the fp32 scratch widened_gemm widens the bf16 ones into:
// each a compact matrix, one after another ([a | b | c]).
struct WidenedOperands {
  StridedMatrix a, b, c;
  explicit WidenedOperands(const GemmArgs& g) {
    const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
    const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
    a = strided_matrix(g.a, g.a_dtype, a_rows, a_cols, g.lda, g.batch, g.stride_a);
    b = strided_matrix(g.b, g.b_dtype, b_rows, b_cols, g.ldb, g.batch, g.stride_b);
    c = strided_matrix(g.c, g.c_dtype, g.m, g.n, g.ldc, g.batch, g.stride_c);
  }
  static int64_t widened(const StridedMatrix& m) {
    return m.dtype == DType::bf16 ? m.elements() : 0;
  }
  int64_t floats() const { return widened(a) + widened(b) + widened(c); }
};

bool empty_product(const GemmArgs& g) { return g.m == 0 || g.n == 0 || g.k == 0 || g.batch == 0; }

}  // namespace

// bf16 × bf16 products on oneDNN's bf16 matmul where it runs them on this CPU's bf16
// instructions (AVX512-BF16, AMX); elsewhere (AVX2) the bf16 operands are widened to fp32
// for oneDNN's fp32 matmul, which stores the same bf16 and costs the conversions.
std::string CpuBackend::bf16_gemm_path() const {
  if (bf16_matmul().empty())
    return "bf16 operands widened to fp32 for the cpu backend's fp32 GEMM (oneDNN has no bf16 "
           "matmul on this CPU)";
  return fmt::format("oneDNN bf16 matmul ({})", bf16_matmul());
}

void CpuBackend::do_gemm(const GemmArgs& args) {
  if (args.reads_other_c()) return gemm_from_other_c(args);
  if (runs_as_is(args)) return dnnl_gemm(args);
  widened_gemm(args);
}

// What do_gemm takes of gemm_ws_ for these args, by the same tests and sizes (C_in read from
// elsewhere is copied into C first, so it adds nothing).
int64_t CpuBackend::gemm_scratch_bytes(const GemmArgs& args) {
  if (runs_as_is(args) || empty_product(args)) return 0;
  return WidenedOperands(args).floats() * int64_t(sizeof(float));
}

// slab_ws_ is as large as the largest Slabs any kernel asked for, whichever kernel that was,
// so it is planned as the largest count x row below; dweight_ws_ likewise. The other scratch
// a step never takes: attention's scores are attention_workspace_bytes, the norms' weights
// are fp32 masters (never widened into weight_ws_, bias_ws_), a parameter gradient is fp32
// (embedding's scatter_add never widens a table into gemm_ws_), and widened GEMMs are
// gemm_scratch_bytes.
int64_t CpuBackend::kernel_scratch_bytes(const KernelShapes& s) {
  size_t slabs = 0;
  if (s.dtype == DType::bf16) {
    const int64_t keys = std::max(s.seq, kQueryBlock) * s.head_dim;
    const int64_t norm = std::max(s.hidden, s.latent_norm);
    for (const size_t floats : {
             slab_floats(kAttentionBackwardSlabs, keys),  // and the forward's kAttentionSlabs
             slab_floats(kResidualNormSlabs, s.hidden),
             slab_floats(kNormBackwardSlabs, norm),
             slab_floats(kNormSlabs, norm),
             slab_floats(kRowSlabs, std::max(s.hidden, s.latent)),  // online RMSNorm's rows
             slab_floats(kLogitSlabs, s.logits),
             slab_floats(kTableSlabs, s.hidden),
             slab_floats(kRopeSlabs, s.rope_width),
             slab_floats(int(kMaxElementwiseOperands), kElementwiseTile),
         })
      slabs = std::max(slabs, floats);
  }
  // The norms' backward in fp32 too: RMSNorm's over the hidden width, LaX's LayerNorm's.
  const size_t partials = std::max(slab_floats(kRmsNormPartials, s.hidden),
                                   slab_floats(kLayerNormPartials, s.latent_norm));
  return int64_t((slabs + partials) * sizeof(float));
}

void CpuBackend::release_scratch() {
  for (Workspace* ws : {&attn_ws_, &dweight_ws_, &slab_ws_, &weight_ws_, &bias_ws_, &gemm_ws_})
    ws->release();
}

// oneDNN's sum post-op reads C where it writes it, so C_in is copied there first: the
// product and C_in are then added in fp32 and rounded once, as with a separate C.
void CpuBackend::gemm_from_other_c(const GemmArgs& g) {
  const size_t row_bytes = size_t(g.n) * dtype_size(g.c_dtype);
  const int64_t rows = g.batch * g.m;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t offset = (i / g.m) * g.stride_c + (i % g.m) * g.ldc;
    std::memcpy(static_cast<char*>(g.c) + offset * int64_t(dtype_size(g.c_dtype)),
                static_cast<const char*>(g.c_in) + offset * int64_t(dtype_size(g.c_dtype)),
                row_bytes);
  }
  GemmArgs same = g;
  same.c_in = nullptr;
  do_gemm(same);
}

void CpuBackend::widened_gemm(const GemmArgs& g) {
  if (empty_product(g)) return dnnl_gemm(g);
  const WidenedOperands operands(g);
  const StridedMatrix &a = operands.a, &b = operands.b, &c = operands.c;
  // One scratch for the three compact fp32 stand-ins: [a | b | c].
  float* next = gemm_ws_.get(size_t(operands.floats()));
  GemmArgs f = g;
  // Each widened operand takes its compact layout's strides.
  auto place = [&](const StridedMatrix& m, bool read, const void*& data, int64_t& ld,
                   int64_t& stride) {
    if (m.dtype != DType::bf16) return;
    if (read) widen_matrix(next, m);
    data = next;
    next += m.elements();
    ld = m.cols;
    stride = m.stride == 0 ? 0 : m.rows * m.cols;
  };
  place(a, true, f.a, f.lda, f.stride_a);
  place(b, true, f.b, f.ldb, f.stride_b);
  const void* c_data = g.c;
  place(c, g.beta != 0.0f, c_data, f.ldc, f.stride_c);
  f.c = const_cast<void*>(c_data);
  f.a_dtype = f.b_dtype = f.c_dtype = DType::f32;
  dnnl_gemm(f);
  if (c.dtype == DType::bf16) narrow_matrix(c, static_cast<const float*>(f.c));
}

void CpuBackend::do_copy(Tensor dst, Tensor src) {
  if (copy_scalars(dst, src)) return;
  if (dst.dtype != src.dtype) {
    // f32 ↔ bf16 (backend.cpp has checked that both are floats).
    if (dst.dtype == DType::bf16)
      narrow_bf16_parallel(dst.bf16(), src.f32(), src.numel());
    else
      widen_bf16_parallel(dst.f32(), src.bf16(), src.numel());
    return;
  }
  const size_t bytes = src.nbytes();
  char* o = static_cast<char*>(dst.data);
  const char* s = static_cast<const char*>(src.data);
#pragma omp parallel
  {
    const size_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const size_t begin = bytes * t / nt / 64 * 64,
                 end = t + 1 == nt ? bytes : bytes * (t + 1) / nt / 64 * 64;
    if (end > begin) std::memcpy(o + begin, s + begin, end - begin);
  }
}

void CpuBackend::do_copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col,
                                 int64_t cols) {
  const int64_t n = dst.rows();
  if (dst.dtype != src.dtype) {
    // Converted row by row; dst's other columns are not touched.
    const int64_t dc = dst.cols(), sc = src.cols();
    if (dst.dtype == DType::bf16) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i)
        narrow_bf16(dst.bf16() + i * dc + dst_col, src.f32() + i * sc + src_col, cols);
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i)
        widen_bf16(dst.f32() + i * dc + dst_col, src.bf16() + i * sc + src_col, cols);
    }
    return;
  }
  check_copy_columns("cpu", dst, dst_col, src, src_col, cols);
  const int64_t size = int64_t(dtype_size(dst.dtype));
  const int64_t dst_row = dst.cols() * size, src_row = src.cols() * size;
  char* o = static_cast<char*>(dst.data) + dst_col * size;
  const char* s = static_cast<const char*>(src.data) + src_col * size;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) std::memcpy(o + i * dst_row, s + i * src_row, cols * size);
}

int64_t CpuBackend::do_first_outside(Tensor ids, int64_t lo, int64_t hi) {
  BOTTLE_CHECK(ids.dtype == DType::i32, "cpu backend: first_outside needs i32 ids, got {}",
               dtype_name(ids.dtype));
  const int32_t* id = ids.i32();
  for (int64_t i = 0; i < ids.numel(); ++i)
    if (id[i] < lo || id[i] >= hi) return i;
  return -1;
}

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<cpu::CpuBackend>(); }

}  // namespace bottle
