// The sparse path's full passes over a bucket, fused, for one CPU thread.
//
// In eager PyTorch, error feedback + exact TopK reads and writes the 45 MB of a
// ResNet18 gradient five times (add, abs, compare, mask scan, zeroing). Here:
// a strided sample of |residual + grad| gives two thresholds (lo: slightly more
// than k above it, hi: slightly fewer); one pass adds the gradient into the
// residual and writes out the indices reaching lo; only the few candidates
// between lo and hi are ranked. Exactness does not depend on the sample: if at
// least k elements reach lo, the k largest are all among them (else the caller
// lowers lo and scans again). Plain C ABI (loaded with ctypes, no torch headers),
// so it builds in about a second with any C++17 compiler. See native.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlock = 64;

inline bool pruned(const float* weights, float prune_below, int64_t i) {
  return weights && std::fabs(weights[i]) < prune_below;
}

template <bool kAddGrad>
int64_t scan(float* __restrict signal, const float* __restrict grad, int64_t n, float threshold,
             const float* __restrict weights, float prune_below, int32_t* __restrict cand,
             float* __restrict cand_val, int64_t cap) {
  int64_t count = 0;
  int64_t base = 0;
#if defined(__AVX512F__)
  // 16 lanes at a time; hits are packed with compress-stores, no branch per element.
  const __m512 thr = _mm512_set1_ps(threshold);
  const __m512 below = _mm512_set1_ps(prune_below);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (; base + 16 <= n && count + 16 <= cap; base += 16) {
    __m512 v = _mm512_loadu_ps(signal + base);
    if (kAddGrad) {
      v = _mm512_add_ps(v, _mm512_loadu_ps(grad + base));
      _mm512_storeu_ps(signal + base, v);
    }
    __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(v), thr, _CMP_GE_OQ);
    if (weights) hit &= _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(weights + base)), below, _CMP_GE_OQ);
    if (!hit) continue;
    _mm512_mask_compressstoreu_epi32(cand + count, hit, _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int32_t>(base))));
    _mm512_mask_compressstoreu_ps(cand_val + count, hit, v);
    count += __builtin_popcount(hit);
  }
#endif
  for (; base < n; base += kBlock) {
    const int64_t end = std::min(base + kBlock, n);
    int hot = 0;
    // Vectorizable: the add, the store and an OR-reduction of the comparison.
    for (int64_t i = base; i < end; ++i) {
      float v = signal[i];
      if (kAddGrad) {
        v += grad[i];
        signal[i] = v;
      }
      hot |= static_cast<int>(std::fabs(v) >= threshold);
    }
    if (!hot) continue;
    if (count + kBlock <= cap) {
      // The block is in cache. Branch-free emit: always write, advance on a hit
      // (a branch per element mispredicts at 1-20% density and costs 3x more).
      for (int64_t i = base; i < end; ++i) {
        cand[count] = static_cast<int32_t>(i);
        cand_val[count] = signal[i];
        count += (std::fabs(signal[i]) >= threshold) & !pruned(weights, prune_below, i);
      }
    } else {
      for (int64_t i = base; i < end; ++i) {
        if (std::fabs(signal[i]) >= threshold && !pruned(weights, prune_below, i)) {
          if (count < cap) {
            cand[count] = static_cast<int32_t>(i);
            cand_val[count] = signal[i];
          }
          ++count;
        }
      }
    }
  }
  return count;
}

}  // namespace

extern "C" {

// splitmix64: a fast, well-mixed hash of a counter (the sample's jitter).
static inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// |signal + grad| (or |signal| if grad is null) at one random position in each
// window of stride elements, into sample (0 where pruned): the threshold is
// estimated from it before the pass. Jittered, not at a fixed stride: gradients
// are periodic (a 3x3 conv on 1x1 feature maps has gradient only in the centre
// tap, every 9th element), and a stride in step with the period samples only
// zeros or only non-zeros.
void ns_sample(const float* signal, const float* grad, int64_t n, const float* weights, float prune_below,
               float* sample, int64_t stride, uint64_t seed) {
  int64_t j = 0;
  for (int64_t base = 0; base < n; base += stride, ++j) {
    const int64_t width = std::min(stride, n - base);
    const int64_t i = base + static_cast<int64_t>(mix64(seed + static_cast<uint64_t>(j)) % static_cast<uint64_t>(width));
    const float v = grad ? signal[i] + grad[i] : signal[i];
    sample[j] = pruned(weights, prune_below, i) ? 0.0f : std::fabs(v);
  }
}

// The values of rank lo and rank hi (0-based, lo <= hi < m) in ascending order
// of sample, into out[0] and out[1]; reorders sample. Two partial selections:
// torch.kthvalue twice costs ~2 ms on 65k values, this ~0.3.
void ns_ranks(float* sample, int64_t m, int64_t lo, int64_t hi, float* out) {
  std::nth_element(sample, sample + lo, sample + m);
  out[0] = sample[lo];
  if (hi > lo) std::nth_element(sample + lo + 1, sample + hi, sample + m);
  out[1] = sample[hi];
}

// One pass over a bucket of n floats. If grad is not null: signal += grad (error
// feedback, in place). Writes up to cap indices i with |signal[i]| >= threshold
// (and |weights[i]| >= prune_below when weights is not null) to cand, in
// ascending order, and their values to cand_val (so that ranking them reads two
// dense arrays instead of gathering from the bucket). Returns the number of
// such indices, which may exceed cap.
int64_t ns_scan(float* signal, const float* grad, int64_t n, float threshold, const float* weights,
                float prune_below, int32_t* cand, float* cand_val, int64_t cap) {
  return grad ? scan<true>(signal, grad, n, threshold, weights, prune_below, cand, cand_val, cap)
              : scan<false>(signal, grad, n, threshold, weights, prune_below, cand, cand_val, cap);
}

// Of count candidates (indices ascending, with their values), keeps exactly k
// with the largest magnitude (ties broken by position) and writes them, still
// ascending, to out_idx with their values to out_val (float32, or IEEE half if
// fp16). With error_feedback, subtracts the value actually sent (after
// rounding) from signal. Candidates with magnitude >= sure are known to be in
// the TopK if there are at most k of them: only the others are ranked (pass
// +inf to rank everything).
void ns_take(float* signal, const int32_t* cand, const float* cand_val, int64_t count, int64_t k, float sure,
             int32_t* out_idx, void* out_val, int fp16, int error_feedback) {
  int64_t n_sure = 0;
  for (int64_t j = 0; j < count; ++j) n_sure += std::fabs(cand_val[j]) >= sure;
  if (n_sure > k) {  // the sure threshold was too low: rank every candidate
    sure = INFINITY;
    n_sure = 0;
  }
  std::vector<float> border;
  border.reserve(count - n_sure);
  for (int64_t j = 0; j < count; ++j) {
    const float m = std::fabs(cand_val[j]);
    if (m < sure) border.push_back(m);
  }
  const int64_t need = std::min<int64_t>(k - n_sure, border.size());
  float kth = -INFINITY;  // border candidates above kth are taken, and `ties` equal to it
  int64_t ties = 0;
  if (need == 0) {
    kth = INFINITY;
  } else if (need < static_cast<int64_t>(border.size())) {
    const auto nth = border.end() - need;
    std::nth_element(border.begin(), nth, border.end());
    kth = *nth;
    ties = need - std::count_if(nth, border.end(), [kth](float m) { return m > kth; });
  }
  auto* f32 = static_cast<float*>(out_val);
  auto* f16 = static_cast<_Float16*>(out_val);
  int64_t taken = 0;
  for (int64_t j = 0; j < count && taken < k; ++j) {
    const float v = cand_val[j];
    const float m = std::fabs(v);
    if (m < sure && m <= kth) {
      if (m < kth || ties == 0) continue;
      --ties;
    }
    const int32_t i = cand[j];
    out_idx[taken] = i;
    float sent = v;
    if (fp16) {
      const _Float16 h = static_cast<_Float16>(v);
      f16[taken] = h;
      sent = static_cast<float>(h);
    } else {
      f32[taken] = v;
    }
    if (error_feedback) signal[i] -= sent;
    ++taken;
  }
}

// The inverse, for every rank's chunk: buf = sum over r of scatter(idx_r,
// val_r / divisor), summed in rank order from 0 as index_add_ would (so both
// paths give identical bits). val_r is float32, or IEEE half if fp16.
//
// Dense results (most cache lines hit) are merged: one sequential write of buf,
// zeros between the indices, which ascend in every chunk ns_take wrote.
// Sparse ones (or chunks from elsewhere, not ascending) are zeroed and scattered.
// A chunk holds ``capacity`` indices, then ``capacity`` values; only the first k of each are read (a padded
// probe's zeros after them are wire, not gradient: decoding them would be work the step never needed).
void ns_decode(float* buf, int64_t n, const uint8_t* const* chunks, int world, int64_t k, int64_t capacity,
               int fp16, float divisor) {
  auto index = [&](int r, int64_t j) { return reinterpret_cast<const int32_t*>(chunks[r])[j]; };
  auto value = [&](int r, int64_t j) {
    const uint8_t* v = chunks[r] + 4 * capacity;
    return fp16 ? static_cast<float>(reinterpret_cast<const _Float16*>(v)[j])
                : reinterpret_cast<const float*>(v)[j];
  };
  if (k * world * 16 >= n && world <= 16) {
    int64_t head[16] = {0};
    int64_t filled = 0;  // buf[0, filled) is final
    bool ascending = true;
    for (;;) {
      int64_t i = n;
      for (int r = 0; r < world; ++r)
        if (head[r] < k) i = std::min<int64_t>(i, index(r, head[r]));
      if (i < filled) {
        ascending = false;
        break;
      }
      std::fill(buf + filled, buf + i, 0.0f);
      if (i == n) break;
      float sum = 0.0f;
      for (int r = 0; r < world; ++r)
        if (head[r] < k && index(r, head[r]) == i) sum += value(r, head[r]++) / divisor;
      buf[i] = sum;
      filled = i + 1;
    }
    if (ascending) return;
  }
  std::memset(buf, 0, n * sizeof(float));
  for (int r = 0; r < world; ++r)
    for (int64_t j = 0; j < k; ++j) buf[index(r, j)] += value(r, j) / divisor;
}

}  // extern "C"
